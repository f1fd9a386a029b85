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
:class:`AsyncMarkerWatch` does the same for asyncio.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, cast

import grpc
import grpc.aio

from .errors import BrokerError, Unavailable, from_rpc_error
from .v1 import broker_pb2 as pb

if TYPE_CHECKING:
    from .aio import AsyncBroker
    from .client import Broker

#: Called before each reconnection with the sequence to resume from and the
#: error that ended the stream (None when it just ended).
OnReconnect = Callable[[int | None, BrokerError | None], None]


class MarkerSequenceError(RuntimeError):
    """The daemon sent a marker out of sequence (a gap or a repeat)."""


def _retryable(err: BrokerError) -> bool:
    # UNAVAILABLE: daemon down, restarting, or ending streams at shutdown.
    # CANCELLED not asked for by this client: the connection was torn down.
    return isinstance(err, Unavailable) or err.code == grpc.StatusCode.CANCELLED


class _Position:
    """Where a watch stands, and the checks on what the daemon sends: the
    part the sync and asyncio watchers share."""

    def __init__(
        self,
        *,
        metadata: Sequence[tuple[str, str]],
        from_seq: int,
        start: pb.WatchStart.ValueType,
        session_ids: Sequence[str],
        max_backoff: float,
        give_up_after: float | None,
        on_reconnect: OnReconnect | None,
    ) -> None:
        self._start = start
        self._session_ids = list(session_ids)
        self._max_backoff = max_backoff
        self._give_up_after = give_up_after
        self._on_reconnect = on_reconnect
        self._authenticated = any(key == "authorization" for key, _ in metadata)
        #: The first sequence not yet delivered; None until known (before
        #: the first event of an OLDEST or NOW watch).
        self.next_seq: int | None = (
            max(from_seq, 1)
            if start in (pb.WATCH_START_FROM_SEQ, pb.WATCH_START_UNSPECIFIED)
            else None
        )
        #: The last marker's sequence, 0 before the first.
        self.last_seq = 0
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
        return bool(self._session_ids) or self._authenticated

    @property
    def session_id(self) -> str | None:
        """The one session watched, whose header the watch sends."""
        return self._session_ids[0] if len(self._session_ids) == 1 else None

    def _request(self) -> pb.WatchCompactionsRequest:
        request = pb.WatchCompactionsRequest(session_ids=self._session_ids)
        if self.next_seq is not None:
            request.start = pb.WATCH_START_FROM_SEQ
            request.from_seq = self.next_seq
        else:
            request.start = self._start
        return request

    def _drop(self) -> None:
        raise NotImplementedError

    def _caught_up_now(self) -> None:
        raise NotImplementedError

    def _ended(self, err: BrokerError | None, failing_since: float) -> None:
        """After a disconnection: raises when it is time to give up, else
        tells ``on_reconnect``."""
        if self._give_up_after is not None and time.monotonic() - failing_since > (
            self._give_up_after
        ):
            raise err or Unavailable(grpc.StatusCode.UNAVAILABLE, "watch stream kept ending")
        if self._on_reconnect is not None:
            self._on_reconnect(self.next_seq, err)

    def _failed(self, raw: grpc.RpcError) -> BrokerError:
        """The error that ended the stream, when retrying may help; raises
        it otherwise."""
        err = from_rpc_error(raw)
        if not _retryable(err):
            self._drop()
            raise err from None
        hint = err.resume_from_seq if isinstance(err, Unavailable) else None
        if hint is not None:
            self.resume_hints.append(hint)
        return err

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
            self._caught_up_now()
        return None


