"""What the garbage collector's full collections cost a unit's trace and codegen, and what putting them off until each
ends (`workers.full_collections_deferred`) saves and costs in memory.

One spec's unit (its specialized variants dropped) built cold in a fresh process (no build server, so the trace and
codegen run in that process; fresh Inductor and Triton caches), with the deferral and without, alternating. Each
build reports the collections by generation that ran during the trace and codegen stages and outside them, its stage
times and its peak resident memory.

    python benchmarks/gc_pauses.py --device cpu --model resnet --out benchmarks/results
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from build_time import MODELS, SPECIALIZE, on_device, start_run  # noqa: E402

ONE_BUILD = """
import contextlib, gc, json, resource, sys, time
from pathlib import Path
from shimgen.build import workers
from shimgen.pipeline import build

deferred, spec, out = sys.argv[1] == "deferred", Path(sys.argv[2]), Path(sys.argv[3])
inner = workers.full_collections_deferred
inside = [False]

@contextlib.contextmanager
def marked():
    inside[0] = True
    try:
        with inner() if deferred else contextlib.nullcontext():
            yield
    finally:
        inside[0] = False

workers.full_collections_deferred = marked
pauses = {"in trace and codegen": [[0, 0.0] for _ in range(3)], "elsewhere": [[0, 0.0] for _ in range(3)]}
began = [0.0]

def timed(phase, info):
    if phase == "start":
        began[0] = time.perf_counter()
        return
    entry = pauses["in trace and codegen" if inside[0] else "elsewhere"][info["generation"]]
    entry[0] += 1
    entry[1] += time.perf_counter() - began[0]

gc.callbacks.append(timed)
start = time.perf_counter()
summary = build(spec, out).summary()
print(json.dumps({
    "wall": time.perf_counter() - start,
    "stages": summary["stages"],
    "pauses": pauses,
    "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
}))
"""


def one_build(mode: str, spec: Path, tmp: Path, tag: str) -> dict:
    env = {
        **os.environ,
        "SHIMGEN_SERVER": "off",
        "TORCHINDUCTOR_CACHE_DIR": str(tmp / f"inductor-{tag}"),
        "TRITON_CACHE_DIR": str(tmp / f"triton-{tag}"),
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    run = subprocess.run(
        [sys.executable, "-c", ONE_BUILD, mode, str(spec), str(tmp / f"out-{tag}")],
        capture_output=True,
        text=True,
        env=env,
    )
    if run.returncode != 0:
        raise SystemExit(f"{mode} build failed:\n{run.stderr[-3000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--model", default="resnet", choices=sorted(MODELS))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    args = parser.parse_args()
    tmp, report, user_cache = start_run(f"gc_pauses.py --device {args.device} --model {args.model}")
    os.environ["SHIMGEN_CACHE_DIR"] = str(user_cache / "toolchain")
    spec = tmp / "projects" / MODELS[args.model][1].name
    shutil.copytree(REPO / "projects", spec.parent, ignore=shutil.ignore_patterns("__pycache__"))
    spec.write_text(SPECIALIZE.sub("", spec.read_text()))
    on_device(spec, args.device)
    one_build("deferred", spec, tmp, "warm")  # the per-user cache (toolchain, prebuilt headers), not counted
    report(
        "\n| round | full collections deferred | wall s | trace s | codegen s "
        "| collections in trace and codegen (gen 0 / 1 / 2) | their pauses s | gen-2 pauses elsewhere s | peak RSS MB |"
    )
    report("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for k in range(args.rounds):
        for mode in ("not deferred", "deferred") if k % 2 == 0 else ("deferred", "not deferred"):
            got = one_build(mode.replace(" ", "-"), spec, tmp, f"{k}-{mode.replace(' ', '-')}")
            inside, elsewhere = got["pauses"]["in trace and codegen"], got["pauses"]["elsewhere"]
            report(
                f"| {k + 1} | {'yes' if mode == 'deferred' else 'no'} | {got['wall']:.1f} "
                f"| {got['stages'].get('trace', 0):.1f} | {got['stages'].get('codegen', 0):.1f} "
                f"| {' / '.join(str(n) for n, _ in inside)} | {sum(s for _, s in inside):.2f} "
                f"| {elsewhere[2][1]:.2f} | {got['max_rss_mb']:.0f} |"
            )
    report.save(args.out / f"gc_pauses_{args.model}_{args.device}.md")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
