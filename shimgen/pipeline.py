"""The build: spec → custom ops → trace → codegen → prebuilt → render → compile → package. Each stage takes the
typed results of the ones before it (shimgen/results.py) and is skipped when state.json holds its
result under the same key.

Outputs under <out>/build/<name>/: ops/ (the custom ops' Meson project and build), trace/, codegen/, project/ (generated
Meson project), meson/
(build directory), site/ (the unpacked wheel: importable); wheels go to <out>/dist/.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from shimgen import devices, toolchain
from shimgen.build import meson, workers
from shimgen.cache import shared_cache
from shimgen.cache.history import History
from shimgen.cache.shared_cache import SharedCache
from shimgen.cache.state import Result, State
from shimgen.commands import matrix
from shimgen.errors import MismatchError, SpecError, SpecErrors, UserError
from shimgen.files import LockHeld, exclusive, file_hash, shimgen_fingerprint, stage_key
from shimgen.inductor import codegen, generated, internals, lockfile, weights
from shimgen.package import cpp, verify
from shimgen.package import wheel as package
from shimgen.package.verify import ReferenceRun
from shimgen.project import render
from shimgen.results import (
    CodegenResult,
    CompileResult,
    CppPackageResult,
    CustomOps,
    KernelChoice,
    PackageResult,
    Prebuilt,
    RenderedProject,
    Stamp,
    TraceResult,
    Unit,
    Variant,
    to_json,
    unit_name,
)
from shimgen.spec import Flags, Graph, ProjectSpec, Target, load_spec
from shimgen.toolchain import Toolchain, entries, prebuilt, probe, warmup
from shimgen.toolchain.cuda import CudaToolchain, check_archs, detect_cuda, torch_cuda_version
from shimgen.trace import custom_ops, entry, variants
from shimgen.trace import export as trace

Progress = Callable[[str, str], None]
R = TypeVar("R", bound=Result)


@dataclass(frozen=True, kw_only=True)
class BuildOutput:
    """What a build made and what it spent: `shimgen build --json` prints its summary()."""

    name: str
    target: str
    wheel: Path
    package_dir: Path
    graphs: list[str]
    weights_file: Path | None = None  # flags.weights = "external": the weights the wheel leaves out, beside it
    platform_reason: str = ""  # why the wheel has no manylinux tag, where it has none
    cpp_prefix: Path | None = None  # the C++ package, installed (package/cpp.py)
    cpp_archive: Path | None = None
    cpp_skipped: str | None = None  # why the build made no C++ package
    stages: dict[str, float] = field(default_factory=dict)
    compile_units: tuple[int, int] = (0, 0)
    slowest_units: list[tuple[str, float]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    compiler_cache: str | None = None
    kernel_choices: dict[str, tuple[KernelChoice, ...]] = field(default_factory=dict)  # by unit
    untimed_gemms: dict[str, tuple[tuple[tuple[tuple[str, ...], str], int], ...]] = field(
        default_factory=dict
    )  # by unit
    scalar_kernels: dict[str, str] = field(default_factory=dict)  # by unit: why its CPU kernels are not vectorized
    onednn_off: dict[str, str] = field(default_factory=dict)  # by unit: why it was generated without oneDNN
    gemm_templates_off: dict[str, str] = field(default_factory=dict)  # by unit: why its GEMMs were not timed
    freezing_off: dict[str, str] = field(default_factory=dict)  # by unit: why it was generated without freezing
    large_kernels: dict[str, list[tuple[str, int]]] = field(
        default_factory=dict
    )  # by unit: its kernel files compiled at -O2 for a kernel -O3 takes minutes on, with that kernel's bytes
    identifiers: list[str] = field(default_factory=list)  # the matrix's build identifiers this package covers
    shared_cache: dict[str, Any] | None = None  # the shared cache's URL, and what this build found and stored there
    timeline: list[tuple[str, str, float, float]] = field(default_factory=list)  # Timeline.events
    elapsed: float = 0.0  # seconds from the build's start to its end
    models: list[dict[str, Any]] = field(
        default_factory=list
    )  # each unit's dynamic model and variants: seconds and bytes (_models)
    verified: dict[str, Any] = field(
        default_factory=dict
    )  # the calls run against the traced programs before installing (verify.py)

    def summary(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "target": self.target,
            "wheel": str(self.wheel),
            "weights_file": str(self.weights_file) if self.weights_file else None,
            "wheel_platform_reason": self.platform_reason or None,
            "package_dir": str(self.package_dir),
            "cpp_prefix": str(self.cpp_prefix) if self.cpp_prefix else None,
            "cpp_archive": str(self.cpp_archive) if self.cpp_archive else None,
            "cpp_skipped": self.cpp_skipped,
            "graphs": self.graphs,
            "stages": {k: round(v, 3) for k, v in self.stages.items()},
            "compiled_units": {"done": self.compile_units[0], "total": self.compile_units[1]},
            "slowest_units": [{"unit": u, "seconds": s} for u, s in self.slowest_units],
            "skipped": self.skipped,
            "compiler_cache": self.compiler_cache,
            "build_server": os.getppid() if os.environ.get("SHIMGEN_SERVER_CHILD") else None,
            "kernel_choices": to_json(self.kernel_choices),
            "untimed_gemms": {
                unit: [{"sizes": list(sizes), "kernel": kernel, "count": n} for (sizes, kernel), n in gemms]
                for unit, gemms in self.untimed_gemms.items()
            },
            "scalar_kernels": self.scalar_kernels,
            "onednn_off": self.onednn_off,
            "gemm_templates_off": self.gemm_templates_off,
            "freezing_off": self.freezing_off,
            "large_kernels": {
                unit: [{"file": f, "kernel_bytes": n} for f, n in files] for unit, files in self.large_kernels.items()
            },
            "identifiers": self.identifiers,
            "shared_cache": self.shared_cache,
            "timeline": [
                {"stage": stage, "unit": unit, "start": start, "end": end} for stage, unit, start, end in self.timeline
            ],
            "elapsed": round(self.elapsed, 3),
            "models": self.models,
            "verified": self.verified,
        }


@dataclass(frozen=True, kw_only=True)
class Layout:
    spec_path: Path
    root: Path
    dist: Path

    @classmethod
    def of(cls, spec_path: Path, out: Path, name: str) -> Layout:
        return cls(spec_path=spec_path, root=out / "build" / name, dist=out / "dist")

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
    def cpp(self) -> Path:
        return self.root / "cpp"

    @property
    def state_file(self) -> Path:
        return self.root / "state.json"

    @property
    def lock_file(self) -> Path:
        """Held while a build writes into `root`."""
        return self.root.with_name(f".{self.root.name}.lock")

    @property
    def lock_path(self) -> Path:
        """The spec's lockfile of kernel choices."""
        return lockfile.path_for(self.spec_path)


@dataclass(frozen=True, kw_only=True)
class Tools:
    """The proved toolchain, the CUDA half where a target needs it, and the compiler cache."""

    tc: Toolchain
    cuda: CudaToolchain | None
    torch_cuda: str | None  # the CUDA torch was built with, where a target is cuda
    launcher: str | None

    @property
    def key(self) -> str:
        """What a Meson build directory keeps from its configuration."""
        return stage_key(self.tc.key, self.launcher, self.cuda.nvcc if self.cuda else None)


