"""Calls from C++: a shimgen build's C++ package against AOTInductor's C++ loader (AOTIModelPackageLoader) on the same
exported program, with the build's Python package as a reference. Each contender runs alone in its own process.

    python benchmarks/cpp_call.py [--case mlp] [--case resnet] [--rounds N] [--quick] [--device cpu|cuda]
        [--out DIR] [--work DIR]

Cases (the models, sizes and thread counts of benchmarks/call_overhead.py): the tiny MLP (8 x residual GELU over
Linear 32, batch 4, 1 thread) of projects/bench.toml and ResNet-18 (batch 1, 2 threads) of projects/resnet.toml.

Contenders, one process each, their order rotated from round to round:
- shimgen C++: benchmarks/cpp/shimgen_bench.cpp linked to the build's lib<name>.so through `pkg-config --cflags --libs`,
  calling the graph's method of `<name>::load()`;
- AOTI loader: benchmarks/cpp/aoti_bench.cpp linked to libtorch (-ltorch -ltorch_cpu -lc10), running
  `torch::inductor::AOTIModelPackageLoader::run` on the .pt2 that `torch._inductor.aoti_compile_and_package` makes of
  the program shimgen exports (the spec's model, example inputs and dims), with freezing on;
- shimgen Python: benchmarks/cpp/python_bench.py, a Python process that imports torch and the build's Python package;
- libtorch alone: benchmarks/cpp/floor_bench.cpp, linked as aoti_bench is, whose "call" hands its inputs back: the
  floor under both C++ contenders (loading libtorch, reading the inputs).

Figures: start -> first result (the driver's time.monotonic_ns() just before it spawns the process, to the
CLOCK_MONOTONIC time the process prints once its first result is ready; the median over the rounds) and time per call
(in each process a warm-up, then the median of timed batches; the median over the rounds). Every process's first
outputs are compared with eager's and with shimgen C++'s. A full run saves benchmarks/results/cpp_call.md; --quick or
--case runs save only with --out.

--device cuda (untested here: the machine this was written on has no GPU) builds a copy of each spec with a cuda target
instead of its own, exports the model on cuda, and runs the same programs with the inputs on cuda; a timed batch ends
with a copy of one output element to the host (C++) or torch.cuda.synchronize() (Python).
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.utils._pytree as pytree
from call_overhead import MODELS, Case, Model
from common import (
    REPO,
    CommandFailed,
    Report,
    export_graph,
    load_graph,
    load_spec,
    non_default_flags,
    project,
    shimgen_build,
    short_error,
    show_time,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "cpp"))
from tensor_file import read_tensors, write_tensors  # noqa: E402

SHIMGEN_CPP, AOTI_LOADER, SHIMGEN_PY, FLOOR = (
    "shimgen C++",
    "AOTI loader (freezing)",
    "shimgen Python",
    "libtorch alone (floor, no model)",
)
ORDER = [SHIMGEN_CPP, AOTI_LOADER, SHIMGEN_PY, FLOOR]
CASES = ("mlp", "resnet")
SOURCES = REPO / "benchmarks" / "cpp"
EXAMPLE = REPO / "examples" / "cpp"  # tensor_file.h and tensor_file.py: the tensor files
# c10::ScalarType's numbers (the tensor files of benchmarks/cpp/bench_common.h).


# --- building the contenders ----------------------------------------------------------------------


def compile_program(cmd: list[str], binary: Path, source: str) -> None:
    """Runs the compiler command unless `binary` was made by this very command after its sources last changed."""
    stamp = binary.with_suffix(".cmd")
    newest = max(
        (SOURCES / source).stat().st_mtime,
        (SOURCES / "bench_common.h").stat().st_mtime,
        (EXAMPLE / "tensor_file.h").stat().st_mtime,
    )
    if (
        binary.is_file()
        and stamp.is_file()
        and stamp.read_text() == shlex.join(cmd)
        and binary.stat().st_mtime > newest
    ):
        return
    binary.parent.mkdir(parents=True, exist_ok=True)
    print(f"  compiling {binary.name}", flush=True)
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"compiling {binary.name} failed: {done.stderr.strip()[-1500:]}")
    stamp.write_text(shlex.join(cmd))


def cxx() -> str:
    from shimgen import toolchain

    return toolchain.detect().cxx


def shimgen_program(summary: dict[str, Any], graph: str, bin_dir: Path) -> Path:
    """shimgen_bench.cpp for the build's C++ package, compiled and linked by one command with pkg-config's flags."""
    name, prefix = summary["name"], Path(summary["cpp_prefix"])
    env = {**os.environ, "PKG_CONFIG_PATH": str(prefix / "lib" / "pkgconfig")}
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", name], capture_output=True, text=True, env=env)
    if flags.returncode != 0:
        raise RuntimeError(f"pkg-config {name}: {flags.stderr.strip()}")
    binary = bin_dir / f"shimgen_bench_{name}_{graph}"
    compile_program(
        [
            cxx(),
            "-O2",
            "-std=c++17",
            f"-DPACKAGE={name}",
            f"-DPACKAGE_HEADER=<{name}/{name}.h>",
            f"-DGRAPH_METHOD={graph}",
            f"-I{SOURCES}",
            f"-I{EXAMPLE}",
            str(SOURCES / "shimgen_bench.cpp"),
            "-o",
            str(binary),
            *shlex.split(flags.stdout),
            "-pthread",
        ],
        binary,
        "shimgen_bench.cpp",
    )
    return binary


def torch_program(source: str, bin_dir: Path, cuda: bool) -> Path:
    """aoti_bench.cpp or floor_bench.cpp against the venv's libtorch."""
    from torch.utils import cpp_extension

    libs = ["-ltorch", "-ltorch_cpu", "-lc10"]
    if cuda:
        libs = ["-Wl,--no-as-needed", "-ltorch_cuda", "-lc10_cuda", *libs, "-Wl,--as-needed"]
    binary = bin_dir / (Path(source).stem + ("_cuda" if cuda else ""))
    compile_program(
        [
            cxx(),
            "-O2",
            "-std=c++17",
            f"-I{SOURCES}",
            f"-I{EXAMPLE}",
            *[f"-I{d}" for d in cpp_extension.include_paths()],
            str(SOURCES / source),
            "-o",
            str(binary),
            *[f"-L{d}" for d in cpp_extension.library_paths()],
            *[f"-Wl,-rpath,{d}" for d in cpp_extension.library_paths()],
            *libs,
            "-pthread",
        ],
        binary,
        source,
    )
    return binary


