"""The top README's Python quick start, run as a reader would run it, against
a fresh daemon (its address in place of the default one): it must run and
print the turn, the live tokens and the prompt it shows."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

from ctxbroker_client.daemon import LocalDaemon

REPO = Path(__file__).resolve().parents[3]
DEFAULT_ADDRESS = "127.0.0.1:50051"


def quick_start() -> str:
    text = (REPO / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)
    assert blocks, "README.md has a Python quick start"
    return blocks[0]


def test_the_readme_python_quick_start_runs(daemon: LocalDaemon) -> None:
    code = quick_start()
    assert DEFAULT_ADDRESS in code
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code.replace(DEFAULT_ADDRESS, daemon.address), "README.md", "exec"), {})
    lines = out.getvalue().splitlines()
    turn, live, compaction = lines[0].split()
    assert (turn, compaction) == ("2", "None")
    assert int(live) > 0
    assert any("Never write to the `prod` namespace" in line for line in lines[1:])
    assert any("k8s/staging/web.yaml" in line for line in lines[1:])
