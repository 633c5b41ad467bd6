"""The build: spec → custom ops → trace → codegen → prebuilt → render → compile → package. Each stage takes the
typed results of the ones before it (shimgen/results.py) and is skipped when state.json holds its
result under the same key.

Outputs under <out>/build/<name>/: ops/ (the custom ops' Meson project and build), trace/, codegen/, project/ (generated Meson project), meson/
(build directory), site/ (the unpacked wheel: importable); wheels go to <out>/dist/.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import codegen, custom_ops, meson, package, prebuilt, probe, render, toolchain, trace
from .errors import SpecError, UserError
from .files import exclusive, file_hash, stage_key
from .results import (
    CodegenResult,
    CompileResult,
    CustomOps,
    KernelChoice,
    PackageResult,
    RenderedProject,
    Stamp,
    TraceResult,
    Unit,
    to_json,
    unit_name,
)
from .spec import Graph, ProjectSpec, Target, load_spec
from .state import State
from .toolchain import Toolchain
from .toolchain.cuda import CudaToolchain, check_archs, detect_cuda, torch_cuda_version

Progress = Callable[[str, str], None]


@dataclass
class BuildOutput:
    name: str
    target: str
    wheel: Path
    package_dir: Path
    graphs: list[str]
    stages: dict[str, float] = field(default_factory=dict)
    compile_units: tuple[int, int] = (0, 0)
    slowest_units: list[tuple[str, float]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    compiler_cache: str | None = None
    kernel_choices: dict[str, tuple[KernelChoice, ...]] = field(default_factory=dict)  # by unit

    def summary(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "target": self.target,
            "wheel": str(self.wheel),
            "package_dir": str(self.package_dir),
            "graphs": self.graphs,
            "stages": {k: round(v, 3) for k, v in self.stages.items()},
            "compiled_units": {"done": self.compile_units[0], "total": self.compile_units[1]},
            "slowest_units": [{"unit": u, "seconds": s} for u, s in self.slowest_units],
            "skipped": self.skipped,
            "compiler_cache": self.compiler_cache,
            "kernel_choices": to_json(self.kernel_choices),
        }


@dataclass(frozen=True)
class Layout:
    spec_path: Path
    root: Path
    dist: Path

    @classmethod
    def of(cls, spec_path: Path, out: Path, name: str) -> Layout:
        return cls(spec_path, out / "build" / name, out / "dist")

    @property
    def spec_dir(self) -> Path:
        return self.spec_path.parent.resolve()

    @property
    def project(self) -> Path:
        return self.root / "project"

    @property
    def meson(self) -> Path:
        return self.root / "meson"

    @property
    def site(self) -> Path:
        return self.root / "site"

    @property
    def state_file(self) -> Path:
        return self.root / "state.json"

    @property
    def lock_file(self) -> Path:
        return self.root.with_name(f".{self.root.name}.lock")


@dataclass(frozen=True)
class Tools:
    """The proved toolchain with the runtime library its probe built, the CUDA half where a target
    needs it, and the compiler cache."""

    tc: Toolchain
    runtime_lib: Path
    cuda: CudaToolchain | None
    launcher: str | None

    @property
    def key(self) -> str:
        """What a Meson build directory keeps from its configuration."""
        return stage_key(self.tc.key, self.launcher, self.cuda.nvcc if self.cuda else None)


class Timeline:
    """Seconds per stage (summed over units) and the units skipped as up to date, reported as they happen."""

    def __init__(self, report: Progress) -> None:
        self.report = report
        self.seconds: dict[str, float] = {}
        self.skipped: list[str] = []

    @contextmanager
    def stage(self, name: str, detail: str = "") -> Iterator[None]:
        self.report(name, f"{detail} ..." if detail else "...")
        start = time.monotonic()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.monotonic() - start
        done = f"done in {time.monotonic() - start:.1f}s"
        self.report(name, f"{detail} {done}" if detail else done)


def build(spec_path: Path, out: Path, force: bool = False, use_cache: bool = True, progress: Progress | None = None) -> BuildOutput:
    report = progress or (lambda stage, msg: None)
    try:
        spec = load_spec(spec_path)
        layout = Layout.of(spec_path, out.resolve(), spec.project.name)
        # One build of a project per output directory at a time; the per-user caches have locks of their own.
        with exclusive(layout.lock_file, lambda msg: report("lock", msg)):
            return _build(spec, layout, force, use_cache, report)
    except SpecError as exc:
        exc.file = exc.file or str(spec_path)
        raise


@dataclass(frozen=True)
class Job:
    """One build's fixed inputs and where it records what it did."""

    spec: ProjectSpec
    layout: Layout
    tools: Tools
    state: State
    timeline: Timeline
    ops: CustomOps | None


