#!/usr/bin/env bash
# The context inspector in a real browser (tests/inspector): a daemon
# started with --inspector, a session driven through a burst and its
# compactions by the Python client, its pages opened in Debian's headless
# chromium through chromedriver (Selenium), the window bar checked against
# GetContext and a new marker seen arriving live, then the same behind a
# token file (login form, a tenant's view, live events with the login
# cookie, log out); screenshots land in
# target/inspector/screenshots (CTXBROKER_SCREENSHOTS=docs/img refreshes
# the README's). Needs chromium and chromium-driver (installed by
# .ci/run); installs its Python packages into target/inspector/venv, pinned
# by tests/inspector/requirements.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
venv=$root/target/inspector/venv
export PIP_DISABLE_PIP_VERSION_CHECK=1
for tool in chromium chromedriver; do
  command -v "$tool" >/dev/null || { echo "no $tool on PATH (apt install chromium chromium-driver)" >&2; exit 1; }
done
chromium --version
chromedriver --version
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet -r tests/inspector/requirements.txt
"$venv/bin/python" -m pip install --quiet --no-deps --force-reinstall ./clients/python
"$venv/bin/python" -m pip check
# Lint and format with the clients' ruff and settings, when that
# environment is there (.ci/clients.sh makes it).
clients_venv=${CTXBROKER_CLIENTS_VENV:-$root/target/clients/venv}
if [ -x "$clients_venv/bin/ruff" ]; then
  "$clients_venv/bin/ruff" check --config clients/python/pyproject.toml tests/inspector
  "$clients_venv/bin/ruff" format --check --config clients/python/pyproject.toml tests/inspector
fi
cargo build --bin ctxbrokerd
(cd tests/inspector && CTXBROKERD=$root/target/debug/ctxbrokerd \
  "$venv/bin/python" -m pytest -v -p no:cacheprovider test_inspector.py)
