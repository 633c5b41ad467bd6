"""Verify stage: a built package, before it replaces the previous one, is imported in a fresh interpreter and each graph
runs once at its smallest, example and largest sizes, and at each specialized variant's, against the program it was
compiled from. A build whose package fails a call or computes something else fails, naming the graph, the sizes and the
first differing output; the previous good package stays.

The program each call is compared with is the traced one that serves those sizes (the variant's where one does), run by
torch as it was exported: what the compiled code must compute, independent of the eager model and its modules. Both
sides run the same inputs in the same order from the same initial state, so graphs that mutate state (package.state)
are compared too, state included.

What the programs compute does not depend on the package: `ReferenceRun` has it computed (`references`) in a process of its
own while the build compiles, and the check then runs the package, and the programs only for what that left out.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shimgen import devices
from shimgen.build.process import start_in_spare
from shimgen.inductor import compat, internals
from shimgen.inductor.weights import WEIGHT_PREFIX
from shimgen.spec import Graph
from shimgen.trace.entry import call_model, example_sizes, float32_as_float32, make_inputs

INPUT_BYTES_LIMIT = 256 << 20  # a case whose inputs need more is skipped (a dim declared with no practical maximum)
# Tolerances never tighter than these: the graph's atol/rtol may be set to 0 for `shimgen check`, and compiled kernels
# round differently from the traced program's ops; the build's runs look for packages that compute something else.
LEAST_ATOL = LEAST_RTOL = 1e-4
REFERENCE_BYTES_LIMIT = 1 << 30  # the outputs and state `references` writes at most; the check computes the rest
NICENESS = 10  # the compile it runs beside comes first


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
    references: Path | None = None  # what `references` wrote for this plan


@dataclass
class Report:
    """What the package did, written as the run goes: a crash leaves the case it crashed in."""

    running: str = ""
    cases: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failure: str = ""
    seconds: float = 0.0
    beforehand: int = 0  # cases whose traced program ran ahead, beside the build (`ReferenceRun`)


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
    import torch

    programs = _Programs()
    known = torch.load(plan.references, weights_only=True) if plan.references else {}
    for models, where, sizes, inputs in _cases(plan, report.skipped):
        if models.state and programs.graph is not models:  # each graph starts from the initial state
            package.reset_state()
        report.running = where
        write(report)
        with torch.no_grad(), float32_as_float32():
            try:
                got = call_model(getattr(package, models.graph.name), models.graph, inputs)
            except Exception as exc:
                report.failure = f"{where}: the call failed: {type(exc).__name__}: {_first_line(exc)}"
                return
            try:
                want, want_state = programs.run(models, where, sizes, inputs, known.get(where))
            except _NotLoaded as exc:
                report.failure = str(exc)
                return
        report.beforehand += where in known
        try:
            difference = _difference(models.graph, want, got) or _state_difference(models, want_state, package)
        except Exception as exc:
            difference = f"its output or state cannot be compared with the traced program's: {type(exc).__name__}: {_first_line(exc)}"
        if difference:
            report.failure = f"{where}: {difference}"
            return
        report.cases.append(where)
    report.running = ""


def references(argv: list[str]) -> int:
    """python -m shimgen.package.verify:references PLAN OUT [MODULE_DIR ...]: what each case of PLAN (pickled Plan)
    computes by its traced program, outputs and state, written to OUT (torch.save, by case) once all are computed; the
    cases past REFERENCE_BYTES_LIMIT in all are left to the check."""
    import torch

    plan_path, out, *module_dirs = argv
    sys.path[:0] = module_dirs
    with open(plan_path, "rb") as f:
        plan = pickle.load(f)
    programs = _Programs()
    known: dict[str, tuple[list[Any], dict[str, Any]]] = {}
    size = 0
    for models, where, sizes, inputs in _cases(plan, []):
        with torch.no_grad(), float32_as_float32():
            want, want_state = programs.run(models, where, sizes, inputs)
        size += sum(t.numel() * t.element_size() for t in [*want, *want_state.values()])
        if size > REFERENCE_BYTES_LIMIT:  # the check computes the rest, from the state the last case kept left
            break
        known[where] = (list(want), want_state)
    torch.save(known, out + ".tmp")
    os.replace(out + ".tmp", out)
    return 0


class ReferenceRun:
    """`references` of `plan` computed in another interpreter (the build's spare where it has one), at lower priority,
    beside the rest of the build."""

    def __init__(self, plan: Plan, module_dirs: tuple[Path, ...]) -> None:
        self.plan = plan
        self._dir = Path(tempfile.mkdtemp(prefix="shimgen-references-"))
        (self._dir / "plan.pickle").write_bytes(pickle.dumps(plan))
        self._out = self._dir / "references.pt"
        self._process = start_in_spare(
            "shimgen.package.verify:references",
            [str(self._dir / "plan.pickle"), str(self._out), *map(str, module_dirs)],
            NICENESS,
            fresh=plan.op_modules,
        )

    def finished(self) -> Plan:
        """The plan with its references once the process has ended; without them where it failed."""
        if self._process.wait() == 0 and self._out.is_file():
            return dataclasses.replace(self.plan, references=self._out)
        return self.plan

    def stop(self) -> None:
        self._process.stop()
        shutil.rmtree(self._dir, ignore_errors=True)


def _cases(plan: Plan, skipped: list[str]) -> Iterator[tuple[GraphModels, str, dict[str, int], list[Any]]]:
    """(graph, where, sizes, inputs) of each case to run, in order; the graphs on a device this machine lacks, and the
    cases whose inputs are over INPUT_BYTES_LIMIT, added to `skipped` instead."""
    import importlib

    compat.check(compat.TRACE)
    for module in plan.op_modules:
        importlib.import_module(module)
    for models in plan.graphs:
        graph = models.graph
        if not devices.device(models.device).available():
            skipped.append(f"{graph.name} ({models.device}): no GPU on this machine")
            continue
        fixed = [dict(f) for f, _ in models.programs[1:]]
        for n, (case, sizes) in enumerate(cases(graph, fixed)):
            where = f"{models.where} ({graph.name}, {models.device}) at {case}"
            if input_bytes(graph, sizes) > INPUT_BYTES_LIMIT:
                skipped.append(f"{where}: inputs over {INPUT_BYTES_LIMIT >> 20} MiB")
                continue
            yield models, where, sizes, [t.to(models.device) for t in make_inputs(graph, sizes, graph.seed + n)]


class _NotLoaded(Exception):
    pass


class _Programs:
    """The traced programs, loaded as first needed, and the state their calls leave: the package's models share one
    state per graph, so each call starts from the state the last call of any program of the graph left."""

    def __init__(self) -> None:
        self.loaded: dict[Path, Any] = {}
        self.graph: GraphModels | None = None
        self.state: dict[str, Any] = {}

    def run(
        self,
        models: GraphModels,
        where: str,
        sizes: dict[str, int],
        inputs: list[Any],
        known: tuple[Any, dict[str, Any]] | None = None,
    ) -> tuple[Any, dict[str, Any]]:
        """The outputs of the program that serves `sizes` for `inputs`, and the state it leaves; `known`, where given,
        taken for what it computes."""
        import torch

        if self.graph is not models:
            self.graph, self.state = models, {}
        if known is not None:
            self.state = known[1]
            return known
        path = program_for(models, sizes)
        if path not in self.loaded:
            try:
                self.loaded[path] = torch.export.load(str(path)).module()
            except Exception as exc:
                raise _NotLoaded(
                    f"{where}: its traced program does not load: {type(exc).__name__}: {_first_line(exc)}"
                ) from None
        buffers = dict(self.loaded[path].named_buffers())
        for name in models.state:
            if name in self.state:
                buffers[name].copy_(self.state[name])
        out = self.loaded[path](*inputs)
        self.state = {name: buffers[name].clone() for name in models.state}
        return out, self.state


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


def _state_difference(models: GraphModels, want: dict[str, Any], package: Any) -> str:
    """How the package's state differs from the state the program's calls left; empty where it does not."""
    import torch

    if not models.state:
        return ""
    graph = models.graph
    have = package.state(models.device, graph.name)
    for name in models.state:
        got = have.get(name.removeprefix(WEIGHT_PREFIX))
        if name not in want or got is None:
            return f"the package holds no state '{name.removeprefix(WEIGHT_PREFIX)}'" if got is None else ""
        if not torch.allclose(
            got.double(),
            want[name].double(),
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
