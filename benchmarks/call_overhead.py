"""Per-call cost: the shimgen package against eager, torch.compile (default and cpp_wrapper) and
AOTInductor (aoti_load_package and loader.run), all in one run, in the same process order.

    python benchmarks/call_overhead.py [--out benchmarks/results]

Tiny MLP (8 x Linear 32, batch 4) with 1 thread; ResNet-18 batch 1 with all cores. Figures are
microseconds per call (median of repeated timing blocks) and each contender's ratio to shimgen.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from common import REPO, Report, import_built, shimgen_build

sys.path.insert(0, str(REPO / "projects"))

from models.mlp import mlp  # noqa: E402
from models.resnet import resnet18  # noqa: E402

IMPORT_SCRIPT = """
import sys, time, torch
sys.path.insert(0, sys.argv[1])
x = torch.randn(4, 32)
start = time.perf_counter()
import mlp
mlp.forward(x)
print(time.perf_counter() - start)
"""

AOTI_IMPORT_SCRIPT = """
import sys, time, torch
x = torch.randn(4, 32)
start = time.perf_counter()
model = torch._inductor.aoti_load_package(sys.argv[1])
model(x)
print(time.perf_counter() - start)
"""


def per_call_us(fn: Callable[[], Any], calls: int, blocks: int = 7) -> float:
    for _ in range(max(3, calls // 10)):
        fn()
    samples = []
    for _ in range(blocks):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(samples)


def contenders(model: torch.nn.Module, x: torch.Tensor, dynamic: dict, shims: dict[str, Callable], tmp: Path,
               tag: str) -> dict[str, Callable[[], Any]]:
    with torch.no_grad():
        example = x.expand(4, *x.shape[1:]).contiguous()  # export specializes a size-1 example
        program = torch.export.export(model, (example,), dynamic_shapes=(dynamic,))
        package = torch._inductor.aoti_compile_and_package(program, package_path=str(tmp / f"{tag}.pt2"), inductor_configs={"freezing": True})
    aoti = torch._inductor.aoti_load_package(package)
    loader = aoti.loader
    compiled = torch.compile(model)
    with torch._inductor.config.patch(cpp_wrapper=True):
        compiled_cpp = torch.compile(model)
        with torch.no_grad():
            compiled_cpp(x)  # compile under the cpp_wrapper config
    return {
        "eager": lambda: model(x),
        "torch.compile": lambda: compiled(x),
        "torch.compile cpp_wrapper": lambda: compiled_cpp(x),
        "AOTI aoti_load_package": lambda: aoti(x),
        "AOTI loader.run": lambda: loader.run([x]),
        **{name: (lambda fn=fn: fn(x)) for name, fn in shims.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="shimgen-calls-"))
    report = Report()

    report(f"# call_overhead.py, {time.strftime('%Y-%m-%d %H:%M')}, {platform.machine()}, {os.cpu_count()} cores, "
           f"torch {torch.__version__}, python {platform.python_version()}")
    mlp_build = shimgen_build(REPO / "projects" / "mlp.toml", tmp)[1]
    # The same MLP with oneDNN on: the kernels AOTI picks, to separate kernel choice from call cost.
    onednn_spec = REPO / "projects" / "_bench_mlp_onednn.toml"
    mlp_text = (REPO / "projects" / "mlp.toml").read_text()
    onednn_spec.write_text(mlp_text.replace('name = "mlp"', 'name = "mlp_onednn"').replace("onednn = false", "onednn = true"))
    try:
        mlp_onednn_build = shimgen_build(onednn_spec, tmp)[1]
    finally:
        onednn_spec.unlink()
    resnet_build = shimgen_build(REPO / "projects" / "resnet.toml", tmp)[1]
    figures: dict[str, dict[str, float]] = {}
    torch.manual_seed(0)
    cases = [
        ("tiny MLP, batch 4, 1 thread", 1, mlp(32, 8).eval(), torch.randn(4, 32),
         {"shimgen, onednn = true (the kernels AOTI uses)": import_built(mlp_onednn_build).forward,
          "shimgen": import_built(mlp_build).forward}, 2000, "mlp"),
        (f"ResNet-18, batch 1, {os.cpu_count()} threads", os.cpu_count(), None, torch.randn(1, 3, 224, 224),
         {"shimgen": import_built(resnet_build).forward}, 20, "resnet"),
    ]
    batch = torch.export.Dim("batch", min=1, max=64)
    for title, threads, model, x, shims, calls, tag in cases:
        torch.set_num_threads(threads)
        if model is None:
            torch.manual_seed(0)
            model = resnet18().eval()
        with torch.no_grad():
            runs = contenders(model, x, {0: batch}, shims, tmp, tag)
            for name, fn in runs.items():
                torch.testing.assert_close(fn()[0] if name == "AOTI loader.run" else fn(), model(x), rtol=1e-3, atol=1e-3)
            figures[title] = {name: per_call_us(fn, calls) for name, fn in runs.items()}
        report(f"\n## {title}\n\n| contender | µs per call | ratio to shimgen |\n| --- | --- | --- |")
        for name, us in figures[title].items():
            report(f"| {name} | {us:.1f} | {us / figures[title]['shimgen']:.2f} |")

    def seconds(*args: str) -> float:
        return float(subprocess.run([sys.executable, "-c", *args], capture_output=True, text=True, check=True).stdout)

    shim_import = [seconds(IMPORT_SCRIPT, mlp_build["package_dir"]) for _ in range(5)]
    aoti_import = [seconds(AOTI_IMPORT_SCRIPT, str(tmp / "mlp.pt2")) for _ in range(3)]
    report(f"\nimport + first call, tiny MLP (after `import torch`), median: shimgen {statistics.median(shim_import):.3f}s, "
           f"AOTI aoti_load_package {statistics.median(aoti_import):.3f}s")

    mlp_f, res_f = figures[cases[0][0]], figures[cases[1][0]]
    report("\n| goal | measured |\n| --- | --- |")
    report(f"| tiny MLP shimgen / AOTI loader.run <= 0.5 | {mlp_f['shimgen'] / mlp_f['AOTI loader.run']:.2f} |")
    report(f"| ResNet-18 shimgen / AOTI (freezing) <= 0.95 | {res_f['shimgen'] / res_f['AOTI loader.run']:.2f} |")
    report(f"| ResNet-18 shimgen / eager <= 0.6 | {res_f['shimgen'] / res_f['eager']:.2f} |")
    report(f"| import + first call <= 0.3 s | {statistics.median(shim_import):.3f} s |")
    report.save(args.out / "call_overhead.md")


if __name__ == "__main__":
    main()
