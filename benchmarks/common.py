"""What every benchmark script shares: a report printed as it goes and saved as markdown, the real
`shimgen build` run in a subprocess, and the contenders a shimgen package is timed against (eager,
torch.compile, AOTInductor default and with freezing, ONNX Runtime), each built from the very model,
inputs and dynamic dims of a spec's graph, checked against eager, then timed side by side."""

from __future__ import annotations

import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # shimgen from the source tree, as `python -m shimgen` runs it

# A contender's call with everything bound: what is checked against eager, then timed.
Call = Callable[[], Any]
# Given a graph's inputs in spec order, the zero-argument call a contender is timed on: everything
# that does not depend on the call (argument lists, ONNX Runtime's feeds) is bound beforehand.
Binder = Callable[[list[Any]], Call]

EAGER, COMPILE, AOTI, AOTI_FREEZING, ORT, SHIMGEN = (
    "eager",
    "torch.compile",
    "AOTI default",
    "AOTI freezing",
    "ONNX Runtime",
    "shimgen",
)


class Report:
    """Call with a line to print it now and keep it for `save`; given `out`, every line is saved there at once (a run
    cut short still says what it ran)."""

    def __init__(self, out: Path | None = None) -> None:
        self.lines: list[str] = []
        self.out = out

    def __call__(self, text: str) -> None:
        print(text, flush=True)
        self.lines.append(text)
        if self.out:
            self.save(self.out)

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(self.lines) + "\n")


class CommandFailed(SystemExit):
    """A command of `run` failed; uncaught, it exits with the command and its stderr like sys.exit."""


