"""The types users get: mypy --strict accepts correct use of the messages,
the stub and both clients, and rejects a misspelt field, a wrong message
and a wrong result type. Runs where mypy is installed (the newest stack of
.ci/clients.sh)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

GOOD = """
import asyncio
from ctxbroker_client import AsyncBroker, Broker, pb, user

def sync(broker: Broker) -> int:
    request = pb.AdmitRequest(session_id="s", spans=[user("hi")])
    reply: pb.AdmitResponse = broker.stub.Admit(request, metadata=broker.session_metadata("s"))
    admitted = broker.admit("s", [user("hi")], idempotency_key="k")
    role: pb.Role.ValueType = admitted.spans[0].role
    return reply.turn + admitted.turn + role

async def run(broker: AsyncBroker) -> list[str]:
    context = await broker.get_context("s")
    ids = [s.session_id async for s in broker.list_sessions()]
    async for marker in broker.watch(session_ids=["s"]):
        ids.append(marker.session_id)
    return ids + [text for _, text in context.messages()]
"""

BAD = """
from ctxbroker_client import AsyncBroker, Broker, pb

def sync(broker: Broker) -> str:
    pb.AdmitRequest(session="s")
    broker.stub.Admit(pb.GetContextRequest(session_id="s"))
    return broker.get_context("s").turn

async def run(broker: AsyncBroker) -> int:
    return await broker.get_span("s", "1")
"""


def mypy(tmp_path: Path, source: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "use.py"
    path.write_text(source)
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(path)],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
    )


def test_correct_use_type_checks_and_mistakes_do_not(tmp_path: Path) -> None:
    pytest.importorskip("mypy")
    good = mypy(tmp_path, GOOD)
    assert good.returncode == 0, good.stdout
    bad = mypy(tmp_path, BAD)
    assert bad.returncode == 1
    for line, what in [
        (5, 'Unexpected keyword argument "session"'),
        (6, '"GetContextRequest"'),
        (7, 'incompatible return value type (got "int", expected "str")'),
        (10, '"get_span" of "AsyncBroker" has incompatible type "str"'),
        (10, 'incompatible return value type (got "Span", expected "int")'),
    ]:
        assert any(
            f"use.py:{line}:" in out and what.lower() in out.lower()
            for out in bad.stdout.splitlines()
        ), (line, what, bad.stdout)
