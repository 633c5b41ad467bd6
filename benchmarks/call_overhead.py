"""Per-call cost: shimgen packages built with the defaults against eager, torch.compile, AOTInductor
(default and with freezing) and ONNX Runtime, all in one run, one process, timed side by side.

    python benchmarks/call_overhead.py [--quick] [--case mlp|bert1|bert8|resnet ...] [--out DIR] [--work DIR]

Cases: a tiny MLP (8 x residual GELU over Linear 32, batch 4, 1 thread), a MiniLM-L12-H384-shaped BERT
(batch 1 and 8, seq 128, 2 threads) and ResNet-18 (batch 1, 2 threads), from projects/bench.toml and
projects/resnet.toml. Every compiled contender compiles the program shimgen exports (the spec's
model, example inputs and dynamic dims) and is checked against eager before it is timed. Figures are
time per call (median of blocks that take turns across contenders) and each contender's ratio to
shimgen. A full run saves benchmarks/results/call_overhead.md; --quick or --case runs save only with --out.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from common import (
    AOTI,
    AOTI_FREEZING,
    COMPILE,
    EAGER,
    ORT,
    REPO,
    SHIMGEN,
    Contenders,
    Report,
    compiled_contenders,
    export_graph,
    import_built,
    kernel_choice_lines,
    load_graph,
    load_spec,
    measure,
    module_binder,
    non_default_flags,
    project,
    shimgen_build,
    show_time,
)

IMPORT_SCRIPT = """
import sys, time, torch
sys.path.insert(0, sys.argv[1])
x = torch.randn(4, 32)
start = time.perf_counter()
import bench
bench.mlp_gelu(x)
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

ORDER = [EAGER, COMPILE, AOTI, AOTI_FREEZING, ORT, SHIMGEN]


@dataclass
class Case:
    """One set of input sizes timed for a model."""

    key: str
    title: str
    sizes: dict[str, int]


@dataclass
class Model:
    """A spec's graph, its thread count, the tolerance of the check against eager, and its cases."""

    spec: str
    graph: str
    threads: int
    tol: float
    cases: list[Case]


MODELS = [
    Model(
        "bench.toml",
        "mlp_gelu",
        1,
        1e-3,
        [Case("mlp", "tiny MLP (8 x residual GELU, Linear 32), batch 4, 1 thread", {"batch": 4})],
    ),
    Model(
        "bench.toml",
        "minilm",
        2,
        2e-3,
        [
            Case("bert1", "MiniLM-L12-H384 BERT, batch 1 x seq 128, 2 threads", {"batch": 1, "seq": 128}),
            Case("bert8", "MiniLM-L12-H384 BERT, batch 8 x seq 128, 2 threads", {"batch": 8, "seq": 128}),
        ],
    ),
    Model("resnet.toml", "forward", 2, 1e-3, [Case("resnet", "ResNet-18, batch 1, 2 threads", {"batch": 1})]),
]


def contenders(model: Model, spec: Any, spec_dir: Path, package: Any, tmp: Path) -> tuple[Any, Contenders]:
    """The graph's model and its six contenders, compiled under the model's thread count."""
    gm = load_graph(spec, spec_dir, model.graph)
    print(f"{model.spec} {model.graph}: exporting and compiling the contenders", flush=True)
    program = export_graph(gm)
    tag = f"{Path(model.spec).stem}_{model.graph}"
    built = compiled_contenders(gm, program, tmp, tag, model.threads, [AOTI, AOTI_FREEZING, ORT])
    out = Contenders(
        {EAGER: module_binder(gm, gm.model), COMPILE: module_binder(gm, torch.compile(gm.model))}, built.missing
    )
    out.binders.update(built.binders)
    out.binders[SHIMGEN] = module_binder(gm, getattr(package, model.graph))
    return gm, out


