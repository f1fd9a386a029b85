"""The package as users get it: the sdist carries the contract, the
committed stubs, their typing and the generator; the wheel built from that
sdist installs the same; the stubs import under the protobuf installed here
(the test runs on the oldest and the newest supported stack) without a
warning."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

from conftest import REPO

PACKAGE = REPO / "clients" / "python"
CONTRACT = REPO / "proto" / "ctxbroker" / "v1" / "broker.proto"
SHIPPED = [
    "ctxbroker_client/__init__.py",
    "ctxbroker_client/aio.py",
    "ctxbroker_client/py.typed",
    "ctxbroker_client/v1/broker_pb2.py",
    "ctxbroker_client/v1/broker_pb2.pyi",
    "ctxbroker_client/v1/broker_pb2_grpc.py",
    "ctxbroker_client/v1/broker_pb2_grpc.pyi",
    "ctxbroker_client/v1/_contract.py",
    "ctxbroker_client/proto/ctxbroker/v1/broker.proto",
]


def test_the_sdist_and_its_wheel_carry_the_proto_and_the_typed_stubs(tmp_path: Path) -> None:
    # sdist first, then the wheel from the unpacked sdist: what pip does.
    subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(tmp_path), str(PACKAGE)],
        check=True,
        capture_output=True,
    )
    (sdist,) = tmp_path.glob("ctxbroker_client-*.tar.gz")
    (wheel,) = tmp_path.glob("ctxbroker_client-*.whl")

    with tarfile.open(sdist) as tar:
        root = tar.getnames()[0].split("/")[0]
        names = set(tar.getnames())
        for shipped in SHIPPED:
            assert f"{root}/src/{shipped}" in names, shipped
        for extra in ("tools/generate.py", "requirements-gen.txt", "pyproject.toml", "README.md"):
            assert f"{root}/{extra}" in names, extra
        proto = tar.extractfile(f"{root}/src/ctxbroker_client/proto/ctxbroker/v1/broker.proto")
        assert proto is not None and proto.read() == CONTRACT.read_bytes()

    with zipfile.ZipFile(wheel) as zipped:
        names = set(zipped.namelist())
        for shipped in SHIPPED:
            assert shipped in names, shipped
        assert zipped.read("ctxbroker_client/proto/ctxbroker/v1/broker.proto") == (
            CONTRACT.read_bytes()
        )
        # Pure Python: installs on any Python >= 3.10 without a compiler.
        assert wheel.name.endswith("-py3-none-any.whl")
        metadata = zipped.read(next(n for n in names if n.endswith(".dist-info/METADATA")))
        requires = [
            line.split(":", 1)[1].strip()
            for line in metadata.decode().splitlines()
            if line.startswith("Requires-Dist:") and "extra ==" not in line
        ]
        assert "protobuf>=4.25" in requires and "grpcio>=1.49.1" in requires, requires


def test_the_stubs_import_without_a_warning() -> None:
    code = (
        "import google.protobuf, grpc, ctxbroker_client as c; "
        "m = c.pb.AdmitRequest(session_id='s', spans=[c.user('hi')]); "
        "assert c.pb.AdmitRequest.FromString(m.SerializeToString()) == m; "
        "print(google.protobuf.__version__, grpc.__version__)"
    )
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", code], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
