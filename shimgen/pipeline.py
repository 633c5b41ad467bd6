"""The build: spec → trace → codegen → render → compile → package, each stage skipped when its key
(a hash of what it depends on) matches the last successful run recorded in state.json.

Outputs under <out>/build/<name>/: trace/, codegen/, project/ (generated Meson project), meson/
(build directory), site/ (the unpacked wheel: importable); wheels go to <out>/dist/.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from . import build as compile_stage
from . import codegen, entry, package, render, toolchain, trace
from .errors import SpecError, UserError
from .files import exclusive, replace_dir, write_if_changed
from .render import GraphSources
from .spec import Graph, ProjectSpec, Target, load_spec
from .toolchain.cuda import CudaToolchain, check_archs, detect_cuda, torch_cuda_version
from .toolchain.prebuilt import ensure_prebuilt

Progress = Callable[[str, str], None]
CHECK_ONLY_FIELDS = ("atol", "rtol")  # used by `shimgen check`, not by the build


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
        }


@dataclass
class Layout:
    spec_path: Path
    root: Path
    dist: Path

    @classmethod
    def of(cls, spec_path: Path, out: Path, name: str) -> Layout:
        return cls(spec_path, out / "build" / name, out / "dist")

    @property
    def site(self) -> Path:
        return self.root / "site"

    @property
    def state_file(self) -> Path:
        return self.root / "state.json"

    @property
    def lock_file(self) -> Path:
        return self.root.with_name(f".{self.root.name}.lock")


def build(spec_path: Path, out: Path, force: bool = False, use_cache: bool = True, progress: Progress | None = None) -> BuildOutput:
    try:
        return _build(spec_path, out, force, use_cache, progress or (lambda stage, msg: None))
    except SpecError as exc:
        exc.file = exc.file or str(spec_path)
        raise


def _build(spec_path: Path, out: Path, force: bool, use_cache: bool, report: Progress) -> BuildOutput:
    spec = load_spec(spec_path)
    layout = Layout.of(spec_path, out.resolve(), spec.project.name)
    # One build of a project per output directory at a time; the per-user caches have locks of their own.
    with exclusive(layout.lock_file, lambda msg: report("lock", msg)):
        return _build_locked(spec, spec_path, layout, force, use_cache, report)


def _build_locked(spec: ProjectSpec, spec_path: Path, layout: Layout, force: bool, use_cache: bool, report: Progress) -> BuildOutput:
    layout.root.mkdir(parents=True, exist_ok=True)
    state = {} if force else _load_state(layout.state_file)
    targets = "+".join(render.target_id(t) for t in spec.target)
    result = BuildOutput(spec.project.name, targets, Path(), layout.site, [g.name for g in spec.graph])

    with _stage(result, "toolchain", report):
        tc, verdicts = toolchain.select(lambda msg: report("toolchain", msg))
        for failed in verdicts[:-1]:
            report("toolchain", f"warning: {failed.cxx} ({failed.identity}) fails the probe: {failed.reason}; using {tc.cxx}")
        cuda = _cuda_toolchain(spec)
    launcher = toolchain.compiler_cache() if use_cache else None
    result.compiler_cache = launcher
    meson_config = [tc.key, launcher, cuda.nvcc if cuda else None]
    if state.get("meson_config") != meson_config:
        # A Meson build directory keeps the compiler it was configured with. Trace and codegen
        # records stay: their keys hold the torch version, and their output ignores the compiler.
        shutil.rmtree(layout.root / "meson", ignore_errors=True)
        state.pop("package_key", None)
        state["meson_config"] = meson_config

    units: list[GraphSources] = []
    unit_state = state.setdefault("units", {})
    for target in spec.target:
        for i, graph in enumerate(spec.graph):
            record = unit_state.setdefault(render.unit_name(graph, target), {})
            units.append(_trace_and_codegen(spec, graph, f"graph[{i}]", target, tc, layout, record, result, report))
            _save_state(layout.state_file, state)
    for stale in set(unit_state) - {u.name for u in units}:
        del unit_state[stale]

    project_dir, meson_dir = layout.root / "project", layout.root / "meson"
    prebuilt = {}
    with _stage(result, "prebuilt", report):
        for target in spec.target:
            sources = [u for u in units if u.target is target]
            interfaces = {(u.codegen_dir / "interface.cpp").read_bytes() for u in sources}
            if len(interfaces) != 1:
                raise UserError("Inductor emitted different runtime interfaces for this project's graphs; unsupported")
            flags = spec.flags
            prebuilt[target.device] = ensure_prebuilt(tc, target.device, render.inductor_args(sources[0].meta),
                                                      flags.wrapper_opt, flags.kernel_opt, flags.pch, interfaces.pop(),
                                                      lambda msg: report("prebuilt", msg))
    with _stage(result, "render", report):
        render.render_project(spec, spec_path.name, tc, cuda, units, prebuilt, project_dir)
    with _stage(result, "compile", report):
        compiled = compile_stage.compile_project(project_dir, meson_dir, tc, launcher, lambda msg: report("compile", msg))
    result.compile_units = (compiled.units_done, compiled.units_total)
    result.slowest_units = sorted(compiled.unit_seconds.items(), key=lambda kv: -kv[1])[:5]

    package_key = _hash_files(sorted(meson_dir.glob("*.so")) + sorted(p for p in project_dir.rglob("*") if p.is_file()))
    wheel = Path(state.get("wheel", ""))
    if state.get("package_key") == package_key and wheel.is_file() and layout.site.is_dir():
        result.skipped.append("package")
    else:
        with _stage(result, "package", report):
            wheel = package.build_and_unpack(project_dir, meson_dir, layout.dist, layout.site, spec.project.name, tc, launcher)
        state.update(package_key=package_key, wheel=str(wheel))
        _save_state(layout.state_file, state)
    result.wheel = wheel
    return result


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


def _trace_and_codegen(
    spec: ProjectSpec, graph: Graph, where: str, target: Target, tc: toolchain.Toolchain,
    layout: Layout, record: dict[str, Any], result: BuildOutput, report: Progress,
) -> GraphSources:
    name = render.unit_name(graph, target)
    trace_dir = layout.root / "trace"
    codegen_dir = layout.root / "codegen" / name
    spec_dir = layout.spec_path.parent.resolve()
    trace_key = _trace_key(graph, target, tc, record.get("deps", {}))
    codegen_key = _codegen_key(trace_key, spec, target)
    meta_file = codegen_dir / "codegen.json"
    if record.get("codegen_key") == codegen_key and meta_file.is_file():
        result.skipped.append(f"trace:{name}")
        result.skipped.append(f"codegen:{name}")
        return GraphSources(graph, target, codegen_dir, json.loads(meta_file.read_text()))

    program_file = trace_dir / f"{name}.pt2"
    trace_meta = trace_dir / f"{name}.json"
    import torch

    if target.device == "cuda" and not torch.cuda.is_available():
        raise SpecError("", f"target[{spec.target.index(target)}]",
                        "building for cuda needs a GPU on this machine (Inductor tunes and compiles the Triton kernels on it); torch sees none")

    if record.get("trace_key") == trace_key and program_file.is_file() and trace_meta.is_file():
        result.skipped.append(f"trace:{name}")
        program = torch.export.load(str(program_file))
        out_meta = json.loads(trace_meta.read_text())
    else:
        with _stage(result, "trace", report, name):
            traced = trace.trace(graph, where, spec_dir, target.device)
            deps = {str(path): _hash_file(path) for path in entry.project_modules(spec_dir)}
            trace_dir.mkdir(parents=True, exist_ok=True)
            torch.export.save(traced.program, str(program_file))
            program = traced.program
            out_meta = {"out_nodes": [dataclasses.asdict(n) for n in traced.out_nodes], "num_outputs": traced.num_outputs}
            write_if_changed(trace_meta, json.dumps(out_meta))
        record.clear()
        record.update(deps=deps, trace_key=_trace_key(graph, target, tc, deps))
        codegen_key = _codegen_key(record["trace_key"], spec, target)

    with _stage(result, "codegen", report, name):
        staging = codegen_dir.with_name(name + ".new")
        shutil.rmtree(staging, ignore_errors=True)
        try:
            compile_flags = codegen.generate(program, target, spec.flags, tc.cxx, staging)
        except UserError as exc:
            raise SpecError("", where, str(exc)) from None
        meta = {**out_meta, **dataclasses.asdict(compile_flags)}
        (staging / "codegen.json").write_text(json.dumps(meta, indent=1))
        replace_dir(staging, codegen_dir)
    record["codegen_key"] = codegen_key
    return GraphSources(graph, target, codegen_dir, meta)


def _codegen_key(trace_key: str, spec: ProjectSpec, target: Target) -> str:
    return _key(trace_key, dataclasses.asdict(target), codegen.inductor_configs(target, spec.flags), spec.flags.split, _source_of(codegen))


def _trace_key(graph: Graph, target: Target, tc: toolchain.Toolchain, deps: dict[str, str]) -> str:
    current = {path: _hash_file(Path(path)) for path in deps}
    section = {k: v for k, v in dataclasses.asdict(graph).items() if k not in CHECK_ONLY_FIELDS}
    return _key(section, target.device, tc.torch_version, current, _source_of(trace), _source_of(entry))


def _source_of(module: Any) -> str:
    return _hash_file(Path(module.__file__))


def _hash_file(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return "missing"


def _hash_files(paths: list[Path]) -> str:
    return _key([(p.name, _hash_file(p)) for p in paths])


def _key(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def _load_state(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _save_state(path: Path, state: dict[str, Any]) -> None:
    write_if_changed(path, json.dumps(state, indent=1, sort_keys=True))


@contextmanager
def _stage(result: BuildOutput, name: str, report: Progress, detail: str = "") -> Iterator[None]:
    report(name, f"{detail} ..." if detail else "...")
    start = time.monotonic()
    try:
        yield
    finally:
        result.stages[name] = result.stages.get(name, 0.0) + time.monotonic() - start
    report(name, f"{detail} done in {time.monotonic() - start:.1f}s" if detail else f"done in {time.monotonic() - start:.1f}s")