class Timeline:
    """Seconds per stage (summed over units), when each ran (from the build's start: stages of several units may
    overlap), and the units skipped as up to date, reported as they happen."""

    def __init__(self, report: Progress) -> None:
        self.report = report
        self.seconds: dict[str, float] = {}
        self.events: list[tuple[str, str, float, float]] = []  # stage, unit or "", start, end
        self.skipped: list[str] = []
        self.started = time.time()

    def record(self, name: str, detail: str, start: float, end: float) -> None:
        """A stage that ran from `start` to `end` (time.time()), perhaps in another process."""
        self.seconds[name] = self.seconds.get(name, 0.0) + end - start
        self.events.append((name, detail, round(start - self.started, 3), round(end - self.started, 3)))
        self.report(name, f"{detail} done in {end - start:.1f}s" if detail else f"done in {end - start:.1f}s")

    @contextmanager
    def stage(self, name: str, detail: str = "") -> Iterator[None]:
        self.report(name, f"{detail} ..." if detail else "...")
        start = time.time()
        try:
            yield
        except BaseException:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.time() - start
            raise
        self.record(name, detail, start, time.time())


def build(
    spec_path: Path,
    out: Path,
    force: bool = False,
    use_cache: bool = True,
    progress: Progress | None = None,
    only: str | None = None,
    retune: bool = False,
    cache_url: str | None = None,
    verify: bool = True,
) -> BuildOutput:
    """Build the spec's package for all its targets, or for the one build identifier `only` names (in a directory of its
    own).
    Kernel choices replay the spec's lockfile; `retune` measures them all again. `cache_url` names a shared cache. With
    `verify`, the package runs against its traced programs before it is installed (shimgen/package/verify.py)."""
    report = progress or (lambda stage, msg: None)
    try:
        spec = load_spec(spec_path)
        layout = Layout.of(spec_path, out.resolve(), spec.project.name)
        all_units = {name for g in spec.graph for t in spec.target for name, _ in variants.works(g, t)}
        if only is not None:
            picked = matrix.select(spec, only)
            spec = dataclasses.replace(spec, target=[picked.target])
            layout = dataclasses.replace(layout, root=layout.root / picked.identifier)
        # One build of a project per output directory at a time; the per-user caches have locks of their own.
        with exclusive(layout.lock_file, lambda held: report("lock", str(held))), _process_kept(), ExitStack() as stack:
            url = shared_cache.configured(cache_url)
            shared = SharedCache(shared_cache.backend(url)) if url else None
            tc = toolchain.detect()
            entries.limit()  # a bad $SHIMGEN_CACHE_LIMIT is told now, not once the build has made a cache entry
            # Custom ops need the compiler at once; a shared cache may answer the build without one.
            warm = (
                None
                if spec.custom_op or shared
                else warmup.start([t.device for t in spec.target], toolchain.compiler_cache() if use_cache else None)
            )
            if warm is not None:
                stack.callback(warm.stop)
            if shared:
                remote = shared_cache.ccache_remote(shared.backend)
                # ccache 4.8 renamed its secondary storage to remote storage; either reads its own name.
                for name in ("CCACHE_REMOTE_STORAGE", "CCACHE_SECONDARY_STORAGE"):
                    os.environ.setdefault(name, remote)
            return _build(
                spec,
                layout,
                force,
                use_cache,
                report,
                Tuning(locked=lockfile.read(layout.lock_path), retune=retune, all_units=all_units),
                shared,
                verify,
                tc,
                warm,
                stack,
            )
    except SpecError as exc:
        exc.file = exc.file or str(spec_path)
        raise
    except SpecErrors as exc:
        for error in exc.errors:
            error.file = error.file or str(spec_path)
        raise


@contextmanager
def _process_kept() -> Iterator[None]:
    """A build leaves its process as it found it: the environment (the shared cache's ccache storage), sys.path and the
    loggers' levels. (The audit hook that sees a trace's reads is installed once and idles outside a trace.)"""
    environ, path = dict(os.environ), list(sys.path)
    levels = {
        name: logger.level
        for name, logger in logging.Logger.manager.loggerDict.items()
        if isinstance(logger, logging.Logger)
    }
    try:
        yield
    finally:
        for name in set(os.environ) - set(environ):
            del os.environ[name]
        os.environ.update(environ)
        sys.path[:] = path
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


@dataclass(frozen=True, kw_only=True)
class Tuning:
    """The lockfile's timing records as the build found them, whether to measure again, and the spec's units (the
    lockfile keeps theirs, also those of targets that `--only` leaves out)."""

    locked: lockfile.Locked
    retune: bool
    all_units: set[str]


class LazyTools:
    """The proved toolchain, probed when a stage first needs to compile: a build that the shared cache answers
    whole, on a machine with an empty per-user cache, never proves a compiler."""

    def __init__(self, spec: ProjectSpec, use_cache: bool, timeline: Timeline, warm: warmup.Warmup | None) -> None:
        self._spec, self._use_cache, self._timeline, self._warm = spec, use_cache, timeline, warm
        self._tools: Tools | None = None

    def __call__(self) -> Tools:
        if self._tools is None:
            with self._timeline.stage("toolchain"):
                self._tools = _tools(self._spec, self._use_cache, self._timeline.report, self.waiting("toolchain"))
        return self._tools

    def waiting(self, stage: str) -> Callable[[LockHeld], None]:
        """What a stage reports while it waits for a per-user lock: who holds it, unless it is this build's warm-up."""
        own = self._warm.process.pid if self._warm else None

        def waiting(held: LockHeld) -> None:
            if own is None or held.pid != own:
                self._timeline.report(stage, str(held))

        return waiting

    @property
    def probed(self) -> Tools | None:
        return self._tools


@dataclass(frozen=True, kw_only=True)
class Job:
    """One build's fixed inputs and where it records what it did."""

    spec: ProjectSpec
    layout: Layout
    tc: Toolchain  # found, not yet proved: what keys need (torch and Python versions, the compiler's identity)
    tools: LazyTools
    state: State
    timeline: Timeline
    ops: CustomOps | None
    tuning: Tuning
    shared: SharedCache | None
    verify: bool
    held: ExitStack  # the per-user cache's entries this build compiles against, held to its end (toolchain/entries.py)
    history: History | None  # earlier builds' code (None: --force, which reuses nothing)
    program_weights: dict[str, dict[str, Any]] = field(default_factory=dict)  # _program_weights, by TraceResult.weights
    fallbacks: dict[str, lockfile.Fallbacks] = field(default_factory=dict)  # by unit: what this build found it needs


