"""Generates the committed stubs of ``ctxbroker_client.v1`` from ``proto/``.

The stubs are checked in, so installing the client needs neither protoc nor
a compiler, and they are generated with the oldest generator whose output
every supported runtime accepts: grpcio-tools 1.60.0, whose protoc writes
protobuf 4.25 gencode (no runtime version check, so protobuf 4.25 through
7.x import it) and gRPC stubs without a minimum-grpcio check, plus
mypy-protobuf for the typed ``.pyi`` of messages and service stubs. The
pinned generator lives in ``requirements-gen.txt``.

    python tools/generate.py           # regenerate in place
    python tools/generate.py --check   # exit 1 if the committed files differ

Besides the stubs it writes ``_contract.py`` (the contract's SHA-256
digest, computed as the daemon computes the ``contract_digest`` it reports
in ``GetServerInfo``) and a copy of the ``.proto`` files under
``ctxbroker_client/proto/``, shipped in the wheel and the sdist.
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
PACKAGE = HERE / "src" / "ctxbroker_client"
CONTRACT_FILE = "ctxbroker/v1/broker.proto"
#: The generator whose output the committed files are.
GRPCIO_TOOLS = "1.60.0"
MYPY_PROTOBUF = "3.6.0"


def proto_root() -> Path:
    configured = os.environ.get("CTXBROKER_PROTO_DIR")
    root = Path(configured) if configured else HERE.parent.parent / "proto"
    if not (root / CONTRACT_FILE).is_file():
        raise SystemExit(f"generate: no {CONTRACT_FILE} under {root} (set CTXBROKER_PROTO_DIR)")
    return root


def contract_digest(root: Path) -> str:
    """SHA-256 over every .proto under ``root`` in path order, each as its
    relative path, a NUL, its bytes and a NUL: the daemon's rule."""
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*.proto") if p.is_file()):
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(b"\0")
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()


def check_generator() -> None:
    from importlib.metadata import version

    found = {"grpcio-tools": version("grpcio-tools"), "mypy-protobuf": version("mypy-protobuf")}
    wanted = {"grpcio-tools": GRPCIO_TOOLS, "mypy-protobuf": MYPY_PROTOBUF}
    if found != wanted:
        raise SystemExit(
            f"generate: the stubs are made with {wanted}, this environment has {found}: "
            "pip install -r requirements-gen.txt"
        )


def localize(text: str) -> str:
    """protoc names the generated module by the proto's package
    (``ctxbroker.v1.broker_pb2``); inside this package it sits beside its
    importers."""
    text = re.sub(
        r"^from ctxbroker\.v1 import broker_pb2 as", "from . import broker_pb2 as", text, flags=re.M
    )
    text = re.sub(
        r"^import ctxbroker\.v1\.broker_pb2$", "from . import broker_pb2", text, flags=re.M
    )
    return text.replace("ctxbroker.v1.broker_pb2.", "broker_pb2.")


def render(root: Path) -> dict[str, str]:
    """Every generated file, by its path relative to the package."""
    from grpc_tools import protoc

    plugin = shutil.which("protoc-gen-mypy")
    plugin_grpc = shutil.which("protoc-gen-mypy_grpc")
    if plugin is None or plugin_grpc is None:
        raise SystemExit(
            "generate: protoc-gen-mypy not on PATH (pip install -r requirements-gen.txt)"
        )
    well_known = Path(protoc.__file__).resolve().parent / "_proto"
    files: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as work:
        status = protoc.main(
            [
                "grpc_tools.protoc",
                f"-I{root}",
                f"-I{well_known}",
                f"--plugin=protoc-gen-mypy={plugin}",
                f"--plugin=protoc-gen-mypy_grpc={plugin_grpc}",
                f"--python_out={work}",
                f"--grpc_python_out={work}",
                f"--mypy_out={work}",
                f"--mypy_grpc_out={work}",
                str(root / CONTRACT_FILE),
            ]
        )
        if status != 0:
            raise SystemExit(f"generate: protoc failed on {root / CONTRACT_FILE}")
        produced = Path(work) / "ctxbroker" / "v1"
        for name in (
            "broker_pb2.py",
            "broker_pb2.pyi",
            "broker_pb2_grpc.py",
            "broker_pb2_grpc.pyi",
        ):
            files[f"v1/{name}"] = localize((produced / name).read_text())
    files["v1/__init__.py"] = (
        '"""Generated from proto/ctxbroker/v1/broker.proto by tools/generate.py."""\n'
    )
    files["v1/_contract.py"] = (
        '"""The contract these stubs were generated from."""\n\n'
        "#: SHA-256 of the .proto files, as the daemon's GetServerInfo reports it.\n"
        f'CONTRACT_DIGEST = "{contract_digest(root)}"\n'
    )
    for path in sorted(p for p in root.rglob("*.proto") if p.is_file()):
        files[f"proto/{path.relative_to(root).as_posix()}"] = path.read_text()
    return files


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    args = parser.parse_args()
    check_generator()
    files = render(proto_root())
    stale = []
    for rel, text in files.items():
        target = PACKAGE / rel
        current = target.read_text() if target.is_file() else None
        if current == text:
            continue
        stale.append(rel)
        if args.check:
            diff = difflib.unified_diff(
                (current or "").splitlines(True), text.splitlines(True), f"a/{rel}", f"b/{rel}", n=1
            )
            sys.stdout.writelines(list(diff)[:40])
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
    # Files generated before that the contract no longer makes.
    for folder in ("v1", "proto"):
        for path in sorted((PACKAGE / folder).rglob("*")):
            rel = path.relative_to(PACKAGE).as_posix()
            if path.is_file() and "__pycache__" not in rel and rel not in files:
                stale.append(rel)
                if not args.check:
                    path.unlink()
    if args.check and stale:
        print(f"generate: stale generated files: {', '.join(stale)}; run tools/generate.py")
        return 1
    if args.check:
        print(f"generate: {len(files)} generated files up to date")
    else:
        print("generate: wrote " + (", ".join(stale) or "nothing (all up to date)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
