"""A thin typed wrapper over the generated ``ContextBroker`` stub.

It covers the common flow of an agent — create a session, admit every turn
before it enters the prompt, build the prompt from the live context, watch
compaction markers — and leaves everything else to the generated stub
(:attr:`Broker.stub`), which speaks the whole contract. Messages are the
generated ones (``ctxbroker_client.pb``), typed by the generated ``.pyi``;
failures raise the exceptions of :mod:`ctxbroker_client.errors`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from .errors import BrokerError, from_rpc_error
from .v1 import broker_pb2 as pb
from .v1 import broker_pb2_grpc as pb_grpc
from .v1._contract import CONTRACT_DIGEST

if TYPE_CHECKING:
    from .watch import MarkerWatch

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
    role: pb.Role,
    text: str,
    *,
    span_class: pb.SpanClass = pb.SPAN_CLASS_UNSPECIFIED,
    idempotency_key: str = "",
    token_count: int | None = None,
    relevance_hint: float | None = None,
    predicate: pb.Predicate | None = None,
) -> pb.SpanInput:
    """One span to admit. Leave ``span_class`` unset to let the daemon's
    rules classify user and system text."""
    out = pb.SpanInput(role=role, text=text, span_class=span_class, idempotency_key=idempotency_key)
    if token_count is not None:
        out.token_count = token_count
    if relevance_hint is not None:
        out.relevance_hint = relevance_hint
    if predicate is not None:
        out.predicate.CopyFrom(predicate)
    return out


def user(text: str, **kwargs) -> pb.SpanInput:
    """A user span."""
    return span(pb.ROLE_USER, text, **kwargs)


def assistant(text: str, **kwargs) -> pb.SpanInput:
    """The model's own turn."""
    return span(pb.ROLE_ASSISTANT, text, **kwargs)


def tool(text: str, **kwargs) -> pb.SpanInput:
    """A tool result."""
    return span(pb.ROLE_TOOL, text, **kwargs)