def _build(
    spec: ProjectSpec,
    layout: Layout,
    force: bool,
    use_cache: bool,
    report: Progress,
    tuning: Tuning,
    shared: SharedCache | None,
    verify: bool,
    tc: Toolchain,
    warm: warmup.Warmup | None,
    held: ExitStack,
) -> BuildOutput:
    timeline = Timeline(report)
    tools = LazyTools(spec, use_cache, timeline, warm)
    ops = None
    if spec.custom_op:
        built = tools()
        with timeline.stage("ops"):
            ops = custom_ops.prepare(
                spec,
                layout.spec_dir,
                layout.spec_path.name,
                layout.root / "ops",
                built.tc,
                built.cuda,
                built.launcher,
                lambda msg: report("ops", msg),
                held,
                tools.waiting("ops"),
            )
    job = Job(
        spec=spec,
        layout=layout,
        tc=tc,
        tools=tools,
        state=State(layout.state_file, fresh=force),
        timeline=timeline,
        ops=ops,
        tuning=tuning,
        shared=shared,
        verify=verify,
        held=held,
        history=None if force else History(layout.root / "history"),
    )
    references: ReferenceRun | None = None

    def traced(programs: list[UnitPrograms], settled: set[str]) -> None:
        nonlocal references
        references = _reference_run(job, programs, settled, codegen_ahead=True)

    try:
        units = _generate_all(job, traced)
        names = {name for u in units for name, _ in u.generated}
        job.state.forget_all_but("unit:", {f"unit:{kind}:{name}" for name in names for kind in ("trace", "codegen")})
        if job.history is not None:
            job.history.forget_all_but(names)
        if references is None:
            references = _reference_run(job, [_programs_of(u) for u in units], _checked(units), codegen_ahead=False)
        return _package_all(job, tools, units, references)
    finally:
        if references is not None:
            references.stop()


def _package_all(job: Job, tools: LazyTools, units: list[Unit], references: ReferenceRun | None) -> BuildOutput:
    """Compiled and packaged, or taken from the shared cache, after `_generate_all`."""
    spec, layout, shared, tc, timeline = job.spec, job.layout, job.shared, job.tc, job.timeline
    target = "+".join(render.target_id(t) for t in spec.target)
    version = f"{spec.project.version}+{matrix.local_version(tc.torch_version, spec.target, _torch_cuda(spec))}"
    wheel_key = _wheel_key(job, units, version)
    packaged = _shared_wheel(job, wheel_key, units) if shared else None
    compiled = None
    cpp_skipped = render.cpp_package_skipped(spec, units)
    archive = cpp.archive_name(spec.project.name, spec.project.version, target)
    cpp_package = None
    if packaged is None:
        built = tools()
        _keep_meson_dir_if_configured_for(job, built)
        while True:
            units, project, compiled = _compiled(job, units, version, built)
            wheel_key = _wheel_key(job, units, version)
            try:
                packaged, cpp_package = _package(
                    job, project, compiled, units, None if cpp_skipped else archive, references
                )
                break
            except MismatchError as exc:
                units = _generated_again(job, units, exc)
        if shared:
            shared.put(
                "wheel",
                wheel_key,
                shared_cache.pack(
                    packaged.wheel.parent,
                    [packaged.wheel, *([packaged.weights_file] if packaged.weights_file else [])],
                    packaged.wheel.name.encode(),
                ),
            )
            if cpp_package:
                shared.put("cpp", wheel_key, cpp_package.archive.read_bytes())
            job.state.commit("wheel", Stamp(key=wheel_key))
    elif cpp_skipped is None:
        cpp_package = _shared_cpp_package(job, wheel_key, packaged, archive)
        if cpp_package is None:
            cpp_skipped = "the package came from the shared cache, which holds no C++ package for it"
    if cpp_package is None:
        shutil.rmtree(layout.cpp, ignore_errors=True)  # the C++ package of an earlier build, of other flags
        job.state.forget("cpp")
    _update_lockfile(job, units)
    return BuildOutput(
        name=spec.project.name,
        target=target,
        wheel=packaged.wheel,
        weights_file=packaged.weights_file,
        platform_reason=packaged.platform_reason,
        package_dir=packaged.site,
        cpp_prefix=cpp_package.prefix if cpp_package else None,
        cpp_archive=cpp_package.archive if cpp_package else None,
        cpp_skipped=cpp_skipped,
        graphs=[g.name for g in spec.graph],
        stages=timeline.seconds,
        compile_units=(compiled.units_done, compiled.units_total) if compiled else (0, 0),
        slowest_units=sorted(compiled.unit_seconds.items(), key=lambda kv: -kv[1])[:5] if compiled else [],
        skipped=timeline.skipped,
        compiler_cache=tools.probed.launcher if tools.probed else None,
        kernel_choices={name: code.kernel_choices for u in units for name, code in u.generated if code.kernel_choices},
        untimed_gemms={name: code.untimed_gemms for u in units for name, code in u.generated if code.untimed_gemms},
        scalar_kernels={name: code.scalar_kernels for u in units for name, code in u.generated if code.scalar_kernels},
        onednn_off={name: code.onednn_off for u in units for name, code in u.generated if code.onednn_off},
        gemm_templates_off={
            name: code.gemm_templates_off for u in units for name, code in u.generated if code.gemm_templates_off
        },
        freezing_off={
            name: why for u in units for name, _ in u.generated if (why := _fallbacks(job, name).freezing_off)
        },
        large_kernels={
            name: [(path.name, n) for path, n in large]
            for u in units
            for name, code in u.generated
            if (large := generated.large_kernels(code.kernels, spec.flags.kernel_opt))
        },
        identifiers=[
            matrix.BuildId(
                python=tc.python_version,
                torch=tc.torch_version,
                cuda=_torch_cuda(spec) if devices.device(t.device).gpu else None,
                target=t,
            ).identifier
            for t in spec.target
        ],
        shared_cache=_shared_summary(shared),
        timeline=timeline.events,
        elapsed=time.time() - timeline.started,
        models=_models(spec.project.name, units, timeline, compiled, packaged.site),
        verified={
            "cases": list(packaged.verified),
            "skipped": list(packaged.verify_skipped),
            "seconds": packaged.verify_seconds,
            "beforehand": packaged.verify_beforehand,
            "settled": list(packaged.verify_settled),
        },
    )


def _models(
    package: str, units: list[Unit], timeline: Timeline, compiled: CompileResult | None, site: Path
) -> list[dict[str, Any]]:
    """Per unit, its dynamic model and each specialized variant: what this build spent on it (trace, codegen, and
    compile
    seconds, each output counted for the longest model name it holds) and its bytes in the package (a variant's weights:
    those the file holds for it alone)."""
    works = [name for u in units for name, _ in u.generated]

    def owner(output: str) -> str | None:
        held = [w for w in works if re.search(rf"{re.escape(w)}(?!\d)", output)]
        return max(held, key=len) if held else None

    compile_seconds: dict[str, float] = {}
    for output, seconds in compiled.unit_seconds.items() if compiled else ():
        work = owner(output)
        if work:
            compile_seconds[work] = compile_seconds.get(work, 0.0) + seconds
    models = []
    for u in units:
        weights_file = site / package / f"{u.name}.safetensors"
        for (work, _), variant in zip(u.generated, (None, *u.variants), strict=True):
            library = (
                next(iter((site / package).glob(f"_{u.name}.*.so")), None)
                if variant is None
                else site / package / f"{u.library(variant)}.so"
            )
            stages = {
                stage: round(
                    sum(end - start for name, unit, start, end in timeline.events if name == stage and unit == work), 3
                )
                for stage in ("trace", "codegen")
            }
            models.append(
                {
                    "unit": u.name,
                    "variant": dict(variant.sizes) if variant else None,
                    "automatic": variant.automatic if variant else "",
                    **stages,
                    "compile": round(compile_seconds.get(work, 0.0), 3),
                    "library_bytes": library.stat().st_size if library and library.is_file() else 0,
                    "weights_bytes": weights.variant_bytes(weights_file, variant.name)
                    if variant and weights_file.is_file()
                    else None,
                }
            )
    return models


