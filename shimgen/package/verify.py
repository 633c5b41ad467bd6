"""Verify stage: a built package, before it replaces the previous one, is imported in a fresh interpreter and each graph
runs once at its smallest, example and largest sizes, and at each specialized variant's, against the program it was
compiled from. A build whose package fails a call or computes something else fails, naming the graph, the sizes and the
first differing output; the previous good package stays.

The program each call is compared with is the traced one that serves those sizes (the variant's where one does), run by
torch as it was exported: what the compiled code must compute, independent of the eager model and its modules. Both
sides run the same inputs in the same order from the same initial state, so graphs that mutate state (package.state)
are compared too, state included.
"""

from __future__ import annotations

import json
import pickle
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shimgen import devices
from shimgen.inductor import compat, internals
from shimgen.inductor.weights import WEIGHT_PREFIX
from shimgen.spec import Graph
from shimgen.trace.entry import call_model, example_sizes, float32_as_float32, make_inputs

INPUT_BYTES_LIMIT = 256 << 20  # a case whose inputs need more is skipped (a dim declared with no practical maximum)
# Tolerances never tighter than these: the graph's atol/rtol may be set to 0 for `shimgen check`, and compiled kernels
# round differently from the traced program's ops; the build's runs look for packages that compute something else.
LEAST_ATOL = LEAST_RTOL = 1e-4


@dataclass(frozen=True, kw_only=True)
class GraphModels:
    """One graph on one target: the traced program of its dynamic code and of each variant, by the sizes it fixes."""

    graph: Graph
    where: str  # graph[i]
    device: str
    programs: tuple[
        tuple[tuple[tuple[str, int], ...], Path], ...
    ]  # ((dim, size) ..., program): the dynamic one first, fixing nothing
    state: tuple[str, ...] = ()  # the names of the state it mutates (package.state's keys)


@dataclass(frozen=True, kw_only=True)
class Plan:
    package: str
    graphs: tuple[GraphModels, ...]
    op_modules: tuple[str, ...] = ()  # [[custom_op]] modules and trace op_modules: the traced programs call their ops


@dataclass
class Report:
    """What the package did, written as the run goes: a crash leaves the case it crashed in."""

    running: str = ""
    cases: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failure: str = ""
    seconds: float = 0.0


def cases(graph: Graph, fixed: list[dict[str, int]]) -> list[tuple[str, dict[str, int]]]:
    """(label, sizes): every dim at its min, the example, every dim at its max, then each variant's sizes (`fixed`) with
    the other dims at their example; each set of sizes once."""
    base = example_sizes(graph)
    wanted = [
        ("smallest", {name: d.min for name, d in graph.dims.items()}),
        ("example", base),
        ("largest", {name: d.max for name, d in graph.dims.items()}),
    ]
    wanted += [("variant", {**base, **sizes}) for sizes in fixed]
    out: list[tuple[str, dict[str, int]]] = []
    for kind, sizes in wanted:
        if all(sizes != seen for _, seen in out):
            out.append((f"{kind} ({label(sizes)})" if sizes else kind, sizes))
    return out


def label(sizes: dict[str, int]) -> str:
    return ", ".join(f"{name}={size}" for name, size in sizes.items())


def program_for(models: GraphModels, sizes: dict[str, int]) -> Path:
    """The program that serves `sizes`: the first variant whose fixed sizes they match, else the dynamic one."""
    for fixed, program in models.programs[1:]:
        if all(sizes.get(dim) == size for dim, size in fixed):
            return program
    return models.programs[0][1]


def input_bytes(graph: Graph, sizes: dict[str, int]) -> int:
    import torch

    total = 0
    for inp in graph.inputs:
        count = 1
        for s in inp.shape:
            count *= sizes[s] if isinstance(s, str) else s
        total += count * getattr(torch, inp.dtype).itemsize
    return total


