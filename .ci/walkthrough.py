#!/usr/bin/env python3
"""Runs README.md's "Walkthrough with grpcurl" against a fresh daemon and
checks every output the README shows, so the documentation cannot go stale.

The README is the test's only script. In that section, each ```sh block is
one step: its commands run in bash (with ``127.0.0.1:50051`` replaced by the
fresh daemon's address). The untagged ``` blocks that follow a step, up to
the next ```sh block, are what the step must print (stdout and stderr
together):

* A block whose first line is not indented and that has no ellipsis is the
  step's whole output.
* Any other block is an excerpt: each of its lines must appear in the
  output, in this order, other lines may come between; within a line, an
  ellipsis (``...`` or ``…``) stands for any text, and a line that is only
  an ellipsis stands for nothing in particular.

Comparison ignores whitespace (grpcurl prints arrays one item a line, the
README may write them on one), reads grpcurl's ``\\u003e``-style escapes as
the characters they are, and treats timestamps as equal. Values that
legitimately differ from run to run (``planId``, commits, digests) are read
from the output and substituted into the later commands and blocks.

A step whose output shows ``ERROR:`` must fail; every other step must exit
0. A step that calls a server-streaming method (found by reflection) is
interrupted, as a reader would with Ctrl-C, once its output matches.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SECTION = "Walkthrough with grpcurl"
README_ADDRESS = "127.0.0.1:50051"
ELLIPSIS = re.compile(r"\.\.\.|…")
TIMESTAMP = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?Z")
# Values that differ between runs: read from the output, substituted later.
VARYING = ("planId", "gitCommit", "contractDigest")
STEP_TIMEOUT = 60.0
# A stream that has not printed what the README shows by then never will.
STREAM_TIMEOUT = 15.0
# How long a stream interrupted once it matched may take to exit, counted
# from the interruption, before it is killed (what it printed stands).
INTERRUPT_GRACE = 10.0


@dataclass
class Step:
    """One ```sh block and the output blocks that follow it."""

    line: int
    commands: str
    expected: list[tuple[int, str]] = field(default_factory=list)


def read_steps(readme: Path) -> list[Step]:
    """The steps of the walkthrough section, in order."""
    lines = readme.read_text().splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip() == f"## {SECTION}"), None)
    if start is None:
        raise SystemExit(f"{readme}: no section '## {SECTION}'")
    steps: list[Step] = []
    i = start + 1
    while i < len(lines) and not lines[i].startswith("## "):
        fence = re.match(r"^```(\S*)\s*$", lines[i])
        if not fence:
            i += 1
            continue
        lang, first = fence.group(1), i + 1
        i += 1
        body = []
        while i < len(lines) and not lines[i].startswith("```"):
            body.append(lines[i])
            i += 1
        i += 1  # closing fence
        text = "\n".join(body)
        if lang in ("sh", "bash", "shell"):
            steps.append(Step(line=first, commands=text))
        elif lang == "":
            if not steps:
                raise SystemExit(f"{readme}:{first}: an output block before any command")
            steps[-1].expected.append((first, text))
    if not steps:
        raise SystemExit(f"{readme}: the section '{SECTION}' has no ```sh blocks")
    return steps


def squash(text: str) -> str:
    """Whitespace removed, timestamps made equal."""
    return re.sub(r"\s+", "", TIMESTAMP.sub("<timestamp>", text))


def unescape(output: str) -> str:
    """grpcurl's JSON escapes of <, > and & read as the characters."""
    return re.sub(r"\\u00(3c|3e|26)", lambda m: chr(int(m.group(1), 16)), output, flags=re.I)


def is_whole(block: str) -> bool:
    """Whether a block is the whole output rather than an excerpt."""
    first = next((line for line in block.splitlines() if line.strip()), "")
    return not ELLIPSIS.search(block) and not first[:1].isspace()


def pieces(block: str) -> list[tuple[str, str]]:
    """(squashed piece, source line) to find in order."""
    out = []
    for line in block.splitlines():
        for part in ELLIPSIS.split(line):
            squashed = squash(part)
            if squashed:
                out.append((squashed, line))
    return out


def matches(block: str, output: str) -> tuple[bool, str]:
    """Whether ``output`` satisfies ``block``; else the line not found."""
    actual = squash(unescape(output))
    if is_whole(block):
        if actual == squash(block):
            return True, ""
        return False, "(the block is the whole output, and it differs)"
    position = 0
    for piece, source in pieces(block):
        found = actual.find(piece, position)
        if found < 0:
            return False, source
        position = found + len(piece)
    return True, ""


def capture_varying(block: str, output: str, values: dict[str, str]) -> None:
    """Maps each varying value the README shows to the one the daemon gave."""
    for key in VARYING:
        shown = re.findall(rf'"{key}":\s*"([^"]+)"', block)
        given = re.findall(rf'"{key}":\s*"([^"]+)"', output)
        # Only as many as both show; a count mismatch fails the comparison.
        for readme_value, actual_value in zip(shown, given, strict=False):
            if readme_value != actual_value:
                values[readme_value] = actual_value


def substitute(text: str, values: dict[str, str]) -> str:
    for readme_value, actual_value in values.items():
        text = text.replace(readme_value, actual_value)
    return text


