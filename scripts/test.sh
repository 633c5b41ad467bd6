#!/usr/bin/env bash
# Sets everything up, lints, then runs the test suite against the installed shimgen: all of it with torch 2.13.0
# (.venv), then, in a venv of its own, the fast tests and one build end to end with torch 2.14.1, the other end of
# the supported range this machine can install. Arguments go to the first run's pytest and skip the second.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/system_packages.sh
second="${SECOND_TORCH:-2.14.1}"
[ $# -eq 0 ] || second=none
if [ "$second" != none ]; then  # installing it is mostly unpacking: done meanwhile
  VENV=".venv-torch$second" TORCH_VERSION="$second" bash scripts/setup.sh > "${TMPDIR:-/tmp}/shimgen-setup-torch$second.log" 2>&1 &
  second_setup=$!
fi
bash scripts/setup.sh
# Lint first (configuration in pyproject.toml): a finding fails the run before the slow tests start. mypy (22 s of one
# core from an empty cache) type-checks beside the first tests; a finding of its fails the run once they end.
.venv/bin/ruff check .
.venv/bin/ruff format --check .
mypy_log="${TMPDIR:-/tmp}/shimgen-mypy.log"
.venv/bin/python -m mypy > "$mypy_log" 2>&1 &
mypy_run=$!
# Two workers on the machine's two cores; a group of tests (a file, or what tests/conftest.py groups) stays on one
# worker, with its module's fixtures; the groups start in the order tests/conftest.py gives them, slowest first
# (pytest-xdist would otherwise start the groups of most tests first).
workers=(-n "${TEST_WORKERS:-2}" --dist loadgroup --no-loadscope-reorder)
(cd tests && ../.venv/bin/python -m pytest -q -ra --durations=30 "${workers[@]}" "$@")
wait "$mypy_run" || { cat "$mypy_log"; exit 1; }
tail -1 "$mypy_log"
if [ "$second" != none ]; then
  wait "$second_setup" || { cat "${TMPDIR:-/tmp}/shimgen-setup-torch$second.log"; exit 1; }
  tail -1 "${TMPDIR:-/tmp}/shimgen-setup-torch$second.log"
  (cd tests && "../.venv-torch$second/bin/python" -m pytest -q -ra --durations=5 "${workers[@]}" \
    -m "not slow" unit integration/test_report.py integration/test_escaping.py)
fi
