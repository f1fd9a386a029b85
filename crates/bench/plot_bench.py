#!/usr/bin/env python3
"""Plots the raw samples `ctxbroker-bench admit|plan|watch --csv` write.

    pip install matplotlib
    python3 crates/bench/plot_bench.py admit admit.csv docs/img/admit-latency.png
    python3 crates/bench/plot_bench.py plan plan.csv docs/img/plan-growth.png
    python3 crates/bench/plot_bench.py watch watch.csv docs/img/watch-delivery.png

admit: one panel per row of the table, the latency of every recorded
request as a histogram on log-spaced bins (replies that carried a
compaction stacked in orange), p50 and p99 marked; the latency probes
(one client, no-op and Admit alternating) on the right.

plan: the time of every run against live spans on log-log axes, the
medians joined (admit = plan + apply + verify, and plan alone), with an
n log n guide through the smallest size's median admit.

watch: delivery latency of every (marker, watcher) pair from the
admitting client's send, as a histogram on log-spaced bins with p50, p99
and the 10 ms target marked; beside it, the fraction of deliveries later
than x, from the send and from the admitting client's reply.

Quantiles are the bench's own: the sorted value at round((n - 1) * p),
and the median of a size's runs in `plan` is the upper one, so the marks
match the printed tables.
"""

import argparse
import csv
import math
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

TARGET_DELIVERY_MS = 10.0

# The table's loaded rows, in its order: (row, server, panel title).
ADMIT_ROWS = [
    ("no-op GetServerInfo", "ctxbroker, durable", "no-op GetServerInfo, durable daemon"),
    ("Admit, durable", "ctxbroker, durable", "Admit, durable (--durability flush)"),
    ("no-op GetServerInfo", "ctxbroker, relaxed", "no-op GetServerInfo, relaxed daemon"),
    ("Admit, relaxed", "ctxbroker, relaxed", "Admit, relaxed (--durability relaxed)"),
    ("Redis RPUSH, appendfsync always", "redis-server", "Redis RPUSH, appendfsync always"),
]
PROBE_SERVERS = [
    ("ctxbroker, durable", "probe, durable daemon (1 client)"),
    ("ctxbroker, relaxed", "probe, relaxed daemon (1 client)"),
]
PROBE_ROWS = [
    ("probe: no-op GetServerInfo", "no-op", "tab:gray"),
    ("probe: Admit, short user message", "Admit", "tab:blue"),
]


def quantile(sorted_values, p):
    """The bench's quantile: the value at round((n - 1) * p)."""
    if not sorted_values:
        return float("nan")
    at = int(math.floor((len(sorted_values) - 1) * p + 0.5))
    return sorted_values[min(at, len(sorted_values) - 1)]


def log_bins(values, per_decade=24):
    lo = max(min(values), 1e-3)
    hi = max(max(values), lo * 1.01)
    first, last = math.log10(lo), math.log10(hi)
    n = max(int((last - first) * per_decade) + 1, 10)
    return [10 ** (first + (last - first) * k / n) for k in range(n + 1)]


def mark_quantiles(ax, values, unit, color="black", label=""):
    p50, p99 = quantile(values, 0.5), quantile(values, 0.99)
    ax.axvline(p50, color=color, ls="--", lw=1, label=f"{label}p50 {p50:,.0f} {unit}")
    ax.axvline(p99, color=color, ls=":", lw=1.3, label=f"{label}p99 {p99:,.0f} {unit}")


# admit


def load_admit(path):
    rows = defaultdict(lambda: ([], []))
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            plain, compacted = rows[(r["row"], r["server"])]
            (compacted if r["compacted"] == "1" else plain).append(float(r["latency_us"]))
    return rows


