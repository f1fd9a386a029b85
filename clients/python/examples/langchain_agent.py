#!/usr/bin/env python3
"""A LangChain v1 agent whose model sees the context ctxbroker keeps.

``create_agent`` with :class:`~ctxbroker_client.adapters.langchain.CtxbrokerMiddleware`:
before every model call the agent's new messages are admitted to the
broker, and the model is given the broker's context. The agent deploys
with a ``kubectl_apply`` tool whose output is long, in a small window, so
the broker compacts as the output piles up. The user says once, at the
start, not to touch ``prod``.

The model is a stand-in (no network, no key): it deploys to ``prod``
unless a rule in the messages it is given forbids that. With the broker
keeping the rule pinned through every compaction, every call stages.

    python examples/langchain_agent.py --addr 127.0.0.1:50051 --steps 6

With ``--json`` the last line is a JSON summary of the run.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from langchain.agents import create_agent
from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool

from ctxbroker_client import Broker
from ctxbroker_client.adapters.langchain import CtxbrokerChatMessageHistory, CtxbrokerMiddleware

CONSTRAINT = "Never write to the `prod` namespace; stage only."


def forbids_prod(messages: list[BaseMessage]) -> bool:
    """Whether a message says not to write to prod."""
    text = "\n".join(str(m.content) for m in messages)
    return "prod` namespace" in text and "never" in text.lower()


class StandInModel(BaseChatModel):
    """Calls ``kubectl_apply`` once per request, then reports; records
    the messages of every call."""

    seen: list[list[BaseMessage]] = []
    namespaces: list[str] = []

    @property
    def _llm_type(self) -> str:
        return "stand-in"

    def bind_tools(self, tools: Any, **kwargs: Any) -> StandInModel:  # type: ignore[override]
        return self

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        self.seen.append(list(messages))
        if messages and isinstance(messages[-1], ToolMessage):
            reply = AIMessage(content=f"Rolled out: {str(messages[-1].content)[:40]}")
        else:
            namespace = "staging" if forbids_prod(messages) else "prod"
            self.namespaces.append(namespace)
            n = len(self.namespaces)
            reply = AIMessage(
                content="",
                tool_calls=[
                    {
                        "name": "kubectl_apply",
                        "args": {"namespace": namespace, "step": n},
                        "id": f"call_{n}",
                        "type": "tool_call",
                    }
                ],
            )
        return ChatResult(generations=[ChatGeneration(message=reply)])


@tool
def kubectl_apply(namespace: str, step: int) -> str:
    """Applies the release manifest to a namespace and returns the log."""
    return "\n".join(
        f"deployment.apps/web-{step}-{i} configured in namespace {namespace}; "
        f"rollout {i} waiting: 2 of 3 replicas ready, probe /healthz on port 8080 returned 503"
        for i in range(6)
    )


def run(addr: str, session_id: str, steps: int, window: int) -> dict[str, Any]:
    model = StandInModel(seen=[], namespaces=[])
    with Broker(addr) as broker:
        history = CtxbrokerChatMessageHistory.open(broker, session_id, window_tokens=window)
        agent = create_agent(model, [kubectl_apply], middleware=[CtxbrokerMiddleware(history)])
        state: dict[str, Any] = {"messages": [HumanMessage(f"{CONSTRAINT} Roll out release 1.")]}
        state = agent.invoke(state)
        for step in range(2, steps + 1):
            messages = [*state["messages"], HumanMessage(f"Roll out release {step}.")]
            state = agent.invoke({"messages": messages})
        for namespace in model.namespaces:
            print(f"kubectl_apply --namespace {namespace}")
        session = broker.get_session(session_id)
    last = model.seen[-1]
    return {
        "namespaces": model.namespaces,
        "compactions": session.compactions,
        "archived_spans": session.archived_spans,
        "state_messages": len(state["messages"]),
        "last_call_messages": len(last),
        "last_call_keeps_constraint": forbids_prod(last),
        "orphans": orphans(model.seen),
    }


def orphans(calls: list[list[BaseMessage]]) -> int:
    """Tool messages given to the model without the AI message calling
    them, or calls given without their results (but for the newest)."""
    bad = 0
    for messages in calls:
        asked = {c["id"] for m in messages if isinstance(m, AIMessage) for c in m.tool_calls}
        answered = {m.tool_call_id for m in messages if isinstance(m, ToolMessage)}
        bad += len(answered - asked) + len(asked - answered)
    return bad


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--addr", required=True, help="the daemon, host:port")
    parser.add_argument("--session", default="langchain-example")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--window", type=int, default=1200, help="the window, in tokens")
    parser.add_argument("--json", action="store_true", help="print a JSON summary last")
    args = parser.parse_args(argv)
    summary = run(args.addr, args.session, args.steps, args.window)
    if args.json:
        print(json.dumps(summary))
    return 0 if all(n == "staging" for n in summary["namespaces"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
