"""Refit with freezing: new weights into a running package, against a rebuild and against AOTInductor.

For each project (default: ResNet-18 and the MiniLM-shaped BERT; both build with freezing): the package is built, then
in a fresh interpreter a model made with another seed gives a new state dict, and these are timed side by side:

- refit: `pkg.load_weights(state_dict)` and the first call on the new weights (the folded constants computed again);
- a plain copy of the state dict's tensors (the least any refit moves);
- AOTInductor (freezing off, where it can swap weights): `load_constants(state_dict)` and the first call;
- a rebuild with the new weights (the spec's seed changed; the build recompiles nothing when only weights change);
- the wheel's size with its weights, and built with flags.weights = "external" (the weights file beside it).

It also times calls before and after the refit (no per-call slowdown), and checks that the refit package computes bit
for bit what the rebuilt one does. Usage: python benchmarks/refit.py [--device cuda] [--out FILE] [spec ...]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_SPECS = ("projects/resnet.toml", "projects/minilm.toml")

MEASURE = r"""
import dataclasses, json, statistics, sys, time
from pathlib import Path
import torch
from shimgen.spec import load_spec
from shimgen.trace.entry import load_model, make_inputs

spec_path, site, name, device, aoti = sys.argv[1:6]
spec = load_spec(Path(spec_path))
graph = spec.graph[0]
sys.path.insert(0, site)
package = __import__(name)
inputs = [t.to(device) for t in make_inputs(graph, {n: d.example for n, d in graph.dims.items()}, 0)]
args = [t for t, i in zip(inputs, graph.inputs) if not i.keyword]
kwargs = {i.name: t for t, i in zip(inputs, graph.inputs) if i.keyword}
new = load_model(dataclasses.replace(graph, seed=1), "graph[0]", Path(spec_path).parent).to(device)
state = {k: v for k, v in new.state_dict().items()}

def sync():
    if device == "cuda":
        torch.cuda.synchronize()

def per_call(fn, runs=30):
    for _ in range(3):
        fn(*args, **kwargs)
    times = []
    for _ in range(runs):
        sync(); start = time.perf_counter(); fn(*args, **kwargs); sync(); times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3

results = {"before_ms": per_call(package.forward)}
refits = []
for _ in range(5):
    sync(); start = time.perf_counter()
    package.load_weights(state)
    out = package.forward(*args, **kwargs)
    sync(); refits.append(time.perf_counter() - start)
results["refit_s"] = statistics.median(refits)
results["after_ms"] = per_call(package.forward)
copies = []
for _ in range(5):
    sync(); start = time.perf_counter(); copied = {k: v.clone() for k, v in state.items()}; sync()
    copies.append(time.perf_counter() - start)
results["copy_s"] = statistics.median(copies)
leaves = lambda tree: [t.cpu() for t in torch.utils._pytree.tree_leaves(tree) if isinstance(t, torch.Tensor)]
with torch.no_grad():
    results["refit_vs_eager"] = max((a - b).abs().max().item() for a, b in zip(leaves(out), leaves(new(*args, **kwargs))))
torch.save(leaves(out), sys.argv[6])
if aoti != "-":
    runner = torch._inductor.aoti_load_package(aoti)
    fqns = set(runner.get_constant_fqns())
    given = {k: v for k, v in state.items() if k in fqns or "model." + k in fqns}
    given = {("model." + k if "model." + k in fqns else k): v for k, v in given.items()}
    loads = []
    for _ in range(5):
        sync(); start = time.perf_counter()
        runner.load_constants(given, check_full_update=False)
        aoti_out = runner(*args, **kwargs)
        sync(); loads.append(time.perf_counter() - start)
    results["aoti_refit_s"] = statistics.median(loads)
    results["aoti_ms"] = per_call(runner)
