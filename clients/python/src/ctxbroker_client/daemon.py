"""Runs a local ``ctxbrokerd`` for tests and examples.

The socket is bound here first (``127.0.0.1:0``) and handed to the daemon
with ``--listen-fd``, so the address is known before the daemon starts and
never changes: a restart hands the same socket to the new process, and
clients reconnect to the same address. Readiness is the gRPC health check
answering SERVING — the kernel queues connections on the bound socket from
the start, so nothing sleeps waiting for a port.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2

from .client import Tls, channel, health_check


class DaemonFailed(RuntimeError):
    """The daemon exited or did not become ready; the message ends with the
    tail of its log."""


def find_binary(repo_root: Path | None = None) -> Path:
    """``$CTXBROKERD``, else ``target/debug/ctxbrokerd`` (then release) under
    ``repo_root``."""
    configured = os.environ.get("CTXBROKERD")
    if configured:
        path = Path(configured)
        if not path.is_file():
            raise FileNotFoundError(f"CTXBROKERD={configured} is not a file")
        return path
    if repo_root is not None:
        for profile in ("debug", "release"):
            path = repo_root / "target" / profile / "ctxbrokerd"
            if path.is_file():
                return path
    raise FileNotFoundError(
        "no ctxbrokerd binary: set CTXBROKERD or run `cargo build --bin ctxbrokerd`"
    )


class LocalDaemon:
    """One ``ctxbrokerd`` process on a socket bound here, with its own data
    directory (a fresh temporary one unless ``data_dir`` is given)."""

    def __init__(
        self,
        binary: Path,
        *,
        data_dir: Path | None = None,
        args: Sequence[str] = (),
        ready_timeout: float = 60.0,
        tls: Tls | None = None,
    ) -> None:
        self.binary = Path(binary)
        self._temp = None if data_dir else tempfile.mkdtemp(prefix="ctxbroker-")
        base = Path(self._temp) if self._temp else Path(data_dir or ".")
        #: The data directory, kept across restarts.
        self.data_dir = Path(data_dir) if data_dir else base / "data"
        #: Where the daemon's stderr goes (appended across restarts).
        self.log_path = (base if self._temp else self.data_dir.parent) / "ctxbrokerd.log"
        self.args = list(args)
        self.ready_timeout = ready_timeout
        #: How the readiness check reaches a daemon that serves TLS (its
        #: ``--tls-*`` files are among ``args``).
        self.tls = tls
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.bind(("127.0.0.1", 0))
        self._socket.listen(1024)
        host, port = self._socket.getsockname()
        #: ``host:port`` to connect to.
        self.address = f"{host}:{port}"
        self.process: subprocess.Popen[bytes] | None = None
        #: How many times the daemon was started.
        self.starts = 0

    def __enter__(self) -> LocalDaemon:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def pid(self) -> int | None:
        """The running process id."""
        return self.process.pid if self.process else None

    def start(self) -> None:
        """Starts the daemon and waits until it serves."""
        if self.process is not None and self.process.poll() is None:
            raise RuntimeError("the daemon is already running")
        fd = self._socket.fileno()
        env = dict(os.environ)
        env.setdefault("CTXBROKER_LOG", "info")
        with open(self.log_path, "ab") as log:
            log.write(f"--- start {self.starts + 1}\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                [
                    str(self.binary),
                    "--listen-fd",
                    str(fd),
                    "--data-dir",
                    str(self.data_dir),
                    "--shutdown-grace-ms",
                    "3000",
                    *self.args,
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                pass_fds=(fd,),
                env=env,
            )
        self.starts += 1
        self.wait_ready()

    def wait_ready(self) -> None:
        """Waits until the health check says SERVING; raises
        :class:`DaemonFailed` if the process exits or the deadline passes."""
        deadline = time.monotonic() + self.ready_timeout
        with channel(self.address, self.tls) as ready:
            health = health_check(ready)
            while True:
                if self.process is None or self.process.poll() is not None:
                    raise DaemonFailed(f"ctxbrokerd exited during start\n{self.log_tail()}")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise DaemonFailed(
                        f"ctxbrokerd not ready in {self.ready_timeout}s\n{self.log_tail()}"
                    )
                try:
                    # Bounded so an exit during start is noticed.
                    reply = health(
                        health_pb2.HealthCheckRequest(service=""),
                        timeout=min(1.0, remaining),
                        wait_for_ready=True,
                    )
                except grpc.RpcError as err:
                    if err.code() not in (
                        grpc.StatusCode.DEADLINE_EXCEEDED,
                        grpc.StatusCode.UNAVAILABLE,
                    ):
                        raise DaemonFailed(
                            f"health check failed: {err}\n{self.log_tail()}"
                        ) from None
                    continue
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return

    def kill(self) -> None:
        """``kill -9``: no flush, no goodbye."""
        self._signal_and_wait(signal.SIGKILL, 30.0)

    def terminate(self, timeout: float = 30.0) -> int:
        """SIGTERM, then waits for the orderly shutdown; returns the exit
        code. Raises :class:`DaemonFailed` if it does not exit in time."""
        return self._signal_and_wait(signal.SIGTERM, timeout)

    def _signal_and_wait(self, sig: signal.Signals, timeout: float) -> int:
        process = self.process
        if process is None or process.poll() is not None:
            return process.returncode if process else 0
        process.send_signal(sig)
        try:
            return process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise DaemonFailed(
                f"ctxbrokerd ignored {sig.name} for {timeout}s\n{self.log_tail()}"
            ) from None

    def restart(self, *, kill: bool = False) -> None:
        """Stops the daemon (SIGKILL when ``kill``, else SIGTERM) and starts
        it again on the same data directory and socket."""
        if kill:
            self.kill()
        else:
            code = self.terminate()
            if code != 0:
                raise DaemonFailed(f"ctxbrokerd exited with {code} on SIGTERM\n{self.log_tail()}")
        self.start()

    def close(self) -> None:
        """Stops the daemon, closes the socket, removes a temporary data
        directory."""
        try:
            if self.process is not None and self.process.poll() is None:
                try:
                    self.terminate(10.0)
                except DaemonFailed:
                    pass
        finally:
            self._socket.close()
            if self._temp:
                shutil.rmtree(self._temp, ignore_errors=True)

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the daemon's log."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])
