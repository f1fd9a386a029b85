"""Builds ctxbroker-client with its gRPC stubs generated from the contract.

The stubs are never checked in: every build runs grpcio-tools' protoc on the
repository's ``proto/`` directory (or ``CTXBROKER_PROTO_DIR``), so the
installed client always speaks the contract it was built from. The build
also records the contract's SHA-256 digest, computed exactly as the daemon
computes the ``contract_digest`` it reports in ``GetServerInfo``, so a test
(or a caller) can tell whether client and daemon agree.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
PACKAGE = "ctxbroker_client"
GENERATED = "v1"
CONTRACT_FILE = "ctxbroker/v1/broker.proto"


def proto_dir() -> Path:
    """The directory that holds ``ctxbroker/v1/broker.proto``."""
    configured = os.environ.get("CTXBROKER_PROTO_DIR")
    root = Path(configured) if configured else HERE.parent.parent / "proto"
    if not (root / CONTRACT_FILE).is_file():
        raise SystemExit(
            f"ctxbroker-client: cannot find {CONTRACT_FILE} under {root}; build the "
            "package from a ctxbroker checkout or set CTXBROKER_PROTO_DIR"
        )
    return root


def contract_digest(root: Path) -> str:
    """SHA-256 over every .proto file under ``root`` in path order, each as
    its relative path, a NUL, its bytes and a NUL: the daemon's rule."""
    files = sorted(p for p in root.rglob("*.proto") if p.is_file())
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(b"\0")
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()


def generate(out: Path) -> list[Path]:
    """Generates the stubs into ``out`` (the ``ctxbroker_client/v1`` folder)
    and returns the files written."""
    from grpc_tools import protoc  # a build requirement

    root = proto_dir()
    work = out / "_protoc"
    work.mkdir(parents=True, exist_ok=True)
    well_known = Path(protoc.__file__).resolve().parent / "_proto"
    status = protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{root}",
            f"-I{well_known}",
            f"--python_out={work}",
            f"--pyi_out={work}",
            f"--grpc_python_out={work}",
            str(root / CONTRACT_FILE),
        ]
    )
    if status != 0:
        raise SystemExit(f"ctxbroker-client: protoc failed on {root / CONTRACT_FILE}")

    produced = work / "ctxbroker" / "v1"
    written = []
    for name in ("broker_pb2.py", "broker_pb2.pyi", "broker_pb2_grpc.py"):
        text = (produced / name).read_text()
        # protoc writes absolute imports of the proto package
        # (`from ctxbroker.v1 import broker_pb2`); inside this package the
        # module sits beside its importer.
        text = re.sub(
            r"^from ctxbroker\.v1 import broker_pb2 as",
            "from . import broker_pb2 as",
            text,
            flags=re.MULTILINE,
        )
        target = out / name
        target.write_text(text)
        written.append(target)
    for leftover in sorted(work.rglob("*"), reverse=True):
        if leftover.is_dir():
            leftover.rmdir()
        else:
            leftover.unlink()
    work.rmdir()

    init = out / "__init__.py"
    init.write_text(
        '"""Generated from proto/ctxbroker/v1/broker.proto when the package was built."""\n'
    )
    contract = out / "_contract.py"
    contract.write_text(
        '"""The contract these stubs were generated from."""\n\n'
        "#: SHA-256 of the .proto files, as the daemon's GetServerInfo reports it.\n"
        f'CONTRACT_DIGEST = "{contract_digest(root)}"\n'
    )
    return [*written, init, contract]


class BuildWithStubs(build_py):
    """``build_py`` that also generates ``ctxbroker_client.v1``."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            # Editable installs import from src/; generate there (ignored).
            out = HERE / "src" / PACKAGE / GENERATED
        else:
            out = Path(self.build_lib) / PACKAGE / GENERATED
        out.mkdir(parents=True, exist_ok=True)
        self._generated = [str(p) for p in generate(out)]

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return [*super().get_outputs(include_bytecode), *getattr(self, "_generated", [])]


setup(cmdclass={"build_py": BuildWithStubs})
