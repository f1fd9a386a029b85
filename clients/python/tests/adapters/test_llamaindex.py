"""The LlamaIndex memory against a real daemon and the real package, with
a stand-in LLM (no network)."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from frameworks import framework

from ctxbroker_client import Broker, LocalDaemon

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "llamaindex_agent.py"


def example() -> ModuleType:
    framework("llama_index.core")
    spec = importlib.util.spec_from_file_location("llamaindex_agent", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # Registered first: the example's type hints are resolved through it.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_messages_come_back_as_they_were_put(daemon: LocalDaemon) -> None:
    types = framework("llama_index.core.base.llms.types")
    adapter = importlib.import_module("ctxbroker_client.adapters.llamaindex")
    chat = types.ChatMessage
    messages = [
        chat(role="user", content="Never write to the `prod` namespace; stage only."),
        chat(
            role="assistant",
            content="checking",
            additional_kwargs={"tool_calls": [{"id": "c1", "name": "kubectl"}]},
        ),
        chat(role="tool", content="3 pods", additional_kwargs={"tool_call_id": "c1"}),
    ]
    with Broker(daemon.address) as broker:
        memory = adapter.CtxbrokerMemory.from_defaults(
            broker=broker, session_id="li-msgs", window_tokens=8000
        )
        for m in messages:
            memory.put(m)
        assert memory.get() == messages
        assert memory.get_all() == messages
        context = broker.get_context("li-msgs")
        assert context.spans[0].span_class == 2, "the user's rule is pinned unlabelled"
        assert [s.tool_call_id for s in context.spans[1:]] == ["c1", "c1"]
        memory.set(messages[:1])
        assert memory.get() == messages[:1]
        memory.reset()
        assert memory.get() == []
        assert broker.get_session("li-msgs").config.window_tokens == 8000


def test_the_example_engine_keeps_its_rule_through_compactions(daemon: LocalDaemon) -> None:
    summary = example().run(daemon.address, "li-agent", steps=8, window=1200)
    assert summary["compactions"] > 0 and summary["archived_spans"] > 0, summary
    assert all("staging" in a for a in summary["answers"]), summary
    assert summary["last_prompt_keeps_constraint"], summary
    assert not summary["first_log_in_last_prompt"], "the oldest log was compacted away"
