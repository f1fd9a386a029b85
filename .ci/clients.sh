#!/usr/bin/env bash
# The polyglot clients against the real daemon, each test with a freshly
# started ctxbrokerd (its own ephemeral port and temporary data directory):
#   - the Python client's tests (clients/python), the example agent loop and
#     the cross-language watcher test (a Python and a Node watcher across a
#     daemon restart) among them;
#   - the Node watcher's test (clients/node);
#   - the README's "Walkthrough with grpcurl", every output it shows checked.
# Installs everything it needs: a virtual environment under target/clients
# (Python packages pinned in clients/python/requirements-ci.txt, grpcurl
# from its PyPI wrapper, the client package built from proto/), and the
# Node packages of clients/node/package-lock.json. Needs Rust, Python 3.10+
# with venv, and Node 20 with npm.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
venv=${CTXBROKER_CLIENTS_VENV:-$root/target/clients/venv}
export PIP_DISABLE_PIP_VERSION_CHECK=1

echo "== clients: daemon"
cargo build --bin ctxbrokerd
export CTXBROKERD=$root/target/debug/ctxbrokerd

echo "== clients: install"
python3 --version
node --version
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet -r clients/python/requirements-ci.txt
# The stubs are generated from proto/ as the package builds: reinstall every
# run so they are this checkout's contract.
"$venv/bin/python" -m pip install --quiet --no-build-isolation --no-deps --force-reinstall ./clients/python
(cd clients/node && npm ci --no-audit --no-fund --loglevel=error)
export PATH=$venv/bin:$PATH
grpcurl --version

echo "== clients: python client tests (with the agent loop and the cross-language watchers)"
(cd clients/python && python -m pytest -v -p no:cacheprovider)

echo "== clients: node watcher test"
(cd clients/node && node --test test/protocol.test.js test/watch.test.js)

echo "== clients: README walkthrough with grpcurl"
python .ci/walkthrough.py