def streaming_methods(address: str, env: dict[str, str]) -> set[str]:
    """Server-streaming methods of every service, by reflection."""
    listed = subprocess.run(
        ["grpcurl", "-plaintext", address, "list"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    if listed.returncode != 0:
        raise SystemExit(f"grpcurl list failed: {listed.stderr}")
    methods = set()
    for service in listed.stdout.split():
        described = subprocess.run(
            ["grpcurl", "-plaintext", address, "describe", service],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        for name in re.findall(r"rpc (\w+) \([^)]*\) returns \( stream ", described.stdout):
            methods.add(f"{service}/{name}")
    return methods


def run_step(
    commands: str, env: dict[str, str], cwd: str, done_when_matched: str | None
) -> tuple[str, int | None, bool]:
    """Runs the commands; returns (output, exit code or None when it had to
    be killed, interrupted). With ``done_when_matched``, the step is
    interrupted once its output matches that block."""
    process = subprocess.Popen(
        ["bash", "-c", "set -eo pipefail\n" + commands],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
        cwd=cwd,
        start_new_session=True,
    )
    assert process.stdout is not None
    chunks: list[bytes] = []
    timeout = STEP_TIMEOUT if done_when_matched is None else STREAM_TIMEOUT
    deadline = time.monotonic() + timeout
    interrupted = False
    fd = process.stdout.fileno()
    started = time.monotonic()
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            os.killpg(process.pid, signal.SIGKILL)
            code = process.wait()
            elapsed = time.monotonic() - started
            if interrupted:
                # It printed what the README shows and was interrupted,
                # but did not exit in time: the output stands.
                chunks.append(
                    f"\n[walkthrough: killed {INTERRUPT_GRACE:.0f} s after Ctrl-C]\n".encode()
                )
                return b"".join(chunks).decode(errors="replace"), code, True
            chunks.append(f"\n[walkthrough: killed after {elapsed:.1f} s]\n".encode())
            return b"".join(chunks).decode(errors="replace"), None, True
        ready, _, _ = select.select([fd], [], [], remaining)
        if not ready:
            continue
        data = os.read(fd, 65536)
        if not data:
            break
        chunks.append(data)
        if done_when_matched is not None and not interrupted:
            if matches(done_when_matched, b"".join(chunks).decode(errors="replace"))[0]:
                os.killpg(process.pid, signal.SIGINT)
                interrupted = True
                deadline = time.monotonic() + INTERRUPT_GRACE
    code = process.wait()
    return b"".join(chunks).decode(errors="replace"), code, interrupted


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--readme", type=Path, default=REPO / "README.md")
    parser.add_argument("--binary", type=Path, help="ctxbrokerd (default: $CTXBROKERD or target/)")
    parser.add_argument(
        "--show", action="store_true", help="print every step's output, passing ones too"
    )
    args = parser.parse_args()

    from ctxbroker_client import LocalDaemon, find_binary

    steps = read_steps(args.readme)
    label = args.readme.name
    binary = args.binary or find_binary(REPO)
    env = dict(os.environ)
    passed = failed = unchecked = 0
    with LocalDaemon(binary) as daemon, tempfile.TemporaryDirectory() as cwd:
        streaming = streaming_methods(daemon.address, env)
        print(f"walkthrough: {len(steps)} steps from {args.readme}, daemon at {daemon.address}")
        values: dict[str, str] = {}
        for number, step in enumerate(steps, 1):
            commands = substitute(step.commands, values).replace(README_ADDRESS, daemon.address)
            expected = [(line, substitute(block, values)) for line, block in step.expected]
            whole = "\n".join(block for _, block in expected)
            is_stream = any(f"{method}" in commands for method in streaming)
            output, code, interrupted = run_step(
                commands, env, cwd, whole if (is_stream and expected) else None
            )
            problems = []
            wants_error = bool(expected) and expected[0][1].lstrip().startswith("ERROR:")
            if code is None:
                problems.append(
                    "the stream never printed what the README shows"
                    if is_stream and expected
                    else f"did not finish in {STEP_TIMEOUT:.0f} s"
                )
            elif not interrupted:
                if wants_error and code == 0:
                    problems.append("succeeded, but the README shows an error")
                if not wants_error and code != 0:
                    problems.append(f"exited {code}")
            for _, block in expected:
                capture_varying(block, output, values)
            for line, block in expected:
                ok, missing = matches(substitute(block, values), output)
                if not ok:
                    diff = "\n".join(
                        difflib.unified_diff(
                            [row.strip() for row in substitute(block, values).splitlines()],
                            [row.strip() for row in unescape(output).splitlines()],
                            f"{label}:{line} (expected)",
                            "actual",
                            lineterm="",
                        )
                    )
                    problems.append(
                        f"output does not match {label}:{line}; "
                        f"not found: {missing.strip()}\n{diff}"
                    )
            title = step.commands.strip().splitlines()[0][:90]
            if problems:
                failed += 1
                print(f"FAIL step {number} ({label}:{step.line}) {title}")
                for problem in problems:
                    print("  " + problem.replace("\n", "\n  "))
                print("  --- output ---\n  " + output.rstrip().replace("\n", "\n  "))
            else:
                passed += 1
                checked = (
                    f"{len(expected)} output block(s) checked" if expected else "exit status only"
                )
                if not expected:
                    unchecked += 1
                print(f"ok   step {number} ({label}:{step.line}) {title} [{checked}]")
                if args.show:
                    print("  " + output.rstrip().replace("\n", "\n  "))
    if unchecked:
        print(
            f"walkthrough: {unchecked} step(s) show no output in the README; "
            "only their exit status was checked"
        )
    print(f"walkthrough: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
