"""The user's side of a graph: import its entry, build the model, make inputs of given sizes.

Every failure in user code becomes a SpecError naming the graph key and where in the user's
file it happened. The project's modules are imported inside `project_scope`, which leaves
sys.path and sys.modules as it found them and records every project file read meanwhile.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import importlib.util
import inspect
import os
import re
import sys
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from shimgen.errors import SpecError, UserError
from shimgen.spec import Graph


def load_model(graph: Graph, where: str, spec_dir: Path) -> Callable[..., Any]:
    """The model in eval mode: an nn.Module, or the plain function the entry names."""
    with project_scope(spec_dir):
        return _load_model(graph, where, spec_dir)


def _load_model(graph: Graph, where: str, spec_dir: Path) -> Callable[..., Any]:
    import torch

    module_name, _, attr = graph.entry.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
    except (Exception, SystemExit) as exc:
        raise SpecError("", f"{where}.entry", f"cannot import '{module_name}': {describe(exc, spec_dir)}") from None
    for part in attr.split("."):
        if not hasattr(target, part):
            raise SpecError("", f"{where}.entry", f"module '{module_name}' has no attribute '{attr}'")
        target = getattr(target, part)
    if not callable(target):
        raise SpecError("", f"{where}.entry", f"'{graph.entry}' is not callable")
    torch.manual_seed(graph.seed)
    if _is_model_function(target, graph):
        return target
    try:
        model = target(*graph.args, **graph.kwargs)
    except (Exception, SystemExit) as exc:
        raise SpecError(
            "", f"{where}.entry", f"calling '{graph.entry}' with args/kwargs failed: {describe(exc, spec_dir)}"
        ) from None
    if isinstance(model, torch.nn.Module):
        return model.eval()
    if callable(model):
        return model
    raise SpecError(
        "", f"{where}.entry", f"'{graph.entry}' returned {type(model).__name__}, not an nn.Module or function"
    )


_scopes: list[tuple[Path, set[Path]]] = []  # the open project scopes: (spec dir, files read under it)
_watching = False  # the audit hook is installed
_kept: dict[str, set[Path]] = {}  # modules imported by import_once, with the project files read importing them


def import_once(module: str, spec_dir: Path) -> set[Path]:
    """Import `module` from `spec_dir` once per process and keep it, with its submodules, past every project scope
    (a module registering ops with torch.library cannot run twice); the project files read importing it."""
    if module not in _kept:
        with project_scope(spec_dir) as reads:
            before = set(reads)
            imported = importlib.import_module(module)
            _kept[module] = (reads - before) | {Path(f).resolve() for f in [getattr(imported, "__file__", None)] if f}
    return _kept[module]


def _is_kept(name: str) -> bool:
    """A kept module, one of its submodules, or a package holding one."""
    return any(name == kept or name.startswith(kept + ".") or kept.startswith(name + ".") for kept in _kept)


@contextmanager
def project_scope(spec_dir: Path) -> Iterator[set[Path]]:
    """Import from `spec_dir` for the duration of the block, freshly (the project's modules imported
    before are set aside, so each is imported and seen again), and collect the files under it that
    are opened meanwhile: modules and whatever the model reads through Python. Afterwards sys.path
    and sys.modules are as they were. Nested scopes for one directory share the outer one."""
    spec_dir = spec_dir.resolve()
    for directory, outer in _scopes:
        if directory == spec_dir:
            yield outer
            return
    _watch_opens()
    saved_path = list(sys.path)
    set_aside = _project_modules(spec_dir) | _shadowing(spec_dir)
    for name in set_aside:
        del sys.modules[name]
    sys.path.insert(0, str(spec_dir))
    reads: set[Path] = set()
    _scopes.append((spec_dir, reads))
    try:
        yield reads
    finally:
        _scopes.remove((spec_dir, reads))
        for name, module in _project_modules(spec_dir).items():
            if getattr(module, "__file__", None) is not None:
                reads.add(Path(module.__file__).resolve())
            del sys.modules[name]
        sys.modules.update(set_aside)
        sys.path[:] = saved_path


def _project_modules(spec_dir: Path) -> dict[str, Any]:
    return {name: m for name, m in list(sys.modules.items()) if _is_projects(m, spec_dir) and not _is_kept(name)}


def _is_projects(module: Any, spec_dir: Path) -> bool:
    """Whether `module` comes from `spec_dir`: its file, or for a namespace package (a directory without __init__.py,
    no file) every portion of its path."""
    paths = _module_paths(module)
    return bool(paths) and all(_under(p, spec_dir) for p in paths)


def _module_paths(module: Any) -> list[str]:
    """A module's file, or for a namespace package its portions."""
    file = getattr(module, "__file__", None)
    try:
        paths = [file] if file is not None else list(getattr(module, "__path__", None) or [])
    except TypeError:  # torch.ops and torch.classes make up any attribute, __path__ too
        return []
    return [p for p in paths if isinstance(p, str)]