def cuda_spec(spec_path: Path, work: Path) -> Path:
    """A copy of the spec in `work` with one cuda target (this GPU's arch) in place of its [[target]] tables, beside a
    link to projects/models so that its entries import."""
    major, minor = torch.cuda.get_device_capability()
    lines, skipping = [], False
    for line in spec_path.read_text().splitlines():
        if line.strip().startswith("["):
            skipping = line.strip() == "[[target]]"
        if not skipping:
            lines.append(line)
    lines += ["", "[[target]]", 'device = "cuda"', f'archs = ["sm_{major}{minor}"]', ""]
    out = work / "specs" / spec_path.name
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines))
    models = out.parent / "models"
    if not models.exists():
        models.symlink_to(spec_path.parent / "models")
    return out


def aoti_package(gm: Any, path: Path, threads: int, device: str) -> Path:
    """aoti_compile_and_package, freezing on, of the program shimgen exports, compiled under the case's thread count
    (Inductor sizes its OpenMP teams by it)."""
    if device == "cuda":
        from shimgen.trace import dims
        from shimgen.trace import export as trace

        gm.model.to("cuda")
        with torch.no_grad():
            program = dims.export(
                trace._spec_order_module(gm.model, gm.graph), [t.cuda() for t in gm.inputs()], gm.graph, gm.where
            )
    else:
        program = export_graph(gm)
    torch.set_num_threads(threads)
    with torch.no_grad():
        return Path(
            torch._inductor.aoti_compile_and_package(
                program, package_path=str(path), inductor_configs={"freezing": True}
            )
        )


# --- running them ---------------------------------------------------------------------------------


@dataclass
class Runs:
    """One contender's figures over the rounds, and the first outputs of its processes."""

    start_ns: list[int] = field(default_factory=list)
    per_call_ns: list[float] = field(default_factory=list)
    # per process, ns: spawn -> loading begins (exec, libraries, threads, inputs read), loading, first call
    phases: list[tuple[int, int, int]] = field(default_factory=list)
    outputs: list[list[torch.Tensor]] = field(default_factory=list)
    failed: str = ""


