"""A thin typed wrapper over the generated ``ContextBroker`` stub.

It covers the common flow of an agent — create a session, admit every turn
before it enters the prompt, build the prompt from the live context, watch
compaction markers — and leaves everything else to the generated stub
(:attr:`Broker.stub`), which speaks the whole contract. Messages are the
generated ones (``ctxbroker_client.pb``), typed by the generated ``.pyi``;
failures raise the exceptions of :mod:`ctxbroker_client.errors`.

Every call about one session carries its id in the ``x-ctxbroker-session``
header, on which a sharded deployment routes (deploy/envoy/envoy.yaml).
:class:`~ctxbroker_client.aio.AsyncBroker` is the same client for asyncio;
the request building below is shared by both.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import grpc
from grpc_health.v1 import health_pb2

from .errors import BrokerError, DeadlineExceeded, Unavailable, from_rpc_error
from .v1 import broker_pb2 as pb
from .v1 import broker_pb2_grpc as pb_grpc
from .v1._contract import CONTRACT_DIGEST

if TYPE_CHECKING:
    from .watch import MarkerWatch

_Req = TypeVar("_Req")
_Resp = TypeVar("_Resp")

#: The header that names a call's session, for session-affine routing.
SESSION_HEADER = "x-ctxbroker-session"

#: Metadata: (key, value) pairs.
Metadata = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Retry:
    """How :meth:`Broker.admit` retries a turn whose outcome is unknown
    (UNAVAILABLE: the connection dropped or the daemon restarted;
    DEADLINE_EXCEEDED): up to ``attempts`` tries in all, sleeping
    ``initial_backoff`` seconds, then ``multiplier`` times more each time up
    to ``max_backoff``, each with ±20 % jitter. Every try sends the same
    idempotency keys, so the daemon admits the turn at most once; a retry
    of a turn that was admitted comes back with ``replayed`` set.
    ``Retry(attempts=1)`` never retries."""

    attempts: int = 4
    initial_backoff: float = 0.1
    max_backoff: float = 2.0
    multiplier: float = 2.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("Retry: attempts must be at least 1")
        if self.initial_backoff < 0 or self.max_backoff < 0 or self.multiplier < 1:
            raise ValueError("Retry: backoffs must be >= 0 and the multiplier >= 1")

    def delays(self) -> Iterator[float]:
        """The sleeps before the second, third ... tries."""
        backoff = self.initial_backoff
        for _ in range(self.attempts - 1):
            yield min(backoff, self.max_backoff) * random.uniform(0.8, 1.2)
            backoff *= self.multiplier


#: What :meth:`Broker.admit` does by default: four tries over about 0.7 s.
DEFAULT_RETRY = Retry()


def retryable_admit_error(err: BrokerError) -> bool:
    """Whether an admission that failed so may have been lost rather than
    refused: only then is it sent again."""
    return isinstance(err, (Unavailable, DeadlineExceeded))


#: Channel options for a daemon that restarts: reconnect within a second
#: instead of gRPC's default backoff of up to two minutes (the minimum
#: connect timeout, ``grpc.min_reconnect_backoff_ms``, keeps its 20 s), and
#: take large contexts (a GetContext reply can hold a whole window of text).
CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.max_send_message_length", 64 << 20),
)


@dataclass(frozen=True)
class Tls:
    """How to reach a daemon that serves TLS: the PEM files of the CA that
    signed its certificate and, for a daemon that asks for client
    certificates (``--tls-client-ca``), this client's certificate chain and
    key. ``server_name`` checks the daemon's certificate against another
    name than the target's host."""

    ca_file: str
    cert_file: str | None = None
    key_file: str | None = None
    server_name: str | None = None

    def credentials(self) -> grpc.ChannelCredentials:
        """The channel credentials these files make."""

        def read(path: str | None) -> bytes | None:
            if path is None:
                return None
            with open(path, "rb") as f:
                return f.read()

        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("Tls: cert_file and key_file go together")
        return grpc.ssl_channel_credentials(
            root_certificates=read(self.ca_file),
            private_key=read(self.key_file),
            certificate_chain=read(self.cert_file),
        )

    def options(self) -> tuple[tuple[str, str], ...]:
        """The channel options these settings add."""
        if self.server_name is None:
            return ()
        return (("grpc.ssl_target_name_override", self.server_name),)


