"""The merged watch of several replicas: each replica's log whole and in
order, once, with the replica it came from; stopped and resumed from its
cursors, nothing is lost or repeated."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import admit_tools, small_session

from ctxbroker_client import (
    REPLICA_HEADER,
    Broker,
    LocalDaemon,
    ReplicaWatch,
    replica_broker,
)


def test_markers_of_two_replicas_merge_and_resume(binary: Path) -> None:
    with LocalDaemon(binary) as first, LocalDaemon(binary) as second:
        addresses = {"r0": first.address, "r1": second.address}
        expected: dict[str, list[int]] = {}
        for name, address in addresses.items():
            with Broker(address) as broker:
                small_session(broker, f"{name}-s")
                markers = admit_tools(broker, f"{name}-s", range(4 + len(name) * 2))
            expected[name] = [m.seq for m in markers]
            assert expected[name], "the session compacted"
        brokers = {name: replica_broker(address, name) for name, address in addresses.items()}
        assert (REPLICA_HEADER, "r1") in brokers["r1"].metadata
        total = sum(len(seqs) for seqs in expected.values())
        seen: list[tuple[str, int, str]] = []
        with ReplicaWatch(brokers) as watch:
            while len(seen) < total // 2:
                item = watch.get(timeout=30)
                assert item is not None
                seen.append((item.replica, item.marker.seq, item.marker.session_id))
            cursors = watch.cursors()
        assert set(cursors) == {"r0", "r1"}
        with ReplicaWatch(brokers, cursors=cursors) as watch:
            while len(seen) < total:
                item = watch.get(timeout=30)
                assert item is not None
                seen.append((item.replica, item.marker.seq, item.marker.session_id))
            assert watch.get(timeout=0.5) is None
        for name, seqs in expected.items():
            assert [seq for replica, seq, _ in seen if replica == name] == seqs
            assert {sid for replica, _, sid in seen if replica == name} == {f"{name}-s"}
        for broker in brokers.values():
            broker.close()


def test_cursors_name_known_replicas(broker: Broker) -> None:
    with pytest.raises(ValueError, match="unknown replicas"):
        ReplicaWatch({"r0": broker}, cursors={"r9": 3})
    with pytest.raises(ValueError, match="at least one"):
        ReplicaWatch({})