def run_once(cmd: list[str], env: dict[str, str], outputs: Path, runs: Runs) -> None:
    """One process of a contender; its start -> first result, per-call time and outputs added to `runs`."""
    outputs.unlink(missing_ok=True)
    start = time.monotonic_ns()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    except subprocess.TimeoutExpired:
        runs.failed = "timed out after 600 s"
        return
    values = dict(line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)
    if done.returncode != 0 or "per_call_ns" not in values:
        lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
        # the C++ programs' one line "<program>: <message>"; else the last line (a Python exception's)
        mine = [line for line in lines if line.startswith(Path(cmd[0]).name + ":")]
        why = mine[0] if mine else lines[-1] if lines else "no message"
        runs.failed = f"exit status {done.returncode}: {why}"[:300].replace("|", "/")
        return
    first, load, loaded = (int(values[k]) for k in ("first_result_ns", "load_ns", "loaded_ns"))
    runs.start_ns.append(first - start)
    runs.phases.append((load - start, loaded - load, first - loaded))
    runs.per_call_ns.append(float(values["per_call_ns"]))
    runs.outputs.append(read_tensors(outputs))


def max_diff(got: list[torch.Tensor], want: list[torch.Tensor], tol: float) -> tuple[float, str, bool]:
    """(the largest absolute difference, it shown, within tolerance); inf and why where they cannot be compared."""
    if len(got) != len(want):
        return float("inf"), f"{len(got)} outputs, expected {len(want)}", False
    worst, ok = 0.0, True
    for a, b in zip(got, want, strict=True):
        if a.shape != b.shape or a.dtype != b.dtype:
            return float("inf"), f"{tuple(a.shape)}/{a.dtype}, expected {tuple(b.shape)}/{b.dtype}", False
        worst = max(worst, (a.double() - b.double()).abs().max().item() if a.numel() else 0.0)
        ok &= torch.allclose(a.double(), b.double(), rtol=tol, atol=tol, equal_nan=True)
    return worst, f"{worst:.1e}", ok


def show_call(ns: float) -> str:
    return f"{ns:.0f} ns" if ns < 1000 else show_time(ns / 1000)


def show_ms(ns: float) -> str:
    return f"{ns / 1e6:.0f} ms" if ns >= 1e8 else f"{ns / 1e6:.1f} ms" if ns >= 1e6 else f"{ns / 1e3:.0f} µs"


def table(report: Report, title: str, runs: dict[str, Runs], expected: list[torch.Tensor], tol: float) -> list[str]:
    """The case's table; the contenders whose outputs differ beyond the tolerance."""
    report(
        f"\n## {title}\n\n| contender | start → first result (range) | per call (range) | ratio to shimgen C++ (start, per call) "
        "| max abs diff to eager | to shimgen C++ |\n| --- | --- | --- | --- | --- | --- |"
    )
    found = runs.get(SHIMGEN_CPP)
    base = found if found is not None and found.start_ns else None
    wrong = []
    for name in ORDER:
        r = runs.get(name)
        if r is None:
            continue
        if not r.start_ns:
            report(f"| {name} | not run: {r.failed or 'not built'} | | | | |")
            continue
        start, call = statistics.median(r.start_ns), statistics.median(r.per_call_ns)
        start_text = f"{show_ms(start)} ({show_ms(min(r.start_ns))} to {show_ms(max(r.start_ns))})"
        call_text = f"{show_call(call)} ({show_call(min(r.per_call_ns))} to {show_call(max(r.per_call_ns))})"
        ratio = ""
        if base:
            ratio = f"{start / statistics.median(base.start_ns):.2f}, {call / statistics.median(base.per_call_ns):.2f}"
        if name == FLOOR:  # its outputs are its inputs
            report(f"| {name} | {start_text} | {call_text} | {ratio} | | |")
            continue
        # the worst over the contender's processes
        _, eager_text, eager_ok = max(
            (max_diff(out, expected, tol) for out in r.outputs), key=lambda d: (not d[2], d[0])
        )
        to_base = ""
        if base:
            _, to_base, close = max(
                (max_diff(out, base.outputs[0], tol) for out in r.outputs), key=lambda d: (not d[2], d[0])
            )
            to_base += "" if close else " (beyond tolerance)"
        if not eager_ok:
            wrong.append(name)
            eager_text += f" (beyond rtol = atol = {tol:g})"
        failed = f"; a later run failed: {r.failed}" if r.failed else ""
        report(f"| {name} | {start_text} | {call_text}{failed} | {ratio} | {eager_text} | {to_base} |")
    report(
        "\nWhere start → first result goes, medians over the processes: until loading begins (exec, dynamic linking, "
        "threads set, inputs read; for Python also the interpreter and `import torch`), loading (the C++ package's "
        "`load()`, AOTI's loader constructor, the Python package's import), the first call.\n\n"
        "| contender | until loading | loading | first call |\n| --- | --- | --- | --- |"
    )
    for name in ORDER:
        r = runs.get(name)
        if r is not None and r.phases:
            cells = [show_ms(statistics.median(p[k] for p in r.phases)) for k in range(3)]
            report(f"| {name} | " + " | ".join(cells) + " |")
    return wrong


