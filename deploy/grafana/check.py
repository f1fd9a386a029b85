#!/usr/bin/env python3
"""Checks the Grafana dashboard against the metrics a real daemon serves.

Starts `ctxbrokerd` (the path given, default target/debug/ctxbrokerd) on
a temporary data directory with `--metrics-addr` on a free loopback port,
scrapes `/metrics`, and fails when the dashboard is not valid JSON, has a
panel without a query, or queries a `ctxbroker_*` series the daemon does
not export (a histogram's `_bucket`, `_sum` and `_count` count as its
family).
"""

import json
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

DASHBOARD = Path(__file__).with_name("ctxbroker.json")
SERIES = re.compile(r"\bctxbroker_[a-z0-9_]+")
SUFFIXES = ("_bucket", "_sum", "_count")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def exported(binary: str) -> set[str]:
    """The metric families a freshly started daemon exports."""
    port = free_port()
    with tempfile.TemporaryDirectory() as data:
        daemon = subprocess.Popen(
            [binary, "--listen", "127.0.0.1:0", "--data-dir", data,
             "--metrics-addr", f"127.0.0.1:{port}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                        text = r.read().decode()
                    break
                except OSError:
                    if daemon.poll() is not None or time.monotonic() > deadline:
                        raise SystemExit(f"the daemon served no metrics on port {port}")
                    time.sleep(0.1)
        finally:
            daemon.terminate()
            daemon.wait(timeout=30)
    return {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}


def queried(dashboard: dict) -> tuple[set[str], list[str]]:
    """Every ctxbroker series the panels query, and panels with no query."""
    names, empty = set(), []
    for panel in dashboard.get("panels", []):
        if panel.get("type") == "row":
            continue
        exprs = [t.get("expr", "") for t in panel.get("targets", [])]
        if not any(exprs):
            empty.append(panel.get("title", "?"))
        for expr in exprs:
            names.update(SERIES.findall(expr))
    return names, empty


def family(name: str, families: set[str]) -> str:
    for suffix in SUFFIXES:
        if name.endswith(suffix) and name[: -len(suffix)] in families:
            return name[: -len(suffix)]
    return name


def main() -> int:
    binary = sys.argv[1] if len(sys.argv) > 1 else "target/debug/ctxbrokerd"
    dashboard = json.loads(DASHBOARD.read_text())
    families = exported(binary)
    names, empty = queried(dashboard)
    unknown = sorted(n for n in names if family(n, families) not in families)
    unused = sorted(families - {family(n, families) for n in names})
    panels = sum(1 for p in dashboard.get("panels", []) if p.get("type") != "row")
    print(f"{DASHBOARD.name}: {panels} panels query {len(names)} series; the daemon exports {len(families)} families")
    if unused:
        print(f"families no panel shows: {', '.join(unused)}")
    if empty:
        print(f"FAILED: panels without a query: {empty}")
    if unknown:
        print(f"FAILED: series the daemon does not export: {unknown}")
    return 1 if unknown or empty else 0


if __name__ == "__main__":
    sys.exit(main())
