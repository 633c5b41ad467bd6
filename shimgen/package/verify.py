"""Verify stage: a built package, before it replaces the previous one, is imported in a fresh interpreter and each graph
runs once at its example, smallest and largest sizes, and at each specialized variant's, against the program it was
compiled from (the example first: code wrong at every size is named there, not at a size of its own). A build whose
package fails a call or computes something else fails, naming the graph, the sizes and the first differing output; the
previous good package stays. Code that passed every size in an earlier build (its weights refitted since, or nothing
changed) runs at one size (`settled_cases`).

The program each call is compared with is the traced one that serves those sizes (the variant's where one does), run by
torch as it was exported: what the compiled code must compute, independent of the eager model and its modules. Both
sides run the same inputs in the same order from the same initial state, so graphs that mutate state (package.state)
are compared too, state included.

What the programs compute does not depend on the package: `ReferenceRun` has it computed (`references`) in a process of its
own while the build compiles. The check runs the package while that process finishes, compares once it has, and runs the
programs only for what it left out.
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

from shimgen import devices, tolerance
from shimgen.build.process import start_in_spare
from shimgen.inductor import compat, internals
from shimgen.inductor.weights import WEIGHT_PREFIX
from shimgen.spec import Graph
from shimgen.trace.entry import call_model, example_sizes, float32_as_float32, make_inputs

INPUT_BYTES_LIMIT = 256 << 20  # a case whose inputs need more is skipped (a dim declared with no practical maximum)
# Tolerances never tighter than this (atol times the output's largest magnitude, at least 1; tolerance.allowed): the
# graph's atol/rtol may be set to 0 for `shimgen check`, and compiled kernels round differently from the traced
# program's ops; the build's runs look for packages that compute something else.
LEAST_TOLERANCE = 1e-4
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
    # by program: its code passed the check at every size before (CodegenResult.checked), so it runs at one size
    settled: tuple[bool, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Plan:
    package: str
    graphs: tuple[GraphModels, ...]
    op_modules: tuple[str, ...] = ()  # [[custom_op]] modules and trace op_modules: the traced programs call their ops
    references: Path | None = None  # what `references` wrote for this plan
    references_writer: int | None = None  # the process writing `references` while the check runs; None: written


@dataclass
class Report:
    """What the package did, written as the run goes: a crash leaves the case it crashed in."""

    running: str = ""
    cases: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failure: str = ""
    program: str = ""  # the traced program of the code that computed `failure`'s case
    seconds: float = 0.0
    beforehand: int = 0  # cases whose traced program ran ahead, beside the build (`ReferenceRun`)
    settled: list[str] = field(default_factory=list)  # cases left out: their code passed them before (`settled_cases`)


def cases(graph: Graph, fixed: list[dict[str, int]]) -> list[tuple[str, dict[str, int]]]:
    """(label, sizes): the example, every dim at its min, every dim at its max, then each variant's sizes (`fixed`) with
    the other dims at their example; each set of sizes once."""
    base = example_sizes(graph)
    wanted = [
        ("example", base),
        ("smallest", {name: d.min for name, d in graph.dims.items()}),
        ("largest", {name: d.max for name, d in graph.dims.items()}),
    ]
    wanted += [("variant", {**base, **sizes}) for sizes in fixed]
    out: list[tuple[str, dict[str, int]]] = []
    for kind, sizes in wanted:
        if all(sizes != seen for _, seen in out):
            out.append((f"{kind} ({label(sizes)})" if sizes else kind, sizes))
    return out


def settled_cases(models: GraphModels, listed: list[tuple[str, dict[str, int]]]) -> set[int]:
    """The cases (indices into `listed`) left out: those of a program whose code passed the check at every size before,
    but one, its example where it serves it. Its code is the same; only its weights, or the package around it, may
    have changed, which any size shows."""
    served: dict[Path, list[int]] = {}
    for n, (_, sizes) in enumerate(listed):
        served.setdefault(program_for(models, sizes), []).append(n)
    left: set[int] = set()
    for (_, program), settled in zip(models.programs, models.settled, strict=False):
        indices = served.get(program, [])
        if settled and indices:
            kept = next((n for n in indices if listed[n][0].startswith("example")), indices[0])
            left.update(n for n in indices if n != kept)
    return left


def label(sizes: dict[str, int]) -> str:
    return ", ".join(f"{name}={size}" for name, size in sizes.items())


def program_for(models: GraphModels, sizes: dict[str, int]) -> Path:
    """The program that serves `sizes`: the first variant whose fixed sizes they match, else the dynamic one."""
    for fixed, program in models.programs[1:]:
        if all(sizes.get(dim) == size for dim, size in fixed):
            return program
    return models.programs[0][1]


def _size_one_hint(models: GraphModels, sizes: dict[str, int]) -> str:
    """Where the dynamic code ran at a dim's size 1: Inductor compiles it for sizes of 2 and up, and a model's code can
    be wrong at 1; a variant of that size is compiled for it."""
    if program_for(models, sizes) != models.programs[0][1]:
        return ""
    ones = [f"'{dim}'" for dim, size in sizes.items() if size == 1]
    if not ones:
        return ""
    return (
        f" (the dynamic code ran at size 1 of {', '.join(ones)}: Inductor compiles a dynamic dim for sizes of 2 and up; "
        "`specialize = [1]` in the dim's table builds size 1 as a variant of its own)"
    )


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
    """Each graph's cases through `package` and through its traced programs; the first difference in `report.failure`.
    While `references` are still being written, the package's calls go ahead, and are compared once they are there."""
    import torch

    programs = _Programs()
    known = _References(plan)
    called: list[_Call] = []
    held = 0
    graph: GraphModels | None = None
    for models, where, sizes, inputs in _cases(plan, report.skipped, report.settled):
        if models.state and graph is not models:  # each graph starts from the initial state
            package.reset_state()
        graph = models
        report.running = where
        write(report)
        ahead = known.pending()
        with torch.no_grad(), float32_as_float32():
            try:
                got = call_model(getattr(package, models.graph.name), models.graph, inputs)
            except Exception as exc:
                report.failure = (
                    f"{where}: the call failed: {type(exc).__name__}: {_first_line(exc)}{_size_one_hint(models, sizes)}"
                )
                report.program = str(program_for(models, sizes))
                return
        call = _Call(models, where, sizes, inputs, internals.tensor_leaves(got), _package_state(package, models))
        if ahead:  # kept until compared: what the package returns may be reused by its next call
            call = dataclasses.replace(call, got=[t.clone() for t in call.got])
        called.append(call)
        held += _bytes([*call.inputs, *call.got, *call.state.values()])
        if ahead and held <= REFERENCE_BYTES_LIMIT:
            continue
        if not _compare(called, known, programs, report, write):
            return
        called, held = [], 0
    if _compare(called, known, programs, report, write):
        report.running = ""