def goals(report: Report, figures: dict[str, dict[str, Runs]]) -> None:
    def ratio(case: str, which: str) -> float | None:
        runs = figures.get(case, {})
        a, b = runs.get(SHIMGEN_CPP), runs.get(AOTI_LOADER)
        if not a or not b or not a.start_ns or not b.start_ns:
            return None
        key = (lambda r: r.start_ns) if which == "start" else (lambda r: r.per_call_ns)
        return statistics.median(key(a)) / statistics.median(key(b))

    rows = []
    if "mlp" in figures:
        rows.append(("tiny MLP per call: shimgen C++ / AOTI loader <= 0.5", ratio("mlp", "call"), 0.5))
    if "resnet" in figures:
        rows.append(("ResNet-18 per call: shimgen C++ / AOTI loader <= 1.0", ratio("resnet", "call"), 1.0))
    for case, label in (("mlp", "tiny MLP"), ("resnet", "ResNet-18")):
        if case in figures:
            rows.append((f"{label} start → first result: shimgen C++ / AOTI loader <= 0.2", ratio(case, "start"), 0.2))
    report("\n## Goals\n\n| goal | measured | met |\n| --- | --- | --- |")
    for text, value, limit in rows:
        shown = "not measured" if value is None else f"{value:.2f}"
        met = "" if value is None else "yes" if value <= limit else "no"
        report(f"| {text} | {shown} | {met} |")
    beyond = []
    for case, label in (("mlp", "tiny MLP"), ("resnet", "ResNet-18")):
        a, b = (figures.get(case, {}).get(n) for n in (SHIMGEN_CPP, AOTI_LOADER))
        if a and b and a.phases and b.phases:
            mine, theirs = (statistics.median(p[1] + p[2] for p in r.phases) for r in (a, b))
            beyond.append(f"{label} {show_ms(mine)} / {show_ms(theirs)} = {mine / theirs:.2f}")
    if beyond:
        report(
            "\nFor reference, not a goal: start → first result less what both C++ programs spend before loading "
            "(exec, loading libtorch, reading the inputs; see the floor row), i.e. loading + first call, shimgen C++ / "
            "AOTI loader: " + "; ".join(beyond) + "."
        )


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def load_text() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.1f} / {five:.1f} / {fifteen:.1f}"


