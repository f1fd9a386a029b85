"""The asyncio client against the real daemon: the same surface as the sync
one, the same results and typed errors, and a marker watch that resumes
across daemon restarts with no gap and no repeat."""

from __future__ import annotations

import asyncio
import inspect

import pytest
from conftest import CONSTRAINT, tool_output

from ctxbroker_client import (
    AsyncBroker,
    AsyncMarkerWatch,
    Broker,
    LocalDaemon,
    MarkerWatch,
    errors,
    pb,
    tool,
    user,
)


def public(cls: type) -> dict[str, object]:
    return {n: m for n, m in vars(cls).items() if callable(m) and not n.startswith("_")}


def test_the_asyncio_client_has_the_sync_clients_methods_and_arguments() -> None:
    sync, aio = public(Broker), public(AsyncBroker)
    assert set(sync) - {"close"} <= set(aio)
    for name, method in sync.items():
        other = aio[name]
        assert inspect.signature(other).parameters.keys() == (
            inspect.signature(method).parameters.keys()
        ), name
        if name in ("watch", "session_metadata"):
            assert not inspect.iscoroutinefunction(other), name
        elif inspect.isgeneratorfunction(method):
            assert inspect.isasyncgenfunction(other), name
        else:
            assert inspect.iscoroutinefunction(other), name
    assert set(public(MarkerWatch)) == set(public(AsyncMarkerWatch))

    # The watchers' state is the same.
    def state(watch: object) -> set[str]:
        return {n for n in vars(watch) if not n.startswith("_")}

    async def compare() -> None:
        async with AsyncBroker("127.0.0.1:9") as aio_broker:
            with Broker("127.0.0.1:9") as sync_broker:
                assert state(aio_broker.watch()) == state(sync_broker.watch())
                assert state(aio_broker) - {"channel", "stub"} == state(sync_broker) - {
                    "channel",
                    "stub",
                }

    asyncio.run(compare())


def test_sessions_turns_and_errors(daemon: LocalDaemon) -> None:
    async def run() -> None:
        async with AsyncBroker(daemon.address) as broker:
            await broker.wait_ready()
            assert await broker.contract_matches()
            session = await broker.create_session("agent", window_tokens=100_000, alpha=0.5)
            assert session.totals.budget_tokens == 50_000
            first = await broker.admit("agent", [user(CONSTRAINT)])
            assert first.spans[0].span_class == pb.SPAN_CLASS_CONSTRAINT and first.turn == 1
            second = await broker.admit("agent", [user("Deploy web."), tool(tool_output(1))])
            assert [s.span_id for s in second.spans] == [2, 3] and not second.replayed
            context = await broker.get_context("agent")
            assert [role for role, _ in context.messages()] == ["user", "user", "tool"]
            assert (await broker.get_span("agent", 3)).tokens == 83
            hits = [h async for h in broker.search_spans("agent", "rollout", page_size=1)]
            assert [h.span_id for h in hits] == [3]
            listed = [h async for h in broker.list_spans("agent", page_size=2)]
            assert [h.span_id for h in listed] == [1, 2, 3]
            updated = await broker.update_session("agent", alpha=0.6)
            assert updated.totals.budget_tokens == 60_000

            for i in range(3):
                await broker.create_session(f"more-{i}", window_tokens=400)
            ids = [s.session_id async for s in broker.list_sessions(page_size=2)]
            assert ids == ["agent", "more-0", "more-1", "more-2"]

            exported = await broker.export_session("agent")
            assert await broker.delete_session("agent") == 3
            imported = await broker.import_session(exported.snapshot)
            assert imported.session.session_id == "agent"
            assert [s.span_id for s in (await broker.get_context("agent")).spans] == [1, 2, 3]

            with pytest.raises(errors.AlreadyExists) as exists:
                await broker.create_session("agent", window_tokens=400)
            assert exists.value.reason == "SESSION_EXISTS"
            with pytest.raises(errors.SessionNotFound) as missing:
                await broker.get_context("nobody")
            assert missing.value.metadata["session_id"] == "nobody"
            with pytest.raises(errors.InvalidArgument) as empty:
                await broker.admit("agent", [])
            assert any(v.field == "spans" for v in empty.value.field_violations)

    asyncio.run(run())


def test_the_async_watch_resumes_across_restarts(daemon: LocalDaemon) -> None:
    async def run() -> None:
        async with AsyncBroker(daemon.address) as broker:
            await broker.create_session("w", window_tokens=400)
            await broker.admit("w", [user(CONSTRAINT)])
            replied: list[pb.CompactionMarker] = []

            async def admit(numbers: range) -> None:
                for i in numbers:
                    admitted = await broker.admit("w", [tool(tool_output(i))])
                    if admitted.compaction is not None:
                        replied.append(admitted.compaction)

            seen: list[pb.CompactionMarker] = []
            reconnects: list[int | None] = []
            watch = broker.watch(max_backoff=0.5, on_reconnect=lambda s, e: reconnects.append(s))

            async def collect() -> None:
                async for marker in watch:
                    seen.append(marker)

            async def arrived(seq: int) -> None:
                while not seen or seen[-1].seq < seq:
                    if task.done():
                        task.result()  # raises what ended the watch
                        raise AssertionError(f"the watch ended at {[m.seq for m in seen]}")
                    await asyncio.sleep(0.02)

            async def until(seq: int) -> None:
                await asyncio.wait_for(arrived(seq), 30)

            task = asyncio.create_task(collect())
            await admit(range(1, 6))  # markers 1, 2
            await until(2)
            await asyncio.wait_for(watch.caught_up.wait(), 10)
            await asyncio.to_thread(daemon.restart, kill=True)
            await admit(range(6, 9))
            await until(5)
            await asyncio.to_thread(daemon.restart)
            await admit(range(9, 11))
            await until(7)
            watch.close()
            await asyncio.wait_for(task, 10)

            assert [m.seq for m in seen] == list(range(1, 8))
            assert seen == replied
            assert watch.reconnects >= 2 and len(reconnects) >= 2
            assert watch.last_seq == 7 and watch.next_seq == 8
            # The orderly restart said where to resume, and it was right.
            assert watch.resume_hints and watch.resume_hints[-1] == 6

    asyncio.run(run())


def test_the_async_watch_raises_what_retrying_cannot_fix(daemon: LocalDaemon) -> None:
    async def run() -> None:
        async with AsyncBroker(daemon.address) as broker:
            watch = broker.watch(session_ids=["bad id with spaces"])
            with pytest.raises(errors.InvalidArgument):
                await watch.__anext__()

    asyncio.run(run())
