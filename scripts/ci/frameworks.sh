#!/usr/bin/env bash
# CI: the frameworks' own tests against the official adapters (sandbox_client/integrations), in a
# virtualenv of their own: mini-swe-agent and swe-rex at the versions setup.cfg's extras pin.
# The vendored suites (tests/frameworks, README there) and the adapters' own tests
# (tests/integrations: the scripted mini-swe-agent episode among them) run against a real
# executor on loopback. Upstream tests marked slow (the container-shaped ones) are included.
set -euo pipefail
cd "$(dirname "$0")/../.."

venv=${DOCKYARD_FRAMEWORKS_VENV:-/opt/dockyard-ci-frameworks-venv}
rm -rf "$venv"
python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/pip" install -q -e '.[test,minisweagent,swerex,skyrl]' 'pytest-asyncio>=0.24,<2'
export MSWEA_SILENT_STARTUP=1
"$venv/bin/python" -m pytest -q --run-slow --asyncio-mode=auto \
    -o asyncio_default_fixture_loop_scope=function \
    tests/frameworks tests/integrations