def _shadowing(spec_dir: Path) -> dict[str, Any]:
    """Modules of another directory under a top-level name that the spec's directory has a module or package for, which
    a new process (the spec's directory first on sys.path) would not import: left in sys.modules, a `models` package
    imported earlier (by the caller, or kept by import_once for another project) would be the package that
    `import models.mlp` looks in. A directory without __init__.py is a namespace portion, which a module or regular
    package found on sys.path takes precedence over: it shadows only namespace packages and modules from directories
    no longer on sys.path."""
    by_top: dict[str, list[str]] = {}
    for name in list(sys.modules):
        by_top.setdefault(name.partition(".")[0], []).append(name)
    shadowed: dict[str, Any] = {}
    for top, names in by_top.items():
        module = sys.modules.get(top)
        if module is None or top in _NEVER_SHADOWED or _under(getattr(module, "__file__", None), spec_dir):
            continue
        if not ((spec_dir / f"{top}.py").is_file() or (spec_dir / top / "__init__.py").is_file()):
            location = getattr(module, "__file__", None)
            on_path = location is not None and any(_under(location, Path(p).resolve()) for p in sys.path if p)
            if not (spec_dir / top).is_dir() or (location is not None and on_path):
                continue
        shadowed.update(
            {
                name: sys.modules[name]
                for name in names
                if not _under(getattr(sys.modules[name], "__file__", None), spec_dir)
            }
        )
    return shadowed


# Never set aside: what shimgen and the interpreter run on (a project's `torch/` or `os.py` cannot replace them).
_NEVER_SHADOWED = frozenset((*sys.builtin_module_names, *getattr(sys, "stdlib_module_names", ()), "torch", "shimgen"))


def _under(path: str | None, directory: Path) -> bool:
    return path is not None and Path(_real_path(path)).is_relative_to(directory)


@functools.cache
def _real_path(path: str) -> str:
    """A module file's real path: asked for every module in sys.modules at each project scope (seconds, uncached)."""
    return os.path.realpath(path)


def resolve_module_paths() -> None:
    """Resolve the files of the modules imported so far into `_real_path`'s cache: the build server does, so that its
    builds' project scopes start with them resolved."""
    for module in list(sys.modules.values()):
        for path in _module_paths(module):
            _real_path(path)


def _watch_opens() -> None:
    """Install, once per process, the audit hook that tells the open scopes what is opened under them."""
    global _watching
    if not _watching:
        sys.addaudithook(_on_audit_event)
        _watching = True


def _on_audit_event(event: str, args: tuple[Any, ...]) -> None:
    if event != "open" or not _scopes:
        return
    try:
        _record_read(*args)
    except Exception:  # an exception here would fail the user's open()
        pass


_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


def _record_read(file: Any, mode: str | None, flags: int) -> None:
    if (
        not isinstance(file, (str, bytes, os.PathLike))
        or (mode and set(mode) & set("wax+"))
        or (mode is None and flags & _WRITE_FLAGS)
    ):
        return
    path = Path(os.fsdecode(file))
    if path.suffix == ".pyc":  # a module imported from the bytecode cache: its source is what matters
        path = Path(importlib.util.source_from_cache(str(path)))
    path = path.resolve()
    for directory, reads in _scopes:
        if (
            path.is_relative_to(directory)
            and path.is_file()
            and not {"site-packages", "dist-packages"} & set(path.parts)
        ):
            reads.add(path)


def _is_model_function(target: Any, graph: Graph) -> bool:
    """A function with required parameters and no args/kwargs in the spec is the model itself."""
    if inspect.isclass(target) or graph.args or graph.kwargs:
        return False
    try:
        params = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.default is inspect.Parameter.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params)