def plot_admit(args):
    rows = load_admit(args.csv)
    loaded = [(key, title) for *key, title in ADMIT_ROWS if tuple(key) in rows]
    probes = [(s, t) for s, t in PROBE_SERVERS if any((r, s) in rows for r, _, _ in PROBE_ROWS)]
    if not loaded:
        sys.exit(f"no row of the admit table in {args.csv}")
    height = max(len(loaded), 2 * len(probes), 1)
    fig = plt.figure(figsize=(14, 2.3 * height + 1))
    grid = fig.add_gridspec(height, 2, width_ratios=[3, 2])

    everything = [v for key, _ in loaded for part in rows[tuple(key)] for v in part]
    bins = log_bins(everything)
    first = None
    for i, (key, title) in enumerate(loaded):
        ax = fig.add_subplot(grid[i, 0], sharex=first)
        first = first or ax
        plain, compacted = rows[tuple(key)]
        ax.hist(
            [plain, compacted], bins=bins, stacked=True, color=["tab:blue", "tab:orange"],
            label=[f"no compaction ({len(plain):,})", f"with a compaction ({len(compacted):,})"],
        )
        mark_quantiles(ax, sorted(plain + compacted), "µs")
        ax.set_xscale("log")
        ax.set_title(title, loc="left", fontsize=10)
        ax.set_ylabel("requests")
        ax.legend(fontsize=7.5, loc="upper right")
        ax.grid(axis="x", which="both", color="0.9", lw=0.5)
        if i < len(loaded) - 1:
            ax.tick_params(labelbottom=False)
        else:
            ax.set_xlabel("latency, µs (log scale)")

    if probes:
        span = height // len(probes)
        everything = [
            v
            for s, _ in probes
            for r, _, _ in PROBE_ROWS
            for part in rows.get((r, s), ([], []))
            for v in part
        ]
        bins = log_bins(everything, per_decade=40)
        top = None
        ax = None
        for j, (server, title) in enumerate(probes):
            ax = fig.add_subplot(grid[j * span:(j + 1) * span, 1], sharex=top)
            top = top or ax
            for row, label, color in PROBE_ROWS:
                plain, compacted = rows.get((row, server), ([], []))
                values = sorted(plain + compacted)
                if not values:
                    continue
                ax.hist(
                    values, bins=bins, histtype="step", color=color, lw=1.2,
                    label=f"{label} ({len(values):,})",
                )
                mark_quantiles(ax, values, "µs", color=color, label=f"{label} ")
            ax.set_xscale("log")
            ax.set_title(title, loc="left", fontsize=10)
            ax.set_ylabel("requests")
            ax.legend(fontsize=7.5, loc="upper right")
            ax.grid(axis="x", which="both", color="0.9", lw=0.5)
        ax.set_xlabel("latency, µs (log scale)")

    fig.suptitle(
        "ctxbroker-bench admit: latency of every recorded request, per row "
        "(dashed p50, dotted p99)",
        fontsize=12,
    )
    fig.tight_layout()
    fig.savefig(args.png, dpi=100)


# plan