@dataclass(frozen=True)
class _Call:
    """One case run through the package: what it returned (flat) and the state it left."""

    models: GraphModels
    where: str
    sizes: dict[str, int]
    inputs: list[Any]
    got: list[Any]
    state: dict[str, Any]


def _package_state(package: Any, models: GraphModels) -> dict[str, Any]:
    if not models.state:
        return {}
    return {name: t.clone() for name, t in package.state(models.device, models.graph.name).items()}


def _bytes(tensors: list[Any]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _compare(called: list[_Call], known: _References, programs: _Programs, report: Report, write: Any) -> bool:
    """Each call against what its traced program computes, in order; False at the first difference."""
    import torch

    for call in called:
        report.running = call.where
        write(report)
        references = known.get(call.where)
        with torch.no_grad(), float32_as_float32():
            try:
                want, want_state = programs.run(call.models, call.where, call.sizes, call.inputs, references)
            except _NotLoaded as exc:
                report.failure = str(exc)
                return False
        report.beforehand += references is not None
        try:
            difference = _difference(call.models.graph, want, call.got) or _state_difference(
                call.models, want_state, call.state
            )
        except Exception as exc:
            difference = f"its output or state cannot be compared with the traced program's: {type(exc).__name__}: {_first_line(exc)}"
        if difference:
            report.failure = f"{call.where}: {difference}{_size_one_hint(call.models, call.sizes)}"
            report.program = str(program_for(call.models, call.sizes))
            return False
        report.cases.append(call.where)
    return True


class _References:
    """What `references` wrote for the plan, loaded once its writer has ended (at once where it has none)."""

    def __init__(self, plan: Plan) -> None:
        self.path, self.writer = plan.references, plan.references_writer
        self._known: dict[str, Any] | None = None

    def pending(self) -> bool:
        """Whether the writer is still computing them."""
        if self._known is not None or self.path is None or self.writer is None:
            return False
        return not self.path.exists() and _running(self.writer)

    def get(self, where: str) -> Any:
        if self._known is None:
            while self.pending():
                time.sleep(0.01)
            self._known = {}
            if self.path is not None and self.path.is_file():
                import torch

                try:
                    self._known = torch.load(self.path, weights_only=True)
                except Exception:  # noqa: BLE001  (the check computes them all itself)
                    pass
        return self._known.get(where)


def _running(pid: int) -> bool:
    """Whether process `pid`, a child of the build that has not been waited for, still runs: once it ends it is a zombie
    until the build waits, so its pid is not another process's."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):
        return False


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
    for models, where, sizes, inputs in _cases(plan, [], []):
        with torch.no_grad(), float32_as_float32():
            want, want_state = programs.run(models, where, sizes, inputs)
        size += _bytes([*want, *want_state.values()])
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

    def for_check(self) -> Plan:
        """The plan with its references: the file and, while it is being written, the process writing it."""
        writer = None if self._process.status is not None else self._process.pid
        return dataclasses.replace(self.plan, references=self._out, references_writer=writer)

    def stop(self) -> None:
        self._process.stop()
        shutil.rmtree(self._dir, ignore_errors=True)


def _cases(
    plan: Plan, skipped: list[str], settled: list[str]
) -> Iterator[tuple[GraphModels, str, dict[str, int], list[Any]]]:
    """(graph, where, sizes, inputs) of each case to run, in order; the graphs on a device this machine lacks, and the
    cases whose inputs are over INPUT_BYTES_LIMIT, added to `skipped` instead, and those `settled_cases` leaves out to
    `settled`."""
    import importlib

    compat.check(compat.TRACE)
    for module in plan.op_modules:
        importlib.import_module(module)
    for models in plan.graphs:
        graph = models.graph
        if not devices.device(models.device).available():
            skipped.append(f"{graph.name} ({models.device}): no GPU on this machine")
            continue
        listed = cases(graph, [dict(f) for f, _ in models.programs[1:]])
        left = settled_cases(models, listed)
        for n, (case, sizes) in enumerate(listed):
            where = f"{models.where} ({graph.name}, {models.device}) at {case}"
            if n in left:
                settled.append(where)
                continue
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
        if self.graph is not models:
            self.graph, self.state = models, {}
        if known is not None:
            self.state = known[1]
            return known
        path = program_for(models, sizes)
        if path not in self.loaded:
            try:
                self.loaded[path] = internals.load_exported(path).module()
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
    got_leaves = internals.tensor_leaves(got)
    want_leaves = list(want)
    if len(got_leaves) != len(want_leaves):
        return f"the package returns {len(got_leaves)} tensors, the traced program {len(want_leaves)}"
    for k, (w, g) in enumerate(zip(want_leaves, got_leaves, strict=True)):
        if w.shape != g.shape or w.dtype != g.dtype:
            return f"output {k} is {_signature(g)}, the traced program's {_signature(w)}"
        how = tolerance.difference(graph, w, g, floor=LEAST_TOLERANCE)
        if how:
            return f"output {k} differs from the traced program ({how})"
    return ""


def _signature(t: Any) -> str:
    return f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}"


def _state_difference(models: GraphModels, want: dict[str, Any], have: dict[str, Any]) -> str:
    """How the package's state (`have`) differs from the state the program's calls left; empty where it does not."""
    if not models.state:
        return ""
    graph = models.graph
    for name in models.state:
        got = have.get(name.removeprefix(WEIGHT_PREFIX))
        if name not in want or got is None:
            return f"the package holds no state '{name.removeprefix(WEIGHT_PREFIX)}'" if got is None else ""
        if got.shape != want[name].shape or tolerance.difference(graph, want[name], got, floor=LEAST_TOLERANCE):
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