def make_inputs(graph: Graph, sizes: dict[str, int], seed: int) -> list[Any]:
    """Random inputs for the spec's shapes with dynamic dims at `sizes`, deterministic per seed."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    tensors = []
    for inp in graph.inputs:
        shape = [sizes[s] if isinstance(s, str) else s for s in inp.shape]
        dtype = getattr(torch, inp.dtype)
        if inp.values == "arange":
            start = 0 if inp.low is None else inp.low
            t = (
                (torch.arange(shape[-1] if shape else 1) + start).to(dtype).expand(shape).contiguous()
                if shape
                else torch.tensor(start, dtype=dtype)
            )
        elif dtype.is_floating_point:
            low = -1.0 if inp.low is None else inp.low
            high = 1.0 if inp.high is None else inp.high
            t = (torch.rand(shape, generator=gen) * (high - low) + low).to(dtype)
        elif dtype == torch.bool:
            t = torch.randint(0, 2, shape, generator=gen).bool()
        else:
            low = 0 if inp.low is None else int(inp.low)
            high = 10 if inp.high is None else int(inp.high)
            t = torch.randint(low, high, shape, generator=gen, dtype=dtype)
        if inp.memory_format == "channels_last":
            t = t.contiguous(memory_format=torch.channels_last)
        tensors.append(t)
    return tensors


def example_sizes(graph: Graph) -> dict[str, int]:
    return {name: dim.example for name, dim in graph.dims.items()}  # type: ignore[misc]


@contextmanager
def float32_as_float32() -> Iterator[None]:
    """float32 GEMMs and convolutions computed without TF32 while a package is compared with its reference. By torch's
    default, cuDNN's convolutions round float32 inputs to TF32 (a relative error near 1e-3), and whether a convolution
    reaches cuDNN, and with which algorithm, differs between eager, a traced program and the package (segformer's batch-1
    variant on the H100: 1e-3 apart with TF32, 1e-6 without). Compared at float32, a package that computes something
    else still stands out against tolerances of 1e-4."""
    import torch

    cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul
    allowed = matmul.allow_tf32
    matmul.allow_tf32 = False
    try:
        with cudnn.flags(
            enabled=cudnn.enabled, benchmark=cudnn.benchmark, deterministic=cudnn.deterministic, allow_tf32=False
        ):
            yield
    finally:
        matmul.allow_tf32 = allowed


def call_model(model: Callable[..., Any], graph: Graph, tensors: list[Any]) -> Any:
    """Call the model the way the spec declares its inputs: positional first, then keywords."""
    args = [t for inp, t in zip(graph.inputs, tensors, strict=True) if not inp.keyword]
    kwargs = {inp.name: t for inp, t in zip(graph.inputs, tensors, strict=True) if inp.keyword}
    return model(*args, **kwargs)


def describe(exc: BaseException, spec_dir: Path) -> str:
    """'TypeError: message (at models/mlp.py:12)': the innermost frame in the user's project."""
    location = ""
    if isinstance(exc, SyntaxError) and exc.filename:
        exc.__traceback__ = None
        location = f" (at {Path(exc.filename).name}:{exc.lineno})"
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        try:
            rel = Path(frame.filename).resolve().relative_to(spec_dir.resolve())
        except ValueError:
            continue
        location = f" (at {rel}:{frame.lineno})"
        break
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {message}{location}{_torchvision_hint(message)}"


def _torchvision_hint(message: str) -> str:
    """Why an op of torchvision is missing where torchvision imports: its compiled ops are of another torch build.
    transformers and timm import torchvision wherever it is installed, so a model that never uses it fails so too."""
    if not re.search(r"operator torchvision::\w+ does not exist", message):
        return ""
    import torch

    try:
        version = importlib.metadata.version("torchvision")
    except importlib.metadata.PackageNotFoundError:
        version = "?"
    return (
        f". torchvision {version}'s compiled ops do not load with this torch ({torch.__version__}): it was built for "
        "another torch or CUDA. Install the torchvision release built for this torch, or uninstall torchvision "
        "(transformers and timm import it wherever it is installed)"
    )


def import_op_modules(modules: tuple[str, ...], where: str) -> None:
    """Import the modules defining the Python custom ops a traced program calls, before it loads."""
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception as exc:
            raise UserError(
                f"{where}: the traced program calls ops defined in {module}, which does not import here: "
                f"{type(exc).__name__}: {exc}"
            ) from None