def run(cmd: list[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> tuple[float, str]:
    """(wall seconds, stdout); raises CommandFailed (exits, unless caught) with the command's stderr if it fails."""
    start = time.perf_counter()
    result = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True)
    if result.returncode != 0:
        raise CommandFailed(f"{shlex.join(cmd)} failed:\n{result.stderr[-3000:]}")
    return time.perf_counter() - start, result.stdout


def shimgen_build(
    spec: Path, out: Path, env: dict[str, str] | None = None, *extra: str
) -> tuple[float, dict[str, Any]]:
    """(wall seconds, the --json summary) of `shimgen build`, from the source tree."""
    seconds, stdout = run(
        [sys.executable, "-m", "shimgen", "build", str(spec), "--out", str(out), "--json", *extra], env, cwd=REPO
    )
    return seconds, json.loads(stdout)


def built_meson_dir(spec: Path, out: Path) -> Path:
    """`spec` built into `out` with this environment, its lockfile left as it was (or absent); its Meson build dir."""
    lock = spec.with_name(spec.name + ".lock")
    kept = lock.read_bytes() if lock.is_file() else None
    try:
        summary = shimgen_build(spec.resolve(), out, dict(os.environ))[1]
    finally:
        if kept is None:
            lock.unlink(missing_ok=True)
        else:
            lock.write_bytes(kept)
    return out / "build" / summary["name"] / "meson"


def shell_medians(ways: list[str], cwd: Path, rounds: int) -> list[float]:
    """Median seconds of each shell command in `ways`, run in `cwd` in alternation for `rounds` rounds."""
    samples: list[list[float]] = [[] for _ in ways]
    for _ in range(rounds):
        for k, way in enumerate(ways):
            start = time.perf_counter()
            subprocess.run(way, shell=True, cwd=cwd, check=True, capture_output=True)
            samples[k].append(time.perf_counter() - start)
    return [statistics.median(s) for s in samples]


def import_built(summary: dict[str, Any]) -> Any:
    """The built package, imported from its site directory."""
    sys.path.insert(0, summary["package_dir"])
    return __import__(summary["name"])


def non_default_flags(spec: Any) -> dict[str, Any]:
    """The spec's [flags] that differ from shimgen's defaults."""
    from dataclasses import fields

    from shimgen.spec import Flags

    defaults = Flags()
    return {
        f.name: getattr(spec.flags, f.name)
        for f in fields(Flags)
        if getattr(spec.flags, f.name) != getattr(defaults, f.name)
    }


def kernel_choice_lines(summary: dict[str, Any]) -> list[str]:
    """Markdown list items for the build summary's `kernel_choices` ({unit: [{op, sizes, picked, us, count}]})."""
    lines = []
    for unit, choices in summary["kernel_choices"].items():
        for c in choices:
            others = ", ".join(f"{name} {us:g}" for name, us in c["us"].items() if name != c["picked"])
            count = f" x{c['count']}" if c["count"] > 1 else ""
            lines.append(
                f"- kernel_choices, {unit}: {c['op']}({', '.join(c['sizes'])}){count}: {c['picked']} {c['us'][c['picked']]:g} µs"
                + (f"; {others}" if others else "")
            )
    return lines


# --- timing ---------------------------------------------------------------------------------------


def per_call_us(fn: Call, calls: int, blocks: int = 7) -> float:
    """Median over `blocks` timed blocks of `calls` calls each, after a warm-up, in µs per call."""
    for _ in range(max(3, calls // 10)):
        fn()
    samples = []
    for _ in range(blocks):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(samples)


def calls_per_block(fn: Call, block_seconds: float, max_calls: int = 20000) -> int:
    """How many calls of `fn` take about `block_seconds`, measured after a warm-up of about a tenth of that."""
    calls, start = 0, time.perf_counter()
    while calls < 3 or (time.perf_counter() - start < block_seconds / 10 and calls < max_calls):
        fn()
        calls += 1
    seconds = (time.perf_counter() - start) / calls
    return max(1, min(max_calls, round(block_seconds / seconds)))


def time_side_by_side(calls: dict[str, Call], block_seconds: float, blocks: int) -> dict[str, float]:
    """µs per call of each, the median of `blocks` blocks of about `block_seconds` each.

    The contenders' blocks take turns (one block of each, then the next round), so a busy moment on a
    shared machine falls on all of them rather than on one."""
    counts = {name: calls_per_block(fn, block_seconds) for name, fn in calls.items()}
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(blocks):
        for name, fn in calls.items():
            n = counts[name]
            start = time.perf_counter()
            for _ in range(n):
                fn()
            samples[name].append((time.perf_counter() - start) / n * 1e6)
    return {name: statistics.median(s) for name, s in samples.items()}


def show_time(us: float) -> str:
    """'12.3 µs' or '45.6 ms'."""
    return f"{us:.1f} µs" if us < 1000 else f"{us / 1000:.2f} ms"


# --- a spec's graph and its contenders ------------------------------------------------------------


@dataclass
class GraphModel:
    """One graph of a spec with its model, loaded the way shimgen's trace and check load it."""

    spec: Any  # shimgen.spec.ProjectSpec
    spec_dir: Path
    index: int
    model: Any

    @property
    def graph(self) -> Any:  # shimgen.spec.Graph
        return self.spec.graph[self.index]

    @property
    def where(self) -> str:
        return f"graph[{self.index}]"

    def inputs(self, sizes: dict[str, int] | None = None, seed: int | None = None) -> list[Any]:
        """Random inputs of the spec's dtypes and ranges, dynamic dims at `sizes` (default: the example)."""
        from shimgen.trace.entry import example_sizes, make_inputs

        graph = self.graph
        return make_inputs(graph, {**example_sizes(graph), **(sizes or {})}, graph.seed if seed is None else seed)

    def split(self, tensors: list[Any]) -> tuple[list[Any], dict[str, Any]]:
        """(positional, keyword) arguments of the model, as the spec declares its inputs."""
        inputs = self.graph.inputs
        return (
            [t for inp, t in zip(inputs, tensors, strict=True) if not inp.keyword],
            {inp.name: t for inp, t in zip(inputs, tensors, strict=True) if inp.keyword},
        )


def load_spec(path: Path) -> Any:
    """The typed spec, validated as `shimgen build` validates it."""
    from shimgen.spec import load_spec as load

    return load(path)


@contextmanager
def project(spec_path: Path) -> Iterator[Path]:
    """The spec's directory importable (and its modules fresh) for the block, as shimgen check runs models."""
    from shimgen.trace.entry import project_scope

    spec_dir = spec_path.resolve().parent
    with project_scope(spec_dir):
        yield spec_dir


def load_graph(spec: Any, spec_dir: Path, name: str) -> GraphModel:
    """The graph called `name`, its model built as shimgen builds it (seeded, eval mode)."""
    from shimgen.trace.entry import load_model

    index = next(i for i, g in enumerate(spec.graph) if g.name == name)
    return GraphModel(spec, spec_dir, index, load_model(spec.graph[index], f"graph[{index}]", spec_dir))


def export_graph(gm: GraphModel, device: str = "cpu") -> Any:
    """The ExportedProgram shimgen compiles: the model wrapped to take the spec's inputs positionally and
    return its tensors flat, exported on `device` at the example sizes with the spec's dims (backed size-oblivious)."""
    import torch

    from shimgen.trace import dims
    from shimgen.trace import export as trace

    inputs = [t.to(device) if isinstance(t, torch.Tensor) else t for t in gm.inputs()]
    with torch.no_grad():
        return dims.export(trace._spec_order_module(gm.model.to(device), gm.graph), inputs, gm.graph, gm.where)


def aoti_binder(program: Any, path: Path, configs: dict[str, Any] | None = None) -> Binder:
    """AOTInductor's package of `program` (Inductor's configs: none for its defaults), called through
    its loader's run: flat inputs in, flat outputs out, nothing in between."""
    import torch

    package = torch._inductor.aoti_compile_and_package(program, package_path=str(path), inductor_configs=configs)
    loader = torch._inductor.aoti_load_package(package).loader
    return lambda tensors: partial(loader.run, list(tensors))


def ort_binder(program: Any, path: Path, threads: int) -> Binder:
    """ONNX Runtime's CPU execution provider on the ONNX export (torch.onnx, dynamo) of `program`, with
    `threads` intra-op threads. Raises ImportError without onnxruntime, anything when export fails."""
    import onnxruntime as ort
    import torch

    torch.onnx.export(program, f=str(path), dynamo=True)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    # ONNX Runtime's pool threads spin after each run by default; timed in turn with the others, they would take
    # the cores the next contender needs (every contender after it ran 2x slower on 2 cores).
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]

    def bind(tensors: list[Any]) -> Call:
        if len(tensors) != len(names):
            raise ValueError(f"the ONNX model takes {len(names)} inputs ({', '.join(names)}), the graph {len(tensors)}")
        return partial(session.run, None, {name: t.numpy() for name, t in zip(names, tensors, strict=True)})

    return bind


def module_binder(gm: GraphModel, fn: Callable[..., Any]) -> Binder:
    """A callable taking the model's own arguments (eager, torch.compile, the shimgen package)."""

    def bind(tensors: list[Any]) -> Call:
        args, kwargs = gm.split(tensors)
        return partial(fn, *args, **kwargs)

    return bind


@dataclass
class Contenders:
    """Binders by contender name, in the order they are shown; what could not be built, and why."""

    binders: dict[str, Binder] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)

    def add(self, name: str, make: Callable[[], Binder]) -> None:
        """Build the contender now; a failure is recorded as the reason it is missing."""
        try:
            self.binders[name] = make()
        except Exception as exc:
            self.missing[name] = short_error(exc)
            print(f"  {name}: not built: {self.missing[name]}", flush=True)


def short_error(exc: BaseException, limit: int = 300) -> str:
    """'Type: first line of the message', cut to `limit` characters, fit for a table cell."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = f"{type(exc).__name__}: {lines[0] if lines else ''}".replace("|", "/")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def compiled_contenders(
    gm: GraphModel, program: Any, tmp: Path, tag: str, threads: int, names: Sequence[str]
) -> Contenders:
    """The compiled contenders among `names` (AOTI default, AOTI freezing, ONNX Runtime) of the exported
    `program`, generated under the current torch thread count (Inductor sizes its OpenMP teams by it)."""
    import torch

    out = Contenders()
    with torch.no_grad():
        if AOTI in names:
            out.add(AOTI, lambda: aoti_binder(program, tmp / f"{tag}_aoti.pt2"))
        if AOTI_FREEZING in names:
            out.add(AOTI_FREEZING, lambda: aoti_binder(program, tmp / f"{tag}_aoti_freezing.pt2", {"freezing": True}))
        if ORT in names:
            out.add(ORT, lambda: ort_binder(program, tmp / f"{tag}.onnx", threads))
    return out


def tensors_of(output: Any) -> list[Any]:
    """The output's tensors in pytree order; ONNX Runtime's numpy arrays as tensors."""
    import numpy as np
    import torch
    import torch.utils._pytree as pytree

    leaves = pytree.tree_leaves(output)
    return [
        torch.from_numpy(x) if isinstance(x, np.ndarray) else x
        for x in leaves
        if isinstance(x, (torch.Tensor, np.ndarray))
    ]


def differs(got: Any, want: Any, rtol: float, atol: float) -> str:
    """Why `got` is not `want` (compared as flat tensors, like shimgen check); empty when it is close."""
    import torch

    have, expected = tensors_of(got), tensors_of(want)
    if len(have) != len(expected):
        return f"{len(have)} output tensors, eager {len(expected)}"
    for k, (a, b) in enumerate(zip(have, expected, strict=True)):
        if a.shape != b.shape or a.dtype != b.dtype:
            return f"output {k}: {tuple(a.shape)}/{a.dtype}, eager {tuple(b.shape)}/{b.dtype}"
        if not torch.allclose(a.double(), b.double(), rtol=rtol, atol=atol, equal_nan=True):
            return f"output {k}: max abs err {(a.double() - b.double()).abs().max().item():.2e} (rtol {rtol:g}, atol {atol:g})"
    return ""


def measure(
    binders: dict[str, Binder],
    tensors: list[Any],
    expected: Any,
    rtol: float,
    atol: float,
    block_seconds: float,
    blocks: int,
) -> tuple[dict[str, float], dict[str, str]]:
    """(µs per call, failures): every contender bound to `tensors` and called once (torch.compile
    compiles then), its output checked against `expected`, then the ones that match timed side by side."""
    import torch

    calls: dict[str, Call] = {}
    failures: dict[str, str] = {}
    with torch.no_grad():
        for name, bind in binders.items():
            try:
                call = bind(tensors)
                wrong = differs(call(), expected, rtol, atol)
                failure = f"output differs from eager: {wrong}" if wrong else ""
            except Exception as exc:
                failure = f"call failed: {short_error(exc)}"
            if failure:
                failures[name] = failure
                print(f"  {name}: {failure}", flush=True)
            else:
                calls[name] = call
        return time_side_by_side(calls, block_seconds, blocks), failures