def upper_median(values):
    values = sorted(values)
    return values[len(values) // 2]


def plot_plan(args):
    runs = defaultdict(list)
    with open(args.csv, newline="") as f:
        for r in csv.DictReader(f):
            runs[int(r["live_spans"])].append((float(r["admit_ms"]), float(r["plan_ms"])))
    if not runs:
        sys.exit(f"no run in {args.csv}")
    sizes = sorted(runs)
    fig, ax = plt.subplots(figsize=(9, 6))
    parts = [(0, "admit (plan + apply + verify)", "tab:blue"), (1, "plan", "tab:green")]
    for part, label, color in parts:
        xs = [n for n in sizes for _ in runs[n]]
        ys = [run[part] for n in sizes for run in runs[n]]
        ax.plot(xs, ys, "o", ms=4, alpha=0.45, color=color, mec="none")
        medians = [upper_median([run[part] for run in runs[n]]) for n in sizes]
        ax.plot(sizes, medians, "-", lw=1.5, color=color, label=f"{label}, median")
        if part == 0:
            for n, m in zip(sizes, medians):
                ax.annotate(
                    f"{m:,.1f} ms", (n, m), textcoords="offset points", xytext=(6, -12), fontsize=8
                )
            n0, m0 = sizes[0], medians[0]
            # Enough points that the guide is a smooth curve on log axes.
            guide_n = [n0 * (sizes[-1] / n0) ** (k / 50) for k in range(51)]
            ax.plot(
                guide_n, [m0 * (n * math.log2(n)) / (n0 * math.log2(n0)) for n in guide_n],
                "--", color="0.4", lw=1, label=f"n log n through {n0:,} spans",
            )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("live spans (log scale)")
    ax.set_ylabel("ms (log scale)")
    repeats = max(len(v) for v in runs.values())
    ax.set_title(
        "ctxbroker-bench plan: one compacting admission against live spans "
        f"({repeats} runs per size)",
        fontsize=11,
    )
    ax.grid(which="both", color="0.9", lw=0.5)
    ax.legend(fontsize=9, loc="upper left")
    fig.tight_layout()
    fig.savefig(args.png, dpi=100)


# watch


def plot_watch(args):
    send, reply, watchers = [], [], set()
    with open(args.csv, newline="") as f:
        for r in csv.DictReader(f):
            watchers.add(r["watcher"])
            send.append(float(r["from_send_us"]) / 1e3)
            reply.append(float(r["from_reply_us"]) / 1e3)
    if not send:
        sys.exit(f"no delivery in {args.csv}")
    send.sort()
    reply.sort()
    fig, (hist, tail) = plt.subplots(
        1, 2, figsize=(14, 5.5), gridspec_kw={"width_ratios": [3, 2]}
    )

    hist.hist(
        send, bins=log_bins(send, per_decade=40), color="tab:blue",
        label=f"from send ({len(send):,} deliveries)",
    )
    p50, p99 = quantile(send, 0.5), quantile(send, 0.99)
    hist.axvline(p50, color="black", ls="--", lw=1, label=f"p50 {p50:.2f} ms")
    hist.axvline(p99, color="black", ls=":", lw=1.3, label=f"p99 {p99:.2f} ms")
    hist.axvline(
        TARGET_DELIVERY_MS, color="tab:red", lw=1.3,
        label=f"target: p99 ≤ {TARGET_DELIVERY_MS:g} ms",
    )
    hist.set_xscale("log")
    hist.set_xlabel("delivery latency from the admitting client's send, ms (log scale)")
    hist.set_ylabel("deliveries")
    hist.legend(fontsize=8.5, loc="upper left")
    hist.grid(axis="x", which="both", color="0.9", lw=0.5)

    series = [(send, "from send", "tab:blue"), (reply, "from reply", "tab:purple")]
    for values, label, color in series:
        n = len(values)
        later = [1.0 - (k + 1) / n for k in range(n)]
        # The last point has nothing later; keep it on the log axis.
        later[-1] = 0.5 / n
        p50, p99 = quantile(values, 0.5), quantile(values, 0.99)
        tail.step(
            values, later, where="post", color=color, lw=1.2,
            label=f"{label}: p50 {p50:.2f}, p99 {p99:.2f} ms",
        )
    tail.axhline(0.01, color="0.5", ls=":", lw=1, label="1 % later (p99)")
    tail.axvline(TARGET_DELIVERY_MS, color="tab:red", lw=1.3, label=f"{TARGET_DELIVERY_MS:g} ms")
    tail.set_yscale("log")
    tail.set_xlabel("delivery latency, ms")
    tail.set_ylabel("fraction of deliveries later")
    tail.legend(fontsize=8.5, loc="upper right")
    tail.grid(which="both", color="0.9", lw=0.5)

    fig.suptitle(
        f"ctxbroker-bench watch: delivery of every marker to {len(watchers):,} watchers "
        "(reply: negative when the watcher was first)",
        fontsize=12,
    )
    fig.tight_layout()
    fig.savefig(args.png, dpi=100)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    for name, run in [("admit", plot_admit), ("plan", plot_plan), ("watch", plot_watch)]:
        p = sub.add_parser(name, help=f"from `ctxbroker-bench {name} --csv`")
        p.add_argument("csv")
        p.add_argument("png")
        p.set_defaults(run=run)
    args = ap.parse_args()
    args.run(args)


if __name__ == "__main__":
    main()