def system(text: str, **kwargs) -> pb.SpanInput:
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
    ) -> None:
        if token is not None and (not token or any(c in token for c in "\r\n")):
            raise ValueError("Broker: token must be a non-empty single line")
        if isinstance(target, str):
            self.channel: grpc.Channel = channel(target, tls)
            self._owns_channel = True
        else:
            self.channel = target
            self._owns_channel = False
        #: The generated stub, for everything the wrapper does not cover.
        self.stub = pb_grpc.ContextBrokerStub(self.channel)
        self._health = health_pb2_grpc.HealthStub(self.channel)
        self.timeout = timeout
        bearer = () if token is None else (("authorization", f"Bearer {token}"),)
        #: The metadata every call sends (the bearer token among them).
        self.metadata = tuple(metadata) + bearer
        self.wait_for_ready = wait_for_ready

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

    def _call(self, method, request):
        try:
            return method(
                request,
                timeout=self.timeout,
                metadata=self.metadata,
                wait_for_ready=self.wait_for_ready,
            )
        except grpc.RpcError as err:
            raise from_rpc_error(err) from None

    # Server ---------------------------------------------------------------

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Waits until the daemon reports SERVING on the health check."""
        try:
            reply = self._health.Check(
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
        cfg = pb.SessionConfig()
        if config is not None:
            cfg.CopyFrom(config)
        cfg.window_tokens = window_tokens
        for name, value in settings.items():
            setattr(cfg, name, value)
        reply = self._call(
            self.stub.CreateSession, pb.CreateSessionRequest(session_id=session_id, config=cfg)
        )
        return reply.session

    def get_session(self, session_id: str) -> pb.Session:
        """One session with its effective configuration and totals."""
        return self._call(self.stub.GetSession, pb.GetSessionRequest(session_id=session_id)).session

    def list_sessions(self, page_size: int = 100) -> Iterator[pb.Session]:
        """Every session, in id order, fetching page by page."""
        request = pb.ListSessionsRequest(page_size=page_size)
        return self._pages(self.stub.ListSessions, request, "sessions")

    def delete_session(self, session_id: str) -> int:
        """Deletes a session; returns the spans deleted."""
        return self._call(
            self.stub.DeleteSession, pb.DeleteSessionRequest(session_id=session_id)
        ).spans_deleted

    # The agent's turn -----------------------------------------------------

    def admit(self, session_id: str, spans: Iterable[pb.SpanInput]) -> Admission:
        """Admits one turn. The daemon compacts first when the turn does not
        fit; a turn that can never fit raises
        :class:`~ctxbroker_client.errors.CompactionInvariant` and changes
        nothing."""
        reply = self._call(
            self.stub.Admit, pb.AdmitRequest(session_id=session_id, spans=list(spans))
        )
        return Admission.from_pb(reply)

    def get_context(self, session_id: str) -> Context:
        """The live context in prompt order."""
        return Context.from_pb(
            self._call(self.stub.GetContext, pb.GetContextRequest(session_id=session_id))
        )

    def get_span(self, session_id: str, span_id: int) -> pb.Span:
        """One span by id, live or archived."""
        return self._call(
            self.stub.GetSpan, pb.GetSpanRequest(session_id=session_id, span_id=span_id)
        ).span

    def search_spans(
        self,
        session_id: str,
        query: str,
        *,
        roles: Iterable[int] = (),
        span_classes: Iterable[int] = (),
        from_turn: int | None = None,
        to_turn: int | None = None,
        state: int = 0,
        page_size: int = 10,
    ) -> Iterator[pb.SpanHit]:
        """Spans of the session, live and archived, that hold words of
        ``query``, best first (BM25), fetching page by page: how an agent
        finds the turn behind an anchor a marker reports dropped. Each hit
        carries a snippet; :meth:`get_span` returns the whole text."""
        span_filter = pb.SpanFilter(
            roles=list(roles),
            span_classes=list(span_classes),
            from_turn=from_turn,
            to_turn=to_turn,
            state=state,
        )
        request = pb.SearchSpansRequest(
            session_id=session_id, query=query, filter=span_filter, page_size=page_size
        )
        return self._pages(self.stub.SearchSpans, request, "hits")

    def list_spans(
        self,
        session_id: str,
        *,
        from_turn: int | None = None,
        to_turn: int | None = None,
        state: int = 0,
        page_size: int = 100,
    ) -> Iterator[pb.SpanHit]:
        """Spans of the session, live and archived, in id order, within
        the turn range, fetching page by page."""
        span_filter = pb.SpanFilter(from_turn=from_turn, to_turn=to_turn, state=state)
        request = pb.ListSpansRequest(
            session_id=session_id, filter=span_filter, page_size=page_size
        )
        return self._pages(self.stub.ListSpans, request, "spans")

    def _pages(self, method, request, field: str) -> Iterator:
        """Every item of `field` over the pages of a paged call."""
        while True:
            reply = self._call(method, request)
            yield from getattr(reply, field)
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
        request = pb.PlanCompactionRequest(session_id=session_id, incoming_tokens=incoming_tokens)
        if target_tokens is not None:
            request.target_tokens = target_tokens
        return self._call(self.stub.PlanCompaction, request)

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
        request = pb.CommitCompactionRequest(
            session_id=session_id,
            plan_id=plan_id,
            actor=actor,
            compressed_forms=list(compressed_forms),
        )
        if summary_text is not None:
            request.summary_text = summary_text
        return self._call(self.stub.CommitCompaction, request)

    def pin(self, session_id: str, span_id: int, predicate: pb.Predicate | None = None) -> pb.Span:
        """Pins a live span as a constraint."""
        request = pb.PinRequest(session_id=session_id, span_id=span_id)
        if predicate is not None:
            request.predicate.CopyFrom(predicate)
        return self._call(self.stub.Pin, request).span

    def unpin(
        self, session_id: str, span_id: int, *, reason: str, actor: str = ""
    ) -> pb.UnpinResponse:
        """Releases a constraint; the UNPIN marker records who and why. With
        a token the marker names the token (``token-id@tenant``), followed
        by ``(as <actor>)`` when ``actor`` is given; without one, ``actor``
        is required."""
        return self._call(
            self.stub.Unpin,
            pb.UnpinRequest(session_id=session_id, span_id=span_id, actor=actor, reason=reason),
        )

    # Markers --------------------------------------------------------------

    def watch(
        self,
        *,
        from_seq: int = 1,
        start: pb.WatchStart = pb.WATCH_START_FROM_SEQ,
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
        stream (None when it just ended) before each reconnection."""
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