def _build(spec: ProjectSpec, layout: Layout, force: bool, use_cache: bool, report: Progress) -> BuildOutput:
    timeline = Timeline(report)
    with timeline.stage("toolchain"):
        tools = _tools(spec, use_cache, report)
    ops = None
    if spec.custom_op:
        with timeline.stage("ops"):
            ops = custom_ops.prepare(spec, layout.spec_dir, layout.spec_path.name, layout.root / "ops", tools.tc, tools.cuda, tools.launcher,
                                     lambda msg: report("ops", msg))
    job = Job(spec, layout, tools, State(layout.state_file, fresh=force), timeline, ops)
    _keep_meson_dir_if_configured_for(job)
    # Inductor registers its oneDNN weight-packing passes once per process, as the first CPU freezing finds oneDNN
    # on or off (codegen.uses_onednn): CPU units go first, so that they decide it.
    generated = {(t.device, i): _generate(job, i, graph, t)
                 for t in sorted(spec.target, key=lambda t: t.device != "cpu") for i, graph in enumerate(spec.graph)}
    units = [generated[t.device, i] for t in spec.target for i in range(len(spec.graph))]
    job.state.forget_all_but("unit:", {f"unit:{kind}:{u.name}" for u in units for kind in ("trace", "codegen")})
    with timeline.stage("prebuilt"):
        shared = {t.device: prebuilt.ensure(tools.tc, t, [u for u in units if u.target is t], spec.flags, lambda msg: report("prebuilt", msg))
                  for t in spec.target}
    with timeline.stage("render"):
        project = render.render_project(spec, layout.spec_path.name, tools.tc, tools.runtime_lib, tools.cuda, units, shared,
                                         ops, layout.project)
    with timeline.stage("compile"):
        compiled = meson.build(layout.project, layout.meson, tools.tc, f"the package '{spec.project.name}'", tools.launcher,
                               lambda msg: report("compile", msg))
    packaged = _package(job, project, compiled)
    return BuildOutput(spec.project.name, "+".join(render.target_id(t) for t in spec.target), packaged.wheel, packaged.site,
                       [g.name for g in spec.graph], timeline.seconds, (compiled.units_done, compiled.units_total),
                       sorted(compiled.unit_seconds.items(), key=lambda kv: -kv[1])[:5], timeline.skipped, tools.launcher,
                       {u.name: u.code.kernel_choices for u in units if u.code.kernel_choices})


def _tools(spec: ProjectSpec, use_cache: bool, report: Progress) -> Tools:
    tc, verdicts = probe.select(lambda msg: report("toolchain", msg))
    for failed in verdicts[:-1]:
        report("toolchain", f"warning: {failed.cxx} ({failed.identity}) fails the probe: {failed.reason}; using {tc.cxx}")
    return Tools(tc, Path(verdicts[-1].runtime_lib), _cuda_toolchain(spec), toolchain.compiler_cache() if use_cache else None)


def _cuda_toolchain(spec: ProjectSpec) -> CudaToolchain | None:
    """nvcc and torch's CUDA, checked against the spec's cuda target; None without one."""
    for i, target in enumerate(spec.target):
        if target.device == "cuda":
            try:
                cuda = detect_cuda()
                check_archs(cuda, target, f"target[{i}]")
                torch_cuda_version()
            except SpecError:
                raise
            except UserError as exc:
                raise SpecError("", f"target[{i}]", str(exc)) from None
            return cuda
    return None


def _keep_meson_dir_if_configured_for(job: Job) -> None:
    """A Meson build directory keeps the compiler it was configured with. Trace and codegen
    records stay: their keys hold the torch version, and their output ignores the compiler."""
    if job.state.get(Stamp, "meson", job.tools.key) is None:
        shutil.rmtree(job.layout.meson, ignore_errors=True)
        job.state.forget("package")
        job.state.commit("meson", Stamp(job.tools.key))


def _generate(job: Job, index: int, graph: Graph, target: Target) -> Unit:
    """One graph on one target traced and generated, or both taken from the last build when up to date."""
    spec, layout, state, timeline = job.spec, job.layout, job.state, job.timeline
    name, where = unit_name(graph, target), f"graph[{index}]"
    key = trace.trace_key(graph, target, job.tools.tc, layout.spec_dir, job.ops.key if job.ops else None)
    traced = state.get(TraceResult, f"unit:trace:{name}")
    if traced is not None and trace.still_valid(traced, key):
        timeline.skipped.append(f"trace:{name}")
    else:
        _require_gpu(spec, target)
        with timeline.stage("trace", name):
            traced = trace.trace(graph, where, layout.spec_dir, target.device, layout.root / "trace" / f"{name}.pt2", key, job.ops)
        state.commit(f"unit:trace:{name}", traced)
    key = codegen.codegen_key(traced, target, spec.flags)
    generated = state.get(CodegenResult, f"unit:codegen:{name}", key)
    if generated is not None:
        timeline.skipped.append(f"codegen:{name}")
        return Unit(graph, target, generated)
    _require_gpu(spec, target)
    with timeline.stage("codegen", name):
        try:
            generated = codegen.generate(traced, target, spec.flags, job.tools.tc.cxx, layout.root / "codegen" / name, key, job.ops)
        except SpecError:
            raise
        except UserError as exc:
            raise SpecError("", where, str(exc)) from None
    state.commit(f"unit:codegen:{name}", generated)
    return Unit(graph, target, generated)


def _require_gpu(spec: ProjectSpec, target: Target) -> None:
    import torch

    if target.device == "cuda" and not torch.cuda.is_available():
        raise SpecError("", f"target[{spec.target.index(target)}]",
                        "building for cuda needs a GPU on this machine (Inductor tunes and compiles the Triton kernels on it); torch sees none")


def _package(job: Job, project: RenderedProject, compiled: CompileResult) -> PackageResult:
    key = stage_key(project.key, [(p.name, file_hash(p)) for p in compiled.extensions])
    packaged = job.state.get(PackageResult, "package", key)
    if packaged is not None:
        job.timeline.skipped.append("package")
        return packaged
    layout, tools = job.layout, job.tools
    with job.timeline.stage("package"):
        module_dirs = (layout.spec_dir,) if any(op.module for op in job.spec.custom_op) else ()
        packaged = package.build_and_unpack(layout.project, layout.meson, layout.dist, layout.site, job.spec.project.name, tools.tc,
                                            tools.launcher, key, module_dirs)
    job.state.commit("package", packaged)
    return packaged
