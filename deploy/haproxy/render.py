#!/usr/bin/env python3
# The template below holds HAProxy lines as HAProxy reads them.
# ruff: noqa: E501
"""Renders the HAProxy configuration for a list of ctxbroker replicas.

    render.py [--bind ADDR] NAME=HOST:PORT ...      print the configuration
    render.py --check FILE [--bind ADDR] NAME=...   fail if FILE differs
    render.py --envoy deploy/envoy/envoy.yaml ...   fail if Envoy routes other replicas

The routing is the one `deploy/envoy/envoy.yaml` describes: a call about a
session carries `x-ctxbroker-session` and goes to the replica that owns
the id on a consistent-hash ring over the replicas' names; a call that
belongs to one replica (ListSessions, a watch of all sessions, the export
and delete of a move) names it in `x-ctxbroker-replica`; health,
reflection and GetServerInfo go to any replica; anything else is refused
with gRPC status UNIMPLEMENTED and a message naming the header.

There is no failover on the ring: no health checks, no redispatch, so a
replica that is down keeps its place and its sessions answer UNAVAILABLE
(HAProxy's 503) until it is back, instead of landing on a replica that
does not hold them. Adding a replica moves only the ids the new one takes
over (`hash-type consistent`); move those sessions to it
(`deploy/scripts/move-session.sh`, docs/operators.md).

`deploy/haproxy/haproxy.cfg` is this script's output for the three pods of
the StatefulSet in deploy/k8s; `tests/scaleout` renders it for brokers on
loopback ports.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path

#: Replica names: what `x-ctxbroker-replica` carries and the ring hashes.
NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")

#: An address whose host is an IP literal: nothing to resolve.
IP_ADDRESS = re.compile(r"^([0-9.]+|\[[0-9a-fA-F:]+\]):[0-9]+$")

#: The pods of deploy/k8s/statefulset.yaml, by their stable DNS names.
K8S_REPLICAS = [
    (f"ctxbroker-{n}", f"ctxbroker-{n}.ctxbroker-headless.ctxbroker.svc.cluster.local:50051")
    for n in range(3)
]

REFUSAL = (
    "calls about a session must carry the x-ctxbroker-session header "
    "(calls about a replica: x-ctxbroker-replica)"
)


def parse_replica(text: str) -> tuple[str, str]:
    """`NAME=HOST:PORT` as a (name, address) pair."""
    name, sep, address = text.partition("=")
    if not sep or not NAME.match(name) or ":" not in address or " " in address:
        raise ValueError(f"replica {text!r}: expected NAME=HOST:PORT, NAME in [a-z0-9-]")
    return name, address


def render(replicas: Sequence[tuple[str, str]], bind: str = ":50051") -> str:
    """The configuration for `replicas` (name, address), listening on
    `bind` (an HAProxy bind address: `:50051`, `127.0.0.1:8080`, `fd@5`)."""
    if not replicas:
        raise ValueError("at least one replica is needed")
    names = [name for name, _ in replicas]
    if len(set(names)) != len(names):
        raise ValueError(f"replica names repeat: {names}")
    servers = "\n".join(f"    server {name} {address} proto h2" for name, address in replicas)
    pick = "\n".join(
        f"    use-server {name} if {{ req.hdr(x-ctxbroker-replica) -m str {name} }}"
        for name in names
    )
    known = " ".join(names)
    # Names (the StatefulSet's pods) are resolved at start when they can
    # be, and again as pods move; addresses are taken as they are.
    by_name = any(not IP_ADDRESS.match(address) for _, address in replicas)
    dns = "\nresolvers dns\n    parse-resolv-conf\n    hold valid 10s\n" if by_name else ""
    server_defaults = (
        "    default-server init-addr last,libc,none resolvers dns\n" if by_name else ""
    )
    return f"""\
# ctxbroker behind HAProxy: session-affine gRPC routing.
# Rendered by deploy/haproxy/render.py; edit the replica list there, not here.

global
    log stderr format raw local0 notice
    maxconn 4096
{dns}
defaults
    mode http
    log global
    option httplog
{server_defaults}
    timeout connect 2s
    timeout client 1h
    timeout server 1h
    # Watches sit idle between markers and resume from their last seq
    # when a stream is cut.
    timeout tunnel 1h
    timeout http-request 10s

frontend grpc
    bind {bind} proto h2
    acl by_session req.hdr(x-ctxbroker-session) -m found
    acl by_replica req.hdr(x-ctxbroker-replica) -m found
    acl known_replica req.hdr(x-ctxbroker-replica) -m str {known}
    acl anywhere path_beg /grpc.health.v1.Health/ /grpc.reflection.
    acl anywhere path /ctxbroker.v1.ContextBroker/GetServerInfo /ctxbroker.v1.ContextBroker/SelectTrigger
    http-request return status 200 hdr grpc-status 5 hdr grpc-message "unknown replica in x-ctxbroker-replica" if by_replica !known_replica
    http-request return status 200 hdr grpc-status 12 hdr grpc-message "{REFUSAL}" unless by_session or by_replica or anywhere
    use_backend replicas if by_replica
    use_backend ring if by_session
    default_backend any

# The ring: one replica per session id, never another.
backend ring
    balance hdr(x-ctxbroker-session)
    hash-type consistent
    # A connection refused is answered at once (503, UNAVAILABLE): a retry
    # would wait a second for a replica that is most likely down, and the
    # client's own retry (with its idempotency keys) is the one to make.
    retries 0
    no option redispatch
{servers}

# One named replica.
backend replicas
    retries 0
    no option redispatch
{pick}
{servers}

# Health, reflection, GetServerInfo: any replica that answers.
backend any
    balance roundrobin
    retries 2
    option redispatch 1
{servers}
"""


def envoy_replicas(text: str) -> list[str]:
    """The replica names an Envoy config routes `x-ctxbroker-replica` to,
    in order: its `exact:` header matches."""
    return re.findall(r"string_match: \{ exact: ([a-z0-9-]+) \}", text)


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bind", default=":50051", help="HAProxy bind address")
    parser.add_argument("--check", type=Path, help="fail when this file differs")
    parser.add_argument(
        "--envoy",
        type=Path,
        help="fail when this Envoy config names other replicas (x-ctxbroker-replica routes)",
    )
    parser.add_argument(
        "replicas",
        nargs="*",
        help="NAME=HOST:PORT, in ring order (default: the StatefulSet's pods)",
    )
    args = parser.parse_args(argv)
    try:
        replicas = [parse_replica(r) for r in args.replicas] or K8S_REPLICAS
        text = render(replicas, args.bind)
    except ValueError as err:
        print(f"render.py: {err}", file=sys.stderr)
        return 2
    if args.envoy is not None:
        routed = envoy_replicas(args.envoy.read_text())
        if routed != [name for name, _ in replicas]:
            print(
                f"{args.envoy} routes replicas {routed}, HAProxy {[n for n, _ in replicas]}",
                file=sys.stderr,
            )
            return 1
    if args.check is not None:
        if args.check.read_text() != text:
            print(f"{args.check} differs from render.py's output: render it again", file=sys.stderr)
            return 1
        return 0
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
