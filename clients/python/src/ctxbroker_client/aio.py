"""The client for asyncio: :class:`AsyncBroker` has the methods of
:class:`~ctxbroker_client.Broker`, with the same arguments, results and
exceptions, as coroutines (paged listings as async iterators, the marker
watch as an :class:`~ctxbroker_client.watch.AsyncMarkerWatch`), over a
``grpc.aio`` channel.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Any, TypeVar, cast

import grpc
import grpc.aio
from grpc_health.v1 import health_pb2

from .client import (
    CHANNEL_OPTIONS,
    DEFAULT_RETRY,
    Admission,
    Context,
    Metadata,
    Retry,
    Tls,
    admit_request,
    bearer_metadata,
    commit_request,
    create_session_request,
    pin_request,
    plan_request,
    reset_request,
    retract_request,
    retryable_admit_error,
    span_filter,
    update_session_request,
    with_session,
)
from .errors import BrokerError, from_rpc_error
from .v1 import broker_pb2 as pb
from .v1 import broker_pb2_grpc as pb_grpc
from .v1._contract import CONTRACT_DIGEST
from .watch import AsyncMarkerWatch, OnReconnect

_Req = TypeVar("_Req")
_Resp = TypeVar("_Resp")


def aio_channel(target: str, tls: Tls | None = None) -> grpc.aio.Channel:
    """:func:`~ctxbroker_client.channel` for asyncio: ``host:port``
    plaintext or over ``tls``, or ``unix:/path``, with
    :data:`~ctxbroker_client.CHANNEL_OPTIONS`."""
    if target.startswith("unix:"):
        return grpc.aio.insecure_channel(
            target, options=CHANNEL_OPTIONS + (("grpc.default_authority", "localhost"),)
        )
    if tls is None:
        return grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS)
    return grpc.aio.secure_channel(
        target, tls.credentials(), options=CHANNEL_OPTIONS + tls.options()
    )


def _unary(
    method: grpc.UnaryUnaryMultiCallable[_Req, _Resp],
) -> grpc.aio.UnaryUnaryMultiCallable[_Req, _Resp]:
    # The generated stub serves both kinds of channel; its .pyi types the
    # attributes for the sync one.
    return cast("grpc.aio.UnaryUnaryMultiCallable[_Req, _Resp]", method)


class AsyncBroker:
    """A client of one ctxbroker daemon for asyncio.

    The arguments are :class:`~ctxbroker_client.Broker`'s; ``target`` may
    be a ready :class:`grpc.aio.Channel` (with interceptors, say). Create
    it inside the event loop that uses it, and ``await close()`` (or use
    ``async with``) when done.
    """

    def __init__(
        self,
        target: str | grpc.aio.Channel,
        *,
        timeout: float = 30.0,
        metadata: Sequence[tuple[str, str]] = (),
        wait_for_ready: bool = True,
        tls: Tls | None = None,
        token: str | None = None,
        admit_retry: Retry = DEFAULT_RETRY,
    ) -> None:
        #: The metadata every call sends (the bearer token among them).
        self.metadata = bearer_metadata(metadata, token)
        if isinstance(target, str):
            self.channel: grpc.aio.Channel = aio_channel(target, tls)
            self._owns_channel = True
        else:
            self.channel = target
            self._owns_channel = False
        #: The generated stub, for everything the wrapper does not cover
        #: (its calls are awaitable on this channel).
        self.stub = pb_grpc.ContextBrokerStub(self.channel)
        self._health = self.channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
            response_deserializer=health_pb2.HealthCheckResponse.FromString,
        )
        self.timeout = timeout
        self.wait_for_ready = wait_for_ready
        self.admit_retry = admit_retry

    def __repr__(self) -> str:
        authenticated = any(key == "authorization" for key, _ in self.metadata)
        return f"AsyncBroker(timeout={self.timeout}, token={'set' if authenticated else 'none'})"

    async def close(self) -> None:
        """Closes the channel if this client made it."""
        if self._owns_channel:
            await self.channel.close()

    async def __aenter__(self) -> AsyncBroker:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def session_metadata(self, session_id: str | None) -> Metadata:
        """The metadata of a call about ``session_id``: :attr:`metadata`
        and the ``x-ctxbroker-session`` header (none for None)."""
        return with_session(self.metadata, session_id)

    async def _call(
        self,
        method: grpc.UnaryUnaryMultiCallable[_Req, _Resp],
        request: _Req,
        session_id: str | None = None,
    ) -> _Resp:
        try:
            return await _unary(method)(
                request,
                timeout=self.timeout,
                metadata=self.session_metadata(session_id),
                wait_for_ready=self.wait_for_ready,
            )
        except grpc.RpcError as err:
            raise from_rpc_error(err) from None

    # Server ---------------------------------------------------------------

    async def wait_ready(self, timeout: float = 30.0) -> None:
        """Waits until the daemon reports SERVING on the health check."""
        try:
            reply = await self._health(
                health_pb2.HealthCheckRequest(service=""),
                timeout=timeout,
                wait_for_ready=True,
            )
        except grpc.RpcError as err:
            raise from_rpc_error(err) from None
        if reply.status != health_pb2.HealthCheckResponse.SERVING:
            raise RuntimeError(f"daemon health is {reply.status}, not SERVING")

    async def server_info(self) -> pb.GetServerInfoResponse:
        """Version, commit, contract digest, limits and marker bounds."""
        return await self._call(self.stub.GetServerInfo, pb.GetServerInfoRequest())

    async def contract_matches(self) -> bool:
        """Whether the daemon serves the contract these stubs were built
        from."""
        return (await self.server_info()).contract_digest == CONTRACT_DIGEST

    # Sessions -------------------------------------------------------------

    async def create_session(
        self,
        session_id: str,
        *,
        window_tokens: int,
        config: pb.SessionConfig | None = None,
        **settings: object,
    ) -> pb.Session:
        """Creates a session (see :meth:`Broker.create_session`)."""
        request = create_session_request(session_id, window_tokens, config, settings)
        return (await self._call(self.stub.CreateSession, request, session_id)).session

    async def get_session(self, session_id: str) -> pb.Session:
        """One session with its effective configuration and totals."""
        request = pb.GetSessionRequest(session_id=session_id)
        return (await self._call(self.stub.GetSession, request, session_id)).session

    async def update_session(
        self, session_id: str, *, config: pb.SessionConfig | None = None, **settings: object
    ) -> pb.Session:
        """Changes a session's configuration (see
        :meth:`Broker.update_session`)."""
        request = update_session_request(session_id, config, settings)
        return (await self._call(self.stub.UpdateSession, request, session_id)).session

    async def list_sessions(self, page_size: int = 100) -> AsyncIterator[pb.Session]:
        """Every session, in id order, fetching page by page."""
        request = pb.ListSessionsRequest(page_size=page_size)
        while True:
            reply = await self._call(self.stub.ListSessions, request)
            for session in reply.sessions:
                yield session
            if not reply.next_page_token:
                return
            request.page_token = reply.next_page_token

    async def delete_session(self, session_id: str) -> int:
        """Deletes a session; returns the spans deleted."""
        request = pb.DeleteSessionRequest(session_id=session_id)
        return (await self._call(self.stub.DeleteSession, request, session_id)).spans_deleted

    async def reset_session(
        self, session_id: str, expected_revision: int | None = None
    ) -> pb.ResetSessionResponse:
        """Empties the session, keeping its configuration."""
        request = reset_request(session_id, expected_revision)
        return await self._call(self.stub.ResetSession, request, session_id)

    async def retract_last_turn(
        self, session_id: str, spans: int = 0, expected_revision: int | None = None
    ) -> pb.RetractLastTurnResponse:
        """Takes back the newest ``spans`` live spans (0: the newest turn's)."""
        request = retract_request(session_id, spans, expected_revision)
        return await self._call(self.stub.RetractLastTurn, request, session_id)

    async def export_session(self, session_id: str) -> pb.ExportSessionResponse:
        """A snapshot of the session for :meth:`import_session`."""
        request = pb.ExportSessionRequest(session_id=session_id)
        return await self._call(self.stub.ExportSession, request, session_id)

    async def import_session(self, snapshot: pb.SessionSnapshot) -> pb.ImportSessionResponse:
        """Creates the snapshot's session here."""
        request = pb.ImportSessionRequest(snapshot=snapshot)
        return await self._call(self.stub.ImportSession, request, snapshot.session_id)

    # The agent's turn -----------------------------------------------------

    async def admit(
        self,
        session_id: str,
        spans: Iterable[pb.SpanInput],
        *,
        idempotency_key: str | None = None,
    ) -> Admission:
        """Admits one turn, with idempotency keys, retrying a lost reply as
        :attr:`admit_retry` says (see :meth:`Broker.admit`)."""
        request = admit_request(session_id, spans, idempotency_key)
        delays = self.admit_retry.delays()
        while True:
            try:
                reply = await self._call(self.stub.Admit, request, session_id)
            except BrokerError as err:
                delay = next(delays, None) if retryable_admit_error(err) else None
                if delay is None:
                    raise
                await asyncio.sleep(delay)
                continue
            return Admission.from_pb(reply)

    async def get_context(self, session_id: str) -> Context:
        """The live context in prompt order."""
        request = pb.GetContextRequest(session_id=session_id)
        return Context.from_pb(await self._call(self.stub.GetContext, request, session_id))

    async def get_span(self, session_id: str, span_id: int) -> pb.Span:
        """One span by id, live or archived."""
        request = pb.GetSpanRequest(session_id=session_id, span_id=span_id)
        return (await self._call(self.stub.GetSpan, request, session_id)).span

    async def search_spans(
        self,
        session_id: str,
        query: str,
        *,
        roles: Iterable[pb.Role.ValueType] = (),
        span_classes: Iterable[pb.SpanClass.ValueType] = (),
        from_turn: int | None = None,
        to_turn: int | None = None,
        state: pb.SpanState.ValueType = pb.SPAN_STATE_UNSPECIFIED,
        page_size: int = 10,
    ) -> AsyncIterator[pb.SpanHit]:
        """Spans that hold words of ``query``, best first, page by page
        (see :meth:`Broker.search_spans`)."""
        found = span_filter(
            roles=roles,
            span_classes=span_classes,
            from_turn=from_turn,
            to_turn=to_turn,
            state=state,
        )
        request = pb.SearchSpansRequest(
            session_id=session_id, query=query, filter=found, page_size=page_size
        )
        while True:
            reply = await self._call(self.stub.SearchSpans, request, session_id)
            for hit in reply.hits:
                yield hit
            if not reply.next_page_token:
                return
            request.page_token = reply.next_page_token

    async def list_spans(
        self,
        session_id: str,
        *,
        from_turn: int | None = None,
        to_turn: int | None = None,
        state: pb.SpanState.ValueType = pb.SPAN_STATE_UNSPECIFIED,
        page_size: int = 100,
    ) -> AsyncIterator[pb.SpanHit]:
        """Spans of the session in id order, page by page."""
        found = span_filter(from_turn=from_turn, to_turn=to_turn, state=state)
        request = pb.ListSpansRequest(session_id=session_id, filter=found, page_size=page_size)
        while True:
            reply = await self._call(self.stub.ListSpans, request, session_id)
            for hit in reply.spans:
                yield hit
            if not reply.next_page_token:
                return
            request.page_token = reply.next_page_token

    # Compaction the caller steers -----------------------------------------

    async def plan_compaction(
        self,
        session_id: str,
        *,
        incoming_tokens: int = 0,
        target_tokens: int | None = None,
    ) -> pb.PlanCompactionResponse:
        """A dry run: the plan, its verification and a plan id."""
        request = plan_request(session_id, incoming_tokens, target_tokens)
        return await self._call(self.stub.PlanCompaction, request, session_id)

    async def commit_compaction(
        self,
        session_id: str,
        plan_id: str,
        *,
        actor: str = "",
        summary_text: str | None = None,
        compressed_forms: Sequence[pb.CompressedForm] = (),
    ) -> pb.CommitCompactionResponse:
        """Commits a plan (re-verified; StalePlan when the session moved
        on)."""
        request = commit_request(session_id, plan_id, actor, summary_text, compressed_forms)
        return await self._call(self.stub.CommitCompaction, request, session_id)

    async def pin(
        self, session_id: str, span_id: int, predicate: pb.Predicate | None = None
    ) -> pb.Span:
        """Pins a live span as a constraint."""
        request = pin_request(session_id, span_id, predicate)
        return (await self._call(self.stub.Pin, request, session_id)).span

    async def unpin(
        self, session_id: str, span_id: int, *, reason: str, actor: str = ""
    ) -> pb.UnpinResponse:
        """Releases a constraint (see :meth:`Broker.unpin`)."""
        request = pb.UnpinRequest(
            session_id=session_id, span_id=span_id, actor=actor, reason=reason
        )
        return await self._call(self.stub.Unpin, request, session_id)

    # Markers --------------------------------------------------------------

    def watch(
        self,
        *,
        from_seq: int = 1,
        start: pb.WatchStart.ValueType = pb.WATCH_START_FROM_SEQ,
        session_ids: Sequence[str] = (),
        max_backoff: float = 2.0,
        give_up_after: float | None = None,
        on_reconnect: OnReconnect | None = None,
    ) -> AsyncMarkerWatch:
        """Compaction markers as an async iterator that resumes across
        disconnects (see :meth:`Broker.watch`)."""
        return AsyncMarkerWatch(
            self,
            from_seq=from_seq,
            start=start,
            session_ids=session_ids,
            max_backoff=max_backoff,
            give_up_after=give_up_after,
            on_reconnect=on_reconnect,
        )

    def watch_call(
        self, request: pb.WatchCompactionsRequest, session_id: str | None
    ) -> grpc.aio.UnaryStreamCall[Any, Any]:
        """Opens one WatchCompactions stream (what :meth:`watch` resumes).
        Not wait_for_ready: while the daemon is unreachable the call fails
        at once and the watch's backoff governs."""
        method = cast(
            "grpc.aio.UnaryStreamMultiCallable[pb.WatchCompactionsRequest, Any]",
            self.stub.WatchCompactions,
        )
        return method(request, metadata=self.session_metadata(session_id))
