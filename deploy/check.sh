#!/usr/bin/env bash
# Validates every file in deploy/ with the tools this machine can install
# (none needs a cluster, a container daemon or an Envoy binary). From the
# repository root, after `cargo build --bin ctxbrokerd`:
#
#   python3 -m venv /tmp/deploy-check
#   /tmp/deploy-check/bin/pip install -r deploy/requirements-check.txt
#   apt-get install -y shellcheck        # systemd (systemd-analyze) and kubectl must be present
#   PATH=/tmp/deploy-check/bin:$PATH bash deploy/check.sh
#
# Exits non-zero when a check fails or a tool is missing.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

failed=0
step() { printf '\n== %s\n' "$1"; }
need() {
  if ! command -v "$1" > /dev/null; then
    echo "MISSING: $1"
    failed=1
    return 1
  fi
}
# The daemon the checks run, built by `cargo build --bin ctxbrokerd`.
daemon=target/debug/ctxbrokerd
need_daemon() {
  if [[ ! -x $daemon ]]; then
    echo "MISSING: $daemon (cargo build --bin ctxbrokerd)"
    failed=1
    return 1
  fi
}
run() {
  if ! "$@"; then
    echo "FAILED: $*"
    failed=1
    return 1
  fi
}

step "YAML syntax and style (yamllint)"
need yamllint && run yamllint -c deploy/.yamllint deploy/kustomization.yaml deploy/k8s deploy/envoy && echo "yamllint: ok"

step "Kubernetes: render (kubectl kustomize) and validate against the API schemas (kubernetes-validate --strict)"
if need kubectl && need kubernetes-validate; then
  rendered=$(mktemp)
  run kubectl kustomize deploy/ -o "$rendered"
  for version in 1.30.0 1.32.0; do
    run kubernetes-validate --strict --quiet -k "$version" "$rendered" && echo "ok against $version"
  done
  rm -f "$rendered"
fi

step "Envoy: v3 API types and routing intent (deploy/envoy/check.py)"
need python3 && run python3 deploy/envoy/check.py deploy/envoy/envoy.yaml

step "HAProxy: the configuration is render.py's, over Envoy's replicas, and HAProxy accepts it"
PATH=$PATH:/usr/sbin
if need python3 && need haproxy; then
  run python3 deploy/haproxy/render.py --check deploy/haproxy/haproxy.cfg --envoy deploy/envoy/envoy.yaml \
    && echo "haproxy.cfg: as rendered, over the replicas envoy.yaml routes"
  # The pods' names do not resolve here: HAProxy starts them unresolved.
  run haproxy -c -q -f deploy/haproxy/haproxy.cfg && echo "haproxy -c: valid"
fi

step "systemd: systemd-analyze verify and security"
if need systemd-analyze; then
  root=$(mktemp -d)
  mkdir -p "$root/usr/local/bin" "$root/etc/systemd/system" "$root/usr/lib/systemd"
  cp -r /lib/systemd/system "$root/usr/lib/systemd/"
  need_daemon && cp "$daemon" "$root/usr/local/bin/ctxbrokerd"
  cp deploy/systemd/ctxbroker.service deploy/systemd/ctxbroker.socket "$root/etc/systemd/system/"
  run systemd-analyze verify --root="$root" /etc/systemd/system/ctxbroker.service /etc/systemd/system/ctxbroker.socket \
    && echo "verify: ok"
  systemd-analyze security --offline=yes --root="$root" /etc/systemd/system/ctxbroker.service 2>&1 | tail -1
  rm -rf "$root"
fi

step "Daemon settings: ctxbrokerd check-config"
if need_daemon; then
  for file in deploy/k8s/ctxbroker.toml deploy/systemd/ctxbroker.toml; do
    run "$daemon" check-config "$file" > /dev/null && echo "$file: valid"
  done
fi

step "Dockerfile: parse (dockerfile-parse) and check the runtime stage"
need python3 && run python3 - <<'PY'
from dockerfile_parse import DockerfileParser
p = DockerfileParser(path="deploy/container/Dockerfile")
stages = p.parent_images
final = [i for i in p.structure if i["instruction"] == "FROM"][-1]["startline"]
tail = [i for i in p.structure if i["startline"] > final]
args = dict(i["value"].split("=", 1) for i in tail if i["instruction"] == "ARG" and "=" in i["value"])
user = [i["value"] for i in tail if i["instruction"] == "USER"]
user = [u.replace("${UID}", args.get("UID", "${UID}")) for u in user]
assert len(stages) == 2, f"two stages expected, got {stages}"
assert user and not user[-1].startswith(("0", "root")), f"the runtime stage must run as non-root: {user}"
assert any(i["instruction"] == "VOLUME" and "/var/lib/ctxbroker" in i["value"] for i in tail), "no data volume"
assert any(i["instruction"] == "COPY" and "--from=build" in i["value"] for i in tail), "binary not copied from the build stage"
print(f"stages {stages}; runtime user {user[-1]}; volume and binary copy present")
PY

step "Scripts: shellcheck"
need shellcheck && run shellcheck deploy/scripts/move-session.sh deploy/check.sh && echo "shellcheck: ok"

echo
if [[ $failed -ne 0 ]]; then
  echo "deploy checks: FAILED"
  exit 1
fi
echo "deploy checks: all passed"
