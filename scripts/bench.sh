#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh), adds the benchmark-only contenders' packages to .venv
# (ONNX Runtime and the ONNX exporter's dependencies), then runs the benchmark scripts given as
# arguments, each with its own options quoted together:
#   bash scripts/bench.sh                                   # benchmarks/call_overhead.py
#   bash scripts/bench.sh benchmarks/zoo_speed.py "benchmarks/call_overhead.py --quick"
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# torch is pinned to the one setup.sh installed, so nothing here can resolve another build of it.
constraints="$(mktemp)"
trap 'rm -f "$constraints"' EXIT
.venv/bin/python -c 'import torch; print(f"torch=={torch.__version__}")' > "$constraints"
.venv/bin/python -m pip install -q --disable-pip-version-check -c "$constraints" onnxruntime onnx onnxscript
[ $# -gt 0 ] || set -- benchmarks/call_overhead.py
for script in "$@"; do
  read -r -a words <<< "$script"
  echo "== ${words[*]}"
  .venv/bin/python "${words[@]}"
done