def compiler_version() -> str:
    try:
        return subprocess.run([cxx(), "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    except Exception as exc:
        return f"unknown compiler ({short_error(exc)})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", action="append", choices=CASES, help="only these cases")
    parser.add_argument("--rounds", type=int, help="processes per contender (default 5, --quick 2)")
    parser.add_argument("--quick", action="store_true", help="two rounds of short timing, for a smoke test")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--out", type=Path, help="where cpp_call.md goes (default: benchmarks/results for a full run)")
    parser.add_argument("--work", type=Path, help="build directory, kept (default: a fresh temporary one)")
    args = parser.parse_args()
    began = time.monotonic()
    partial_run = args.quick or args.case
    out = args.out or (None if partial_run else REPO / "benchmarks" / "results")
    rounds = args.rounds or (2 if args.quick else 5)
    warmup, batch, batches = ("0.1", "0.05", "3") if args.quick else ("0.5", "0.2", "9")
    work = args.work or Path(tempfile.mkdtemp(prefix="shimgen-cpp-call-"))
    work.mkdir(parents=True, exist_ok=True)
    cuda = args.device == "cuda"
    report = Report()
    load_before = load_text()
    max_load = max(os.getloadavg()[:2])
    report(
        f"# cpp_call.py, {time.strftime('%Y-%m-%d %H:%M')}, {platform.machine()}, {os.cpu_count()} cores ({cpu_model()}), "
        f"torch {torch.__version__}, {compiler_version()}, python {platform.python_version()}, device {args.device}"
        + (", --quick" if args.quick else "")
    )
    if cuda:
        report(f"\nGPU: {torch.cuda.get_device_name()}")
    report(
        f"\nMethod: every contender runs alone in its own process, {rounds} processes per contender per case, the "
        "contenders' order rotated from round to round; the driver waits for each process to exit before it starts the "
        "next. **start → first result**: the driver's `time.monotonic_ns()` just before it spawns the process, to the "
        "CLOCK_MONOTONIC time (`std::chrono::steady_clock`, Python's `time.monotonic_ns()`) the process prints once its "
        "first result is ready (it sets its thread count, reads the inputs from a file, loads its package, calls once); "
        "median over the processes, their range in brackets. **per call**: in the same process, a warm-up of "
        f"{warmup} s, then {batches} batches of about {batch} s of back-to-back calls on the same inputs; the median of "
        "the batches' means, then the median over the processes. Each process's first outputs are compared with eager's "
        "(PyTorch in the driver) and with shimgen C++'s. The C++ programs (benchmarks/cpp/) are compiled with -O2; the "
        "shimgen one with the flags of `pkg-config --cflags --libs <name>` of the build's C++ package, the AOTI one "
        "against the venv's libtorch (-ltorch -ltorch_cpu -lc10). AOTI's .pt2 is `torch._inductor.aoti_compile_and_package` "
        'of the program shimgen exports (the spec\'s model, example inputs, dims) with `inductor_configs={"freezing": '
        "True}`, compiled under the case's thread count; its loader extracts the .pt2 and loads its model library at "
        "start. Every process has OMP_NUM_THREADS set to the case's thread count and calls at::set_num_threads / "
        "torch.set_num_threads with it. The Python reference imports torch, then the package, and calls the graph "
        'under torch.no_grad. "libtorch alone" (benchmarks/cpp/floor_bench.cpp, linked as the AOTI program is) does '
        'all of it but load a model: its "call" hands the inputs back, the floor under both C++ contenders.'
    )
    report(f"\nMachine load (1 / 5 / 15 min load averages) at the start: {load_before}.")

    wanted = args.case or list(CASES)
    todo: list[tuple[Model, Case]] = [(m, c) for m in MODELS for c in m.cases if c.key in wanted]
    bin_dir = work / "bin"
    failed: list[str] = []
    summaries: dict[str, dict[str, Any] | str] = {}
    figures: dict[str, dict[str, Runs]] = {}
    torch_binaries: dict[str, Path | str] = {}  # by source: the program, or why it did not compile

    def torch_binary(source: str) -> Path:
        if source not in torch_binaries:
            try:
                torch_binaries[source] = torch_program(source, bin_dir, cuda)
            except Exception as exc:
                torch_binaries[source] = short_error(exc)
        if isinstance(torch_binaries[source], str):
            raise RuntimeError(torch_binaries[source])
        return Path(torch_binaries[source])

    for model, case in todo:
        spec_path = REPO / "projects" / model.spec
        build_spec = cuda_spec(spec_path, work) if cuda else spec_path
        build_out = work / "cuda" if cuda else work
        if model.spec not in summaries:
            print(f"shimgen build projects/{model.spec}", flush=True)
            try:
                summaries[model.spec] = shimgen_build(build_spec, build_out)[1]
            except CommandFailed as exc:
                summaries[model.spec] = "shimgen build failed: " + short_error(exc).split(": ", 1)[-1]
        summary = summaries[model.spec]
        spec = load_spec(spec_path)
        runs: dict[str, Runs] = {name: Runs() for name in ORDER}
        commands: dict[str, list[str]] = {}
        tag = f"{Path(model.spec).stem}_{model.graph}"
        inputs_file, device_args = work / f"{tag}_{case.key}_inputs.bin", ["--device", args.device]
        timing = ["--threads", str(model.threads), "--warmup", warmup, "--batch", batch, "--batches", batches]
        torch.manual_seed(0)
        with project(spec_path) as spec_dir:
            gm = load_graph(spec, spec_dir, model.graph)
            tensors = gm.inputs(case.sizes)
            write_tensors(inputs_file, tensors)
            torch.set_num_threads(model.threads)
            with torch.no_grad():
                expected = [t for t in pytree.tree_leaves(gm.model(*tensors)) if isinstance(t, torch.Tensor)]
            print(f"{case.title}: compiling the contenders", flush=True)
            if isinstance(summary, str):
                runs[SHIMGEN_CPP].failed = runs[SHIMGEN_PY].failed = summary
            else:
                try:
                    binary = shimgen_program(summary, model.graph, bin_dir)
                    commands[SHIMGEN_CPP] = [str(binary), str(inputs_file), "{out}", *timing, *device_args]
                except Exception as exc:
                    runs[SHIMGEN_CPP].failed = short_error(exc)
                commands[SHIMGEN_PY] = [
                    sys.executable,
                    str(SOURCES / "python_bench.py"),
                    summary["package_dir"],
                    summary["name"],
                    model.graph,
                    str(inputs_file),
                    "{out}",
                    *timing,
                    *device_args,
                ]
            try:
                binary = torch_binary("aoti_bench.cpp")
                pt2 = aoti_package(gm, work / f"{tag}_{args.device}_aoti_freezing.pt2", model.threads, args.device)
                commands[AOTI_LOADER] = [str(binary), str(pt2), str(inputs_file), "{out}", *timing, *device_args]
            except Exception as exc:
                runs[AOTI_LOADER].failed = short_error(exc)
            try:
                commands[FLOOR] = [
                    str(torch_binary("floor_bench.cpp")),
                    str(inputs_file),
                    "{out}",
                    *timing,
                    *device_args,
                ]
            except Exception as exc:
                runs[FLOOR].failed = short_error(exc)
        for name, why in ((n, r.failed) for n, r in runs.items() if r.failed):
            print(f"  {name}: not run: {why}", flush=True)

        env = {**os.environ, "OMP_NUM_THREADS": str(model.threads)}
        print(f"{case.title}: {rounds} rounds", flush=True)
        names = [n for n in ORDER if n in commands]
        for r in range(rounds if names else 0):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                if runs[name].failed:
                    continue
                outputs = work / f"{tag}_{case.key}_{re.sub(r'[^a-z]+', '_', name.lower())}_out.bin"
                cmd = [str(outputs) if part == "{out}" else part for part in commands[name]]
                run_once(cmd, env, outputs, runs[name])
                max_load = max(max_load, os.getloadavg()[0])
                got = runs[name]
                if got.failed:
                    print(f"  round {r + 1}, {name}: failed: {got.failed}", flush=True)
                else:
                    print(
                        f"  round {r + 1}, {name}: start -> first result {show_ms(got.start_ns[-1])}, "
                        f"per call {show_call(got.per_call_ns[-1])}",
                        flush=True,
                    )
        figures[case.key] = runs
        wrong = table(report, case.title, runs, expected, model.tol)
        failed += [f"{case.key}: {name}: output differs from eager" for name in wrong]
        failed += [f"{case.key}: {name}: {r.failed}" for name, r in runs.items() if r.failed]

    goals(report, figures)
    report("\n## Builds\n")
    for name, summary in summaries.items():
        if isinstance(summary, str):
            report(f"- projects/{name}: {summary}")
            continue
        flags = non_default_flags(load_spec(REPO / "projects" / name))
        report(
            f"- projects/{name}: "
            + (f"[flags] differing from the defaults: {flags}" if flags else "shimgen's default flags")
            + f"; graphs {', '.join(summary['graphs'])} (the C++ package's `load()` loads every graph's model)"
        )
    report(
        f"\nMachine load at the end: {load_text()}. The whole run (builds, compiles, rounds) took "
        f"{time.monotonic() - began:.0f} s."
    )
    if max(max_load, *os.getloadavg()[:2]) > (os.cpu_count() or 1):
        report(
            f"\nThe load average exceeded the {os.cpu_count()} cores during the run: other processes held cores, so "
            "the figures are noisy (see the ranges), and most of all those of the cases with more than one thread, "
            "whose OpenMP teams wait at every kernel's barrier for a thread the scheduler has put aside."
        )
    if out:
        report.save(out / "cpp_call.md")
    if failed:
        sys.exit("contenders failed or outputs differ:\n  " + "\n  ".join(failed))


if __name__ == "__main__":
    main()
