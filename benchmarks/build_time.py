"""Build time: shimgen against AOTInductor on the same model, torch, machine and cores, in one run.

    python benchmarks/build_time.py [--out benchmarks/results]

Every contender runs in its own subprocess with a fresh Inductor cache (TORCHINDUCTOR_CACHE_DIR),
so no one profits from another's compiled artefacts. Figures are ratios; see the printed table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import REPO, Report, run, shimgen_build

AOTI_SCRIPT = """
import sys, time, torch
sys.path.insert(0, {projects!r})
from models.resnet import resnet18
torch.manual_seed(0)
model = resnet18(num_classes=1000).eval()
start = time.perf_counter()
with torch.no_grad():
    batch = torch.export.Dim("batch", min=1, max=64)
    program = torch.export.export(model, (torch.randn(4, 3, 224, 224),), dynamic_shapes=({{0: batch}},))
    exported = time.perf_counter()
    torch._inductor.aoti_compile_and_package(program, package_path={package!r}, inductor_configs={{"freezing": True}})
print(exported - start, time.perf_counter() - exported)
"""

LATENCY_SCRIPT = """
import sys, time, torch
sys.path.insert(0, sys.argv[1])
forward = __import__(sys.argv[2]).forward
x = torch.randn(1, 3, 224, 224)
for _ in range(5):
    forward(x)
times = []
for _ in range(40):
    t = time.perf_counter(); forward(x); times.append(time.perf_counter() - t)
