#!/usr/bin/env bash
# Sets everything up, then runs the test suite against the installed shimgen.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cd tests
exec ../.venv/bin/python -m pytest -q -ra "$@"
