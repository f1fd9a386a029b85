"""Compaction markers as an iterator that survives daemon restarts.

``WatchCompactions`` replays markers from the durable log, sends one
``caught_up`` event when the replay is done, then streams new markers live.
When the daemon shuts down it ends the stream with UNAVAILABLE and a
``resume-from-seq`` trailer; when it is killed the connection just drops.
:class:`MarkerWatch` hides both: it reconnects with backoff and asks for
``last seq + 1``, so the caller sees every marker once, in order. It checks
what the daemon sends: an unfiltered watch must see ``seq`` increase by
exactly one, and a marker that would repeat or skip raises
:class:`MarkerSequenceError` instead of being passed on. A watch filtered
by session, or made with a token (a tenant sees its own sessions' markers
only, so its sequence has gaps), checks only that ``seq`` increases.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import grpc

from .errors import BrokerError, Unavailable, from_rpc_error
from .v1 import broker_pb2 as pb

if TYPE_CHECKING:
    from .client import Broker


class MarkerSequenceError(RuntimeError):
    """The daemon sent a marker out of sequence (a gap or a repeat)."""


def _retryable(err: BrokerError) -> bool:
    # UNAVAILABLE: daemon down, restarting, or ending streams at shutdown.
    # CANCELLED not asked for by this client: the connection was torn down.
    return isinstance(err, Unavailable) or err.code == grpc.StatusCode.CANCELLED


class MarkerWatch(Iterator[pb.CompactionMarker]):
    """Iterates over compaction markers, resuming across disconnects.

    ``start`` is ``WATCH_START_FROM_SEQ`` (from ``from_seq``; 0 and 1 both
    mean the first marker), ``WATCH_START_OLDEST`` or ``WATCH_START_NOW``.
    After the first event the position is known and every reconnection
    asks for ``from_seq = next_seq``. Reconnections back off from 50 ms to
    ``max_backoff`` seconds; ``give_up_after`` bounds how long the daemon
    may stay unreachable (None: forever), after which the last error is
    raised. Errors that retrying cannot fix — ``MarkerOutOfRange`` when the
    markers to resume from are past retention, bad arguments — are raised at
    once. :meth:`close` (from any thread) ends the iteration.
    """

    def __init__(
        self,
        broker: Broker,
        *,
        from_seq: int = 1,
        start: pb.WatchStart = pb.WATCH_START_FROM_SEQ,
        session_ids: Sequence[str] = (),
        max_backoff: float = 2.0,
        give_up_after: float | None = None,
        on_reconnect: Callable[[int | None, BrokerError | None], None] | None = None,
    ) -> None:
        self._broker = broker
        self._start = start
        self._session_ids = list(session_ids)
        self._max_backoff = max_backoff
        self._give_up_after = give_up_after
        self._on_reconnect = on_reconnect
        #: The open stream (a grpc call is also the iterator of its replies).
        self._call: Any = None
        self._lock = threading.Lock()
        self._closed = threading.Event()
        #: The first sequence not yet delivered; None until known (before
        #: the first event of an OLDEST or NOW watch).
        self.next_seq: int | None = (
            max(from_seq, 1)
            if start in (pb.WATCH_START_FROM_SEQ, pb.WATCH_START_UNSPECIFIED)
            else None
        )
        #: The last marker's sequence, 0 before the first.
        self.last_seq = 0
        #: Set once the first replay from the log is done.
        self.caught_up = threading.Event()
        #: How many times the stream was opened again.
        self.reconnects = 0
        #: The ``resume-from-seq`` the daemon named each time it ended the
        #: stream at shutdown (it must agree with :attr:`next_seq`).
        self.resume_hints: list[int] = []

    @property
    def filtered(self) -> bool:
        """True when only some sessions' markers may be delivered (then
        sequences have gaps by design): a session filter, or a token (a
        tenant's watch delivers its own sessions' markers only)."""
        authenticated = any(key == "authorization" for key, _ in self._broker.metadata)
        return bool(self._session_ids) or authenticated

    def close(self) -> None:
        """Ends the iteration; safe from any thread."""
        self._closed.set()
        with self._lock:
            call = self._call
        if call is not None:
            call.cancel()

    def __enter__(self) -> MarkerWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> MarkerWatch:
        return self

    def _request(self) -> pb.WatchCompactionsRequest:
        request = pb.WatchCompactionsRequest(session_ids=self._session_ids)
        if self.next_seq is not None:
            request.start = pb.WATCH_START_FROM_SEQ
            request.from_seq = self.next_seq
        else:
            request.start = self._start
        return request

    def _open(self) -> None:
        # Not wait_for_ready: while the daemon is unreachable the call fails
        # at once and the backoff (and give_up_after) here governs.
        call = self._broker.stub.WatchCompactions(self._request(), metadata=self._broker.metadata)
        with self._lock:
            self._call = call
        if self._closed.is_set():
            call.cancel()

    def _drop(self) -> None:
        with self._lock:
            call, self._call = self._call, None
        if call is not None:
            call.cancel()

    def __next__(self) -> pb.CompactionMarker:
        backoff = 0.05
        failing_since: float | None = None
        while True:
            if self._closed.is_set():
                self._drop()
                raise StopIteration
            if self._call is None:
                self._open()
            try:
                event = next(self._call)
            except StopIteration:
                # The daemon ended the stream without a status: resume.
                err: BrokerError | None = None
            except grpc.RpcError as raw:
                if self._closed.is_set():
                    self._drop()
                    raise StopIteration from None
                err = from_rpc_error(raw)
                if not _retryable(err):
                    self._drop()
                    raise err from None
                hint = err.resume_from_seq if isinstance(err, Unavailable) else None
                if hint is not None:
                    self.resume_hints.append(hint)
            else:
                marker = self._accept(event)
                if marker is not None:
                    return marker
                continue

            # Disconnected: back off, then resume from next_seq.
            self._drop()
            now = time.monotonic()
            failing_since = failing_since or now
            if self._give_up_after is not None and now - failing_since > self._give_up_after:
                raise err or Unavailable(grpc.StatusCode.UNAVAILABLE, "watch stream kept ending")
            if self._on_reconnect is not None:
                self._on_reconnect(self.next_seq, err)
            if self._closed.wait(backoff * random.uniform(0.8, 1.2)):
                raise StopIteration
            backoff = min(backoff * 2, self._max_backoff)
            self.reconnects += 1

    def _accept(self, event: pb.WatchCompactionsResponse) -> pb.CompactionMarker | None:
        kind = event.WhichOneof("event")
        if kind == "marker":
            marker = event.marker
            expected = self.next_seq
            if expected is not None:
                if marker.seq < expected or (marker.seq > expected and not self.filtered):
                    self._drop()
                    raise MarkerSequenceError(
                        f"expected marker {expected}, the daemon sent {marker.seq}"
                    )
            self.next_seq = marker.seq + 1
            self.last_seq = marker.seq
            return marker
        if kind == "caught_up":
            seq = event.caught_up.next_seq
            if self.next_seq is not None and (
                seq < self.next_seq or (seq > self.next_seq and not self.filtered)
            ):
                self._drop()
                raise MarkerSequenceError(
                    f"caught up at {seq}, but the next marker due is {self.next_seq}"
                )
            self.next_seq = seq
            self.caught_up.set()
        return None


def watch_in_thread(
    watch: MarkerWatch, handle: Callable[[pb.CompactionMarker], None]
) -> tuple[threading.Thread, list[BaseException]]:
    """Runs ``handle`` on every marker of ``watch`` in a daemon thread.
    Returns the thread and a list that receives the exception that ended
    it, if any; stop it with ``watch.close()``."""
    failures: list[BaseException] = []

    def run() -> None:
        try:
            for marker in watch:
                handle(marker)
        except BaseException as err:  # handed to the caller, not lost
            failures.append(err)

    thread = threading.Thread(target=run, name="ctxbroker-watch", daemon=True)
    thread.start()
    return thread, failures
