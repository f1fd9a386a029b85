"""An admission whose reply is lost is sent again with the same
idempotency keys, and the daemon admits the turn once: the retry comes back
``replayed`` with the original spans. The reply is lost on purpose by an
interceptor that lets the first Admit reach the daemon, waits for its
answer, and hands the caller UNAVAILABLE (or DEADLINE_EXCEEDED) instead;
once with a ``kill -9`` of the daemon in between."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import grpc
import grpc.aio
import pytest
from conftest import tool_output

from ctxbroker_client import AsyncBroker, Broker, LocalDaemon, Retry, errors, pb, tool, user

FAST = Retry(attempts=4, initial_backoff=0.01, max_backoff=0.05)


def method_name(details: Any) -> str:
    method = details.method
    return method.decode() if isinstance(method, bytes) else str(method)


class Lost(grpc.RpcError, grpc.Call):
    """What the caller sees of an answered call whose reply never came."""

    def __init__(self, code: grpc.StatusCode) -> None:
        super().__init__(f"{code.name}: reply dropped")
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return "reply dropped by the test"

    def initial_metadata(self) -> tuple[()]:
        return ()

    def trailing_metadata(self) -> tuple[()]:
        return ()

    def is_active(self) -> bool:
        return False

    def time_remaining(self) -> None:
        return None

    def cancel(self) -> bool:
        return False

    def add_callback(self, callback: Callable[[], None]) -> bool:
        return False


class DropReplies(grpc.UnaryUnaryClientInterceptor):
    """Drops the replies of the first ``drops`` Admit calls, after the
    daemon answered them (and runs ``after_drop`` then)."""

    def __init__(
        self, drops: int, code: grpc.StatusCode, after_drop: Callable[[], None] = lambda: None
    ) -> None:
        self.drops = drops
        self.code = code
        self.after_drop = after_drop
        self.sent: list[pb.AdmitRequest] = []

    def intercept_unary_unary(self, continuation, client_call_details, request):
        outcome = continuation(client_call_details, request)
        if not method_name(client_call_details).endswith("/Admit"):
            return outcome
        self.sent.append(request)
        outcome.result()  # the daemon has answered (raises on its errors)
        if self.drops > 0:
            self.drops -= 1
            self.after_drop()
            raise Lost(self.code)
        return outcome


def keys(request: pb.AdmitRequest) -> list[str]:
    return [s.idempotency_key for s in request.spans]


@pytest.mark.parametrize("code", [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED])
def test_a_lost_reply_is_retried_and_the_turn_admitted_once(daemon: LocalDaemon, code) -> None:
    dropper = DropReplies(2, code)
    raw = grpc.insecure_channel(daemon.address)
    with Broker(grpc.intercept_channel(raw, dropper), admit_retry=FAST) as broker:
        broker.create_session("retry", window_tokens=100_000)
        turn = [user("Deploy web to staging."), tool(tool_output(1))]
        admitted = broker.admit("retry", turn)

        assert len(dropper.sent) == 3
        first = keys(dropper.sent[0])
        assert all(first) and len(set(first)) == 2
        assert all(keys(sent) == first for sent in dropper.sent)
        # The caller's spans were not changed.
        assert [s.idempotency_key for s in turn] == ["", ""]

        assert admitted.replayed
        assert [s.span_id for s in admitted.spans] == [1, 2]
        context = broker.get_context("retry")
        assert [s.span_id for s in context.spans] == [1, 2]
        assert context.turn == 1
        assert broker.get_session("retry").totals.live_tokens == context.totals.live_tokens

        # A new call is a new turn: its keys are new.
        again = broker.admit("retry", turn)
        assert not again.replayed and again.turn == 2
        assert set(keys(dropper.sent[-1])).isdisjoint(first)
    raw.close()


def test_without_retries_the_lost_reply_is_the_callers(daemon: LocalDaemon) -> None:
    dropper = DropReplies(1, grpc.StatusCode.UNAVAILABLE)
    raw = grpc.insecure_channel(daemon.address)
    with Broker(grpc.intercept_channel(raw, dropper), admit_retry=Retry(attempts=1)) as broker:
        broker.create_session("once", window_tokens=100_000)
        with pytest.raises(errors.Unavailable):
            broker.admit("once", [user("hello")], idempotency_key="turn-1")
        assert keys(dropper.sent[0]) == ["turn-1.0"]
        # It was admitted; the caller's own retry with its key replays it.
        again = broker.admit("once", [user("hello")], idempotency_key="turn-1")
        assert again.replayed and again.turn == 1
        assert broker.get_context("once").turn == 1
    raw.close()


def test_a_retry_across_a_daemon_kill_admits_once(daemon: LocalDaemon) -> None:
    dropper = DropReplies(1, grpc.StatusCode.UNAVAILABLE, lambda: daemon.restart(kill=True))
    raw = grpc.insecure_channel(daemon.address)
    with Broker(grpc.intercept_channel(raw, dropper), admit_retry=FAST) as broker:
        broker.create_session("killed", window_tokens=100_000)
        admitted = broker.admit("killed", [user("Never write to prod.")])
        assert daemon.starts == 2
        assert admitted.replayed and admitted.turn == 1
        assert len(dropper.sent) == 2 and keys(dropper.sent[0]) == keys(dropper.sent[1])
        context = broker.get_context("killed")
        assert [s.text for s in context.spans] == ["Never write to prod."]
    raw.close()


def test_errors_that_are_answers_are_not_retried(broker: Broker) -> None:
    with pytest.raises(errors.SessionNotFound):
        broker.admit("nobody", [user("hello")])
    broker.create_session("keys", window_tokens=100_000)
    keyed = pb.SpanInput(role=pb.ROLE_USER, text="a", idempotency_key="k")
    with pytest.raises(ValueError):
        broker.admit("keys", [keyed], idempotency_key="other")
    assert broker.admit("keys", [keyed]).spans[0].span_id == 1
    assert broker.admit("keys", [keyed]).replayed
    # A key reused for other text is refused at once, not retried.
    other = pb.SpanInput(role=pb.ROLE_USER, text="b", idempotency_key="k")
    with pytest.raises(errors.InvalidArgument):
        broker.admit("keys", [other])
    with pytest.raises(ValueError):
        broker.admit("keys", [user("x")], idempotency_key="k" * 121)


class AsyncDropReplies(grpc.aio.UnaryUnaryClientInterceptor):
    def __init__(self) -> None:
        self.drops = 1
        self.sent: list[pb.AdmitRequest] = []

    async def intercept_unary_unary(self, continuation, client_call_details, request):
        call = await continuation(client_call_details, request)
        if not method_name(client_call_details).endswith("/Admit"):
            return call
        self.sent.append(request)
        await call
        if self.drops > 0:
            self.drops -= 1
            raise grpc.aio.AioRpcError(
                grpc.StatusCode.UNAVAILABLE,
                grpc.aio.Metadata(),
                grpc.aio.Metadata(),
                details="reply dropped by the test",
            )
        return call


def test_the_asyncio_client_retries_with_the_same_keys(daemon: LocalDaemon) -> None:
    async def run() -> None:
        dropper = AsyncDropReplies()
        channel = grpc.aio.insecure_channel(daemon.address, interceptors=[dropper])
        async with AsyncBroker(channel, admit_retry=FAST) as broker:
            await broker.create_session("aretry", window_tokens=100_000)
            admitted = await broker.admit("aretry", [user("hello"), user("again")])
            assert admitted.replayed and admitted.turn == 1
            assert len(dropper.sent) == 2 and keys(dropper.sent[0]) == keys(dropper.sent[1])
            context = await broker.get_context("aretry")
            assert [s.span_id for s in context.spans] == [1, 2]
        await channel.close()

    asyncio.run(run())
