"""Custom-ops stage: the spec's [[custom_op]] entries compiled, loaded into this process for tracing, and described
for codegen and the package.

Each entry's C++/CUDA sources become one library, built by a Meson project of their own (build/<name>/ops/); the
package ships the libraries and loads them on import. Modules are imported once per process, since torch.library
cannot register an op twice. The key says what a trace depends on: the ops' schemas, and their fake implementations
(a Python module's files, or the sources where the shapes come from a C++ Meta kernel). An edit to an op's body
alone rebuilds its library and relinks the package; nothing is traced again.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

from shimgen.build import meson
from shimgen.errors import SpecError, UserError
from shimgen.files import LockHeld, file_hash, stage_key
from shimgen.inductor import compat, internals
from shimgen.project import render
from shimgen.results import CustomOps, DefinedOp
from shimgen.spec import ProjectSpec
from shimgen.toolchain import Toolchain, prebuilt
from shimgen.toolchain.cuda import CudaToolchain
from shimgen.trace.entry import describe, import_once

_loaded: dict[Path, str] = {}  # library → hash when this process loaded it
# The message torch gives for torch.ops.<ns>.<name> when no library registers it.
_NO_OP = re.compile(r"'_OpNamespace' '(\w+)' object has no attribute '(\w+)'")
_INCLUDE = re.compile(r'#\s*include\s*[<"]([^>"]+)[>"]')


def prepare(
    spec: ProjectSpec,
    spec_dir: Path,
    spec_file: str,
    root: Path,
    tc: Toolchain,
    cuda: CudaToolchain | None,
    launcher: str | None,
    report: Callable[[str], None],
    held: ExitStack,
    waiting: Callable[[LockHeld], None] | None = None,
) -> CustomOps:
    """Build the entries' libraries under `root` (a failed compile leaves the last good ones), load them, import the
    modules. With flags.pch and GCC, the torch header each C++ source includes first is precompiled in the per-user
    cache once the sources are edited, and used (held until `held` closes) once made."""
    sources = [
        [_source(spec_dir, s, f"custom_op[{i}].sources[{k}]") for k, s in enumerate(op.sources)]
        for i, op in enumerate(spec.custom_op)
    ]
    libraries: dict[int, Path] = {}
    if any(sources):
        project, build_dir = root / "project", root / "meson"
        headers = sorted(
            {
                h
                for entry_sources in sources
                for s in entry_sources
                if s.suffix != ".cu" and (h := first_torch_header(s, tc.extension_includes))
            }
        )
        # The sources this output's ops last compiled from: a build from others is an edit, the case the headers pay for.
        compiled_from, digest = root / "sources.sha256", stage_key([[str(s), file_hash(s)] for e in sources for s in e])
        edit = compiled_from.is_file() and compiled_from.read_text() != digest
        pch_dirs = (
            prebuilt.ops_headers(tc, headers, held, waiting, launcher, make_missing=edit)
            if spec.flags.pch and "clang" not in tc.cxx_identity.lower()
            else ()
        )
        names = render.render_ops(spec, spec_file, tc, cuda, sources, project, pch_dirs)
        meson.build(project, build_dir, tc, "the custom ops", launcher, report)
        compiled_from.write_text(digest)
        libraries = {i: meson.target_file(build_dir, name) for i, name in names.items()}
    compat.check(compat.TRACE)
    defined: list[DefinedOp] = []
    fakes: list[tuple[str, str]] = []
    for i, op in enumerate(spec.custom_op):
        where = f"custom_op[{i}]"
        before = _schemas()
        if i in libraries:
            load_library(libraries[i], where)
            new = _schemas() - before
            if not new:
                raise SpecError(
                    "",
                    f"{where}.sources",
                    "the sources register no op (define them with TORCH_LIBRARY(ns, m) { m.def(...); })",
                )
            for name in sorted(new):
                meta = any(internals.has_kernel(name, k) for k in ("Meta", "CompositeImplicitAutograd"))
                defined.append(DefinedOp(name=name, entry=i, module=None))
                if meta:  # the trace takes its shapes from C++
                    fakes += [(str(p), file_hash(p)) for p in sources[i]]
            before = _schemas()
        if op.module is not None:
            files = _import(op.module, spec_dir, where)
            fakes += [(str(p), file_hash(p)) for p in sorted(files)]
            defined += [DefinedOp(name=name, entry=i, module=op.module) for name in sorted(_schemas() - before)]
    schemas = sorted(str(internals.op_schema(d.name)) for d in defined)
    return CustomOps(
        key=stage_key(schemas, sorted(set(fakes))),
        libraries=tuple(libraries[i] for i in sorted(libraries)),
        ops=tuple(defined),
    )


def _source(spec_dir: Path, source: str, where: str) -> Path:
    path = (spec_dir / source).resolve()
    if not path.is_file():
        raise SpecError(
            "", where, f"'{source}' does not exist (paths are relative to the spec's directory, {spec_dir})"
        )
    return path


def first_torch_header(source: Path, torch_includes: tuple[str, ...]) -> str | None:
    """The header that `source` includes before any code, where it is one of torch's ("ATen/ATen.h"): the one header a
    precompiled header can stand for."""
    text = re.sub(r"/\*.*?\*/", " ", source.read_text(errors="replace"), flags=re.DOTALL)
    for line in text.splitlines():
        line = line.split("//")[0].strip()
        if not line:
            continue
        if not line.startswith("#"):
            return None
        included = _INCLUDE.match(line)
        if included:
            header = included[1]
            return header if any((Path(d) / header).is_file() for d in torch_includes) else None
    return None


def _schemas() -> set[str]:
    return internals.registered_ops()


def load_library(library: Path, where: str) -> None:
    import torch

    digest = file_hash(library)
    if library in _loaded:
        if _loaded[library] != digest:
            raise UserError(f"{where}: its library changed since this process loaded it; build again in a new process")
        return
    try:
        torch.ops.load_library(str(library))
    except (OSError, RuntimeError) as exc:
        raise SpecError(
            "", f"{where}.sources", f"the library built from them does not load: {str(exc).strip().splitlines()[0]}"
        ) from None
    _loaded[library] = digest


def _import(module: str, spec_dir: Path, where: str) -> set[Path]:
    try:
        return import_once(module, spec_dir)
    except ModuleNotFoundError as exc:
        if exc.name and module.startswith(exc.name):
            raise SpecError(
                "",
                f"{where}.module",
                f"no module named '{exc.name}' in the spec's directory ({spec_dir}) or the environment",
            ) from None
        raise SpecError("", f"{where}.module", f"cannot import '{module}': {describe(exc, spec_dir)}") from None
    except (Exception, SystemExit) as exc:
        raise SpecError("", f"{where}.module", f"cannot import '{module}': {describe(exc, spec_dir)}") from None


def explain_trace_failure(message: str, ops: CustomOps) -> str | None:
    """A clearer message for a trace that failed on a custom op: one no entry registers, or one without a fake."""
    missing = _NO_OP.search(message)
    if missing:
        ns, name = missing.groups()
        known = ", ".join(d.name for d in ops.ops) or "none"
        return (
            f"the model calls torch.ops.{ns}.{name}, which no [[custom_op]] registers (they register: {known}); "
            "define it in an entry's sources (TORCH_LIBRARY) or module (torch.library.custom_op)"
        )
    for d in ops.ops:
        dotted = d.name.replace("::", ".") + ("" if "." in d.name else ".default")  # how FakeTensor names it
        if (
            d.name in message and ("fake" in message or "Meta" in message)
        ) or f"UnsupportedOperatorException: {dotted}" in message:
            entry = f"custom_op[{d.entry}]"
            return (
                f"{d.name} ({entry}) has no fake implementation, which tracing needs for its output's shapes: register "
                f'one with torch.library.register_fake("{d.name}") in a module, or a Meta kernel with '
                f"TORCH_LIBRARY_IMPL({d.name.split('::')[0]}, Meta, m)"
            )
    return None


def installed_op_modules(library_ops: tuple[str, ...]) -> tuple[str, ...]:
    """The modules of installed distributions (transformers.integrations.moe, not the project's files) that define
    Python custom ops among `library_ops`: a process that loads the traced program, or the package, imports them
    first."""
    import importlib.metadata

    modules = [m for op in library_ops if (m := internals.python_custom_op_module(op))]
    if not modules:
        return ()
    installed = importlib.metadata.packages_distributions()
    return tuple(sorted({m for m in modules if m.split(".")[0] in installed}))


def run_time_modules(called: list[str], ops: CustomOps | None, installed: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The Python modules a graph calling `called` (extern node targets) needs imported when the package loads:
    an entry's module for its ops, the module of an installed distribution defining a Python op (`installed`,
    trace's op_modules), the installed package of a namespace such as torchvision's; an entry's library ops need none
    (the package loads the library). A Python op defined anywhere else (the project's files) is refused."""
    by_name = {d.name: d for d in ops.ops} if ops else {}
    modules: list[str] = []
    for target in called:
        defined = by_name.get(target)
        if defined is not None:
            module = defined.module
        elif (owner := internals.python_custom_op_module(target)) in installed:
            module = owner
        elif (where := internals.python_custom_op_file(target)) is not None:
            raise UserError(
                f"the graph calls {target}, a Python custom op defined in {where}, which the package would have to import "
                'when it loads: name its module in a [[custom_op]] entry (module = "...")'
            )
        else:
            ns = target.split("::")[0]
            module = ns if ns in sys.modules and ns not in ("aten", "prims", "torch") else None
        if module and module not in modules:
            modules.append(module)
    return tuple(modules)