def _shared_summary(shared: SharedCache | None) -> dict[str, Any] | None:
    if shared is None:
        return None
    entries = (
        [kind for kind in shared.hits if kind != "trace-reads"],
        sorted({kind for kind in shared.stored if kind != "trace-reads"}),
    )
    return {"url": shared.backend.url, "found": entries[0], "stored": entries[1], "error": shared.error}


def _torch_cuda(spec: ProjectSpec) -> str | None:
    return torch_cuda_version() if any(devices.device(t.device).gpu for t in spec.target) else None


def _tools(spec: ProjectSpec, use_cache: bool, report: Progress, waiting: Callable[[LockHeld], None]) -> Tools:
    tc, verdicts = probe.select(waiting)
    for failed in verdicts[:-1]:
        report("toolchain", f"warning: {failed.named} fails the probe: {failed.reason}; using {verdicts[-1].named}")
    cuda = _cuda_toolchain(spec)
    return Tools(
        tc=tc,
        cuda=cuda,
        torch_cuda=torch_cuda_version() if cuda else None,
        launcher=toolchain.compiler_cache() if use_cache else None,
    )


def _cuda_toolchain(spec: ProjectSpec) -> CudaToolchain | None:
    """nvcc and torch's CUDA, checked against the spec's cuda target; None without one."""
    for i, target in enumerate(spec.target):
        if devices.device(target.device).gpu:
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


def _keep_meson_dir_if_configured_for(job: Job, tools: Tools) -> None:
    """A Meson build directory keeps the compiler it was configured with. Trace and codegen
    records stay: their keys hold the torch version, and their output ignores the compiler."""
    if job.state.get(Stamp, "meson", tools.key) is None:
        shutil.rmtree(job.layout.meson, ignore_errors=True)
        job.state.forget("package")
        job.state.commit("meson", Stamp(key=tools.key))


def _generate_all(job: Job, traced_all: Callable[[list[UnitPrograms], set[str]], None] | None = None) -> list[Unit]:
    """Every graph on every target traced and generated, its dynamic code and each specialized variant, or taken from
    the last build (or the shared cache) where up to date. The traces to make run at once in worker processes, then the
    codegens (shimgen/build/workers.py); `traced_all` is told the programs in between, and the units whose checked code
    will most likely be kept (`_keeps_checked_code`). A unit is generated as `_fallbacks` says."""
    spec, layout, state = job.spec, job.layout, job.state
    # CPU units first: in one process, the first CPU freezing decides whether Inductor's oneDNN passes are registered.
    works = [
        (name, i, g, t, sizes)
        for t in sorted(spec.target, key=lambda t: devices.device(t.device).build_order)
        for i, g in enumerate(spec.graph)
        for name, sizes in variants.works(g, t)
    ]
    traced: dict[str, TraceResult] = {}

    def record_trace(name: str, result: TraceResult, start: float, end: float) -> None:
        job.timeline.record("trace", name, start, end)
        traced[name] = result
        state.commit(f"unit:trace:{name}", result)
        _store_trace(job, result)

    pending = works
    while pending:  # then the variants of the sizes a trace left out of its dynamic range, and theirs
        to_trace = []
        for name, i, graph, target, sizes in pending:
            graph = variants.traced_graph(graph, sizes)
            key = trace.trace_key(graph, target, job.tc, layout.spec_dir, job.ops.key if job.ops else None)
            found = _cached(
                job,
                f"unit:trace:{name}",
                TraceResult,
                key,
                valid=functools.partial(trace.still_valid, key=key),
                shared=functools.partial(_shared_trace, job, key=key),
            )
            if found is not None:
                traced[name] = found
                continue
            _require_gpu(spec, target)
            to_trace.append(
                (
                    name,
                    workers.TraceTask(
                        graph=graph,
                        where=f"graph[{i}]",
                        spec_dir=layout.spec_dir,
                        device=target.device,
                        program_file=layout.root / "trace" / f"{name}.pt2",
                        key=key,
                    ),
                )
            )
        _run(job, "trace", to_trace, workers.run_trace, record_trace)
        pending = variants.left_out(works, traced)
        works += pending
    keys = {}
    for name, _, _, target, _ in works:
        section = lockfile.section(name, job.tc.torch_version)
        locked = [] if job.tuning.retune else job.tuning.locked.timings(section)
        fallbacks = _fallbacks(job, name)
        flags, vectorize = _unit_flags(spec.flags, fallbacks), not fallbacks.scalar_kernels
        keys[name] = (
            locked,
            fallbacks,
            codegen.codegen_key(traced[name], target, flags, locked, job.tc.torch_version, vectorize=vectorize),
            codegen.codegen_key(
                traced[name], target, flags, locked, job.tc.torch_version, values=False, vectorize=vectorize
            ),
        )
    if traced_all is not None:
        traced_all(
            [_traced_programs(works, g, t) for t in spec.target for g in spec.graph],
            {name for name, (_, _, key, structure) in keys.items() if _keeps_checked_code(job, name, key, structure)},
        )
    code: dict[str, CodegenResult] = {}
    to_generate: list[tuple[str, workers.CodegenTask]] = []
    for name, i, _, target, _ in works:
        locked, fallbacks, key, structure = keys[name]
        _keep_replaced_code(job, name, key, structure)
        generated = (
            _known_codegen(job, name, traced[name], key)
            or _refitted_codegen(job, name, traced[name], key, structure, target)
            or _earlier_codegen(job, name, traced[name], key, structure, target)
        )
        if generated is not None:
            code[name] = generated
            continue
        _require_gpu(spec, target)
        gpu = devices.device(target.device).gpu
        flags = _unit_flags(spec.flags, fallbacks)
        to_generate.append(
            (
                name,
                workers.CodegenTask(
                    traced=traced[name],
                    target=target,
                    flags=flags,
                    cxx=None if gpu else job.tools().tc.cxx,
                    out_dir=layout.root / "codegen" / name,
                    key=key,
                    locked=locked,
                    retune=job.tuning.retune,
                    where=f"graph[{i}]",
                    scalar_kernels=fallbacks.scalar_kernels,
                    vec_isas=None if gpu or fallbacks.scalar_kernels else _vec_isas_record(job.tools().tc),
                    onednn_threads=codegen.packing_threads(target, flags),
                    onednn_off=fallbacks.onednn_off,
                    gemm_templates_off=fallbacks.gemm_templates_off,
                ),
            )
        )

    def record_codegen(name: str, generated: CodegenResult, start: float, end: float) -> None:
        job.timeline.record("codegen", name, start, end)
        task = next(task for unit, task in to_generate if unit == name)
        # Recorded under the key the next build computes, once the lockfile holds the timings this run used.
        torch_version, vectorize = job.tc.torch_version, not task.scalar_kernels
        if generated.gemm_templates_off:  # found in the worker: a unit generated again in this build starts there
            job.fallbacks[name] = dataclasses.replace(
                _fallbacks(job, name), gemm_templates_off=generated.gemm_templates_off
            )
        flags = _unit_flags(task.flags, lockfile.Fallbacks(gemm_templates_off=generated.gemm_templates_off))
        sets = job.tuning.locked.units.get(lockfile.section(name, torch_version), ())
        used = lockfile.Measured(generated.autotune_timings)
        timings = [measured.timings for measured in lockfile.merged(sets, used)]
        generated = dataclasses.replace(
            generated,
            key=codegen.codegen_key(task.traced, task.target, flags, timings, torch_version, vectorize=vectorize),
            structure_key=codegen.codegen_key(
                task.traced, task.target, flags, timings, torch_version, values=False, vectorize=vectorize
            ),
        )
        state.commit(f"unit:codegen:{name}", generated)
        if job.shared:
            for shared_key in {
                task.key,
                generated.key,
            }:  # found by a machine with this lockfile and by one with the next
                shared_cache.store(job.shared, "codegen", shared_key, generated, {"ROOT": task.out_dir})
        code[name] = generated

    job.program_weights.clear()
    _run(job, "codegen", to_generate, workers.run_codegen, record_codegen)
    units = []
    for t in spec.target:
        for g in spec.graph:
            made = _variant_works(works, g, t)
            units.append(
                Unit(
                    graph=g,
                    target=t,
                    code=code[unit_name(g, t)],
                    variants=tuple(
                        Variant(
                            sizes=tuple(sizes.items()), code=code[name], automatic=variants.reason(g, t, sizes, traced)
                        )
                        for name, sizes in made
                    ),
                )
            )
    return units


