#!/usr/bin/env python3
"""A LlamaIndex chat engine whose memory ctxbroker keeps.

A ``SimpleChatEngine`` with :class:`~ctxbroker_client.adapters.llamaindex.CtxbrokerMemory`
in a small window: every message goes to the broker, and the model is
given the broker's context. The user states a rule once, at the start;
after every answer the rollout tool's long log is put in the memory as a
tool message, as an agent's tool step would, so the broker compacts as the
logs pile up.

The model is a stand-in (no network, no key): it deploys to ``prod``
unless a rule in its prompt forbids that. With the broker keeping the
rule pinned through every compaction, every answer stages.

    python examples/llamaindex_agent.py --addr 127.0.0.1:50051 --steps 6

With ``--json`` the last line is a JSON summary of the run.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.chat_engine import SimpleChatEngine
from llama_index.core.llms import CompletionResponse, CompletionResponseGen, CustomLLM, LLMMetadata

from ctxbroker_client import Broker
from ctxbroker_client.adapters.llamaindex import CtxbrokerMemory

CONSTRAINT = "Never write to the `prod` namespace; stage only."


def forbids_prod(prompt: str) -> bool:
    """Whether the prompt says not to write to prod."""
    return "prod` namespace" in prompt and "never" in prompt.lower()


class StandInLLM(CustomLLM):
    """Answers with the namespace it would deploy to; records its prompts."""

    prompts: list[str] = []

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(model_name="stand-in")

    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        self.prompts.append(prompt)
        namespace = "staging" if forbids_prod(prompt) else "prod"
        return CompletionResponse(text=f"Deploying to {namespace}.")

    def stream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseGen:
        yield self.complete(prompt, formatted, **kwargs)


def rollout_log(step: int) -> str:
    return "\n".join(
        f"deployment.apps/web-{step}-{i} configured; rollout {i} waiting: 2 of 3 replicas "
        f"ready, probe /healthz on port 8080 returned 503 after 30s"
        for i in range(6)
    )


def run(addr: str, session_id: str, steps: int, window: int) -> dict[str, Any]:
    llm = StandInLLM(prompts=[])
    answers = []
    with Broker(addr) as broker:
        memory = CtxbrokerMemory.from_defaults(
            broker=broker, session_id=session_id, window_tokens=window
        )
        engine = SimpleChatEngine.from_defaults(llm=llm, memory=memory)
        for step in range(1, steps + 1):
            request = f"Roll out release {step}."
            if step == 1:
                request = f"{CONSTRAINT} {request}"
            answers.append(str(engine.chat(request)))
            memory.put(
                ChatMessage(
                    role="tool",
                    content=rollout_log(step),
                    additional_kwargs={"tool_call_id": f"rollout_{step}", "name": "rollout"},
                )
            )
        for answer in answers:
            print(answer)
        session = broker.get_session(session_id)
    return {
        "answers": answers,
        "compactions": session.compactions,
        "archived_spans": session.archived_spans,
        "last_prompt_keeps_constraint": forbids_prod(llm.prompts[-1]),
        "first_log_in_last_prompt": rollout_log(1) in llm.prompts[-1],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--addr", required=True, help="the daemon, host:port")
    parser.add_argument("--session", default="llamaindex-example")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--window", type=int, default=1200, help="the window, in tokens")
    parser.add_argument("--json", action="store_true", help="print a JSON summary last")
    args = parser.parse_args(argv)
    summary = run(args.addr, args.session, args.steps, args.window)
    if args.json:
        print(json.dumps(summary))
    return 0 if all("staging" in a for a in summary["answers"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