def run(plan: Plan, package: Any, report: Report, write: Any) -> None:
    """Each graph's cases through `package` and through its traced programs; the first difference in `report.failure`."""
    import importlib

    import torch

    compat.check(compat.TRACE)
    for module in plan.op_modules:
        importlib.import_module(module)
    loaded: dict[Path, Any] = {}
    for models in plan.graphs:
        graph = models.graph
        if not devices.device(models.device).available():
            report.skipped.append(f"{graph.name} (cuda): no GPU on this machine")
            continue
        compiled = getattr(package, graph.name)
        fixed = [dict(f) for f, _ in models.programs[1:]]
        if (
            models.state
        ):  # the package's state is one for all its graphs and models: each graph starts from the initial one
            package.reset_state()
        state: dict[str, Any] = {}  # the state the programs' calls leave, carried from one program to the next
        for n, (case, sizes) in enumerate(cases(graph, fixed)):
            where = f"{models.where} ({graph.name}, {models.device}) at {case}"
            if input_bytes(graph, sizes) > INPUT_BYTES_LIMIT:
                report.skipped.append(f"{where}: inputs over {INPUT_BYTES_LIMIT >> 20} MiB")
                continue
            path = program_for(models, sizes)
            report.running = where
            write(report)
            if path not in loaded:
                try:
                    loaded[path] = torch.export.load(str(path)).module()
                except Exception as exc:
                    report.failure = (
                        f"{where}: its traced program does not load: {type(exc).__name__}: {_first_line(exc)}"
                    )
                    return
            inputs = [t.to(models.device) for t in make_inputs(graph, sizes, graph.seed + n)]
            with torch.no_grad(), float32_as_float32():
                try:
                    got = call_model(compiled, graph, inputs)
                except Exception as exc:
                    report.failure = f"{where}: the call failed: {type(exc).__name__}: {_first_line(exc)}"
                    return
                want = _run_with_state(loaded[path], inputs, models.state, state)
            try:
                difference = _difference(graph, want, got) or _state_difference(graph, models, loaded[path], package)
            except Exception as exc:
                difference = f"its output or state cannot be compared with the traced program's: {type(exc).__name__}: {_first_line(exc)}"
            if difference:
                report.failure = f"{where}: {difference}"
                return
            report.cases.append(where)
        report.running = ""


def _run_with_state(program: Any, inputs: list[Any], names: tuple[str, ...], state: dict[str, Any]) -> Any:
    """The program's call, from the state the last call of any program of the graph left (as the package's models share
    it), which it then leaves in `state`."""
    buffers = dict(program.named_buffers())
    for name in names:
        if name in state:
            buffers[name].copy_(state[name])
    out = program(*inputs)
    state.update({name: buffers[name].clone() for name in names})
    return out


def _difference(graph: Graph, want: Any, got: Any) -> str:
    """How the package's output differs from the program's flat tensors; empty where it does not."""
    import torch

    got_leaves = internals.tensor_leaves(got)
    want_leaves = list(want)
    if len(got_leaves) != len(want_leaves):
        return f"the package returns {len(got_leaves)} tensors, the traced program {len(want_leaves)}"
    for k, (w, g) in enumerate(zip(want_leaves, got_leaves, strict=True)):
        if w.shape != g.shape or w.dtype != g.dtype:
            return f"output {k} is {_signature(g)}, the traced program's {_signature(w)}"
        atol, rtol = max(graph.atol, LEAST_ATOL), max(graph.rtol, LEAST_RTOL)
        if not torch.allclose(g.double(), w.double(), rtol=rtol, atol=atol, equal_nan=True):
            error = (g.double() - w.double()).abs().nan_to_num(float("inf")).max().item() if g.numel() else 0.0
            return (
                f"output {k} differs from the traced program (max abs error {error:.3g}; atol {atol:g}, rtol {rtol:g})"
            )
    return ""


def _signature(t: Any) -> str:
    return f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}"


def _state_difference(graph: Graph, models: GraphModels, program: Any, package: Any) -> str:
    """How the package's state differs from the program's after the same calls; empty where it does not."""
    import torch

    if not models.state:
        return ""
    have = package.state(models.device, graph.name)
    buffers = dict(program.named_buffers())
    for name in models.state:
        want = buffers.get(name)
        got = have.get(name.removeprefix(WEIGHT_PREFIX))
        if want is None or got is None:
            return f"the package holds no state '{name.removeprefix(WEIGHT_PREFIX)}'" if got is None else ""
        if not torch.allclose(
            got.double(),
            want.double(),
            rtol=max(graph.rtol, LEAST_RTOL),
            atol=max(graph.atol, LEAST_ATOL),
            equal_nan=True,
        ):
            return f"the state '{name.removeprefix(WEIGHT_PREFIX)}' differs from the traced program's"
    return ""


def _first_line(exc: BaseException) -> str:
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    return lines[0] if lines else ""


def main(argv: list[str]) -> int:
    """python -m shimgen.package.verify SITE PACKAGE REPORT [PLAN] [MODULE_DIR ...]: import the package from SITE (with
    the module
    dirs on sys.path), then, given a PLAN (pickled Plan; "-" for none), run it; the report is written to REPORT as
    JSON."""
    site, name, report_path, plan_path, *module_dirs = argv
    sys.path[:0] = [site, *module_dirs]
    report = Report()

    def write(r: Report) -> None:
        Path(report_path).write_text(json.dumps(r.__dict__))

    import importlib

    try:
        package = importlib.import_module(name)
    except BaseException:
        report.failure = "import: " + traceback.format_exc().strip().splitlines()[-1]
        write(report)
        return 1
    if plan_path != "-":
        with open(plan_path, "rb") as f:
            plan = pickle.load(f)
        start = time.time()
        run(plan, package, report, write)
        report.seconds = round(time.time() - start, 3)
    write(report)
    return 1 if report.failure else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