def _fallbacks(job: Job, name: str) -> lockfile.Fallbacks:
    """What the unit is generated without: what this build found, and what the lockfile keeps from earlier builds."""
    found = job.fallbacks.get(name, lockfile.Fallbacks())
    if job.tuning.retune:
        return found
    kept = job.tuning.locked.fallbacks.get(lockfile.section(name, job.tc.torch_version), lockfile.Fallbacks())
    return lockfile.Fallbacks(**{why: getattr(found, why) or getattr(kept, why) for why in vars(found)})


def _unit_flags(flags: Flags, fallbacks: lockfile.Fallbacks) -> Flags:
    if fallbacks.onednn_off:
        flags = dataclasses.replace(flags, onednn=False)
    if fallbacks.gemm_templates_off:
        flags = dataclasses.replace(flags, gemm_autotune=False)
    if fallbacks.freezing_off:
        flags = dataclasses.replace(flags, freezing=False)
    return flags


def _variant_works(works: list[Any], g: Graph, t: Target) -> list[tuple[str, dict[str, int]]]:
    """(name, sizes) of the graph's specialized variants on the target, the most specific first: a call runs the first
    whose sizes match."""
    made = [(name, sizes) for name, _, graph, target, sizes in works if graph is g and target is t and sizes]
    return sorted(made, key=lambda work: -len(work[1]))


def _traced_programs(works: list[Any], g: Graph, t: Target) -> UnitPrograms:
    variant_programs = ((name, tuple(sizes.items())) for name, sizes in _variant_works(works, g, t))
    return g, t, [(unit_name(g, t), ()), *variant_programs]


def _compiled(
    job: Job, units: list[Unit], version: str, built: Tools
) -> tuple[list[Unit], RenderedProject, CompileResult]:
    """The project rendered and compiled: (the units as compiled, the project, what Meson built). A graph whose
    vectorized CPU kernels the compiler refuses (Inductor's vectorized codegen has bugs that a torch release or a g++
    version brings out) is generated again with scalar kernels, and compiled again; the lockfile keeps why."""
    spec, layout, timeline = job.spec, job.layout, job.timeline
    while True:
        with timeline.stage("prebuilt"):
            prebuilts: dict[str, Prebuilt] = {
                t.device: prebuilt.ensure(
                    built.tc,
                    t,
                    [u for u in units if u.target is t],
                    spec.flags,
                    job.held,
                    job.tools.waiting("prebuilt"),
                    built.launcher,
                )
                for t in spec.target
            }
        with timeline.stage("render"):
            project = render.render_project(
                spec, version, layout.spec_path.name, built.tc, built.cuda, units, prebuilts, job.ops, layout.project
            )
        try:
            with timeline.stage("compile"):
                return (
                    units,
                    project,
                    meson.build(
                        layout.project,
                        layout.meson,
                        built.tc,
                        f"the package '{spec.project.name}'",
                        built.launcher,
                        lambda msg: timeline.report("compile", msg),
                    ),
                )
        except meson.BuildFailure as failure:
            failed = _failed_kernels(layout.project, units, failure)
            if failed is None:
                raise
            name, code = failed
            if code.scalar_kernels:
                raise meson.BuildFailure(
                    f"the package '{spec.project.name}' ({name}: its kernels without vectorization, made since the "
                    f"compiler refused its vectorized ones: {code.scalar_kernels})",
                    failure.step,
                    failure.completed,
                    failure.detail,
                    failure.unit,
                ) from None
            refused = meson.error_message(failure.detail)
            job.fallbacks[name] = dataclasses.replace(_fallbacks(job, name), scalar_kernels=refused)
            timeline.report(
                "compile",
                f"{name}: the compiler refused its vectorized kernels ({refused}); "
                "generating them again without vectorization",
            )
            units = _generate_all(job)


def _failed_kernels(project: Path, units: list[Unit], failure: meson.BuildFailure) -> tuple[str, CodegenResult] | None:
    """The CPU unit whose kernels `failure` is in, or None."""
    if failure.step != "compile" or not failure.unit:
        return None
    path = Path(failure.unit).resolve()
    if not re.fullmatch(r"kernels_\d+\.cpp", path.name) or path.parent.parent != (project / "src").resolve():
        return None
    return next(
        (
            (name, code)
            for u in units
            if not devices.device(u.target.device).gpu
            for name, code in u.generated
            if name == path.parent.name
        ),
        None,
    )


def _run(
    job: Job,
    stage: str,
    tasks: list[tuple[str, Any]],
    work: Callable[..., Any],
    done: Callable[[str, Any, float, float], None],
) -> None:
    # On a GPU the units run here, one after another: the later ones reuse what the first started (Inductor's compile
    # workers, the CUDA context, kernels already compiled). ResNet-18 and its batch-1 variant on the H100: 84.8 s cold,
    # against 95.9 s in two worker processes at once (results/gpu_units_in_process.md).
    gpu = any(devices.device(t.device).gpu for t in job.spec.target)
    # In a build server's child (shimgen/commands/server.py) torch is imported already: workers forked from it skip
    # the import.
    fork = bool(os.environ.get("SHIMGEN_SERVER_CHILD"))
    processes = workers.count(len(tasks), in_process=job.ops is not None or gpu, forking=fork)
    if processes:
        job.timeline.report(
            stage,
            f"{', '.join(name for name, _ in tasks)} in {processes} worker process{'es' if processes > 1 else ''} ...",
        )
    for name, _ in tasks:
        job.timeline.report(stage, f"{name} ...")
    workers.run_all(tasks, work, processes, job.ops, done, fork=fork)


