#!/usr/bin/env bash
# Creates the venv ($VENV, default .venv) with torch $TORCH_VERSION (default 2.13.0; pinned and installed first, so
# nothing resolves a CUDA build from the registry), the build tools (meson, ninja, cmake), the test tools (pytest, pytest-xdist, ruff,
# jsonschema, pyyaml) and shimgen itself (built by meson-python).
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
PYTHON="${PYTHON:-python3}"
VENV="$(realpath -m "${VENV:-.venv}")"  # absolute: meson-python runs the venv's meson from elsewhere

# torchvision's release that matches a torch release: 0.(minor + 15).patch.
torchvision_for() { local minor patch; IFS=. read -r _ minor patch <<< "$1"; echo "0.$((minor + 15)).${patch:-0}"; }

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-compile)
"${pip[@]}" "torch==${TORCH_VERSION}"
# Everything after torch is installed against it: a package that asks for torch (timm, torchvision) gets this one, never
# the registry's newest (a CUDA build of several GB).
constraints="$(mktemp)"
trap 'rm -f "$constraints"' EXIT
echo "torch==${TORCH_VERSION}" > "$constraints"
pip+=(-c "$constraints")
# cmake: the C++ package's CMake consumer in the tests (examples/cpp).
# pytest below 9.2: pytest-xdist's --dist loadgroup (scripts/test.sh) names each test's group in its node id, which
# pytest 9.2 no longer reads; every test would then be scheduled alone and each file's fixtures built on both workers.
# twine, auditwheel and pypiserver: the tests check the wheels as an index would, and install them from a real one.
"${pip[@]}" "meson>=1.3" "meson-python>=0.16" ninja "cmake>=3.18" jinja2 packaging numpy "pytest>=8,<9.2" "pytest-xdist>=3.6,<4" hypothesis jsonschema pyyaml "transformers==5.23.0" \
  "twine>=6,<8" "auditwheel>=6.2,<7" "pypiserver>=2.3,<3"
# The model zoo's vision models (timm needs torchvision, whose wheel matches torch's version; its ops library may not load
# on a CPU build of torch, which timm's models do not need).
"${pip[@]}" "timm==1.0.29" "torchvision==$(torchvision_for "$TORCH_VERSION")"
# The linter scripts/test.sh runs; pinned to a minor release, since new releases add findings.
"${pip[@]}" "ruff>=0.17,<0.18" "mypy>=1.20,<2"
# meson-python looks meson up on PATH unless told; the venv's is not on PATH (nothing is activated).
MESON="$VENV/bin/meson" NINJA="$VENV/bin/ninja" "${pip[@]}" --no-build-isolation --no-deps --force-reinstall .
# Byte-compiled once, on every core: pip compiles nothing above (--no-compile: it would compile serially), and where
# PYTHONDONTWRITEBYTECODE is set, as in many container images, Python never writes what it compiles at import, so every
# interpreter would compile torch's sources again (here: `import torch` 4.0 s against 1.6 s, a build server's imports
# 12 s against 3 s). Files that only a newer Python can compile (torch's tests of 3.12 syntax) are left as they are.
"$VENV/bin/python" -c 'import compileall, sysconfig; compileall.compile_dir(sysconfig.get_paths()["purelib"], quiet=2, workers=0)'
echo "setup: $("$VENV/bin/python" -c 'import torch; print("torch", torch.__version__)'), $("$VENV/bin/shimgen" --help >/dev/null && echo 'shimgen installed')"
