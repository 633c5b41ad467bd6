#!/usr/bin/env bash
# Creates the venv ($VENV, default .venv) with torch $TORCH_VERSION (default 2.13.0; pinned and installed first, so
# nothing resolves a CUDA build from the registry), the build tools, the test tools (pytest, pytest-xdist, ruff,
# jsonschema, pyyaml) and shimgen itself (built by meson-python).
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
PYTHON="${PYTHON:-python3}"
VENV="${VENV:-.venv}"

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
"${pip[@]}" "torch==${TORCH_VERSION}"
"${pip[@]}" "meson>=1.3" "meson-python>=0.16" ninja jinja2 packaging numpy pytest pytest-xdist hypothesis jsonschema pyyaml "transformers==5.23.0"
# The linter scripts/test.sh runs; pinned to a minor release, since new releases add findings.
"${pip[@]}" "ruff>=0.17,<0.18"
# meson-python looks meson up on PATH unless told; the venv's is not on PATH (nothing is activated).
MESON="$PWD/$VENV/bin/meson" NINJA="$PWD/$VENV/bin/ninja" "${pip[@]}" --no-build-isolation --no-deps --force-reinstall .
echo "setup: $("$VENV/bin/python" -c 'import torch; print("torch", torch.__version__)'), $("$VENV/bin/shimgen" --help >/dev/null && echo 'shimgen installed')"