print(sorted(times)[len(times) // 2] * 1e3)
"""


def fresh_env(tmp: Path, tag: str, shimgen_cache: Path) -> dict[str, str]:
    return {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp / f"inductor-{tag}"), "SHIMGEN_CACHE_DIR": str(shimgen_cache / "toolchain")}


def spec_variant(tmp: Path, name: str, flags: str) -> Path:
    """projects/resnet.toml with other [flags], as its own project `name` beside the real models."""
    text = (REPO / "projects" / "resnet.toml").read_text().replace('name = "resnet"', f'name = "{name}"')
    head, _, _ = text.partition("[flags]")
    path = REPO / "projects" / f"_bench_{name}.toml"
    path.write_text(head + "[flags]\n" + flags + "\n")
    return path


def monolithic_o3_seconds(build: Path, codegen: Path) -> float:
    """Inductor's wrapper as one translation unit (interface + model + all kernels) at -O3, no PCH."""
    commands = json.loads((build / "meson" / "compile_commands.json").read_text())
    model = next(c for c in commands if c["file"].endswith("model.cpp"))
    args = shlex.split(model["command"])
    args = [a for i, a in enumerate(args) if a != "-include" and (i == 0 or args[i - 1] != "-include")]
    args = ["-O3" if a.startswith("-O") else a for a in args]
    source = build / "monolithic.cpp"
    parts = [codegen / "interface.cpp", codegen / "model.cpp", *sorted(codegen.glob("kernels_*.cpp"))]
    source.write_text("".join(p.read_text() for p in parts))
    args[args.index(model["file"])] = str(source)
    args[args.index("-o") + 1] = str(build / "monolithic.o")
    start = time.perf_counter()
    subprocess.run(args, cwd=model["directory"], check=True, capture_output=True)
    return time.perf_counter() - start


def latency_ms(summary: dict) -> float:
    return float(run([sys.executable, "-c", LATENCY_SCRIPT, summary["package_dir"], summary["name"]], dict(os.environ))[1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="shimgen-bench-"))
    report = Report()
    results: dict[str, float] = {}

    import torch

    report(f"# build_time.py, {time.strftime('%Y-%m-%d %H:%M')}, {platform.processor() or platform.machine()}, "
           f"{os.cpu_count()} cores, torch {torch.__version__}, python {platform.python_version()}")
    resnet_spec = REPO / "projects" / "resnet.toml"
    user_cache = tmp / "user-cache"

    # 1. AOTInductor: export + aoti_compile_and_package (codegen and compile), fresh caches.
    script = AOTI_SCRIPT.format(projects=str(REPO / "projects"), package=str(tmp / "resnet.pt2"))
    aoti_wall, out = run([sys.executable, "-c", script], fresh_env(tmp, "aoti", user_cache))
    aoti_export, aoti_compile = map(float, out.split())
    report(f"AOTI export + aoti_compile_and_package: {aoti_wall:.1f}s wall (export {aoti_export:.1f}s, codegen+compile {aoti_compile:.1f}s)")

    # 2. shimgen first ever (empty per-user cache: toolchain probe and PCH built), then a cold project
    #    with the per-user cache warm (the usual case).
    first_wall, first = shimgen_build(resnet_spec, tmp / "first", fresh_env(tmp, "first", user_cache), "--no-cache")
    report(f"shimgen, first build on this machine: {first_wall:.1f}s wall; stages {first['stages']}")
    cold_wall, cold = shimgen_build(resnet_spec, tmp / "cold", fresh_env(tmp, "cold", user_cache), "--no-cache")
    report(f"shimgen, cold project build: {cold_wall:.1f}s wall; stages {cold['stages']}")
    results["cold_ratio"] = cold_wall / aoti_wall
    results["first_ratio"] = first_wall / aoti_wall

    # 3. C++ compile portion: PCH + split + O1 wrapper (ninja, 2 cores) vs one monolithic -O3 TU.
    build_dir = tmp / "cold" / "build" / "resnet"
    mono = monolithic_o3_seconds(build_dir, build_dir / "codegen" / "forward_cpu")
    results["compile_ratio"] = cold["stages"]["compile"] / mono
    report(f"C++ compile: shimgen {cold['stages']['compile']:.1f}s vs monolithic -O3 wrapper.cpp {mono:.1f}s")

    # 4. No-op rebuild.
    noop_wall, noop = shimgen_build(resnet_spec, tmp / "cold", fresh_env(tmp, "cold", user_cache), "--no-cache")
    results["noop_seconds"] = noop_wall
    report(f"no-op rebuild: {noop_wall:.2f}s wall (skipped: {', '.join(noop['skipped'])})")

    # 5. Multi-graph: full build of the three-graph zoo, then one model's source edited.
    zoo = REPO / "projects" / "zoo.toml"
    zoo_wall, _ = shimgen_build(zoo, tmp / "zoo", fresh_env(tmp, "zoo", user_cache), "--no-cache")
    convnet = REPO / "projects" / "models" / "convnet.py"
    original = convnet.read_text()
    try:
        convnet.write_text(original.replace("return self.head(self.features(x).mean(dim=(2, 3)))",
                                            "return self.head(self.features(x).amax(dim=(2, 3)))"))
        one_wall, one = shimgen_build(zoo, tmp / "zoo", fresh_env(tmp, "zoo", user_cache), "--no-cache")
    finally:
        convnet.write_text(original)
    results["one_graph_ratio"] = one_wall / zoo_wall
    report(f"zoo (3 graphs) full build {zoo_wall:.1f}s; convnet.py edited: rebuild {one_wall:.1f}s "
           f"(skipped: {', '.join(one['skipped'])}; compiled {one['compiled_units']['done']} of {one['compiled_units']['total']} steps)")

    # 6. Flag choices: C++ compile seconds and ResNet-18 batch-1 latency, same process order for all.
    variants = {
        "default (pch, split 4, wrapper O1, kernels O3)": "",
        "no pch": "pch = false",
        "split 1": "split = 1",
        "split 2": "split = 2",
        "wrapper O3": 'wrapper_opt = "O3"',
        "kernels O1": 'kernel_opt = "O1"',
    }
    report("\n| variant | C++ compile s | ResNet-18 batch 1 ms |\n| --- | --- | --- |")
    built = {}
    for label, flags in variants.items():
        spec = spec_variant(tmp, "resnet_" + str(len(built)), flags)
        try:
            _, summary = shimgen_build(spec, tmp / "variants", fresh_env(tmp, "variants", user_cache), "--no-cache")
        finally:
            spec.unlink()
        built[label] = summary
    for label, summary in built.items():
        ms = latency_ms(summary)
        results[f"latency_ms[{label}]"] = ms
        report(f"| {label} | {summary['stages']['compile']:.1f} | {ms:.2f} |")

    report("\n| figure | value | goal |\n| --- | --- | --- |")
    report(f"| cold end-to-end shimgen / AOTI | {results['cold_ratio']:.2f} | <= 0.6 |")
    report(f"| first-ever build (probe + PCH) / AOTI | {results['first_ratio']:.2f} | |")
    report(f"| C++ compile shimgen / monolithic -O3 TU | {results['compile_ratio']:.2f} | |")
    report(f"| no-op rebuild | {results['noop_seconds']:.2f}s | <= 1 s |")
    report(f"| one graph of three changed / full build | {results['one_graph_ratio']:.2f} | <= 0.4 |")
    report.save(args.out / "build_time.md")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