def _cached(
    job: Job,
    record: str,
    cls: type[R],
    key: str,
    *,
    valid: Callable[[R], bool] | None = None,
    shared: Callable[[SharedCache], R | None] | None = None,
) -> R | None:
    """A stage's result without running it: as the last build recorded it under `key` (with `valid`, any record it
    accepts),
    else as the shared cache holds it (then recorded here). None: the stage runs, and its caller commits what it
    made."""
    found = job.state.get(cls, record, None if valid else key)
    if found is not None and (valid is None or valid(found)):
        job.timeline.skipped.append(record.removeprefix("unit:"))
        return found
    found = shared(job.shared) if shared is not None and job.shared is not None else None
    if found is not None:
        job.timeline.skipped.append(f"{record.removeprefix('unit:')} (shared cache)")
        job.state.commit(record, found)
    return found


def _known_codegen(job: Job, name: str, traced: TraceResult, key: str) -> CodegenResult | None:
    """The unit's code as the last build (or the shared cache) left it under `key`, its weights file made again where
    only
    the weights changed."""
    fetch = (
        None
        if job.tuning.retune
        else lambda shared: shared_cache.fetch(
            shared, "codegen", key, CodegenResult, {"ROOT": job.layout.root / "codegen" / name}
        )
    )
    generated = _cached(job, f"unit:codegen:{name}", CodegenResult, key, shared=fetch)
    if generated is not None and generated.weights_file is not None and generated.weights_digest != traced.weights:
        generated = _rewrite_weights(job, name, traced, generated)  # None: codegen makes them
    return generated


def _rewrite_weights(job: Job, name: str, traced: TraceResult, generated: CodegenResult) -> CodegenResult | None:
    """The weights file of up-to-date code made again from the traced program's weights (only their values changed);
    None where the model's constants are not all plain weights of the program (then codegen makes them)."""

    assert generated.weights_file is not None and generated.constants is not None
    with job.timeline.stage("weights", name):
        tensors = _program_weights(job, name, traced)
        _unrecorded_while_rewritten(job, name, generated)
        if not weights.write_from_tensors(
            weights.read_constants(generated.constants),
            tensors,
            generated.weights_file,
        ):
            return None
    generated = dataclasses.replace(generated, weights_digest=traced.weights)
    job.state.commit(f"unit:codegen:{name}", generated)
    return generated


def _program_weights(job: Job, name: str, traced: TraceResult) -> dict[str, Any]:
    """The traced program's weights and constants by name, loaded once per build for the programs that have the same
    values (a graph's dynamic program and its variants')."""
    found = job.program_weights.get(traced.weights) if traced.weights else None
    if found is None:
        entry.import_op_modules(traced.op_modules, name)
        found = internals.saved_program_weights(traced.program)
        if traced.weights:
            job.program_weights[traced.weights] = found
    return found


def _unrecorded_while_rewritten(job: Job, name: str, generated: CodegenResult) -> None:
    """The unit's code recorded under no key while its weights file is written again in place: a build stopped before
    the new record finds no record that the file no longer matches."""
    job.state.commit(f"unit:codegen:{name}", dataclasses.replace(generated, key="", structure_key=""))


def _refits(job: Job) -> bool:
    """Whether a weights-only edit may keep the code (`_refitted_codegen`)."""
    flags = job.spec.flags
    return not job.tuning.retune and flags.weights != "embedded" and flags.freezing


def _keeps_checked_code(job: Job, name: str, key: str, structure_key: str) -> bool:
    """Whether the unit will most likely keep code that passed the package check at every size, the last build's or
    one in the history (`_keeps_code`). A guess made before codegen: the plan made from what the units did keep
    decides."""
    code = job.state.get(CodegenResult, f"unit:codegen:{name}", None)
    if (code is None or not _keeps_code(job, code, key, structure_key)) and job.history is not None:
        code = job.history.find(name, structure_key, job.layout.root / "codegen" / name)
    return code is not None and code.checked and _keeps_code(job, code, key, structure_key)


def _refitted_codegen(
    job: Job, name: str, traced: TraceResult, key: str, structure_key: str, target: Target
) -> CodegenResult | None:
    """The last build's code where only the weights' values changed and the code depends on them through freezing
    alone: its weights file made again by the refit programs the build recorded (inductor/refit.py), as load_weights()
    does, instead of generating and compiling the code again. None: codegen runs."""

    if not _refits(job):
        return None
    last = job.state.get(CodegenResult, f"unit:codegen:{name}", None)
    if (
        last is None
        or last.structure_key != structure_key
        or last.weights_file is None
        or last.constants is None
        or last.refit is None
        or not all(path.is_file() for path in last.files)
    ):
        return None
    with job.timeline.stage("weights", f"{name} (refit)"):
        _unrecorded_while_rewritten(job, name, last)
        if not _weights_file_made(job, name, traced, last, target):
            return None
    generated = dataclasses.replace(last, key=key, weights_digest=traced.weights)
    job.state.commit(f"unit:codegen:{name}", generated)
    job.timeline.skipped.append(f"codegen:{name} (weights refitted)")
    return generated


def _keeps_code(job: Job, code: CodegenResult, key: str, structure_key: str) -> bool:
    """Whether a build under `key` keeps `code` in place: the same key, or the same structure where weights are
    refitted."""
    return code.key == key or (_refits(job) and code.structure_key == structure_key)


def _keep_replaced_code(job: Job, name: str, key: str, structure_key: str) -> None:
    """The last build's code of the unit put in the history where this build replaces it: undoing the edit finds
    it there (`_earlier_codegen`)."""
    last = job.state.get(CodegenResult, f"unit:codegen:{name}", None)
    if job.history is not None and last is not None and not _keeps_code(job, last, key, structure_key):
        job.history.keep(name, last, job.layout.root / "codegen" / name)


def _earlier_codegen(
    job: Job, name: str, traced: TraceResult, key: str, structure_key: str, target: Target
) -> CodegenResult | None:
    """The code an earlier build generated for this program (an edit undone), taken from the build's history, its
    weights file made again from the traced program: by its refit program where freezing folded them, as a
    weights-only edit makes it. None: codegen runs."""
    if job.history is None or job.tuning.retune:
        return None
    root = job.layout.root / "codegen" / name
    earlier = job.history.find(name, structure_key, root)
    if earlier is None or not _keeps_code(job, earlier, key, structure_key):
        return None
    if earlier.weights_file is not None and earlier.constants is None:
        return None
    with job.timeline.stage("weights", f"{name} (earlier code)"):
        last = job.state.get(CodegenResult, f"unit:codegen:{name}", None)
        if last is not None:  # its files are replaced now: a build stopped meanwhile must not take them for its own
            _unrecorded_while_rewritten(job, name, last)
        job.history.restore(name, structure_key, root)
        if earlier.weights_file is not None and not _weights_file_made(job, name, traced, earlier, target):
            return None
    generated = dataclasses.replace(earlier, key=key, weights_digest=traced.weights)
    job.state.commit(f"unit:codegen:{name}", generated)
    job.timeline.skipped.append(f"codegen:{name} (earlier build)")
    return generated


