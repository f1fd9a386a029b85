"""Several ``ctxbrokerd`` on loopback, each with its own data directory,
behind a real HAProxy configured by ``deploy/haproxy/render.py``.

Every listening socket is bound here, on port 0, and handed to the process
that serves it (``--listen-fd`` for a broker, ``bind fd@N`` for HAProxy):
no port is guessed. A broker's socket is closed here once the broker
holds it, so a broker killed with ``kill -9`` refuses connections, as a
lost machine would, and HAProxy answers its calls 503 (gRPC UNAVAILABLE).
It starts again on the same port and data directory.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import grpc
from ctxbroker_client import Broker, BrokerError, DaemonFailed, find_binary

REPO = Path(__file__).resolve().parents[2]
RENDER = REPO / "deploy" / "haproxy" / "render.py"


def load_render() -> ModuleType:
    """deploy/haproxy/render.py as a module."""
    spec = importlib.util.spec_from_file_location("haproxy_render", RENDER)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {RENDER}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def listening_socket(port: int = 0) -> socket.socket:
    """A TCP socket listening on 127.0.0.1:``port`` (0: any free port)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(1024)
    return sock


def wait_serving(address: str, process: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    """Waits until ``address`` answers a health check; fails if the process
    exits first or the deadline passes."""
    deadline = time.monotonic() + timeout
    with Broker(address) as broker:
        while True:
            if process.poll() is not None:
                raise DaemonFailed(f"exited during start:\n{tail(log)}")
            try:
                broker.wait_ready(timeout=min(1.0, max(0.1, deadline - time.monotonic())))
                return
            except (grpc.RpcError, BrokerError):
                if time.monotonic() > deadline:
                    raise DaemonFailed(f"not serving in {timeout}s:\n{tail(log)}") from None


def tail(log: Path, lines: int = 30) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class Replica:
    """One broker: its name on the ring, its port and data directory."""

    def __init__(self, name: str, root: Path, binary: Path) -> None:
        self.name = name
        self.binary = binary
        self.data_dir = root / name / "data"
        self.log = root / name / "ctxbrokerd.log"
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        sock = listening_socket(self.port)
        self.port = sock.getsockname()[1]
        env = dict(os.environ)
        env.setdefault("CTXBROKER_LOG", "info")
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [
                    str(self.binary),
                    "--listen-fd",
                    str(sock.fileno()),
                    "--data-dir",
                    str(self.data_dir),
                    "--shutdown-grace-ms",
                    "3000",
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                pass_fds=(sock.fileno(),),
                env=env,
            )
        # The broker holds the socket now: once it dies, the port refuses.
        sock.close()
        wait_serving(self.address, self.process, self.log, 60.0)

    def kill(self) -> None:
        """``kill -9``."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(30)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


class Proxy:
    """HAProxy in the foreground, configured for the given replicas."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.config = root / "haproxy.cfg"
        self.log = root / "haproxy.log"
        self.sock = listening_socket()
        self.port = self.sock.getsockname()[1]
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, replicas: Sequence[Replica]) -> None:
        """(Re)starts HAProxy over ``replicas``, on the same socket."""
        self.stop()
        render = load_render()
        text = render.render(
            [(r.name, r.address) for r in replicas], bind=f"fd@{self.sock.fileno()}"
        )
        self.config.write_text(text)
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [haproxy_binary(), "-db", "-f", str(self.config)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                pass_fds=(self.sock.fileno(),),
            )
        wait_serving(self.address, self.process, self.log, 30.0)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(30)


def haproxy_binary() -> str:
    found = shutil.which("haproxy") or (
        "/usr/sbin/haproxy" if Path("/usr/sbin/haproxy").is_file() else None
    )
    if found is None:
        raise FileNotFoundError("haproxy is not installed (Debian: apt install haproxy)")
    return found


class Cluster:
    """Brokers ``r0``..``rN-1`` behind one HAProxy."""

    def __init__(self, replicas: int) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="ctxbroker-cluster-"))
        self.binary = find_binary(REPO)
        self.replicas = [Replica(f"r{n}", self.root, self.binary) for n in range(replicas)]
        self.proxy = Proxy(self.root)

    def __enter__(self) -> Cluster:
        try:
            for replica in self.replicas:
                replica.start()
            self.proxy.start(self.replicas)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def add(self) -> Replica:
        """Starts one more broker and puts it on the ring (HAProxy is
        restarted with the new configuration, on the same socket)."""
        replica = Replica(f"r{len(self.replicas)}", self.root, self.binary)
        replica.start()
        self.replicas.append(replica)
        self.proxy.start(self.replicas)
        return replica

    def close(self) -> None:
        self.proxy.stop()
        for replica in self.replicas:
            replica.stop()
        self.proxy.sock.close()
        shutil.rmtree(self.root, ignore_errors=True)


def main(argv: Sequence[str]) -> int:
    """``python tests/scaleout/cluster.py [N]``: N brokers (3 by default)
    behind HAProxy until interrupted, their addresses printed. Needs the
    client package (``pip install clients/python``) and a built
    ``ctxbrokerd`` (``$CTXBROKERD``, else target/debug or target/release)."""
    count = int(argv[0]) if argv else 3
    # SIGTERM stops them as Ctrl-C does: through the cleanup below.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with Cluster(count) as cluster:
        for replica in cluster.replicas:
            print(f"{replica.name}: {replica.address}  (data: {replica.data_dir})")
        print(f"proxy: {cluster.proxy.address}  (config: {cluster.proxy.config})")
        print("Ctrl-C (or SIGTERM) stops them all.", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
