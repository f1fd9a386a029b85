"""The LangChain adapter against a real daemon and the real packages, with
a stand-in chat model (no network)."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from frameworks import framework

from ctxbroker_client import Broker, LocalDaemon

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "langchain_agent.py"


def example() -> ModuleType:
    framework("langchain.agents")
    spec = importlib.util.spec_from_file_location("langchain_agent", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # Registered first: the example's type hints are resolved through it.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_messages_come_back_as_they_were_added(daemon: LocalDaemon) -> None:
    framework("langchain_core")
    adapter = importlib.import_module("ctxbroker_client.adapters.langchain")
    messages_mod = importlib.import_module("langchain_core.messages")
    messages = [
        messages_mod.HumanMessage("Never write to the `prod` namespace; stage only.", id="m1"),
        messages_mod.AIMessage(
            "",
            id="m2",
            tool_calls=[
                {"name": "kubectl_apply", "args": {"namespace": "staging"}, "id": "c1"},
                {"name": "kubectl_apply", "args": {"namespace": "qa"}, "id": "c2"},
            ],
        ),
        messages_mod.ToolMessage("configured", tool_call_id="c1", name="kubectl_apply", id="m3"),
        messages_mod.ToolMessage("configured", tool_call_id="c2", name="kubectl_apply", id="m4"),
    ]
    with Broker(daemon.address) as broker:
        history = adapter.CtxbrokerChatMessageHistory.open(broker, "lc-msgs", window_tokens=8000)
        history.add_messages(messages[:2])
        history.add_messages(messages[2:])
        assert history.messages == messages
        context = broker.get_context("lc-msgs")
        assert context.spans[0].span_class == 2, "the user's rule is pinned unlabelled"
        # One exchange for the AI message and both its results.
        assert [s.tool_call_id for s in context.spans[1:]] == ["c1", "c1", "c1"]
        # A fresh history (another process) joins a later result to it too.
        again = adapter.CtxbrokerChatMessageHistory(broker, "lc-msgs")
        again.add_messages([messages_mod.ToolMessage("late", tool_call_id="c2", id="m5")])
        assert broker.get_context("lc-msgs").spans[-1].tool_call_id == "c1"
        history.clear()
        assert history.messages == []
        assert broker.get_session("lc-msgs").config.window_tokens == 8000


def test_the_example_agent_keeps_its_rule_through_compactions(daemon: LocalDaemon) -> None:
    summary = example().run(daemon.address, "lc-agent", steps=8, window=1200)
    assert summary["compactions"] > 0 and summary["archived_spans"] > 0, summary
    assert summary["namespaces"] == ["staging"] * 8, summary
    assert summary["last_call_keeps_constraint"], summary
    # The state keeps every message; the model was given fewer.
    assert summary["last_call_messages"] < summary["state_messages"], summary
    assert summary["orphans"] == 0, summary