def health_check(
    to: grpc.Channel,
) -> grpc.UnaryUnaryMultiCallable[health_pb2.HealthCheckRequest, health_pb2.HealthCheckResponse]:
    """The standard health check's ``Check`` on ``to`` (a sync channel; on
    a ``grpc.aio`` channel the call is awaitable)."""
    return to.unary_unary(
        "/grpc.health.v1.Health/Check",
        request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
        response_deserializer=health_pb2.HealthCheckResponse.FromString,
    )


def channel(target: str, tls: Tls | None = None) -> grpc.Channel:
    """A channel to ``host:port`` with :data:`CHANNEL_OPTIONS`: plaintext,
    or over TLS with ``tls``. ``unix:/path`` reaches a daemon serving a
    Unix socket (``--listen-unix``), plaintext."""
    if target.startswith("unix:"):
        # gRPC names the socket's path as the call's authority, which is no
        # host the daemon's HTTP/2 server accepts; any host name does.
        return grpc.insecure_channel(
            target, options=CHANNEL_OPTIONS + (("grpc.default_authority", "localhost"),)
        )
    if tls is None:
        return grpc.insecure_channel(target, options=CHANNEL_OPTIONS)
    return grpc.secure_channel(target, tls.credentials(), options=CHANNEL_OPTIONS + tls.options())


def span(
    role: pb.Role.ValueType,
    text: str,
    *,
    span_class: pb.SpanClass.ValueType = pb.SPAN_CLASS_UNSPECIFIED,
    idempotency_key: str = "",
    token_count: int | None = None,
    relevance_hint: float | None = None,
    predicate: pb.Predicate | None = None,
    tool_call_id: str = "",
    tool_name: str = "",
    metadata: Mapping[str, str] | None = None,
) -> pb.SpanInput:
    """One span to admit. Leave ``span_class`` unset to let the daemon's
    rules classify user and system text. Give a tool call and its result
    the same ``tool_call_id``: compaction then keeps or evicts them
    together."""
    out = pb.SpanInput(
        role=role,
        text=text,
        span_class=span_class,
        idempotency_key=idempotency_key,
        tool_call_id=tool_call_id,
        tool_name=tool_name,
        metadata=dict(metadata or {}),
    )
    if token_count is not None:
        out.token_count = token_count
    if relevance_hint is not None:
        out.relevance_hint = relevance_hint
    if predicate is not None:
        out.predicate.CopyFrom(predicate)
    return out


def user(text: str, **kwargs: Any) -> pb.SpanInput:
    """A user span."""
    return span(pb.ROLE_USER, text, **kwargs)


def assistant(text: str, **kwargs: Any) -> pb.SpanInput:
    """The model's own turn."""
    return span(pb.ROLE_ASSISTANT, text, **kwargs)


def tool(text: str, **kwargs: Any) -> pb.SpanInput:
    """A tool result."""
    return span(pb.ROLE_TOOL, text, **kwargs)


def system(text: str, **kwargs: Any) -> pb.SpanInput:
    """A system or developer instruction."""
    return span(pb.ROLE_SYSTEM, text, **kwargs)


@dataclass(frozen=True)
class Admission:
    """What one admitted turn became."""

    #: The admitted spans with ids, token counts, classes and predicates.
    spans: list[pb.Span]
    #: The compaction this admission needed, when one ran.
    compaction: pb.CompactionMarker | None
    #: The live context's totals after the admission.
    totals: pb.ContextTotals
    #: The session revision after the admission.
    revision: int
    #: The turn number.
    turn: int
    #: True when the turn was a retry of one already admitted.
    replayed: bool

    @classmethod
    def from_pb(cls, reply: pb.AdmitResponse) -> Admission:
        """Wraps an ``AdmitResponse``."""
        return cls(
            spans=list(reply.spans),
            compaction=reply.compaction if reply.HasField("compaction") else None,
            totals=reply.totals,
            revision=reply.revision,
            turn=reply.turn,
            replayed=reply.replayed,
        )


