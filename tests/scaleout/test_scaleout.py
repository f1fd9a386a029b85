"""Sharding, run for real: three brokers behind HAProxy, 300 sessions made
and admitted through it by the Python client (which sets
``x-ctxbroker-session`` itself); one broker killed and brought back; a
fourth added and the sessions whose owner changed moved to it.

Run by ``.ci/scaleout.sh`` (which installs HAProxy when absent); the
figures it prints are the issue's record of the run.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections import Counter

import grpc
import pytest
from ctxbroker_client import (
    Broker,
    BrokerError,
    ReplicaWatch,
    Retry,
    pb,
    replica_broker,
    tool,
    user,
)

from cluster import REPO, Cluster

MOVE_SESSION = REPO / "deploy" / "scripts" / "move-session.sh"

SESSIONS = 300
CONSTRAINT = "Never write to the `prod` namespace; stage only."


def owners(cluster: Cluster) -> dict[str, str]:
    """Session id -> the replica whose ListSessions holds it; fails if a
    session is held by two."""
    held: dict[str, str] = {}
    for replica in cluster.replicas:
        with Broker(replica.address) as direct:
            for session in direct.list_sessions(page_size=500):
                assert session.session_id not in held, (
                    f"{session.session_id} on {held[session.session_id]} and {replica.name}"
                )
                held[session.session_id] = replica.name
    return held


def long_output(sid: str, k: int) -> str:
    """About 450 tokens of tool output: twelve of them overflow a
    4,000-token window."""
    lines = [
        f"{sid} step {k}.{n}: GET /api/v1/items/{k * 100 + n} 200 OK in {n + 3} ms, "
        f"cache {'hit' if n % 3 else 'miss'}, shard s{n % 4}"
        for n in range(18)
    ]
    return "\n".join(lines)


STARTED = time.monotonic()


def report(label: str, value: object) -> None:
    print(f"scaleout: [{time.monotonic() - STARTED:6.1f} s] {label}: {value}", flush=True)


@pytest.fixture(scope="module")
def cluster():
    with Cluster(3) as running:
        yield running


def test_sessions_are_sharded_survive_a_lost_broker_and_move_on_rebalance(cluster: Cluster) -> None:
    ids = [f"agent-{n:04d}" for n in range(SESSIONS)]
    acknowledged: Counter[str] = Counter()
    # No retries: an UNAVAILABLE must show as such, not be retried away.
    with Broker(cluster.proxy.address, admit_retry=Retry(attempts=1), timeout=10) as proxy:
        started = time.monotonic()
        for sid in ids:
            proxy.create_session(sid, window_tokens=4000)
            proxy.admit(sid, [user(CONSTRAINT)])
            acknowledged[sid] += 1
            proxy.admit(sid, [tool(f"{sid}: kubectl apply -f deploy/{sid}.yaml: configured")])
            acknowledged[sid] += 1
        # A tenth of them compact, so that their marker counts travel too.
        replied: set[tuple[str, int]] = set()  # (session, marker seq on its broker)
        for sid in ids[::10]:
            for k in range(12):
                reply = proxy.admit(sid, [tool(long_output(sid, k))])
                acknowledged[sid] += 1
                if reply.compaction is not None:
                    replied.add((sid, reply.compaction.seq))
        compacted = [sid for sid in ids if proxy.get_session(sid).compactions > 0]
        report(
            "sessions created and admitted through the proxy",
            f"{SESSIONS} in {time.monotonic() - started:.1f} s, {len(compacted)} compacted",
        )
        assert len(compacted) >= SESSIONS // 10

        # Every session is on exactly one broker, and the proxy reaches it.
        held = owners(cluster)
        assert sorted(held) == ids
        per_broker = Counter(held.values())
        report("sessions per broker", dict(sorted(per_broker.items())))
        assert all(per_broker[r.name] > 0 for r in cluster.replicas), per_broker

        # A call about a session without the header is refused by the
        # proxy, naming it; one naming an unknown replica too.
        with pytest.raises(grpc.RpcError) as refused:
            proxy.stub.GetSession(pb.GetSessionRequest(session_id=ids[0]), timeout=10)
        report("a call without a header", f"{refused.value.code().name}: {refused.value.details()}")
        assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert "x-ctxbroker-session" in (refused.value.details() or "")
        with replica_broker(cluster.proxy.address, "r9") as unknown_replica:
            with pytest.raises(BrokerError) as unknown:
                list(unknown_replica.list_sessions())
        assert unknown.value.code == grpc.StatusCode.NOT_FOUND
        # A replica by name, through the proxy: the same sessions as direct.
        with replica_broker(cluster.proxy.address, "r2") as named:
            through_proxy = sorted(s.session_id for s in named.list_sessions(page_size=500))
        assert through_proxy == sorted(sid for sid, owner in held.items() if owner == "r2")

        # kill -9 one broker: only its sessions fail, with UNAVAILABLE.
        lost = cluster.replicas[1]
        lost.kill()
        errors: Counter[str] = Counter()
        codes: Counter[str] = Counter()
        for sid in ids:
            try:
                proxy.admit(sid, [tool(f"{sid}: during the outage")])
                acknowledged[sid] += 1
            except BrokerError as err:
                errors[held[sid]] += 1
                codes[err.code.name] += 1
        report("errors during the kill, by owner", dict(errors))
        report("their codes", dict(codes))
        assert set(errors) == {lost.name}, errors
        assert errors[lost.name] == per_broker[lost.name]
        assert set(codes) == {"UNAVAILABLE"}, codes

        # Back on the same port and data: its sessions answer again, and
        # every acknowledged turn is there.
        started = time.monotonic()
        lost.start()
        report("killed broker serving again after", f"{time.monotonic() - started:.2f} s")
        for sid in ids:
            proxy.admit(sid, [tool(f"{sid}: after the outage")])
            acknowledged[sid] += 1
        missing = {
            sid: (acknowledged[sid], turns)
            for sid in ids
            if (turns := proxy.get_session(sid).turns) != acknowledged[sid]
        }
        report("acknowledged admissions lost", sum(a - t for a, t in missing.values()))
        assert not missing, missing

        # A fourth broker joins the ring: the ids it now owns answer
        # NOT_FOUND through the proxy until moved; no other id changes hands.
        before = {sid: proxy.get_context(sid) for sid in ids}
        records = {sid: proxy.get_session(sid) for sid in ids}
        added = cluster.add()
        to_move = []
        for sid in ids:
            try:
                proxy.get_session(sid)
            except BrokerError as err:
                assert err.code == grpc.StatusCode.NOT_FOUND, err
                to_move.append(sid)
        expected = SESSIONS / len(cluster.replicas)
        report(
            "sessions to move on rebalance", f"{len(to_move)} (a quarter would be {expected:.0f})"
        )
        assert 0.5 * expected <= len(to_move) <= 1.6 * expected, len(to_move)
        # Moved with deploy/scripts/move-session.sh, through the proxy: the
        # export, checks and delete name the old replica, the import goes
        # where the ring now sends the id.
        started = time.monotonic()
        for sid in to_move:
            subprocess.run(
                ["bash", str(MOVE_SESSION), sid, cluster.proxy.address, cluster.proxy.address],
                env={**os.environ, "FROM_REPLICA": held[sid]},
                check=True,
                capture_output=True,
                timeout=60,
            )
        report(
            "moved with move-session.sh", f"{len(to_move)} in {time.monotonic() - started:.1f} s"
        )

        # Every session once, where the ring sends it, exactly as before.
        after = owners(cluster)
        assert sorted(after) == ids
        moved = [sid for sid in ids if after[sid] != held[sid]]
        assert sorted(moved) == sorted(to_move)
        assert all(after[sid] == added.name for sid in moved)
        for sid in ids:
            assert proxy.get_context(sid) == before[sid], sid
            record = proxy.get_session(sid)
            assert (record.turns, record.revision, record.compactions) == (
                records[sid].turns,
                records[sid].revision,
                records[sid].compactions,
            ), sid
        report(
            "sessions per broker after the rebalance", dict(sorted(Counter(after.values()).items()))
        )

        # The moved sessions keep taking turns on their new broker, their
        # markers numbered on from the count they brought.
        moved_compacted = [sid for sid in moved if sid in compacted]
        report("compacted sessions among those moved", len(moved_compacted))
        for sid in moved_compacted:
            marker = None
            for k in range(12, 40):
                reply = proxy.admit(sid, [tool(long_output(sid, k))])
                if reply.compaction is not None:
                    marker = reply.compaction
                    break
            assert marker is not None, sid
            assert marker.session_seq == records[sid].compactions + 1, (sid, marker.session_seq)
            replied.add((sid, marker.seq))

        # Every replica's markers, merged through the proxy, each log from
        # its own cursor: read part, stop, resume from the cursors, read
        # the rest. Each log comes whole, in order, once; every marker an
        # admission returned is among them, from the broker of its session.
        brokers = {r.name: replica_broker(cluster.proxy.address, r.name) for r in cluster.replicas}
        seen: list[tuple[str, int, str]] = []
        with ReplicaWatch(brokers) as watch:
            while len(seen) < len(replied) // 2:
                item = watch.get(timeout=30)
                assert item is not None, "markers stopped arriving"
                seen.append((item.replica, item.marker.seq, item.marker.session_id))
            cursors = watch.cursors()
        report("merged watch: markers before the stop, cursors", f"{len(seen)}, {cursors}")
        with ReplicaWatch(brokers, cursors=cursors) as watch:
            while True:
                item = watch.get(timeout=3)
                if item is None:
                    break
                seen.append((item.replica, item.marker.seq, item.marker.session_id))
        for broker in brokers.values():
            broker.close()
        by_replica: dict[str, list[int]] = {}
        for replica, seq, _ in seen:
            by_replica.setdefault(replica, []).append(seq)
        for replica, seqs in by_replica.items():
            assert seqs == list(range(1, len(seqs) + 1)), (replica, seqs)
        # A seq is one replica's: a moved session has markers in two logs.
        watched = {(replica, seq): sid for replica, seq, sid in seen}
        assert len(watched) == len(seen), "a marker came twice"
        missing_markers = [
            (sid, seq)
            for sid, seq in replied
            if sid not in (watched.get((held[sid], seq)), watched.get((after[sid], seq)))
        ]
        assert not missing_markers, missing_markers
        report(
            "merged watch: markers per replica",
            {name: len(seqs) for name, seqs in sorted(by_replica.items())},
        )