def table(report: Report, title: str, figures: dict[str, float], missing: dict[str, str]) -> None:
    report(f"\n## {title}\n\n| contender | per call | ratio to shimgen |\n| --- | --- | --- |")
    base = figures.get(SHIMGEN)
    for name in ORDER:
        if name in figures:
            ratio = f"{figures[name] / base:.2f}" if base else ""
            report(f"| {name} | {show_time(figures[name])} | {ratio} |")
        elif name in missing:
            report(f"| {name} | not run: {missing[name]} | |")


def goals(report: Report, figures: dict[str, dict[str, float]], import_s: float | None) -> None:
    """The goals table, for the cases that ran (issue 29's for BERT and ResNet-18)."""
    rows: list[tuple[str, float | None, float, str]] = []

    def ratio(case: str, a: str, b: str | list[str]) -> float | None:
        f = figures.get(case, {})
        others = [f[n] for n in ([b] if isinstance(b, str) else b) if n in f]
        return f[a] / min(others) if a in f and others else None

    if "mlp" in figures:
        rows.append(("tiny MLP shimgen per call <= 3 µs", figures["mlp"].get(SHIMGEN), 3.0, "µs"))
        rows.append(("tiny MLP shimgen / AOTI default <= 0.2", ratio("mlp", SHIMGEN, AOTI), 0.2, ""))
    for case, label in (("bert1", "BERT batch 1"), ("bert8", "BERT batch 8")):
        if case in figures:
            rows.append(
                (
                    f"{label} shimgen / AOTI (better of default, freezing) <= 0.85",
                    ratio(case, SHIMGEN, [AOTI, AOTI_FREEZING]),
                    0.85,
                    "",
                )
            )
            rows.append((f"{label} shimgen / ONNX Runtime <= 0.7", ratio(case, SHIMGEN, ORT), 0.7, ""))
    if "resnet" in figures:
        rows.append(("ResNet-18 shimgen / AOTI freezing <= 0.85", ratio("resnet", SHIMGEN, AOTI_FREEZING), 0.85, ""))
        rows.append(("ResNet-18 shimgen / ONNX Runtime <= 0.85", ratio("resnet", SHIMGEN, ORT), 0.85, ""))
    if import_s is not None:
        rows.append(("tiny MLP import + first call <= 0.3 s", import_s, 0.3, "s"))
    report("\n| goal | measured | met |\n| --- | --- | --- |")
    for text, value, limit, unit in rows:
        shown = (
            "not measured"
            if value is None
            else f"{value:.3f} s"
            if unit == "s"
            else f"{value:.2f}" + (f" {unit}" if unit else "")
        )
        met = "" if value is None else "yes" if value <= limit else "no"
        report(f"| {text} | {shown} | {met} |")


