"""A Python watcher and the Node watcher, connected at once from seq 1,
across a daemon restart in the middle of the admissions: both must end with
the same contiguous marker sequence 1..N, equal to what Admit replied."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import threading
import time

import pytest
from conftest import REPO, Collector, admit_tools, small_session

from ctxbroker_client import Broker, LocalDaemon, pb

WATCH_JS = REPO / "clients" / "node" / "watch.js"


class NodeWatcher:
    """``node clients/node/watch.js`` as a subprocess printing JSON lines."""

    def __init__(self, address: str) -> None:
        node = shutil.which("node")
        assert node, "node is needed for the cross-language test"
        assert (WATCH_JS.parent / "node_modules" / "@grpc" / "grpc-js").is_dir(), (
            "run `npm ci` in clients/node first"
        )
        self.process = subprocess.Popen(
            [node, str(WATCH_JS), "--addr", address, "--from-seq", "1", "--max-backoff-ms", "500"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.markers: list[dict] = []
        self.events: list[dict] = []
        self.errors: list[str] = []
        self._changed = threading.Condition()
        threading.Thread(target=self._read_markers, daemon=True).start()
        threading.Thread(target=self._read_events, daemon=True).start()

    def _read_markers(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with self._changed:
                self.markers.append(json.loads(line))
                self._changed.notify_all()

    def _read_events(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            with self._changed:
                try:
                    self.events.append(json.loads(line))
                except ValueError:
                    self.errors.append(line.rstrip())
                self._changed.notify_all()

    def wait(self, done, what: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        with self._changed:
            while not done():
                remaining = deadline - time.monotonic()
                if self.process.poll() is not None:
                    raise AssertionError(
                        f"node watcher exited {self.process.returncode}: {self.errors}"
                    )
                if remaining <= 0:
                    raise AssertionError(
                        f"node watcher: no {what} in {timeout}s; markers "
                        f"{[m['seq'] for m in self.markers]}, events {self.events}, {self.errors}"
                    )
                self._changed.wait(min(remaining, 0.2))

    def until(self, seq: int) -> None:
        self.wait(lambda: bool(self.markers) and self.markers[-1]["seq"] >= seq, f"marker {seq}")

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(10)


def as_row(marker: pb.CompactionMarker) -> dict:
    """The fields both watchers print, in the Node watcher's spelling."""
    return {
        "seq": marker.seq,
        "session_id": marker.session_id,
        "session_seq": marker.session_seq,
        "trigger": pb.CompactionTrigger.Name(marker.trigger),
        "outcome": pb.CompactionOutcome.Name(marker.outcome),
        "tokens_before": marker.tokens_before,
        "tokens_after": marker.tokens_after,
        "incoming_tokens": marker.incoming_tokens,
        "evicted_span_ids": list(marker.evicted_span_ids),
        "summary_span_id": marker.summary_span_id if marker.HasField("summary_span_id") else None,
        "pinned_retained": marker.pinned_retained,
        "pinned_total": marker.pinned_total,
        "actor": marker.actor,
    }


@pytest.mark.parametrize("how", ["kill", "term"])
def test_python_and_node_watchers_see_the_same_markers_across_a_restart(
    daemon: LocalDaemon, broker: Broker, how: str
) -> None:
    small_session(broker, "polyglot")
    python = Collector(broker.watch(from_seq=1, max_backoff=0.5))
    node = NodeWatcher(daemon.address)
    try:
        # Both connected before the first marker exists.
        assert python.watch.caught_up.wait(30)
        node.wait(lambda: any(e.get("event") == "caught_up" for e in node.events), "caught_up")

        replied = admit_tools(broker, "polyglot", range(1, 7))  # markers 1..3
        python.until(3)
        node.until(3)
        daemon.restart(kill=(how == "kill"))
        replied += admit_tools(broker, "polyglot", range(7, 11))  # markers 4..7
        last = broker.server_info().next_marker_seq - 1
        python.until(last)
        node.until(last)
    finally:
        code = node.stop()
        python.stop()
    assert code == 0, node.errors

    assert last == 7
    expected = [as_row(m) for m in replied]
    assert [row["seq"] for row in expected] == list(range(1, last + 1))
    assert [as_row(m) for m in python.markers] == expected
    assert node.markers == expected
    # Both really lost their stream and resumed.
    assert python.watch.reconnects >= 1
    reconnects = [e for e in node.events if e.get("event") == "reconnect"]
    assert reconnects and reconnects[0]["next_seq"] == 4
    if how == "term":
        assert python.watch.resume_hints == [4]
        assert reconnects[0]["resume_from_seq"] == 4
