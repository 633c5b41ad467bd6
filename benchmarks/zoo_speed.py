"""Defaults never lose: every CPU graph of the example specs, built by shimgen as the spec says, against
eager and AOTInductor (default and with freezing) compiling the very program shimgen exports.

    python benchmarks/zoo_speed.py [--quick] [--only GRAPH ...] [--out DIR] [--work DIR]

For each graph: the spec's model and example inputs (shimgen's own helpers), exported with the spec's
dynamic dims as shimgen exports it, checked against eager on the flattened output tensors with the
spec's tolerances, then timed at 2 threads, and at 1 thread too where eager takes under 200 µs a call
(AOTI compiled again under 1 thread: Inductor fixes its OpenMP team size at compile time). --only takes
a graph name, or spec:graph (hf:bert). A full run saves benchmarks/results/zoo_speed.md; --quick or
--only runs save only with --out.
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from common import (
    AOTI,
    AOTI_FREEZING,
    EAGER,
    REPO,
    SHIMGEN,
    CommandFailed,
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
    short_error,
    show_time,
)

SPECS = ["hf.toml", "shapes.toml", "outputs.toml", "mlp.toml", "multi.toml", "resnet.toml"]
COLUMNS = [EAGER, AOTI, AOTI_FREEZING, SHIMGEN]
ONE_THREAD_BELOW_US = 200.0
SLOWER = 1.05


def wanted(spec: str, graph: str, only: list[str] | None) -> bool:
    """Whether --only names this graph (by its name, or spec:graph with or without .toml)."""
    stem = Path(spec).stem
    return not only or any(o in (graph, f"{stem}:{graph}", f"{spec}:{graph}") for o in only)


def time_graph(
    gm: Any,
    package: Any,
    program: Any,
    program_error: str,
    tmp: Path,
    tag: str,
    threads: int,
    block_seconds: float,
    blocks: int,
) -> tuple[dict[str, float], dict[str, str]]:
    """(µs per call, why not) of eager, AOTI default, AOTI freezing and shimgen at `threads`."""
    torch.set_num_threads(threads)
    runs = Contenders({EAGER: module_binder(gm, gm.model)})
    if program is None:
        runs.missing = {AOTI: program_error, AOTI_FREEZING: program_error}
    else:
        built = compiled_contenders(gm, program, tmp, f"{tag}_t{threads}", threads, [AOTI, AOTI_FREEZING])
        runs.binders.update(built.binders)
        runs.missing.update(built.missing)
    runs.binders[SHIMGEN] = module_binder(gm, getattr(package, gm.graph.name))
    tensors = gm.inputs()
    with torch.no_grad():
        args, kwargs = gm.split(tensors)
        expected = gm.model(*args, **kwargs)
    figures, wrong = measure(runs.binders, tensors, expected, gm.graph.rtol, gm.graph.atol, block_seconds, blocks)
    return figures, {**runs.missing, **wrong}


def graph_table(report: Report, title: str, rows: dict[int, tuple[dict[str, float], dict[str, str]]]) -> list[str]:
    """The graph's table (one row per thread count) and its footnotes; returns the rows where shimgen
    is more than 5% slower than an AOTI contender."""
    report(
        f"\n### {title}\n\n| threads | "
        + " | ".join(f"{c} per call" for c in COLUMNS)
        + " | shimgen / AOTI default | shimgen / AOTI freezing |\n|"
        + " --- |" * (len(COLUMNS) + 3)
    )
    notes: dict[str, str] = {}
    losses = []
    for threads, (figures, why) in rows.items():
        cells = []
        for name in COLUMNS:
            if name in figures:
                cells.append(show_time(figures[name]))
            else:
                notes.setdefault(why.get(name, "not run"), f"[{len(notes) + 1}]")
                cells.append(f"not run {notes[why.get(name, 'not run')]}")
        ratios = []
        for name in (AOTI, AOTI_FREEZING):
            if SHIMGEN in figures and name in figures:
                ratio = figures[SHIMGEN] / figures[name]
                ratios.append(f"{ratio:.2f}")
                if ratio > SLOWER:
                    losses.append(
                        f"{title} at {threads} thread{'s' * (threads > 1)}: shimgen {show_time(figures[SHIMGEN])} "
                        f"vs {name} {show_time(figures[name])} ({ratio:.2f}x)"
                    )
            else:
                ratios.append("")
        report(f"| {threads} | " + " | ".join(cells + ratios) + " |")
    for reason, mark in notes.items():
        report(f"\n{mark} {reason}")
    return losses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short timing blocks, for a smoke test")
    parser.add_argument("--only", action="append", help="only this graph (name, or spec:graph); repeatable")
    parser.add_argument("--out", type=Path, help="where zoo_speed.md goes (default: benchmarks/results for a full run)")
    parser.add_argument("--work", type=Path, help="build directory, kept (default: a fresh temporary one)")
    args = parser.parse_args()
    out = args.out or (None if args.quick or args.only else REPO / "benchmarks" / "results")
    block_seconds, blocks = (0.05, 3) if args.quick else (0.3, 9)
    tmp = args.work or Path(tempfile.mkdtemp(prefix="shimgen-zoo-"))
    tmp.mkdir(parents=True, exist_ok=True)
    report = Report()
    report(
        f"# zoo_speed.py, {time.strftime('%Y-%m-%d %H:%M')}, {platform.machine()}, {os.cpu_count()} cores, "
        f"torch {torch.__version__}, python {platform.python_version()}" + (", --quick" if args.quick else "")
    )
    report(
        f"\nEvery CPU graph of projects/{{{','.join(Path(s).stem for s in SPECS)}}}.toml at its example sizes. shimgen: the "
        "spec built as it is. AOTI: `aoti_compile_and_package` of the program shimgen exports (its defaults, and "
        "`freezing`), run through its loader's `run`, compiled under the row's thread count. Time per call: median of "
        f"{blocks} blocks of about {block_seconds} s, the contenders' blocks taking turns; 1-thread rows where eager "
        f"takes under {ONE_THREAD_BELOW_US:.0f} µs at 2 threads."
    )

    losses: list[str] = []
    for spec_name in SPECS:
        spec_path = REPO / "projects" / spec_name
        if not spec_path.is_file():
            report(f"\n## projects/{spec_name}\n\nnot found")
            continue
        spec = load_spec(spec_path)
        names = [g.name for g in spec.graph if wanted(spec_name, g.name, args.only)]
        if not names:
            continue
        report(f"\n## projects/{spec_name}\n")
        if spec.target and not any(t.device == "cpu" for t in spec.target):
            report("no CPU target: skipped")
            continue
        flags = non_default_flags(spec)
        report(
            f"[flags] differing from shimgen's defaults, built as they are: {flags}"
            if flags
            else "shimgen's default flags"
        )
        print(f"shimgen build projects/{spec_name}", flush=True)
        try:
            summary = shimgen_build(spec_path, tmp)[1]
        except CommandFailed as exc:
            report(f"\nshimgen build failed: {short_error(exc, 1000)}")
            continue
        report(f"\nbuild stages (s): {summary['stages']}")
        extras = kernel_choice_lines(summary)
        if extras:
            report("\nkernels chosen by timing at build time (µs per call):\n\n" + "\n".join(extras))
        package = import_built(summary)
        with project(spec_path) as spec_dir:
            for name in names:
                print(f"{spec_name} {name}", flush=True)
                torch.manual_seed(0)
                gm = load_graph(spec, spec_dir, name)
                program, program_error = None, ""
                try:
                    program = export_graph(gm)
                except Exception as exc:
                    program_error = f"torch.export failed: {short_error(exc)}"
                tag = f"{Path(spec_name).stem}_{name}"
                rows = {2: time_graph(gm, package, program, program_error, tmp, tag, 2, block_seconds, blocks)}
                if rows[2][0].get(EAGER, float("inf")) < ONE_THREAD_BELOW_US:
                    rows[1] = time_graph(gm, package, program, program_error, tmp, tag, 1, block_seconds, blocks)
                losses += graph_table(report, f"{Path(spec_name).stem}:{name}", rows)

    report("\n## shimgen default slower than AOTI by more than 5%\n")
    report("\n".join(f"- {line}" for line in losses) if losses else "none")
    if out:
        report.save(out / "zoo_speed.md")


if __name__ == "__main__":
    main()
