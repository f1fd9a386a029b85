"""The client over a Unix domain socket: a daemon started with
``--listen-unix``, reached as ``unix:/path``."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from conftest import CONSTRAINT, REPO

from ctxbroker_client import Broker, find_binary, user


def test_the_client_reaches_a_daemon_on_a_unix_socket(tmp_path: Path) -> None:
    socket = tmp_path / "ctxbroker.sock"
    daemon = subprocess.Popen(
        [
            str(find_binary(REPO)),
            "--listen-unix",
            str(socket),
            "--data-dir",
            str(tmp_path / "data"),
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        while not socket.exists():
            assert daemon.poll() is None, daemon.stderr.read() if daemon.stderr else ""
            assert time.monotonic() < deadline, "no socket within 30 s"
            time.sleep(0.02)
        with Broker(f"unix:{socket}", timeout=10) as broker:
            broker.wait_ready(timeout=10)
            broker.create_session("over-uds", window_tokens=4000)
            admitted = broker.admit("over-uds", [user(CONSTRAINT)])
            assert admitted.spans[0].span_class == 2  # SPAN_CLASS_CONSTRAINT
            assert broker.get_session("over-uds").turns == 1
    finally:
        daemon.terminate()
        assert daemon.wait(30) == 0
    assert not socket.exists(), "the daemon removes its socket at a clean stop"
