#!/usr/bin/env python3
"""An agent loop that lets ctxbroker own its context window.

Every turn goes to the broker before it enters the prompt: the user's
message, the model's reply, and each tool result — some of them tens of
thousands of tokens of logs. The prompt is built from ``GetContext`` alone.
A watcher thread prints every compaction marker as it is committed.

The model here is a stand-in (no network): it reads its prompt the way a
real model would be steered by it. Asked to roll a fix out, it targets the
``prod`` namespace unless a constraint in its prompt forbids that, in which
case it stages. So the loop shows the compaction cliff being avoided: the
user's constraint is admitted once, at the start, and however much tool
output is compacted away, every later action still stages.

    python examples/agent_loop.py --addr 127.0.0.1:50051 --steps 8

With ``--json`` the last line is a JSON summary of the run.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import threading
import time
from dataclasses import dataclass, field

from ctxbroker_client import Broker, Context, assistant, errors, pb, tool, user, watch_in_thread

CONSTRAINT = "Never write to the `prod` namespace; stage only."
SYSTEM_PROMPT = "You are a deployment agent. Use the kubectl tool; report what you did."
TRIGGERS = {
    value: name.removeprefix("COMPACTION_TRIGGER_") for name, value in pb.CompactionTrigger.items()
}
OUTCOMES = {
    value: name.removeprefix("COMPACTION_OUTCOME_") for name, value in pb.CompactionOutcome.items()
}


class StandInModel:
    """Decides the next tool call from the prompt it is given, like a model
    that obeys what its context says and knows nothing else."""

    FORBIDDEN = re.compile(r"never write to the `([\w.-]+)` namespace", re.IGNORECASE)

    def respond(self, prompt: list[tuple[str, str]], task: str) -> tuple[str, str]:
        """Returns (reply text, namespace the tool call writes to)."""
        forbidden = {m.group(1) for _, text in prompt for m in self.FORBIDDEN.finditer(text)}
        namespace = "staging" if "prod" in forbidden else "prod"
        service = re.search(r"web-\d+", task)
        target = service.group(0) if service else "web"
        manifest = f"k8s/{namespace}/{target}.yaml"
        reply = f"Applying the fix for {target}: kubectl -n {namespace} apply -f {manifest}"
        if namespace == "staging":
            reply += " (prod is off limits; staging only)"
        return reply, namespace


def run_tool(step: int, namespace: str, big_tokens: int, rng: random.Random) -> str:
    """A stand-in kubectl: a short result, or on big steps a rollout log of
    about ``big_tokens`` tokens (43 per line)."""
    ready, seconds = rng.randint(1, 3), rng.randint(20, 300)
    head = (
        f"kubectl -n {namespace} apply -f k8s/{namespace}/web-{step}.yaml: "
        f"deployment.apps/web-{step} configured; rollout status: {ready}/3 replicas ready "
        f"after {seconds}s."
    )
    if big_tokens <= 0:
        return head
    lines = [head]
    for i in range(max(1, big_tokens // 43)):
        lines.append(
            f"2026-12-02T18:{i // 60 % 60:02d}:{i % 60:02d}Z web-{step} pod/web-{step}-5f9c "
            f"{namespace} error: upstream connect error or disconnect/reset before headers, "
            "retried 3 times"
        )
    return "\n".join(lines)


@dataclass
class Run:
    """What a run did, for the summary."""

    steps: int = 0
    namespaces: list[str] = field(default_factory=list)
    markers: list[dict] = field(default_factory=list)
    admitted_markers: list[int] = field(default_factory=list)
    max_live: int = 0
    budget: int = 0
    big_results: list[int] = field(default_factory=list)
    constraint_in_final_context: bool = False


def prompt_of(context: Context) -> list[tuple[str, str]]:
    """The chat messages, built from the live context only."""
    return [("system", SYSTEM_PROMPT), *context.messages()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--addr", default="127.0.0.1:50051", help="the daemon's host:port")
    parser.add_argument(
        "--session", default=f"agent-{int(time.time())}", help="session id to create"
    )
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--window", type=int, default=128_000, help="the model's window in tokens")
    parser.add_argument(
        "--big-every", type=int, default=3, help="every Nth tool result is a large log"
    )
    parser.add_argument(
        "--big-tokens", type=int, default=60_000, help="about this many tokens per large log"
    )
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", action="store_true", help="print a JSON summary as the last line")
    args = parser.parse_args(argv)

    rng = random.Random(args.seed)
    model = StandInModel()
    out = Run()
    printing = threading.Lock()

    def say(line: str) -> None:
        with printing:
            print(line, flush=True)

    with Broker(args.addr) as broker:
        session = broker.create_session(args.session, window_tokens=args.window)
        out.budget = session.totals.budget_tokens
        say(f"session {args.session}: window {args.window}, budget {out.budget} tokens")

        # Watch this session's markers from the next one to be written.
        first_seq = broker.server_info().next_marker_seq
        watch = broker.watch(from_seq=first_seq, session_ids=[args.session])

        def on_marker(marker: pb.CompactionMarker) -> None:
            out.markers.append(
                {
                    "seq": marker.seq,
                    "trigger": TRIGGERS.get(marker.trigger, str(marker.trigger)),
                    "outcome": OUTCOMES.get(marker.outcome, str(marker.outcome)),
                    "tokens_before": marker.tokens_before,
                    "tokens_after": marker.tokens_after,
                    "evicted": len(marker.evicted_span_ids),
                    "pinned_retained": marker.pinned_retained,
                    "pinned_total": marker.pinned_total,
                }
            )
            row = out.markers[-1]
            say(
                f"  marker {marker.seq}: {row['trigger']} {row['outcome']} "
                f"{marker.tokens_before} -> {marker.tokens_after} tokens, "
                f"evicted {row['evicted']}, pinned {marker.pinned_retained}/{marker.pinned_total}, "
                f"anchors dropped {marker.anchors_dropped}"
            )

        watcher, failures = watch_in_thread(watch, on_marker)
        try:
            broker.admit(args.session, [user(CONSTRAINT)])
            for step in range(1, args.steps + 1):
                task = f"Rollout of web-{step} is failing its health probe; apply the fix."
                broker.admit(args.session, [user(task)])
                context = broker.get_context(args.session)
                reply, namespace = model.respond(prompt_of(context), task)
                broker.admit(args.session, [assistant(reply)])
                out.namespaces.append(namespace)

                big = args.big_every > 0 and step % args.big_every == 0
                result = run_tool(step, namespace, args.big_tokens if big else 0, rng)
                try:
                    admitted = broker.admit(args.session, [tool(result)])
                except errors.CompactionInvariant as refused:
                    # Never fits, whatever is compacted: keep a note instead.
                    size = refused.incoming_tokens
                    say(f"step {step}: tool result refused ({size} tokens never fit)")
                    note = f"{result[:400]}\n[{size} tokens of output not admitted]"
                    admitted = broker.admit(args.session, [tool(note)])
                tokens = admitted.spans[0].tokens
                if big:
                    out.big_results.append(tokens)
                if admitted.compaction is not None:
                    out.admitted_markers.append(admitted.compaction.seq)
                live = admitted.totals.live_tokens
                out.max_live = max(out.max_live, live)
                out.steps = step
                say(
                    f"step {step}: wrote to {namespace}; tool result {tokens} tokens; "
                    f"live {live}/{admitted.totals.budget_tokens}"
                    + (
                        f"; compacted (marker {admitted.compaction.seq})"
                        if admitted.compaction
                        else ""
                    )
                )

            final = broker.get_context(args.session)
            out.constraint_in_final_context = any(s.text == CONSTRAINT for s in final.constraints())
            # Every marker an admission reported reaches the watcher.
            last = max(out.admitted_markers, default=0)
            deadline = time.monotonic() + 30
            while (watch.next_seq or 0) <= last and time.monotonic() < deadline and not failures:
                time.sleep(0.05)
        finally:
            watch.close()
            watcher.join(10)
        if failures:
            raise failures[0]

    say(
        f"done: {out.steps} steps, {len(out.markers)} markers, "
        f"max live {out.max_live}/{out.budget}, namespaces {sorted(set(out.namespaces))}, "
        f"constraint kept: {out.constraint_in_final_context}"
    )
    if args.json:
        print(json.dumps(out.__dict__), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