@dataclass(frozen=True)
class Context:
    """The live context, in prompt order."""

    #: The spans to put in the prompt, in order.
    spans: list[pb.Span]
    #: Its totals.
    totals: pb.ContextTotals
    #: The session revision it reflects.
    revision: int
    #: The latest turn admitted.
    turn: int

    @classmethod
    def from_pb(cls, reply: pb.GetContextResponse) -> Context:
        """Wraps a ``GetContextResponse``."""
        return cls(
            spans=list(reply.spans), totals=reply.totals, revision=reply.revision, turn=reply.turn
        )

    def messages(self) -> list[tuple[str, str]]:
        """(role, text) pairs in prompt order, roles as chat APIs name them
        (``user``, ``assistant``, ``tool``, ``system``)."""
        names = {
            pb.ROLE_USER: "user",
            pb.ROLE_ASSISTANT: "assistant",
            pb.ROLE_TOOL: "tool",
            pb.ROLE_SYSTEM: "system",
        }
        return [(names.get(s.role, "system"), s.text) for s in self.spans]

    def constraints(self) -> list[pb.Span]:
        """The pinned constraints standing in the context."""
        return [s for s in self.spans if s.span_class == pb.SPAN_CLASS_CONSTRAINT]


# Requests, built the same way for the sync and the asyncio client ----------


def bearer_metadata(metadata: Sequence[tuple[str, str]], token: str | None) -> Metadata:
    """The metadata every call sends: ``metadata`` and, with a token,
    ``authorization: Bearer <token>``."""
    if token is not None and (not token or any(c in token for c in "\r\n")):
        raise ValueError("Broker: token must be a non-empty single line")
    bearer = () if token is None else (("authorization", f"Bearer {token}"),)
    return tuple(metadata) + bearer


def with_session(metadata: Metadata, session_id: str | None) -> Metadata:
    """``metadata`` plus the ``x-ctxbroker-session`` header naming
    ``session_id`` (replacing one the caller set), unless it is None."""
    if session_id is None:
        return metadata
    kept = tuple((k, v) for k, v in metadata if k != SESSION_HEADER)
    return (*kept, (SESSION_HEADER, session_id))


def create_session_request(
    session_id: str,
    window_tokens: int,
    config: pb.SessionConfig | None,
    settings: dict[str, object],
) -> pb.CreateSessionRequest:
    cfg = pb.SessionConfig()
    if config is not None:
        cfg.CopyFrom(config)
    cfg.window_tokens = window_tokens
    for name, value in settings.items():
        setattr(cfg, name, value)
    return pb.CreateSessionRequest(session_id=session_id, config=cfg)


def update_session_request(
    session_id: str, config: pb.SessionConfig | None, settings: dict[str, object]
) -> pb.UpdateSessionRequest:
    cfg = pb.SessionConfig()
    if config is not None:
        cfg.CopyFrom(config)
    for name, value in settings.items():
        setattr(cfg, name, value)
    return pb.UpdateSessionRequest(session_id=session_id, config=cfg)


#: The longest caller key :func:`admit_request` accepts: the daemon takes
#: keys of up to 128 characters, and a span's key adds ``.<index>``.
MAX_TURN_KEY = 120


