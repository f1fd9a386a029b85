#!/usr/bin/env bash
# Sharding run for real: three brokers behind HAProxy, 300 sessions made
# and admitted through it by the Python client, one broker killed and
# restarted, a fourth added and the sessions it now owns moved to it, and
# every replica's markers watched merged (tests/scaleout). Needs HAProxy
# (installed by .ci/run) and the clients' environment (.ci/clients.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
venv=${CTXBROKER_CLIENTS_VENV:-$root/target/clients/venv}
if [ ! -x "$venv/bin/python" ]; then
  echo "no clients environment at $venv: run .ci/clients.sh first" >&2
  exit 1
fi
PATH=$PATH:/usr/sbin
# sed reads the whole version text: `head` would leave haproxy writing into a
# closed pipe, and pipefail makes its SIGPIPE fail the run.
haproxy -v | sed -n 1p
cargo build --bin ctxbrokerd
(cd tests/scaleout && PATH=$venv/bin:$PATH ruff check --config "$root/clients/python/pyproject.toml" . ../../deploy/haproxy \
  && PATH=$venv/bin:$PATH ruff format --check --config "$root/clients/python/pyproject.toml" . ../../deploy/haproxy)
# grpcurl (from the clients' environment) and jq, for move-session.sh.
(cd tests/scaleout && PATH=$venv/bin:$PATH CTXBROKERD=$root/target/debug/ctxbrokerd \
  python -m pytest -v -s -p no:cacheprovider test_scaleout.py)