def first_call_seconds(package_dir: str, aoti_packages: dict[str, Path], repeats: int) -> dict[str, float]:
    """Median seconds, in a fresh process after `import torch`, to import and call the tiny MLP once."""

    def seconds(*args: str) -> float:
        return float(subprocess.run([sys.executable, "-c", *args], capture_output=True, text=True, check=True).stdout)

    out = {SHIMGEN: statistics.median(seconds(IMPORT_SCRIPT, package_dir) for _ in range(repeats))}
    for name, path in aoti_packages.items():
        if path.is_file():
            out[f"{name} (aoti_load_package)"] = statistics.median(
                seconds(AOTI_IMPORT_SCRIPT, str(path)) for _ in range(max(1, repeats - 2))
            )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short timing blocks, for a smoke test")
    parser.add_argument(
        "--case", action="append", choices=[c.key for m in MODELS for c in m.cases], help="only these cases"
    )
    parser.add_argument(
        "--out", type=Path, help="where call_overhead.md goes (default: benchmarks/results for a full run)"
    )
    parser.add_argument("--work", type=Path, help="build directory, kept (default: a fresh temporary one)")
    args = parser.parse_args()
    partial_run = args.quick or args.case
    out = args.out or (None if partial_run else REPO / "benchmarks" / "results")
    block_seconds, blocks = (0.05, 3) if args.quick else (0.5, 11)
    tmp = args.work or Path(tempfile.mkdtemp(prefix="shimgen-calls-"))
    tmp.mkdir(parents=True, exist_ok=True)
    report = Report()

    try:
        import onnxruntime

        ort_version = f"onnxruntime {onnxruntime.__version__}"
    except ImportError as exc:
        ort_version = f"no onnxruntime ({exc})"
    import transformers

    report(
        f"# call_overhead.py, {time.strftime('%Y-%m-%d %H:%M')}, {platform.machine()}, {os.cpu_count()} cores, "
        f"torch {torch.__version__}, transformers {transformers.__version__}, {ort_version}, python {platform.python_version()}"
        + (", --quick" if args.quick else "")
    )
    report(
        f"\nTime per call: median of {blocks} blocks of about {block_seconds} s per contender, the contenders' blocks taking "
        "turns. Every compiled contender compiles the program shimgen exports (the spec's model, example inputs, dynamic "
        "dims), under the case's thread count (shimgen's build: OMP_NUM_THREADS), and is checked against eager first. "
        "AOTI runs through its loader's `run`; ONNX Runtime through `InferenceSession.run` on numpy views of the inputs "
        "(CPU execution provider, intra-op threads = the case's, inter-op 1), its model exported by "
        "`torch.onnx.export(..., dynamo=True)`."
    )

    models = [m for m in MODELS if not args.case or any(c.key in args.case for c in m.cases)]
    figures: dict[str, dict[str, float]] = {}
    failed: list[str] = []
    summaries: dict[str, dict[str, Any]] = {}
    for model in models:
        spec_path = REPO / "projects" / model.spec
        if model.spec not in summaries:
            # Built for the threads its cases run (oneDNN packs weights for them), as a user sets them for a build.
            threads = max(m.threads for m in MODELS if m.spec == model.spec)
            print(f"OMP_NUM_THREADS={threads} shimgen build projects/{model.spec}", flush=True)
            summaries[model.spec] = shimgen_build(spec_path, tmp, {**os.environ, "OMP_NUM_THREADS": str(threads)})[1]
        summary = summaries[model.spec]
        spec = load_spec(spec_path)
        torch.set_num_threads(model.threads)
        torch.manual_seed(0)
        with project(spec_path) as spec_dir:
            gm, runs = contenders(model, spec, spec_dir, import_built(summary), tmp)
            for case in (c for c in model.cases if not args.case or c.key in args.case):
                tensors = gm.inputs(case.sizes)
                args_, kwargs = gm.split(tensors)
                with torch.no_grad():
                    expected = gm.model(*args_, **kwargs)
                print(f"{case.title}: checking and timing", flush=True)
                figures[case.key], wrong = measure(
                    runs.binders, tensors, expected, model.tol, model.tol, block_seconds, blocks
                )
                failed += [f"{case.key}: {name}: {why}" for name, why in wrong.items()]
                table(report, case.title, figures[case.key], {**runs.missing, **wrong})

    report("\n## shimgen builds\n")
    for name, summary in summaries.items():
        flags = non_default_flags(load_spec(REPO / "projects" / name))
        report(
            f"- projects/{name}: "
            + (f"[flags] differing from the defaults: {flags}" if flags else "shimgen's default flags")
            + f"; stages {summary['stages']}"
        )
        for line in kernel_choice_lines(summary):
            report(f"  {line}")

    import_s = None
    if "mlp" in figures:
        first = first_call_seconds(
            summaries["bench.toml"]["package_dir"],
            {AOTI: tmp / "bench_mlp_gelu_aoti.pt2", AOTI_FREEZING: tmp / "bench_mlp_gelu_aoti_freezing.pt2"},
            2 if args.quick else 5,
        )
        import_s = first[SHIMGEN]
        report(
            "\nimport + first call, tiny MLP (after `import torch`), median: "
            + ", ".join(f"{name} {s:.3f} s" for name, s in first.items())
        )
    goals(report, figures, import_s)
    if out:
        report.save(out / "call_overhead.md")
    if failed:
        sys.exit("outputs differ from eager or calls failed:\n  " + "\n  ".join(failed))


if __name__ == "__main__":
    main()