def admit_request(
    session_id: str, spans: Iterable[pb.SpanInput], idempotency_key: str | None
) -> pb.AdmitRequest:
    """The request for one turn, every span carrying an idempotency key.

    Spans that all carry keys keep them. Spans that carry none get
    ``<key>.<index>`` (index from 0), where ``<key>`` is
    ``idempotency_key`` or, when that is None, a fresh random one: made
    once here, so every retry of the request sends the same keys. The
    caller's spans are copied, not changed. Spans of which only some carry
    keys are sent as they are (the daemon refuses them)."""
    turn = []
    for given in spans:
        copy = pb.SpanInput()
        copy.CopyFrom(given)
        turn.append(copy)
    if idempotency_key is not None and not 1 <= len(idempotency_key) <= MAX_TURN_KEY:
        raise ValueError(f"admit: idempotency_key must be 1 to {MAX_TURN_KEY} characters")
    if turn and not any(s.idempotency_key for s in turn):
        key = idempotency_key if idempotency_key is not None else uuid.uuid4().hex
        for index, item in enumerate(turn):
            item.idempotency_key = f"{key}.{index}"
    elif idempotency_key is not None:
        raise ValueError("admit: idempotency_key given, but the spans carry keys of their own")
    return pb.AdmitRequest(session_id=session_id, spans=turn)


def span_filter(
    *,
    roles: Iterable[pb.Role.ValueType] = (),
    span_classes: Iterable[pb.SpanClass.ValueType] = (),
    from_turn: int | None = None,
    to_turn: int | None = None,
    state: pb.SpanState.ValueType = pb.SPAN_STATE_UNSPECIFIED,
) -> pb.SpanFilter:
    return pb.SpanFilter(
        roles=list(roles),
        span_classes=list(span_classes),
        from_turn=from_turn,
        to_turn=to_turn,
        state=state,
    )


def plan_request(
    session_id: str, incoming_tokens: int, target_tokens: int | None
) -> pb.PlanCompactionRequest:
    request = pb.PlanCompactionRequest(session_id=session_id, incoming_tokens=incoming_tokens)
    if target_tokens is not None:
        request.target_tokens = target_tokens
    return request


def commit_request(
    session_id: str,
    plan_id: str,
    actor: str,
    summary_text: str | None,
    compressed_forms: Sequence[pb.CompressedForm],
) -> pb.CommitCompactionRequest:
    request = pb.CommitCompactionRequest(
        session_id=session_id,
        plan_id=plan_id,
        actor=actor,
        compressed_forms=list(compressed_forms),
    )
    if summary_text is not None:
        request.summary_text = summary_text
    return request


def reset_request(session_id: str, expected_revision: int | None) -> pb.ResetSessionRequest:
    request = pb.ResetSessionRequest(session_id=session_id)
    if expected_revision is not None:
        request.expected_revision = expected_revision
    return request


def retract_request(
    session_id: str, spans: int, expected_revision: int | None
) -> pb.RetractLastTurnRequest:
    request = pb.RetractLastTurnRequest(session_id=session_id, spans=spans)
    if expected_revision is not None:
        request.expected_revision = expected_revision
    return request


def pin_request(session_id: str, span_id: int, predicate: pb.Predicate | None) -> pb.PinRequest:
    request = pb.PinRequest(session_id=session_id, span_id=span_id)
    if predicate is not None:
        request.predicate.CopyFrom(predicate)
    return request


