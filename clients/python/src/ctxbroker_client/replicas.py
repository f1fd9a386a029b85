"""Several replicas behind a session-affine proxy (deploy/haproxy,
deploy/envoy): a client for one named replica, and the compaction markers
of every replica merged into one stream.

Each replica has its own marker log, with its own sequence numbers, so a
merged watch keeps one cursor per replica: the sequence to resume that
replica's log from. :class:`ReplicaWatch` runs one :class:`MarkerWatch` per
replica (each reconnecting on its own, so a replica that is down delays
only its own markers) and hands their markers over as they arrive, each
with the replica it came from. :meth:`ReplicaWatch.cursors` says where to
resume every log after the markers handed over so far::

    brokers = {name: replica_broker("proxy:50051", name) for name in ("r0", "r1", "r2")}
    with ReplicaWatch(brokers, cursors=saved) as watch:
        for item in watch:
            handle(item.replica, item.marker)
            saved = watch.cursors()
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from .client import Broker
from .v1 import broker_pb2 as pb
from .watch import MarkerWatch

#: The header that names the replica a call is for.
REPLICA_HEADER = "x-ctxbroker-replica"


def replica_broker(
    target: str | grpc.Channel,
    replica: str,
    *,
    metadata: Sequence[tuple[str, str]] = (),
    **kwargs: Any,
) -> Broker:
    """A :class:`Broker` whose every call carries ``x-ctxbroker-replica:
    replica``: ListSessions, a watch of all sessions, and the export and
    delete of a move, through the proxy, on that replica."""
    return Broker(target, metadata=[*metadata, (REPLICA_HEADER, replica)], **kwargs)


@dataclass(frozen=True)
class ReplicaMarker:
    """A marker and the replica whose log it comes from."""

    replica: str
    marker: pb.CompactionMarker


class ReplicaWatch(Iterator[ReplicaMarker]):
    """The markers of every session on every replica of ``brokers`` (name
    -> client of that replica), merged in the order they arrive. Each
    replica's log is read from ``cursors[name]`` (1, its first marker, when
    absent). Iteration ends when :meth:`close` is called; an error that a
    replica's watch cannot retry past ends it with that error, after
    closing the others."""

    def __init__(
        self,
        brokers: Mapping[str, Broker],
        *,
        cursors: Mapping[str, int] | None = None,
        max_backoff: float = 2.0,
        give_up_after: float | None = None,
    ) -> None:
        if not brokers:
            raise ValueError("ReplicaWatch: at least one replica is needed")
        start = dict(cursors or {})
        unknown = set(start) - set(brokers)
        if unknown:
            raise ValueError(f"ReplicaWatch: cursors for unknown replicas {sorted(unknown)}")
        self._next = {name: max(1, start.get(name, 1)) for name in brokers}
        self._arrived: queue.Queue[tuple[str, pb.CompactionMarker | BaseException | None]] = (
            queue.Queue()
        )
        self._watches = {
            name: MarkerWatch(
                broker,
                from_seq=self._next[name],
                max_backoff=max_backoff,
                give_up_after=give_up_after,
            )
            for name, broker in brokers.items()
        }
        self._running = len(self._watches)
        for name, watch in self._watches.items():
            threading.Thread(
                target=self._pump, args=(name, watch), name=f"ctxbroker-watch-{name}", daemon=True
            ).start()

    def _pump(self, name: str, watch: MarkerWatch) -> None:
        try:
            for marker in watch:
                self._arrived.put((name, marker))
        except BaseException as err:  # handed to the iterating thread
            self._arrived.put((name, err))
            return
        self._arrived.put((name, None))

    def cursors(self) -> dict[str, int]:
        """Per replica, the sequence to resume from: one past the last
        marker handed over from its log."""
        return dict(self._next)

    def get(self, timeout: float | None = None) -> ReplicaMarker | None:
        """The next marker, waiting at most ``timeout`` seconds (None:
        until one arrives); None when none came in time. Raises
        StopIteration once closed and drained."""
        while True:
            if self._running == 0:
                raise StopIteration
            try:
                name, item = self._arrived.get(timeout=timeout)
            except queue.Empty:
                return None
            if item is None:
                self._running -= 1
                continue
            if isinstance(item, BaseException):
                self.close()
                raise item
            self._next[name] = item.seq + 1
            return ReplicaMarker(name, item)

    def __iter__(self) -> ReplicaWatch:
        return self

    def __next__(self) -> ReplicaMarker:
        item = self.get()
        if item is None:  # no timeout was given, so this is not reached
            raise StopIteration
        return item

    def close(self) -> None:
        """Ends every replica's watch; safe from any thread."""
        for watch in self._watches.values():
            watch.close()

    def __enter__(self) -> ReplicaWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