print(json.dumps(results))
"""

AOTI_BUILD = r"""
import sys, torch
from pathlib import Path
from shimgen.spec import load_spec
from shimgen.trace.entry import load_model, make_inputs
spec_path, device, package = sys.argv[1:4]
spec = load_spec(Path(spec_path))
graph = spec.graph[0]
model = load_model(graph, "graph[0]", Path(spec_path).parent).to(device)
inputs = [t.to(device) for t in make_inputs(graph, {n: d.example for n, d in graph.dims.items()}, 0)]
args = tuple(t for t, i in zip(inputs, graph.inputs) if not i.keyword)
kwargs = {i.name: t for t, i in zip(inputs, graph.inputs) if i.keyword}
class Wrap(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model
    def forward(self, *a, **k):
        return self.model(*a, **k)
program = torch.export.export(Wrap(model), args, kwargs)
# The compiler shimgen proved: the GPU machine's default g++ builds libraries that crash at load.
from shimgen.toolchain import probe
cxx = probe.select(lambda message: None)[0].cxx
with torch.no_grad():
    torch._inductor.aoti_compile_and_package(
        program, package_path=package, inductor_configs={"freezing": False, "cpp.cxx": (None, cxx)}
    )
"""


def build(spec: Path, out: Path, env: dict[str, str]) -> tuple[float, dict]:
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "shimgen", "build", str(spec), "--out", str(out), "--json"],
        capture_output=True,
        text=True,
        env=env,
    )
    if done.returncode:
        sys.exit(f"build of {spec} failed:\n{done.stderr[-2000:]}")
    return time.perf_counter() - start, json.loads(done.stdout)


def bench(spec_file: Path, device: str, tmp: Path) -> dict:
    work = tmp / spec_file.stem
    work.mkdir()
    spec = work / spec_file.name
    text = spec_file.read_text()
    if device == "cuda":
        # TF32 convolutions and GEMMs (torch's defaults on cuda) differ from the traced program's by about 5e-3.
        import torch

        arch = "sm_{}{}".format(*torch.cuda.get_device_capability())
        text = text.replace('device = "cpu"\nisa = "native"', f'device = "cuda"\narchs = ["{arch}"]')
        text = re.sub(r"(?m)^atol = .*$", "atol = 1e-2\nrtol = 1e-2", re.sub(r"(?m)^rtol = .*\n", "", text))
    spec.write_text(text)
    if spec_file.with_suffix(".toml.lock").is_file() and device == "cpu":
        shutil.copy(spec_file.with_suffix(".toml.lock"), work)
    (work / "models").symlink_to(spec_file.parent / "models")
    env = {**os.environ, "SHIMGEN_SERVER": "off", "PYTHONPATH": str(REPO), "PYTHONFAULTHANDLER": "1"}
    _, summary = build(spec, work / "out", env)
    snapshot = work / "refit-site"
    shutil.copytree(summary["package_dir"], snapshot)
    aoti = work / "aoti.pt2"
    done = subprocess.run(
        [sys.executable, "-c", AOTI_BUILD, str(spec), device, str(aoti)], capture_output=True, text=True, env=env
    )
    if done.returncode:
        print(f"AOTInductor build failed: {done.stderr[-500:]}", file=sys.stderr)
    measured = subprocess.run(
        [
            sys.executable,
            "-c",
            MEASURE,
            str(spec),
            str(snapshot),
            summary["name"],
            device,
            str(aoti) if aoti.is_file() else "-",
            str(work / "refit.pt"),
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    if measured.returncode:
        sys.exit(f"measuring failed ({measured.returncode}):\n{measured.stdout[-1000:]}\n{measured.stderr[-2000:]}")
    results = json.loads(measured.stdout.strip().splitlines()[-1])
    spec.write_text(text.replace("[[graph]]\n", "[[graph]]\nseed = 1\n", 1))
    results["rebuild_s"], rebuilt = build(spec, work / "out", env)
    results["rebuild_compiled"] = rebuilt.get("compiled_units", {}).get("done")
    compare = (
        "import sys, torch, dataclasses\nfrom pathlib import Path\nfrom shimgen.spec import load_spec\n"
        "from shimgen.trace.entry import make_inputs\nsys.path.insert(0, sys.argv[2]); package = __import__(sys.argv[3])\n"
        "graph = load_spec(Path(sys.argv[1])).graph[0]\n"
        "inputs = [t.to(sys.argv[5]) for t in make_inputs(graph, {n: d.example for n, d in graph.dims.items()}, 0)]\n"
        "args = [t for t, i in zip(inputs, graph.inputs) if not i.keyword]\n"
        "kwargs = {i.name: t for t, i in zip(inputs, graph.inputs) if i.keyword}\n"
        "out = [t.cpu() for t in torch.utils._pytree.tree_leaves(package.forward(*args, **kwargs))]\n"
        "print(all(torch.equal(a, b) for a, b in zip(out, torch.load(sys.argv[4]), strict=True)))"
    )
    same = subprocess.run(
        [
            sys.executable,
            "-c",
            compare,
            str(spec),
            rebuilt["package_dir"],
            rebuilt["name"],
            str(work / "refit.pt"),
            device,
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    results["bitwise_as_rebuilt"] = same.stdout.strip().splitlines()[-1] if same.returncode == 0 else same.stderr[-300:]
    results["wheel_bytes"] = Path(rebuilt["wheel"]).stat().st_size
    spec.write_text(spec.read_text().replace("[flags]\n", '[flags]\nweights = "external"\n', 1))
    _, external = build(spec, work / "out", env)
    results["external_wheel_bytes"] = Path(external["wheel"]).stat().st_size
    results["weights_file_bytes"] = Path(external["weights_file"]).stat().st_size
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("specs", nargs="*", default=list(DEFAULT_SPECS))
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    lines = [
        f"# Refit with freezing ({args.device}, torch {__import__('torch').__version__})",
        "",
        "| model | refit (load_weights + first call) | refit / rebuild | plain copy | AOTI load_constants + first call "
        "(freezing off) | rebuild | call before / after refit | same as rebuilt | refit vs eager | wheel: weights in / "
        "external (+ weights file) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    with tempfile.TemporaryDirectory(prefix="shimgen-refit-") as tmp:
        for spec in args.specs:
            r = bench((REPO / spec).resolve(), args.device, Path(tmp))
            aoti = f"{r['aoti_refit_s']:.3f} s (call {r['aoti_ms']:.2f} ms)" if "aoti_refit_s" in r else "failed"
            lines.append(
                f"| {Path(spec).stem} | {r['refit_s']:.3f} s | {r['refit_s'] / r['rebuild_s']:.4f}x | {r['copy_s']:.3f} s "
                f"| {aoti} | {r['rebuild_s']:.1f} s ({r['rebuild_compiled']} units compiled) | {r['before_ms']:.2f} / "
                f"{r['after_ms']:.2f} ms | {r['bitwise_as_rebuilt']} | {r['refit_vs_eager']:.1e} | "
                f"{r['wheel_bytes'] / 1e6:.1f} MB / {r['external_wheel_bytes'] / 1e6:.2f} MB "
                f"(+ {r['weights_file_bytes'] / 1e6:.1f} MB) |"
            )
            print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