def _weights_file_made(job: Job, name: str, traced: TraceResult, code: CodegenResult, target: Target) -> bool:
    """`code`'s weights file written from the traced program's weights: by the refit programs its build recorded where
    freezing computed constants from them, else as they are. False, and nothing written, where that cannot make
    them (codegen then runs)."""
    assert code.weights_file is not None and code.constants is not None
    constants, tensors = weights.read_constants(code.constants), _program_weights(job, name, traced)
    if code.refit is not None and _refits(job):
        program = json.loads(code.refit.read_text())
        return weights.write_refitted(constants, tensors, program, target.device, code.weights_file)
    return weights.write_from_tensors(constants, tensors, code.weights_file)


def _shared_trace(job: Job, shared: SharedCache, key: str) -> TraceResult | None:
    """A trace the shared cache holds for `key` and for the present content of the files that trace read."""
    index = shared.get("trace-reads", key)
    if index is None:
        return None
    spec_dir = job.layout.spec_dir
    reads = [(rel, file_hash(spec_dir / rel)) for rel in json.loads(index)]
    traced = shared_cache.fetch(
        shared, "trace", stage_key(key, reads), TraceResult, {"ROOT": job.layout.root / "trace", "SPEC": spec_dir}
    )
    return traced if traced is not None and trace.still_valid(traced, key) else None


def _store_trace(job: Job, traced: TraceResult) -> None:
    spec_dir = job.layout.spec_dir
    if job.shared is None or not all(Path(path).is_relative_to(spec_dir) for path, _ in traced.reads):
        return
    reads = [(str(Path(path).relative_to(spec_dir)), digest) for path, digest in traced.reads]
    job.shared.put("trace-reads", traced.key, json.dumps([rel for rel, _ in reads]).encode())
    shared_cache.store(
        job.shared, "trace", stage_key(traced.key, reads), traced, {"ROOT": job.layout.root / "trace", "SPEC": spec_dir}
    )


def _wheel_key(job: Job, units: list[Unit], version: str) -> str:
    """What the wheel is made of, with no path of this machine: the shared cache's key for it."""
    spec, tc = job.spec, job.tc
    ops = [(p.name, file_hash(p)) for p in job.ops.libraries] if job.ops else []
    # A codegen key leaves out the weights' values where the code does not depend on them; the wheel holds them.
    code_keys = [(name, code.key, code.weights_digest) for u in units for name, code in u.generated]
    return stage_key(
        version,
        code_keys,
        ops,
        [op.module for op in spec.custom_op],
        spec.project,
        spec.flags,
        spec.runtime,
        tc.cxx_identity,
        tc.python_version,
        tc.torch_version,
        meson.source_date_epoch(),
        shimgen_fingerprint(),
    )


def _shared_wheel(job: Job, key: str, units: list[Unit]) -> PackageResult | None:
    """The package this build would make, as the last build left it or as the shared cache holds it."""
    return _cached(
        job,
        "package",
        PackageResult,
        key,
        valid=lambda _: job.state.get(Stamp, "wheel", key) is not None,
        shared=lambda shared: _wheel_from(shared, job, key, units),
    )


def _wheel_from(shared: SharedCache, job: Job, key: str, units: list[Unit]) -> PackageResult | None:
    data = shared.get("wheel", key)
    if data is None:
        return None
    layout = job.layout
    with job.timeline.stage("package", "wheel from the shared cache"):
        with tempfile.TemporaryDirectory(prefix=".shimgen-shared-", dir=layout.root) as tmp:
            name = shared_cache.unpack(data, Path(tmp)).decode()
            packaged = package.install(
                Path(tmp) / name,
                layout.dist,
                layout.site,
                job.spec.project.name,
                key,
                _module_dirs(job),
                _verify_plan(job, [_programs_of(u) for u in units], _checked(units)),
            )
    _record_checked(job, units, packaged)
    job.state.commit("wheel", Stamp(key=key))
    return packaged


def _update_lockfile(job: Job, units: list[Unit]) -> None:
    torch = job.tc.torch_version
    written = {
        lockfile.section(name, torch): (
            lockfile.Measured(code.autotune_timings, to_json(code.kernel_choices)),
            lockfile.Fallbacks(
                scalar_kernels=code.scalar_kernels,
                onednn_off=_fallbacks(job, name).onednn_off,
                gemm_templates_off=code.gemm_templates_off,
                freezing_off=_fallbacks(job, name).freezing_off,
            ),
        )
        for u in units
        for name, code in u.generated
    }
    keep = {
        lockfile.section(unit, version)
        for unit in job.tuning.all_units
        for version in {torch, *(s.rpartition(" torch")[2] for s in job.tuning.locked.units)}
    }
    if lockfile.update(job.layout.lock_path, written, keep - set(written)):
        job.timeline.report("lockfile", f"wrote the kernel choices measured to {job.layout.lock_path}")


def _vec_isas_record(tc: Toolchain) -> Path:
    """Where the vector ISAs that `tc`'s compiler and this CPU support are kept, for every CPU codegen to read."""
    return toolchain.cache_dir() / "vec_isa" / f"{stage_key(probe.probe_key(tc), codegen.host_cpu())[:16]}.json"


def _require_gpu(spec: ProjectSpec, target: Target) -> None:
    """A cuda target's toolchain checked first (nvcc, archs, torch's CUDA: what a user fixes first), then its GPU.
    Its trace and codegen need no C++ compiler, so they do not wait for the probe."""
    if not devices.device(target.device).gpu:
        return
    _cuda_toolchain(spec)
    if not devices.device(target.device).available():
        raise SpecError(
            "",
            f"target[{spec.target.index(target)}]",
            "building for cuda needs a GPU on this machine (Inductor tunes and compiles the Triton kernels on it); torch sees none",
        )


def _package(
    job: Job,
    project: RenderedProject,
    compiled: CompileResult,
    units: list[Unit],
    cpp_archive: str | None,
    references: ReferenceRun | None,
) -> tuple[PackageResult, CppPackageResult | None]:
    """The wheel and the importable package, and the C++ package (where `cpp_archive` names it), made while the
    wheel is checked; against `references` where they were computed for the units' plan."""
    key = stage_key(project.key, [(p.name, file_hash(p)) for p in compiled.extensions], meson.source_date_epoch())
    packaged = _cached(job, "package", PackageResult, key)
    if packaged is not None:
        return packaged, _cpp_package(job, packaged, cpp_archive) if cpp_archive else None
    layout = job.layout
    external = [
        (u.name, layout.project / "src" / u.name / render.weights_file_name(u)) for u in units if u.code.weights_file
    ]
    staged = _staged_cpp(job, key, cpp_archive) if cpp_archive else None
    plan = _verify_plan(job, [_programs_of(u) for u in units], _checked(units))

    def stage_cpp(tree: Path, weights_file: Path | None) -> None:
        assert staged is not None
        with job.timeline.stage("cpp", "the C++ package"):
            staged.prepare(layout.meson, tree, weights_file, job.tools().tc)

    with job.timeline.stage("package"):
        try:
            packaged = package.build_and_unpack(
                layout.project,
                layout.meson,
                layout.dist,
                layout.site,
                job.spec.project.name,
                key,
                _module_dirs(job),
                references if references and references.plan == plan else plan,
                external if job.spec.flags.weights == "external" else None,
                beside=stage_cpp if staged else None,
            )
        except BaseException:
            if staged:
                staged.discard()
            raise
    _record_checked(job, units, packaged)
    job.state.commit("package", packaged)
    if staged is None:
        return packaged, None
    made = staged.commit()
    job.state.commit("cpp", made)
    return packaged, made


