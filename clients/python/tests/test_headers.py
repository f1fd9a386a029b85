"""Every call about one session carries ``x-ctxbroker-session: <id>``, the
header a sharded deployment routes on (deploy/envoy/envoy.yaml); calls
about no session carry none. A local server stands in for the daemon and
records what each call arrived with, for the sync and the asyncio client."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest

from ctxbroker_client import SESSION_HEADER, AsyncBroker, Broker, pb, pb_grpc, user

SERVICE = pb.DESCRIPTOR.services_by_name["ContextBroker"]


class Recorder(pb_grpc.ContextBrokerServicer):
    """Answers every unary call with an empty reply (a watch with one
    marker) and records the session headers each call carried."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[str]]] = []

    def record(self, name: str, context: grpc.ServicerContext) -> None:
        values = [v for k, v in context.invocation_metadata() if k == SESSION_HEADER]
        self.calls.append((name, values))

    def WatchCompactions(self, request, context):  # noqa: N802 (generated name)
        self.record("WatchCompactions", context)
        yield pb.WatchCompactionsResponse(marker=pb.CompactionMarker(seq=1, session_id="w"))


def _unary(name: str) -> Callable[..., Any]:
    reply = getattr(pb, SERVICE.methods_by_name[name].output_type.name)

    def handle(self: Recorder, request: Any, context: grpc.ServicerContext) -> Any:
        self.record(name, context)
        return reply()

    return handle


for _name, _method in SERVICE.methods_by_name.items():
    if not _method.client_streaming and not _method.server_streaming:
        setattr(Recorder, _name, _unary(_name))


@pytest.fixture
def recorder() -> Iterator[tuple[str, Recorder]]:
    servicer = Recorder()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_ContextBrokerServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}", servicer
    server.stop(None)


#: (what the test calls, the RPC it makes, the header it must carry).
EXPECTED = [
    ("create_session", "CreateSession", "s-create"),
    ("get_session", "GetSession", "s-get"),
    ("update_session", "UpdateSession", "s-update"),
    ("delete_session", "DeleteSession", "s-delete"),
    ("export_session", "ExportSession", "s-export"),
    ("import_session", "ImportSession", "s-import"),
    ("admit", "Admit", "s-admit"),
    ("get_context", "GetContext", "s-context"),
    ("get_span", "GetSpan", "s-span"),
    ("search_spans", "SearchSpans", "s-search"),
    ("list_spans", "ListSpans", "s-list"),
    ("plan_compaction", "PlanCompaction", "s-plan"),
    ("commit_compaction", "CommitCompaction", "s-commit"),
    ("pin", "Pin", "s-pin"),
    ("unpin", "Unpin", "s-unpin"),
    ("watch one session", "WatchCompactions", "s-watch"),
    ("server_info", "GetServerInfo", None),
    ("list_sessions", "ListSessions", None),
    ("watch two sessions", "WatchCompactions", None),
]


def sync_calls(broker: Broker) -> None:
    broker.create_session("s-create", window_tokens=400)
    broker.get_session("s-get")
    broker.update_session("s-update", alpha=0.5)
    broker.delete_session("s-delete")
    broker.export_session("s-export")
    broker.import_session(pb.SessionSnapshot(session_id="s-import"))
    broker.admit("s-admit", [user("hello")])
    broker.get_context("s-context")
    broker.get_span("s-span", 1)
    list(broker.search_spans("s-search", "hello"))
    list(broker.list_spans("s-list"))
    broker.plan_compaction("s-plan")
    broker.commit_compaction("s-commit", "plan")
    broker.pin("s-pin", 1)
    broker.unpin("s-unpin", 1, reason="done", actor="test")
    with broker.watch(session_ids=["s-watch"]) as watch:
        assert next(watch).seq == 1
    broker.server_info()
    list(broker.list_sessions())
    with broker.watch(session_ids=["a", "b"]) as watch:
        assert next(watch).seq == 1


async def async_calls(broker: AsyncBroker) -> None:
    await broker.create_session("s-create", window_tokens=400)
    await broker.get_session("s-get")
    await broker.update_session("s-update", alpha=0.5)
    await broker.delete_session("s-delete")
    await broker.export_session("s-export")
    await broker.import_session(pb.SessionSnapshot(session_id="s-import"))
    await broker.admit("s-admit", [user("hello")])
    await broker.get_context("s-context")
    await broker.get_span("s-span", 1)
    [hit async for hit in broker.search_spans("s-search", "hello")]
    [hit async for hit in broker.list_spans("s-list")]
    await broker.plan_compaction("s-plan")
    await broker.commit_compaction("s-commit", "plan")
    await broker.pin("s-pin", 1)
    await broker.unpin("s-unpin", 1, reason="done", actor="test")
    async with broker.watch(session_ids=["s-watch"]) as watch:
        assert (await watch.__anext__()).seq == 1
    await broker.server_info()
    [s async for s in broker.list_sessions()]
    async with broker.watch(session_ids=["a", "b"]) as watch:
        assert (await watch.__anext__()).seq == 1


def check(calls: list[tuple[str, list[str]]]) -> None:
    assert [rpc for rpc, _ in calls] == [rpc for _, rpc, _ in EXPECTED]
    for (what, rpc, session), (_, headers) in zip(EXPECTED, calls, strict=True):
        assert headers == ([session] if session else []), f"{what} ({rpc}) sent {headers}"


def test_the_sync_client_names_the_session_of_every_call(recorder) -> None:
    address, servicer = recorder
    with Broker(address, metadata=[("x-other", "1")]) as broker:
        sync_calls(broker)
        check(servicer.calls)
        assert broker.session_metadata("a") == (("x-other", "1"), (SESSION_HEADER, "a"))


def test_the_asyncio_client_names_the_session_of_every_call(recorder) -> None:
    address, servicer = recorder

    async def run() -> None:
        async with AsyncBroker(address) as broker:
            await async_calls(broker)

    asyncio.run(run())
    check(servicer.calls)


def test_a_callers_own_session_header_is_replaced(recorder) -> None:
    address, servicer = recorder
    with Broker(address, metadata=[(SESSION_HEADER, "stale")]) as broker:
        broker.get_session("mine")
        broker.server_info()
    assert servicer.calls == [("GetSession", ["mine"]), ("GetServerInfo", ["stale"])]
