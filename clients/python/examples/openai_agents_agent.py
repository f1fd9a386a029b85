#!/usr/bin/env python3
"""An OpenAI Agents SDK agent whose history ctxbroker keeps.

The agent deploys with a ``kubectl`` tool whose output is long; its history
is a :class:`~ctxbroker_client.adapters.openai_agents.BrokerSession` in a
small window, so the broker compacts it as the tool output piles up. The
user says once, at the start, not to touch ``prod``.

The model is a stand-in (no network, no key): it reads its input the way a
real model would be steered by it, deploying to ``prod`` unless a rule in
its input forbids that. Every call it makes is printed; with the broker
keeping the rule pinned through every compaction, every one stages.

    python examples/openai_agents_agent.py --addr 127.0.0.1:50051 --steps 6

With ``--json`` the last line is a JSON summary of the run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from agents import Agent, ModelSettings, Runner, function_tool
from agents.items import ModelResponse, TResponseInputItem, TResponseStreamEvent
from agents.models.interface import Model, ModelTracing
from agents.usage import Usage
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from ctxbroker_client import AsyncBroker
from ctxbroker_client.adapters.openai_agents import BrokerSession

CONSTRAINT = "Never write to the `prod` namespace; stage only."


def forbids_prod(items: list[TResponseInputItem] | str) -> bool:
    """Whether a message of the input says not to write to prod."""
    text = items if isinstance(items, str) else json.dumps(items)
    return "prod` namespace" in text and "never" in text.lower()


class StandInModel(Model):
    """Calls ``kubectl`` once per user request, then reports. The
    namespace is ``staging`` if its input forbids ``prod``, else
    ``prod``. Records every input it was given."""

    def __init__(self) -> None:
        self.inputs: list[list[TResponseInputItem] | str] = []
        self.namespaces: list[str] = []
        self.calls = 0

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Any],
        output_schema: Any,
        handoffs: list[Any],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: Any,
    ) -> ModelResponse:
        self.inputs.append(input)
        self.calls += 1
        last = input[-1] if isinstance(input, list) and input else {}
        if isinstance(last, dict) and last.get("type") == "function_call_output":
            text = f"Rolled out: {str(last.get('output', ''))[:40]}"
            output: list[Any] = [
                ResponseOutputMessage(
                    id=f"msg_{self.calls}",
                    content=[ResponseOutputText(annotations=[], text=text, type="output_text")],
                    role="assistant",
                    status="completed",
                    type="message",
                )
            ]
        else:
            namespace = "staging" if forbids_prod(input) else "prod"
            self.namespaces.append(namespace)
            output = [
                ResponseFunctionToolCall(
                    arguments=json.dumps({"namespace": namespace, "step": self.calls}),
                    call_id=f"call_{self.calls}",
                    name="kubectl_apply",
                    type="function_call",
                    id=f"fc_{self.calls}",
                    status="completed",
                )
            ]
        return ModelResponse(output=output, usage=Usage(), response_id=None)

    def stream_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Any],
        output_schema: Any,
        handoffs: list[Any],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: Any,
    ) -> AsyncIterator[TResponseStreamEvent]:
        raise NotImplementedError("the stand-in model does not stream")


@function_tool
def kubectl_apply(namespace: str, step: int) -> str:
    """Applies the release manifest to a namespace and returns the log."""
    lines = [
        f"deployment.apps/web-{step}-{i} configured in namespace {namespace}; "
        f"rollout {i} waiting: 2 of 3 replicas ready, probe /healthz on port 8080 returned 503"
        for i in range(6)
    ]
    return "\n".join(lines)


async def run(addr: str, session_id: str, steps: int, window: int) -> dict[str, Any]:
    model = StandInModel()
    agent = Agent(
        name="deployer", instructions="Deploy with kubectl.", model=model, tools=[kubectl_apply]
    )
    async with AsyncBroker(addr) as broker:
        session = await BrokerSession.open(broker, session_id, window_tokens=window)
        await Runner.run(agent, f"{CONSTRAINT} Roll out release 1.", session=session)
        for step in range(2, steps + 1):
            await Runner.run(agent, f"Roll out release {step}.", session=session)
        for namespace in model.namespaces:
            print(f"kubectl_apply --namespace {namespace}")
        state = await broker.get_session(session_id)
        items = await session.get_items()
    return {
        "namespaces": model.namespaces,
        "compactions": state.compactions,
        "archived_spans": state.archived_spans,
        "items": len(items),
        "last_input_keeps_constraint": forbids_prod(model.inputs[-1]),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--addr", required=True, help="the daemon, host:port")
    parser.add_argument("--session", default="openai-agents-example")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--window", type=int, default=1200, help="the window, in tokens")
    parser.add_argument("--json", action="store_true", help="print a JSON summary last")
    args = parser.parse_args(argv)
    summary = asyncio.run(run(args.addr, args.session, args.steps, args.window))
    if args.json:
        print(json.dumps(summary))
    return 0 if all(n == "staging" for n in summary["namespaces"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
