"""Fixtures: a fresh ``ctxbrokerd`` per test, on a socket bound here, with
its own temporary data directory; a client connected to it."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ctxbroker_client import (
    Broker,
    LocalDaemon,
    MarkerWatch,
    find_binary,
    pb,
    tool,
    user,
    watch_in_thread,
)

REPO = Path(__file__).resolve().parents[3]

#: The README's constraint: 12 tokens, classified by the rules.
CONSTRAINT = "Never write to the `prod` namespace; stage only."


def tool_output(i: int) -> str:
    """83 tokens of tool output (o200k_base), different for every ``i``."""
    return (
        f"kubectl -n staging apply -f k8s/staging/deploy-{i}.yaml: deployment.apps/web-{i} "
        f"configured. error: timed out waiting for rollout of web-{i} after 300s; replicas 2/3 "
        f"ready, image registry.local/web:1.4.{i} pulled in 12s, probe /healthz failing on "
        "port 8080 with status 503 Service Unavailable."
    )


def small_session(broker: Broker, session_id: str) -> None:
    """A 400-token window (budget 340, soft watermark 306) holding the
    constraint. From the fourth tool output on, every admission compacts
    first and leaves 298 live tokens, under the soft watermark, so no
    background compaction interleaves with the markers of admissions."""
    broker.create_session(session_id, window_tokens=400)
    admitted = broker.admit(session_id, [user(CONSTRAINT)])
    assert admitted.spans[0].span_class == 2  # SPAN_CLASS_CONSTRAINT


def admit_tools(broker: Broker, session_id: str, numbers: range) -> list:
    """Admits tool outputs; returns the markers their replies carried."""
    markers = []
    for i in numbers:
        admitted = broker.admit(session_id, [tool(tool_output(i))])
        assert admitted.totals.live_tokens <= admitted.totals.budget_tokens
        if admitted.compaction is not None:
            markers.append(admitted.compaction)
    return markers


class Collector:
    """Collects a watch's markers in a thread; ``until(n)`` waits for seq n."""

    def __init__(self, watch: MarkerWatch) -> None:
        self.watch = watch
        self.markers: list[pb.CompactionMarker] = []
        self._arrived = threading.Condition()
        self.thread, self.failures = watch_in_thread(watch, self._take)

    def _take(self, marker: pb.CompactionMarker) -> None:
        with self._arrived:
            self.markers.append(marker)
            self._arrived.notify_all()

    def until(self, seq: int, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        with self._arrived:
            while not self.markers or self.markers[-1].seq < seq:
                if self.failures:
                    raise self.failures[0]
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(
                        f"saw {[m.seq for m in self.markers]}, not {seq}, in {timeout}s"
                    )
                self._arrived.wait(min(remaining, 0.2))

    def stop(self) -> None:
        self.watch.close()
        self.thread.join(10)
        assert not self.thread.is_alive()
        if self.failures:
            raise self.failures[0]


@pytest.fixture(scope="session")
def binary() -> Path:
    return find_binary(REPO)


@pytest.fixture
def daemon(binary: Path) -> Iterator[LocalDaemon]:
    with LocalDaemon(binary) as running:
        yield running


@pytest.fixture
def broker(daemon: LocalDaemon) -> Iterator[Broker]:
    with Broker(daemon.address, timeout=30.0) as client:
        yield client
