#!/usr/bin/env python3
"""Plots live tokens over time per policy from `ctxbroker-bench replay --csv`.

    pip install matplotlib
    python3 crates/bench/plot_replay.py replay.csv docs/img/replay-live-tokens.png

One panel per policy, for one session (--session, default 0): live tokens
over simulated hours, W as a dashed line, the budget alpha*W as a dotted
one, compactions as markers (those with no turn since the previous
compaction, i.e. while idle, in orange), lost turns as red crosses at the
size they would have brought the context to, idle gaps (no turn for more
than --idle-min minutes) shaded.
"""

import argparse
import csv
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

POLICIES = [
    ("cadence", "(a) 90 s cadence, oldest 60%"),
    ("relevance", "(b) relevance-only eviction"),
    ("ctxbroker", "(c) ctxbroker"),
]


def load(path, session):
    rows = defaultdict(list)
    window = None
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            if int(r["session"]) != session:
                continue
            rows[r["policy"]].append(
                (
                    float(r["t_s"]) / 3600.0,
                    int(r["live_tokens"]) / 1000.0,
                    int(r["demand_tokens"]) / 1000.0,
                    r["event"],
                )
            )
            window = int(r["window_tokens"]) / 1000.0
    return rows, window


def idle_spans(points, idle_h):
    arrivals = [t for t, _, _, e in points if e in ("admit", "lost")]
    return [(a, b) for a, b in zip(arrivals, arrivals[1:]) if b - a > idle_h]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("png")
    ap.add_argument("--session", type=int, default=0)
    ap.add_argument("--alpha", type=float, default=0.85)
    ap.add_argument("--idle-min", type=float, default=10.0)
    args = ap.parse_args()

    rows, window = load(args.csv, args.session)
    if not rows or window is None:
        sys.exit(f"no rows for session {args.session} in {args.csv}")

    fig, axes = plt.subplots(len(POLICIES), 1, figsize=(14, 10), sharex=True, sharey=True)
    top = window * 1.12
    for _t, _live, demand, event in (p for pts in rows.values() for p in pts):
        if event == "lost":
            top = max(top, demand * 1.05)
    for ax, (key, label) in zip(axes, POLICIES):
        points = rows.get(key, [])
        for a, b in idle_spans(points, args.idle_min / 60.0):
            ax.axvspan(a, b, color="0.92", lw=0)
        t = [p[0] for p in points]
        live = [p[1] for p in points]
        ax.plot(t, live, color="tab:blue", lw=0.7, label="live tokens")
        ax.axhline(window, color="tab:red", ls="--", lw=1, label=f"W = {window:g}k")
        if key != "cadence":
            ax.axhline(
                window * args.alpha, color="0.4", ls=":", lw=1, label=f"budget {args.alpha:g}·W"
            )
        busy = [(p[0], p[1]) for p in points if p[3] == "compact"]
        idle = [(p[0], p[1]) for p in points if p[3] == "compact_idle"]
        lost = [(p[0], p[2]) for p in points if p[3] == "lost"]
        if busy:
            ax.plot(*zip(*busy), "v", ms=3.5, color="tab:green", label=f"compaction ({len(busy)})")
        if idle:
            ax.plot(
                *zip(*idle), "v", ms=3.5, color="tab:orange",
                label=f"compaction while idle ({len(idle)})",
            )
        if lost:
            ax.plot(*zip(*lost), "x", ms=8, mew=2, color="tab:red", label=f"turn lost ({len(lost)})")
        ax.set_title(label, loc="left", fontsize=11)
        ax.set_ylabel("thousand tokens")
        ax.set_ylim(0, top)
        ax.grid(axis="y", color="0.85", lw=0.5)
        ax.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, framealpha=0.9)
    axes[-1].set_xlabel(
        f"simulated hours (session {args.session}; grey: no turn for over {args.idle_min:g} min)"
    )
    fig.suptitle("Live tokens over time, one trace replayed through three policies", fontsize=12)
    fig.tight_layout()
    fig.savefig(args.png, dpi=110)


if __name__ == "__main__":
    main()
