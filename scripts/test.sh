#!/usr/bin/env bash
# Sets everything up, lints, then runs the test suite against the installed shimgen.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/system_packages.sh
# Lint first (configuration in pyproject.toml): any finding fails the run before the slow tests start.
.venv/bin/ruff check .
cd tests
exec ../.venv/bin/python -m pytest -q -ra --durations=15 "$@"
