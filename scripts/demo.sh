#!/usr/bin/env bash
# The main job: build ResNet-18 from projects/resnet.toml, install its wheel into a fresh venv
# that has torch and no shimgen, run it there, and compare it with eager (agreement and speed).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
TORCH_VERSION="$(.venv/bin/python -c 'import torch; print(torch.__version__.split("+")[0])')"

summary="$(.venv/bin/shimgen build projects/resnet.toml --json)"
wheel="$(.venv/bin/python -c 'import json, sys; print(json.loads(sys.argv[1])["wheel"])' "$summary")"
.venv/bin/shimgen check projects/resnet.toml

demo_env="$(mktemp -d)/venv"
.venv/bin/python -m venv "$demo_env"  # the Python the wheel was built for
"$demo_env/bin/python" -m pip install -q --disable-pip-version-check "torch==${TORCH_VERSION}"
"$demo_env/bin/python" -m pip install -q --disable-pip-version-check "$wheel"
"$demo_env/bin/python" scripts/run_resnet.py