ONEDNN_MISMATCH = (
    "This build let Inductor hand convolutions and linear layers to oneDNN, whose fusions compute otherwise for some "
    "graphs (torch 2.13 fuses a convolution and an add in place into a tensor that a later kernel still reads, as in "
    "torchvision's RAFT): `[flags] onednn = false` builds without them"
)


def _generated_again(job: Job, units: list[Unit], mismatch: MismatchError) -> list[Unit]:
    """The units generated again, the differing unit now without what may have made it differ, where its code was just
    generated (code that passed the check before is the same code, so the difference lies elsewhere): first without
    oneDNN's fusions, where it used them, then without freezing (Inductor's freezing passes have computed otherwise:
    `_scalar_folds_kept_apart`). Otherwise `mismatch` is raised, noting what the unit already ran without, or naming
    the flag where the oneDNN fallback cannot run (custom ops: their codegen runs in this process, where Inductor's
    oneDNN passes stay registered). The lockfile keeps the fallback (`_update_lockfile`)."""
    found = next(
        (
            (name, u.target, code)
            for u in units
            for name, code in u.generated
            if (traced := job.state.get(TraceResult, f"unit:trace:{name}")) and str(traced.program) == mismatch.program
        ),
        None,
    )
    if found is None:
        raise mismatch
    name, target, code = found
    fallbacks = _fallbacks(job, name)
    if code.checked or not job.spec.flags.freezing:
        raise mismatch
    if codegen.uses_onednn(target, job.spec.flags) and not (code.onednn_off or fallbacks.freezing_off):
        if job.ops is not None:
            raise MismatchError(f"{mismatch}. {ONEDNN_MISMATCH}", mismatch.failure, mismatch.program) from None
        why = f"with oneDNN's fusions its package computed otherwise ({mismatch.failure})"
        job.fallbacks[name] = dataclasses.replace(fallbacks, onednn_off=why)
        job.timeline.report("package", f"{name}: {why}; generating it again without oneDNN")
        return _generate_all(job)
    if fallbacks.freezing_off:
        without = "without oneDNN and without freezing" if code.onednn_off else "without freezing"
        raise MismatchError(f"{mismatch} (generated {without})", mismatch.failure, mismatch.program) from None
    why = f"with freezing its package computed otherwise ({mismatch.failure})"
    job.fallbacks[name] = dataclasses.replace(fallbacks, freezing_off=why)
    job.timeline.report("package", f"{name}: {why}; generating it again without freezing")
    return _generate_all(job)


def _cpp_package(job: Job, packaged: PackageResult, archive: str) -> CppPackageResult:
    """The C++ package beside a wheel the last build made."""
    staged = _staged_cpp(job, packaged.key, archive)
    made = _cached(job, "cpp", CppPackageResult, staged.key)
    if made is not None:
        return made
    with job.timeline.stage("cpp", "the C++ package"):
        staged.prepare(job.layout.meson, packaged.site, packaged.weights_file, job.tools().tc)
    made = staged.commit()
    job.state.commit("cpp", made)
    return made


def _staged_cpp(job: Job, package_key: str, archive: str) -> cpp.Staged:
    """Where the C++ package of the package keyed `package_key` is staged and installed."""
    layout = job.layout
    key = stage_key(package_key, archive)
    return cpp.Staged(layout.dist, layout.cpp, job.spec.project.name, archive, key)


def _shared_cpp_package(job: Job, wheel_key: str, packaged: PackageResult, archive: str) -> CppPackageResult | None:
    """The C++ package beside a wheel this build did not compile: as the last build left it, or from the shared
    cache."""
    staged = _staged_cpp(job, packaged.key, archive)

    def from_shared(shared: SharedCache) -> CppPackageResult | None:
        data = shared.get("cpp", wheel_key)
        if data is None:
            return None
        with job.timeline.stage("cpp", "the C++ package from the shared cache"):
            staged.unpack(data, job.tc)
        return staged.commit()

    return _cached(job, "cpp", CppPackageResult, staged.key, shared=from_shared)


# A unit's graph and target, and the traces of its dynamic code and variants: (name, the sizes the variant fixes).
UnitPrograms = tuple[Graph, Target, list[tuple[str, tuple[tuple[str, int], ...]]]]


def _programs_of(unit: Unit) -> UnitPrograms:
    sizes = ((), *(v.sizes for v in unit.variants))
    return unit.graph, unit.target, [(name, fixed) for (name, _), fixed in zip(unit.generated, sizes, strict=True)]


def _checked(units: list[Unit]) -> set[str]:
    """The units whose code passed the package check at every size in an earlier build."""
    return {name for u in units for name, code in u.generated if code.checked}


def _record_checked(job: Job, units: list[Unit], packaged: PackageResult) -> None:
    """The units' code recorded as checked at every size, where the package check left no case out."""
    if not job.verify or packaged.verify_skipped:
        return
    for u in units:
        for name, code in u.generated:
            if not code.checked:
                job.state.commit(f"unit:codegen:{name}", dataclasses.replace(code, checked=True))


def _reference_run(
    job: Job, programs: list[UnitPrograms], settled: set[str], codegen_ahead: bool
) -> ReferenceRun | None:
    """What the package check compares with, computed by the traced programs from now on, beside the rest of the
    build, where this build made something (else its package is most likely the last one): once traced, on CPU
    targets (the codegen workers' kernel timings run beside each other already); on a GPU, once generated, never
    beside the GPU's kernel timings."""
    plan = _verify_plan(job, programs, settled)
    if codegen_ahead:
        made = "trace" in job.timeline.seconds and not any(devices.device(t.device).gpu for t in job.spec.target)
    else:
        made = bool({"trace", "codegen", "weights"} & set(job.timeline.seconds))
    return ReferenceRun(plan, _module_dirs(job)) if plan is not None and made else None


def _verify_plan(job: Job, units: list[UnitPrograms], settled: set[str]) -> verify.Plan | None:
    """What the package is run against before it is installed: each unit's traced programs, those of the `settled`
    units (code checked before) at one size."""
    if not job.verify:
        return None
    graphs = []
    modules = [op.module for op in job.spec.custom_op if op.module]
    for graph, target, names in units:
        programs: list[tuple[tuple[tuple[str, int], ...], Path]] = []
        state: tuple[str, ...] = ()
        for name, sizes in names:
            traced = job.state.get(TraceResult, f"unit:trace:{name}")
            assert traced is not None, name
            state = state if programs else traced.state  # the dynamic program's, which its codegen keeps
            programs.append((sizes, traced.program))
            modules += [m for m in traced.op_modules if m not in modules]
        graphs.append(
            verify.GraphModels(
                graph=graph,
                where=f"graph[{job.spec.graph.index(graph)}]",
                device=target.device,
                programs=tuple(programs),
                state=state,
                settled=tuple(name in settled for name, _ in names),
            )
        )
    return verify.Plan(
        package=job.spec.project.name,
        graphs=tuple(graphs),
        op_modules=tuple(modules),
    )


def _module_dirs(job: Job) -> tuple[Path, ...]:
    """Where the package's import check finds the Python modules of custom ops."""
    return (job.layout.spec_dir,) if any(op.module for op in job.spec.custom_op) else ()