class Broker:
    """A client of one ctxbroker daemon.

    ``target`` is ``host:port`` (a channel with :data:`CHANNEL_OPTIONS` is
    made: plaintext, or over TLS with ``tls``), ``unix:/path`` for a daemon
    serving a Unix socket, or a ready
    :class:`grpc.Channel`.
    ``token`` is a bearer token for a daemon started with a token file
    (``auth_tokens_file``): every call then carries ``authorization:
    Bearer <token>``, and the token's role and tenant decide what the calls
    may do and which sessions they see (docs/security.md). Without one, a
    daemon that requires tokens answers
    :class:`~ctxbroker_client.errors.Unauthenticated`. The token is kept
    out of this object's ``repr`` and of every error.
    Unary calls time out after ``timeout`` seconds. With ``wait_for_ready``
    (the default) a call made while the daemon is unreachable — restarting,
    say — waits for it within that timeout instead of failing at once; the
    request has not been sent then, so this never repeats an admission.
    :meth:`admit` retries a turn whose reply was lost as ``admit_retry``
    says, with idempotency keys. Every call about one session sends the
    ``x-ctxbroker-session`` header; :meth:`session_metadata` gives it for
    calls made on :attr:`stub` directly.
    """

    def __init__(
        self,
        target: str | grpc.Channel,
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
            self.channel: grpc.Channel = channel(target, tls)
            self._owns_channel = True
        else:
            self.channel = target
            self._owns_channel = False
        #: The generated stub, for everything the wrapper does not cover.
        self.stub = pb_grpc.ContextBrokerStub(self.channel)
        self._health = health_check(self.channel)
        self.timeout = timeout
        self.wait_for_ready = wait_for_ready
        self.admit_retry = admit_retry

    def __repr__(self) -> str:
        authenticated = any(key == "authorization" for key, _ in self.metadata)
        return f"Broker(timeout={self.timeout}, token={'set' if authenticated else 'none'})"

    def close(self) -> None:
        """Closes the channel if this client made it."""
        if self._owns_channel:
            self.channel.close()

    def __enter__(self) -> Broker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def session_metadata(self, session_id: str | None) -> Metadata:
        """The metadata of a call about ``session_id``: :attr:`metadata`
        and the ``x-ctxbroker-session`` header (none for None)."""
        return with_session(self.metadata, session_id)

    def _call(
        self,
        method: grpc.UnaryUnaryMultiCallable[_Req, _Resp],
        request: _Req,
        session_id: str | None = None,
    ) -> _Resp:
        try:
            return method(
                request,
                timeout=self.timeout,
                metadata=self.session_metadata(session_id),
                wait_for_ready=self.wait_for_ready,
            )
        except grpc.RpcError as err:
            raise from_rpc_error(err) from None

    # Server ---------------------------------------------------------------

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Waits until the daemon reports SERVING on the health check."""
        try:
            reply = self._health(
                health_pb2.HealthCheckRequest(service=""),
                timeout=timeout,
                wait_for_ready=True,
            )
        except grpc.RpcError as err:
            raise from_rpc_error(err) from None
        if reply.status != health_pb2.HealthCheckResponse.SERVING:
            raise RuntimeError(f"daemon health is {reply.status}, not SERVING")

    def server_info(self) -> pb.GetServerInfoResponse:
        """Version, commit, contract digest, limits and marker bounds."""
        return self._call(self.stub.GetServerInfo, pb.GetServerInfoRequest())

    def contract_matches(self) -> bool:
        """Whether the daemon serves the contract these stubs were built
        from."""
        return self.server_info().contract_digest == CONTRACT_DIGEST

    # Sessions -------------------------------------------------------------

    def create_session(
        self,
        session_id: str,
        *,
        window_tokens: int,
        config: pb.SessionConfig | None = None,
        **settings: object,
    ) -> pb.Session:
        """Creates a session. ``settings`` are ``SessionConfig`` fields
        (``alpha=0.8``, ``mode=pb.SESSION_MODE_APPROVAL`` ...); unset ones
        take the daemon's defaults, which the returned session spells out."""
        request = create_session_request(session_id, window_tokens, config, settings)
        return self._call(self.stub.CreateSession, request, session_id).session

    def get_session(self, session_id: str) -> pb.Session:
        """One session with its effective configuration and totals."""
        request = pb.GetSessionRequest(session_id=session_id)
        return self._call(self.stub.GetSession, request, session_id).session

    def update_session(
        self, session_id: str, *, config: pb.SessionConfig | None = None, **settings: object
    ) -> pb.Session:
        """Changes a session's configuration: ``settings`` (or ``config``)
        are the ``SessionConfig`` fields to change; the rest keep their
        value. Returns the session after the change."""
        request = update_session_request(session_id, config, settings)
        return self._call(self.stub.UpdateSession, request, session_id).session

    def list_sessions(self, page_size: int = 100) -> Iterator[pb.Session]:
        """Every session, in id order, fetching page by page."""
        request = pb.ListSessionsRequest(page_size=page_size)
        while True:
            reply = self._call(self.stub.ListSessions, request)
            yield from reply.sessions
            if not reply.next_page_token:
                return
            request.page_token = reply.next_page_token

    def delete_session(self, session_id: str) -> int:
        """Deletes a session; returns the spans deleted."""
        request = pb.DeleteSessionRequest(session_id=session_id)
        return self._call(self.stub.DeleteSession, request, session_id).spans_deleted

    def reset_session(
        self, session_id: str, expected_revision: int | None = None
    ) -> pb.ResetSessionResponse:
        """Empties the session (live spans, archive, keys), keeping its
        configuration; with ``expected_revision``, only if it still is."""
        request = reset_request(session_id, expected_revision)
        return self._call(self.stub.ResetSession, request, session_id)

    def retract_last_turn(
        self, session_id: str, spans: int = 0, expected_revision: int | None = None
    ) -> pb.RetractLastTurnResponse:
        """Takes back the newest ``spans`` live spans (0: the newest turn's);
        returns them and the session after."""
        request = retract_request(session_id, spans, expected_revision)
        return self._call(self.stub.RetractLastTurn, request, session_id)

    def export_session(self, session_id: str) -> pb.ExportSessionResponse:
        """A snapshot of the session (``.snapshot``) for
        :meth:`import_session`, with the session as exported."""
        request = pb.ExportSessionRequest(session_id=session_id)
        return self._call(self.stub.ExportSession, request, session_id)

    def import_session(self, snapshot: pb.SessionSnapshot) -> pb.ImportSessionResponse:
        """Creates the snapshot's session here; its header names
        ``snapshot.session_id``, so it lands where later calls look."""
        request = pb.ImportSessionRequest(snapshot=snapshot)
        return self._call(self.stub.ImportSession, request, snapshot.session_id)

    # The agent's turn -----------------------------------------------------

    def admit(
        self,
        session_id: str,
        spans: Iterable[pb.SpanInput],
        *,
        idempotency_key: str | None = None,
    ) -> Admission:
        """Admits one turn. The daemon compacts first when the turn does not
        fit; a turn that can never fit raises
        :class:`~ctxbroker_client.errors.CompactionInvariant` and changes
        nothing.

        The turn is sent with idempotency keys (see :func:`admit_request`:
        the spans' own, or ``<idempotency_key>.<index>``, or random ones
        made once for this call) and sent again as :attr:`admit_retry` says
        when its reply is lost (UNAVAILABLE, DEADLINE_EXCEEDED): the daemon
        admits it once, and answers a retry of an admitted turn with the
        original spans and ``replayed`` set. Pass ``idempotency_key`` to
        make retries across calls (or processes) safe as well."""
        request = admit_request(session_id, spans, idempotency_key)
        delays = self.admit_retry.delays()
        while True:
            try:
                reply = self._call(self.stub.Admit, request, session_id)
            except BrokerError as err:
                delay = next(delays, None) if retryable_admit_error(err) else None
                if delay is None:
                    raise
                time.sleep(delay)
                continue
            return Admission.from_pb(reply)

    def get_context(self, session_id: str) -> Context:
        """The live context in prompt order."""
        request = pb.GetContextRequest(session_id=session_id)
        return Context.from_pb(self._call(self.stub.GetContext, request, session_id))

    def get_span(self, session_id: str, span_id: int) -> pb.Span:
        """One span by id, live or archived."""
        request = pb.GetSpanRequest(session_id=session_id, span_id=span_id)
        return self._call(self.stub.GetSpan, request, session_id).span

    def search_spans(
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
    ) -> Iterator[pb.SpanHit]:
        """Spans of the session, live and archived, that hold words of
        ``query``, best first (BM25), fetching page by page: how an agent
        finds the turn behind an anchor a marker reports dropped. Each hit
        carries a snippet; :meth:`get_span` returns the whole text."""
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
            reply = self._call(self.stub.SearchSpans, request, session_id)
            yield from reply.hits
            if not reply.next_page_token:
                return
            request.page_token = reply.next_page_token

    def list_spans(
        self,
        session_id: str,
        *,
        from_turn: int | None = None,
        to_turn: int | None = None,
        state: pb.SpanState.ValueType = pb.SPAN_STATE_UNSPECIFIED,
        page_size: int = 100,
    ) -> Iterator[pb.SpanHit]:
        """Spans of the session, live and archived, in id order, within
        the turn range, fetching page by page."""
        found = span_filter(from_turn=from_turn, to_turn=to_turn, state=state)
        request = pb.ListSpansRequest(session_id=session_id, filter=found, page_size=page_size)
        while True:
            reply = self._call(self.stub.ListSpans, request, session_id)
            yield from reply.spans
            if not reply.next_page_token:
                return
            request.page_token = reply.next_page_token

    # Compaction the caller steers -----------------------------------------

    def plan_compaction(
        self,
        session_id: str,
        *,
        incoming_tokens: int = 0,
        target_tokens: int | None = None,
    ) -> pb.PlanCompactionResponse:
        """A dry run: the plan, its verification and a plan id."""
        request = plan_request(session_id, incoming_tokens, target_tokens)
        return self._call(self.stub.PlanCompaction, request, session_id)

    def commit_compaction(
        self,
        session_id: str,
        plan_id: str,
        *,
        actor: str = "",
        summary_text: str | None = None,
        compressed_forms: Sequence[pb.CompressedForm] = (),
    ) -> pb.CommitCompactionResponse:
        """Commits a plan (re-verified; :class:`StalePlan` when the session
        moved on)."""
        request = commit_request(session_id, plan_id, actor, summary_text, compressed_forms)
        return self._call(self.stub.CommitCompaction, request, session_id)

    def pin(self, session_id: str, span_id: int, predicate: pb.Predicate | None = None) -> pb.Span:
        """Pins a live span as a constraint."""
        request = pin_request(session_id, span_id, predicate)
        return self._call(self.stub.Pin, request, session_id).span

    def unpin(
        self, session_id: str, span_id: int, *, reason: str, actor: str = ""
    ) -> pb.UnpinResponse:
        """Releases a constraint; the UNPIN marker records who and why. With
        a token the marker names the token (``token-id@tenant``), followed
        by ``(as <actor>)`` when ``actor`` is given; without one, ``actor``
        is required."""
        request = pb.UnpinRequest(
            session_id=session_id, span_id=span_id, actor=actor, reason=reason
        )
        return self._call(self.stub.Unpin, request, session_id)

    # Markers --------------------------------------------------------------

    def watch(
        self,
        *,
        from_seq: int = 1,
        start: pb.WatchStart.ValueType = pb.WATCH_START_FROM_SEQ,
        session_ids: Sequence[str] = (),
        max_backoff: float = 2.0,
        give_up_after: float | None = None,
        on_reconnect: Callable[[int | None, BrokerError | None], None] | None = None,
    ) -> MarkerWatch:
        """Compaction markers from ``from_seq`` (or the oldest retained, or
        only new ones, with ``start``), as an iterator that reconnects with
        backoff and resumes from the last sequence seen + 1. See
        :class:`~ctxbroker_client.watch.MarkerWatch`; ``on_reconnect`` is
        called with the sequence to resume from and the error that ended the
        stream (None when it just ended) before each reconnection. A watch
        of one session's markers sends that session's header."""
        from .watch import MarkerWatch

        return MarkerWatch(
            self,
            from_seq=from_seq,
            start=start,
            session_ids=session_ids,
            max_backoff=max_backoff,
            give_up_after=give_up_after,
            on_reconnect=on_reconnect,
        )