class MarkerWatch(_Position, Iterator[pb.CompactionMarker]):
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
        start: pb.WatchStart.ValueType = pb.WATCH_START_FROM_SEQ,
        session_ids: Sequence[str] = (),
        max_backoff: float = 2.0,
        give_up_after: float | None = None,
        on_reconnect: OnReconnect | None = None,
    ) -> None:
        super().__init__(
            metadata=broker.metadata,
            from_seq=from_seq,
            start=start,
            session_ids=session_ids,
            max_backoff=max_backoff,
            give_up_after=give_up_after,
            on_reconnect=on_reconnect,
        )
        self._broker = broker
        #: The open stream (a grpc call is also the iterator of its replies).
        self._call: Any = None
        self._lock = threading.Lock()
        self._closed = threading.Event()
        #: Set once the first replay from the log is done.
        self.caught_up = threading.Event()

    def _caught_up_now(self) -> None:
        self.caught_up.set()

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

    def _open(self) -> None:
        # Not wait_for_ready: while the daemon is unreachable the call fails
        # at once and the backoff (and give_up_after) here governs.
        call = self._broker.stub.WatchCompactions(
            self._request(), metadata=self._broker.session_metadata(self.session_id)
        )
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
            err: BrokerError | None
            try:
                event = next(self._call)
            except StopIteration:
                # The daemon ended the stream without a status: resume.
                err = None
            except grpc.RpcError as raw:
                if self._closed.is_set():
                    self._drop()
                    raise StopIteration from None
                err = self._failed(raw)
            else:
                marker = self._accept(event)
                if marker is not None:
                    return marker
                continue

            # Disconnected: back off, then resume from next_seq.
            self._drop()
            failing_since = failing_since or time.monotonic()
            self._ended(err, failing_since)
            if self._closed.wait(backoff * random.uniform(0.8, 1.2)):
                raise StopIteration
            backoff = min(backoff * 2, self._max_backoff)
            self.reconnects += 1


class AsyncMarkerWatch(_Position, AsyncIterator[pb.CompactionMarker]):
    """:class:`MarkerWatch` for asyncio: ``async for marker in watch``,
    with the same arguments, resumption, checks and attributes
    (:attr:`caught_up` is an :class:`asyncio.Event`). :meth:`close` ends
    the iteration; call it from the watch's event loop."""

    def __init__(
        self,
        broker: AsyncBroker,
        *,
        from_seq: int = 1,
        start: pb.WatchStart.ValueType = pb.WATCH_START_FROM_SEQ,
        session_ids: Sequence[str] = (),
        max_backoff: float = 2.0,
        give_up_after: float | None = None,
        on_reconnect: OnReconnect | None = None,
    ) -> None:
        super().__init__(
            metadata=broker.metadata,
            from_seq=from_seq,
            start=start,
            session_ids=session_ids,
            max_backoff=max_backoff,
            give_up_after=give_up_after,
            on_reconnect=on_reconnect,
        )
        self._broker = broker
        self._call: grpc.aio.UnaryStreamCall[Any, Any] | None = None
        self._closed = asyncio.Event()
        #: Set once the first replay from the log is done.
        self.caught_up = asyncio.Event()

    def _caught_up_now(self) -> None:
        self.caught_up.set()

    def close(self) -> None:
        """Ends the iteration."""
        self._closed.set()
        self._drop()

    async def __aenter__(self) -> AsyncMarkerWatch:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def __aiter__(self) -> AsyncMarkerWatch:
        return self

    def _drop(self) -> None:
        call, self._call = self._call, None
        if call is not None:
            call.cancel()

    async def __anext__(self) -> pb.CompactionMarker:
        backoff = 0.05
        failing_since: float | None = None
        while True:
            if self._closed.is_set():
                self._drop()
                raise StopAsyncIteration
            if self._call is None:
                self._call = self._broker.watch_call(self._request(), self.session_id)
            err: BrokerError | None
            try:
                event = await self._call.read()
            except asyncio.CancelledError:
                # The call was cancelled by close(); any other cancellation
                # (of the task awaiting here) goes on up.
                if self._closed.is_set():
                    self._drop()
                    raise StopAsyncIteration from None
                raise
            except grpc.RpcError as raw:
                if self._closed.is_set():
                    self._drop()
                    raise StopAsyncIteration from None
                err = self._failed(raw)
            else:
                if event is grpc.aio.EOF:
                    # The daemon ended the stream without a status: resume.
                    err = None
                else:
                    marker = self._accept(cast(pb.WatchCompactionsResponse, event))
                    if marker is not None:
                        return marker
                    continue

            self._drop()
            failing_since = failing_since or time.monotonic()
            self._ended(err, failing_since)
            try:
                await asyncio.wait_for(self._closed.wait(), backoff * random.uniform(0.8, 1.2))
            except asyncio.TimeoutError:
                pass
            else:
                raise StopAsyncIteration
            backoff = min(backoff * 2, self._max_backoff)
            self.reconnects += 1


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
