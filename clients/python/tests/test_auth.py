"""The client with bearer tokens: a daemon started with a token file
(``--auth-tokens-file``) written here, two tenants' agents, a watcher and
an operator; each test with a freshly started daemon."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import CONSTRAINT, REPO, Collector

from ctxbroker_client import Broker, LocalDaemon, find_binary, pb, span, tool, user
from ctxbroker_client.errors import (
    InvalidArgument,
    PermissionDenied,
    SessionNotFound,
    Unauthenticated,
)

TOKENS = {
    "acme-agent": ("agent", "acme", "acme-agent-token-0123456789"),
    "beta-agent": ("agent", "beta", "beta-agent-token-0123456789"),
    "beta-watcher": ("watcher", "beta", "beta-watcher-token-012345"),
    "root": ("operator", None, "operator-token-0123456789ab"),
}


def token(token_id: str) -> str:
    return TOKENS[token_id][2]


def token_file(directory: Path) -> Path:
    """The token file: each token's SHA-256, never the token."""
    entries = []
    for token_id, (role, tenant, secret) in TOKENS.items():
        lines = [f'id = "{token_id}"', f'role = "{role}"']
        if tenant is not None:
            lines.append(f'tenant = "{tenant}"')
        lines.append(f'sha256 = "{hashlib.sha256(secret.encode()).hexdigest()}"')
        entries.append("[[token]]\n" + "\n".join(lines) + "\n")
    path = directory / "tokens.toml"
    path.write_text("\n".join(entries))
    return path


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[LocalDaemon]:
    with LocalDaemon(
        find_binary(REPO), args=["--auth-tokens-file", str(token_file(tmp_path))]
    ) as running:
        yield running


def client(daemon: LocalDaemon, token_id: str | None) -> Broker:
    secret = None if token_id is None else token(token_id)
    return Broker(daemon.address, timeout=10, token=secret)


def test_a_call_without_a_token_or_with_an_unknown_one_is_unauthenticated(daemon) -> None:
    for secret in (None, "not-a-token-of-this-daemon-0000"):
        with Broker(daemon.address, timeout=10, token=secret) as broker:
            with pytest.raises(Unauthenticated) as refused:
                broker.create_session("s1", window_tokens=4000)
            assert refused.value.reason == "UNAUTHENTICATED"
            if secret is not None:
                assert secret not in str(refused.value)
                assert secret not in repr(broker)
    # Health needs no token: the daemon's readiness check used it.
    with client(daemon, None) as broker:
        broker.wait_ready(timeout=10)


def test_a_watcher_reads_its_tenants_sessions_and_may_not_admit(daemon) -> None:
    with client(daemon, "beta-agent") as agent, client(daemon, "beta-watcher") as watcher:
        agent.create_session("s1", window_tokens=4000)
        agent.admit("s1", [user(CONSTRAINT)])
        assert watcher.get_session("s1").turns == 1
        assert [s.session_id for s in watcher.list_sessions()] == ["s1"]
        with pytest.raises(PermissionDenied) as refused:
            watcher.admit("s1", [user("hello")])
        assert refused.value.metadata["role"] == "watcher"
        assert refused.value.metadata["rpc"] == "Admit"


def test_each_tenant_sees_only_its_own_sessions_and_the_operator_sees_all(daemon) -> None:
    with (
        client(daemon, "acme-agent") as acme,
        client(daemon, "beta-agent") as beta,
        client(daemon, "root") as root,
    ):
        for broker, text in ((acme, "acme's secret plan"), (beta, "beta's own notes")):
            broker.create_session("s1", window_tokens=4000)
            broker.admit("s1", [tool(text)])
        for broker, own, other in (
            (acme, "acme's secret plan", "beta's own notes"),
            (beta, "beta's own notes", "acme's secret plan"),
        ):
            assert [s.session_id for s in broker.list_sessions()] == ["s1"]
            texts = [s.text for s in broker.get_context("s1").spans]
            assert texts == [own]
            assert other not in texts
        assert [s.session_id for s in root.list_sessions()] == ["acme/s1", "beta/s1"]
        assert [s.text for s in root.get_context("acme/s1").spans] == ["acme's secret plan"]
        # Another tenant's full id is no id a tenant can name.
        with pytest.raises(InvalidArgument, match="session_id"):
            beta.get_session("acme/s1")
        beta.delete_session("s1")
        with pytest.raises(SessionNotFound):
            beta.get_session("s1")
        assert acme.get_session("s1").turns == 1


def test_a_watch_with_a_token_sees_its_tenants_markers_with_the_token_as_actor(daemon) -> None:
    with client(daemon, "acme-agent") as acme, client(daemon, "beta-agent") as beta:
        watch = beta.watch(start=pb.WATCH_START_OLDEST)
        collector = Collector(watch)
        try:
            for broker in (acme, beta):
                broker.create_session("s1", window_tokens=4000)
                admitted = broker.admit(
                    "s1", [span(pb.ROLE_USER, CONSTRAINT, span_class=pb.SPAN_CLASS_CONSTRAINT)]
                )
                broker.unpin("s1", admitted.spans[0].span_id, reason="superseded")
            collector.until(2)
        finally:
            collector.stop()
        assert [(m.seq, m.session_id, m.actor) for m in collector.markers] == [
            (2, "s1", "beta-agent@beta")
        ]


def test_the_node_watcher_sends_its_token(daemon) -> None:
    node = shutil.which("node")
    assert node, "node is needed for the cross-language test"
    with client(daemon, "beta-agent") as beta:
        beta.create_session("s1", window_tokens=4000)
        admitted = beta.admit(
            "s1", [span(pb.ROLE_USER, CONSTRAINT, span_class=pb.SPAN_CLASS_CONSTRAINT)]
        )
        marker = beta.unpin("s1", admitted.spans[0].span_id, reason="done").marker

    def watch(env_token: str | None, *flags: str) -> subprocess.CompletedProcess:
        env = {"PATH": os.environ.get("PATH", "")}
        if env_token is not None:
            env["CTXBROKER_TOKEN"] = env_token
        return subprocess.run(
            [
                node,
                str(REPO / "clients" / "node" / "watch.js"),
                "--addr",
                daemon.address,
                "--from-seq",
                "1",
                "--until-seq",
                str(marker.seq),
                "--max-backoff-ms",
                "100",
                *flags,
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )

    for watched in (watch(token("beta-watcher")), watch(None, "--token", token("beta-watcher"))):
        assert watched.returncode == 0, watched.stderr
        seen = [json.loads(line) for line in watched.stdout.splitlines()]
        assert [(m["seq"], m["session_id"], m["actor"]) for m in seen] == [
            (marker.seq, "s1", "beta-agent@beta")
        ], seen
    refused = watch(None)
    assert refused.returncode != 0
    assert "code 16" in refused.stderr, refused.stderr
    assert token("beta-watcher") not in refused.stderr
