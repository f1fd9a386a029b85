"""The example agent loop, run for a few steps against the real daemon."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

from ctxbroker_client import LocalDaemon

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "agent_loop.py"


def load_example():
    spec = importlib.util.spec_from_file_location("agent_loop", EXAMPLE)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look themselves up
    spec.loader.exec_module(module)
    return module


def test_the_stand_in_model_obeys_only_what_its_prompt_says() -> None:
    model = load_example().StandInModel()
    task = "Rollout of web-3 is failing its health probe; apply the fix."
    _, unconstrained = model.respond([("user", task)], task)
    _, constrained = model.respond(
        [("user", "Never write to the `prod` namespace; stage only."), ("user", task)], task
    )
    assert (unconstrained, constrained) == ("prod", "staging")


def test_agent_loop_keeps_its_constraint_through_compactions(daemon: LocalDaemon) -> None:
    run = subprocess.run(
        [
            sys.executable,
            str(EXAMPLE),
            "--addr",
            daemon.address,
            "--session",
            "agent",
            "--steps",
            "6",
            "--window",
            "32000",
            "--big-every",
            "2",
            "--big-tokens",
            "20000",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr + run.stdout
    lines = run.stdout.strip().splitlines()
    summary = json.loads(lines[-1])

    assert summary["steps"] == 6
    assert summary["budget"] == 27200  # floor(0.85 * 32000)
    assert summary["max_live"] <= summary["budget"]
    # Three large tool results, each about 20k tokens, were admitted whole.
    assert len(summary["big_results"]) == 3
    assert all(19_000 <= tokens <= 21_000 for tokens in summary["big_results"])
    # The window forced compactions, and the watcher thread logged every one
    # of them, contiguous from the first marker ever written.
    seqs = [m["seq"] for m in summary["markers"]]
    assert len(summary["admitted_markers"]) >= 2
    assert seqs == list(range(1, len(seqs) + 1))
    assert set(summary["admitted_markers"]) <= set(seqs)
    for marker in summary["markers"]:
        assert marker["outcome"] == "COMMITTED"
        assert marker["tokens_after"] < marker["tokens_before"]
        # Every pinned span survived (the constraint, and any task turn the
        # classifier pinned with it).
        assert marker["pinned_retained"] == marker["pinned_total"] >= 1
        assert any(line.startswith(f"  marker {marker['seq']}: ") for line in lines)
    # The constraint stood in every prompt: the model never touched prod.
    assert summary["namespaces"] == ["staging"] * 6
    assert summary["constraint_in_final_context"] is True
