#!/usr/bin/env bash
# The polyglot clients against the real daemon, each test with a freshly
# started ctxbrokerd (its own ephemeral port and temporary data directory):
#   - the Python client (clients/python): its committed stubs checked
#     against what the pinned generator makes of proto/, mypy --strict, and
#     its tests twice, on the newest and on the oldest supported stack (the
#     example agent loop and the cross-language watcher test, a Python and
#     a Node watcher across a daemon restart, among them);
#   - the framework adapters (OpenAI Agents SDK, LangChain, LlamaIndex):
#     mypy --strict and their tests, each with its example agent, in an
#     environment of their own (requirements-adapters.txt) where a missing
#     framework fails the run;
#   - the Node client's tests (clients/node): the typed TypeScript client
#     (every RPC), the watcher, and the package as it would be published;
#   - the README's "Walkthrough with grpcurl", every output it shows checked.
# Installs everything it needs: three virtual environments under
# target/clients, each pinned by a file of clients/python: the newest stack
# (requirements-ci.txt, with mypy and grpcurl from its PyPI wrapper), the
# oldest (requirements-ci-oldest.txt: the floors pyproject.toml declares)
# and the stubs' generator (requirements-gen.txt); the client package in
# the first two; and the Node packages of clients/node/package-lock.json.
# Needs Rust, Python 3.10+ with venv, and Node 20 with npm.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
venv=${CTXBROKER_CLIENTS_VENV:-$root/target/clients/venv}
venv_oldest=${CTXBROKER_CLIENTS_VENV_OLDEST:-$root/target/clients/venv-oldest}
venv_gen=${CTXBROKER_CLIENTS_VENV_GEN:-$root/target/clients/venv-gen}
export PIP_DISABLE_PIP_VERSION_CHECK=1

echo "== clients: daemon"
cargo build --bin ctxbrokerd
export CTXBROKERD=$root/target/debug/ctxbrokerd

echo "== clients: install"
python3 --version
node --version
for pair in "$venv:requirements-ci.txt" "$venv_oldest:requirements-ci-oldest.txt" \
  "$venv_gen:requirements-gen.txt"; do
  env_dir=${pair%%:*}
  if [ ! -x "$env_dir/bin/python" ]; then
    python3 -m venv "$env_dir"
  fi
  "$env_dir/bin/python" -m pip install --quiet -r "clients/python/${pair#*:}"
done
# Reinstalled every run, so the tests exercise this checkout's client.
for env_dir in "$venv" "$venv_oldest"; do
  "$env_dir/bin/python" -m pip install --quiet --no-build-isolation --no-deps --force-reinstall \
    ./clients/python
  "$env_dir/bin/python" -m pip check
done
(cd clients/node && npm ci --no-audit --no-fund --loglevel=error)
export PATH=$venv/bin:$PATH
grpcurl --version

echo "== clients: python stubs are what the pinned generator makes of proto/"
(cd clients/python && PATH=$venv_gen/bin:$PATH python tools/generate.py --check)

echo "== clients: python lint and format (ruff), types (mypy --strict)"
(cd clients/python && ruff check . && ruff format --check . && mypy)

for env_dir in "$venv" "$venv_oldest"; do
  stack=$("$env_dir/bin/python" -c \
    'import google.protobuf as p, grpc as g; print(f"protobuf {p.__version__}, grpcio {g.__version__}")')
  echo "== clients: python client tests on $stack (with the agent loop and the cross-language watchers)"
  (cd clients/python && PATH=$env_dir/bin:$PATH python -m pytest -v -p no:cacheprovider)
done

echo "== clients: python framework adapters (their own environment, every framework required)"
venv_adapters=${CTXBROKER_CLIENTS_VENV_ADAPTERS:-$root/target/clients/venv-adapters}
if [ ! -x "$venv_adapters/bin/python" ]; then
  python3 -m venv "$venv_adapters"
fi
"$venv_adapters/bin/python" -m pip install --quiet -r clients/python/requirements-adapters.txt
"$venv_adapters/bin/python" -m pip install --quiet --no-build-isolation --no-deps --force-reinstall \
  ./clients/python
"$venv_adapters/bin/python" -m pip check
(cd clients/python && PATH=$venv_adapters/bin:$PATH mypy --config-file mypy-adapters.ini)
(cd clients/python && PATH=$venv_adapters/bin:$PATH CTXBROKER_ADAPTER_TESTS=required \
  python -m pytest -v -p no:cacheprovider -o addopts= tests/adapters)

echo "== clients: node client tests (typed client, watcher, package)"
# `npm ci` above built the package (its `prepare` script generates the
# types from proto/ and compiles them); `npm test` type-checks and runs.
(cd clients/node && npm test)

echo "== clients: README walkthrough with grpcurl"
python .ci/walkthrough.py
