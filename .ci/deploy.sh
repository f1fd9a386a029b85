#!/usr/bin/env bash
# Installs the validators deploy/check.sh uses (Python packages in a
# virtual environment under target/) and runs it. systemd-analyze and
# kubectl come with the machine; shellcheck is installed by .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=target/deploy-check/venv
export PIP_DISABLE_PIP_VERSION_CHECK=1
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet -r deploy/requirements-check.txt
cargo build --bin ctxbrokerd
PATH=$PWD/$venv/bin:$PATH bash deploy/check.sh
