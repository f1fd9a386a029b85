"""The installed stubs were generated from this checkout's proto/, and the
daemon under test serves the same contract. Either fails as soon as one of
the three drifts (a .proto edited without reinstalling the client, or a
daemon built before the edit)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from conftest import REPO

from ctxbroker_client import CONTRACT_DIGEST, Broker, pb


def digest_of(root: Path) -> str:
    """The daemon's rule (build.rs): SHA-256 over every .proto under root
    in path order, each as relative path, NUL, bytes, NUL."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.proto")):
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(b"\0")
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()


def test_stubs_match_the_checkout_proto() -> None:
    assert CONTRACT_DIGEST == digest_of(REPO / "proto"), (
        "the installed client was generated from another proto/: reinstall it "
        "(pip install clients/python)"
    )


def test_the_daemon_serves_the_contract_of_the_stubs(broker: Broker) -> None:
    info = broker.server_info()
    assert info.contract_digest == CONTRACT_DIGEST
    assert broker.contract_matches()


def test_every_rpc_of_the_proto_is_in_the_stub() -> None:
    text = (REPO / "proto" / "ctxbroker" / "v1" / "broker.proto").read_text()
    declared = {
        line.split("rpc ", 1)[1].split("(", 1)[0].strip()
        for line in text.splitlines()
        if line.strip().startswith("rpc ")
    }
    generated = set(pb.DESCRIPTOR.services_by_name["ContextBroker"].methods_by_name)
    assert declared and declared == generated
