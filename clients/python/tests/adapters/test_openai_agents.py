"""The OpenAI Agents SDK adapter against a real daemon and the real SDK,
with a stand-in model (no network)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from frameworks import framework

from ctxbroker_client import AsyncBroker, LocalDaemon

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "openai_agents_agent.py"


def example() -> ModuleType:
    framework("agents")
    spec = importlib.util.spec_from_file_location("openai_agents_agent", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # Registered first: the example's type hints are resolved through it.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def adapter() -> ModuleType:
    framework("agents")
    return importlib.import_module("ctxbroker_client.adapters.openai_agents")


def test_items_come_back_as_they_were_added(daemon: LocalDaemon) -> None:
    mod = adapter()
    items: list[Any] = [
        {"role": "user", "content": "Never write to the `prod` namespace; stage only."},
        {
            "role": "assistant",
            "content": [{"type": "output_text", "text": "ok", "annotations": []}],
        },
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "kubectl_apply",
            "arguments": '{"namespace": "staging"}',
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "configured"},
    ]

    async def go() -> None:
        async with AsyncBroker(daemon.address) as broker:
            session = await mod.BrokerSession.open(broker, "oa-items", window_tokens=8000)
            await session.add_items(items)
            assert await session.get_items() == items
            assert await session.get_items(limit=2) == items[-2:]
            context = await broker.get_context("oa-items")
            assert context.spans[0].span_class == 2, "the user's rule is pinned unlabelled"
            assert [s.tool_call_id for s in context.spans[2:]] == ["call_1", "call_1"]
            assert context.spans[2].tool_name == "kubectl_apply"
            # pop_item takes back the newest item, then the one before.
            assert await session.pop_item() == items[3]
            assert await session.pop_item() == items[2]
            assert await session.get_items() == items[:2]
            await session.clear_session()
            assert await session.get_items() == []
            assert await session.pop_item() is None
            # The session goes on after a clear, with its settings.
            await session.add_items(items[:1])
            assert await session.get_items() == items[:1]
            state = await broker.get_session("oa-items")
            assert state.config.window_tokens == 8000

    asyncio.run(go())


def test_the_example_agent_keeps_its_rule_through_compactions(daemon: LocalDaemon) -> None:
    mod = example()
    summary = asyncio.run(mod.run(daemon.address, "oa-agent", steps=8, window=1200))
    assert summary["compactions"] > 0 and summary["archived_spans"] > 0, summary
    assert summary["namespaces"] == ["staging"] * 8, summary
    assert summary["last_input_keeps_constraint"], summary


def test_no_tool_output_without_its_call_after_compactions(daemon: LocalDaemon) -> None:
    mod = example()

    async def go() -> list[Any]:
        await mod.run(daemon.address, "oa-pairs", steps=10, window=1000)
        async with AsyncBroker(daemon.address) as broker:
            session = adapter().BrokerSession(broker, "oa-pairs")
            return list(await session.get_items())

    items = asyncio.run(go())
    calls = {i["call_id"] for i in items if i.get("type") == "function_call"}
    outputs = {i["call_id"] for i in items if i.get("type") == "function_call_output"}
    assert calls == outputs, json.dumps(items)[:2000]
    assert calls, "some exchanges are still live"
