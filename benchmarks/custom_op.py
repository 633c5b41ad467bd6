"""Custom ops per call: a graph calling [[custom_op]] ops, built by shimgen, against eager and AOTInductor (default and
with freezing) with the ops' library loaded and their modules imported, all compiling the very program shimgen exports.

    python benchmarks/custom_op.py [--spec projects/custom_ops.toml ...] [--quick] [--out DIR] [--work DIR]

CPU graphs are timed at 1 thread. A CUDA graph's calls each end with torch.cuda.synchronize(). Saves
benchmarks/results/custom_op_<device>.md unless --quick (then only with --out).
"""

from __future__ import annotations

import argparse
import platform
import tempfile
from pathlib import Path

import torch
from common import (
    AOTI,
    AOTI_FREEZING,
    EAGER,
    REPO,
    SHIMGEN,
    Binder,
    Report,
    compiled_contenders,
    import_built,
    load_graph,
    load_spec,
    measure,
    module_binder,
    project,
    shimgen_build,
    show_time,
)

COLUMNS = [EAGER, AOTI, AOTI_FREEZING, SHIMGEN]


def synchronized(bind: Binder) -> Binder:
    def bound(tensors: list[torch.Tensor]):  # type: ignore[no-untyped-def]
        call = bind(tensors)

        def call_and_wait():  # type: ignore[no-untyped-def]
            out = call()
            torch.cuda.synchronize()
            return out

        return call_and_wait

    return bound


def bench(spec_path: Path, work: Path, quick: bool, report: Report) -> None:
    from shimgen.trace import dims
    from shimgen.trace import export as trace
    from shimgen.trace.custom_ops import load_library
    from shimgen.trace.entry import import_once

    seconds, summary = shimgen_build(spec_path, work)
    spec = load_spec(spec_path)
    device = spec.target[0].device
    for op in spec.custom_op:  # what AOTI needs loaded to run the ops, as its users must do
        if op.module:
            import_once(op.module, spec_path.parent.resolve())
    for library in sorted((work / "build" / spec.project.name / "ops" / "meson").glob("lib*.so")):
        load_library(library, "custom_op")
    package = import_built(summary)
    with project(spec_path) as spec_dir:
        for graph in spec.graph:
            gm = load_graph(spec, spec_dir, graph.name)
            if isinstance(gm.model, torch.nn.Module):
                gm.model.to(device)
            tensors = [t.to(device) for t in gm.inputs()]
            with torch.no_grad():
                program = dims.export(trace._spec_order_module(gm.model, gm.graph), tensors, gm.graph, gm.where)
            with torch.no_grad():
                expected = gm.model(*gm.split(tensors)[0], **gm.split(tensors)[1])
            contenders = compiled_contenders(gm, program, work, graph.name, 1, [AOTI, AOTI_FREEZING])
            binders = {
                EAGER: module_binder(gm, gm.model),
                **contenders.binders,
                SHIMGEN: module_binder(gm, getattr(package, graph.name)),
            }
            if device == "cuda":
                binders = {name: synchronized(b) for name, b in binders.items()}
            us, failures = measure(
                binders, tensors, expected, graph.rtol, graph.atol, 0.05 if quick else 0.3, 3 if quick else 9
            )
            ops = ", ".join(sorted(set(_ops_called(program))))
            shape = ", ".join(f"{t.dtype}{list(t.shape)}".replace("torch.", "") for t in tensors)
            row = [
                show_time(us[c]) if c in us else (failures.get(c) or contenders.missing.get(c, "-")) for c in COLUMNS
            ]
            ratio = (
                f"{us[SHIMGEN] / min(us[AOTI], us[AOTI_FREEZING]):.2f}"
                if {SHIMGEN, AOTI, AOTI_FREEZING} <= set(us)
                else "-"
            )
            report(f"| {spec_path.name}:{graph.name} ({ops}; {shape}) | {' | '.join(row)} | {ratio} |")
    report(f"\n{spec_path.name}: shimgen build {seconds:.1f} s (cold: new build directory).")


def _ops_called(program: torch.export.ExportedProgram) -> list[str]:
    return [
        str(n.target).removesuffix(".default")
        for n in program.graph.nodes
        if n.op == "call_function"
        and isinstance(n.target, torch._ops.OpOverload)
        and n.target.namespace not in ("aten", "prims")
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", type=Path, action="append", help="specs to run (default: projects/custom_ops.toml)")
    parser.add_argument("--quick", action="store_true", help="short timing blocks, for a smoke test")
    parser.add_argument("--out", type=Path, help="where custom_op_<device>.md goes")
    parser.add_argument("--work", type=Path, help="build directory, kept (default: a fresh temporary one)")
    args = parser.parse_args()
    specs = args.spec or [REPO / "projects" / "custom_ops.toml"]
    device = load_spec(specs[0]).target[0].device
    torch.set_num_threads(1)
    report = Report()
    where = (
        torch.cuda.get_device_name() if device == "cuda" else f"{platform.processor() or platform.machine()}, 1 thread"
    )
    report(f"# Custom ops: µs per call ({where}; torch {torch.__version__})\n")
    report(
        "AOTI is given what its users must set up by hand: the ops' library loaded and their modules imported. "
        "Ratio: shimgen / the faster AOTI.\n"
    )
    report(f"| graph | {' | '.join(COLUMNS)} | ratio |")
    report("|" + " --- |" * (len(COLUMNS) + 2))
    with tempfile.TemporaryDirectory(prefix="shimgen-bench-") as tmp:
        for spec in specs:
            bench(spec.resolve(), (args.work or Path(tmp)).resolve(), args.quick, report)
    out = args.out or (None if args.quick else REPO / "benchmarks" / "results")
    if out:
        report.save(out / f"custom_op_{device}.md")


if __name__ == "__main__":
    main()
