#!/usr/bin/env python3
"""Checks deploy/envoy/envoy.yaml without an Envoy binary.

1. Structure: the YAML is parsed into the Envoy v3 API's own message types
   (the `envoy-data-plane` package, generated from Envoy's .proto files),
   which refuses unknown fields, wrong value types and unknown enum values.
   Every `typed_config` is resolved by its `@type` and parsed the same way.
2. Intent: the routing this deployment depends on is there. The ring
   cluster uses RING_HASH over stable pod names with no failover; calls
   with `x-ctxbroker-session` hash on it; every pod on the ring has its
   `x-ctxbroker-replica` route and cluster, with the same address; every
   route names a cluster that exists.

It does not run Envoy's own validation (`envoy --mode validate`), which
also checks field constraints (ranges, required fields) and that each
extension is compiled in.

    pip install envoy-data-plane pyyaml
    python3 deploy/envoy/check.py deploy/envoy/envoy.yaml
"""

import importlib
import sys

import betterproto2
import yaml
from envoy_data_plane.envoy.config.bootstrap.v3 import Bootstrap
from envoy_data_plane.envoy.config.cluster.v3 import ClusterDiscoveryType, ClusterLbPolicy

SESSION_HEADER = "x-ctxbroker-session"
REPLICA_HEADER = "x-ctxbroker-replica"
RING = "ctxbroker"


def type_urls(node):
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "@type":
                yield value
            yield from type_urls(value)
    elif isinstance(node, list):
        for value in node:
            yield from type_urls(value)


def unpack_all(message, found):
    """Replaces nothing; collects every message reachable, Any unpacked."""
    for name in getattr(message, "__dataclass_fields__", {}):
        value = getattr(message, name)
        items = value if isinstance(value, list) else (
            value.values() if isinstance(value, dict) else [value])
        for item in items:
            if isinstance(item, betterproto2.Message):
                if type(item).__name__ == "Any":
                    item = item.unpack()
                found.append(item)
                unpack_all(item, found)


def addresses(cluster):
    return [
        (lb.endpoint.address.socket_address.address,
         lb.endpoint.address.socket_address.port_value)
        for locality in cluster.load_assignment.endpoints
        for lb in locality.lb_endpoints
    ]


def main(path):
    with open(path, encoding="utf-8") as f:
        doc = yaml.safe_load(f)
    # Importing a type's module registers it for Any.
    for url in sorted(set(type_urls(doc))):
        importlib.import_module("envoy_data_plane." + url.split("/", 1)[1].rsplit(".", 1)[0])
    bootstrap = Bootstrap.from_dict(doc)
    messages = []
    unpack_all(bootstrap, messages)
    typed = sum(1 for _ in type_urls(doc))

    problems = []
    clusters = {c.name: c for c in bootstrap.static_resources.clusters}
    ring = clusters.get(RING)
    if ring is None:
        problems.append(f"no cluster {RING!r}")
    else:
        if ring.lb_policy != ClusterLbPolicy.RING_HASH:
            problems.append(f"cluster {RING!r} is not RING_HASH")
        if ring.type != ClusterDiscoveryType.STRICT_DNS:
            problems.append(f"cluster {RING!r} is not STRICT_DNS")
        chc = ring.common_lb_config and ring.common_lb_config.consistent_hashing_lb_config
        if not (chc and chc.use_hostname_for_hashing):
            problems.append(f"cluster {RING!r} hashes addresses, not the pods' stable names")
        if ring.health_checks or ring.outlier_detection:
            problems.append(f"cluster {RING!r} fails over: a session would land on a pod without it")

    routes = [
        route
        for m in messages if type(m).__name__ == "RouteConfiguration"
        for vh in m.virtual_hosts for route in vh.routes
    ]
    replica_routes = {}
    hashed = False
    for route in routes:
        target = route.route.cluster if route.route else None
        if target and target not in clusters:
            problems.append(f"a route names the missing cluster {target!r}")
        for h in route.match.headers:
            if h.name == REPLICA_HEADER and h.string_match and h.string_match.exact:
                replica_routes[h.string_match.exact] = target
            if h.name == SESSION_HEADER and h.present_match:
                policies = route.route.hash_policy if route.route else []
                hashed = target == RING and any(
                    p.header and p.header.header_name == SESSION_HEADER for p in policies)
    if not hashed:
        problems.append(f"no route sends {SESSION_HEADER} calls to {RING!r} hashing on the header")
    if ring is not None:
        ring_addresses = addresses(ring)
        for pod, target in sorted(replica_routes.items()):
            cluster = clusters.get(target)
            if cluster is None or len(addresses(cluster)) != 1:
                problems.append(f"replica {pod}: cluster {target!r} must hold exactly one endpoint")
                continue
            if addresses(cluster)[0] not in ring_addresses:
                problems.append(f"replica {pod}: {addresses(cluster)[0]} is not on the ring")
        if len(replica_routes) != len(ring_addresses):
            problems.append(
                f"{len(ring_addresses)} pods on the ring but {len(replica_routes)} replica routes")

    for problem in problems:
        print(f"FAIL: {problem}")
    print(
        f"{path}: {len(bootstrap.static_resources.listeners)} listeners, {len(clusters)} clusters, "
        f"{typed} typed configs parsed; {len(replica_routes)} replicas on the ring; "
        f"{'OK' if not problems else f'{len(problems)} problems'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "deploy/envoy/envoy.yaml"))
