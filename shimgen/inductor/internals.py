"""torch's private API that the trace, custom-op and verification stages use, behind named functions: pytree nodes,
export's config and saved archive, the dispatcher's op registry. shimgen imports no private torch module outside
shimgen/inductor/; `compat` checks that each of these still is what these functions expect.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import traceback
import warnings
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any


@dataclass(frozen=True)
class PytreeNode:
    """How torch's pytree takes a registered type apart and puts it together again."""

    flatten: Callable[[Any], tuple[list[Any], Any]]
    flatten_with_keys: Callable[[Any], tuple[list[tuple[Any, Any]], Any]] | None
    unflatten: Callable[[Any, Any], Any]


def tree_leaves(value: Any) -> list[Any]:
    import torch.utils._pytree as pytree

    return pytree.tree_leaves(value)


def tensor_leaves(value: Any) -> list[Any]:
    """The tensors among `value`'s pytree leaves, in pytree order."""
    import torch

    return [leaf for leaf in tree_leaves(value) if isinstance(leaf, torch.Tensor)]


def pytree_node(value: Any) -> PytreeNode | None:
    """`value`'s type's pytree registration; None for a leaf."""
    import torch.utils._pytree as pytree

    node = pytree.SUPPORTED_NODES.get(pytree._get_node_type(value))
    if node is None:
        return None
    return PytreeNode(node.flatten_fn, node.flatten_with_keys_fn, node.unflatten_fn)


def key_name(entry: Any) -> Any:
    """The attribute name or mapping key a pytree key entry stands for; None for a sequence index."""
    import torch.utils._pytree as pytree

    if isinstance(entry, pytree.GetAttrKey):
        return entry.name
    return entry.key if isinstance(entry, pytree.MappingKey) else None


@contextmanager
def backed_size_oblivious() -> Iterator[None]:
    """Tracing that treats sizes 0 and 1 of a dynamic dim like any other (dims.export)."""
    import torch.fx.experimental._config as fx_config

    _report_unphrasable_fixes()
    with fx_config.patch(backed_size_oblivious=True):  # type: ignore[attr-defined]
        yield


@contextmanager
def slices_sized_by_min_max() -> Iterator[None]:
    """Slices whose bounds torch cannot order against the size (`x[:, :n]` of a padded length, `mask[:, -n:]`) sized
    by min and max of the sizes while tracing in the block, as torch 2.13 sizes them (pytorch#185166). Before, torch
    gave such a slice a size of its own that no input determines, and then refused the first condition on it:
    Mamba-2, Qwen3-Next, Falcon-H1 and SEW over a dynamic length on torch 2.11. Nothing changes on a torch that
    does it already."""
    import inspect

    import torch
    from torch._subclasses import fake_impls

    slice_op, table = torch.ops.aten.slice.Tensor, getattr(fake_impls, "op_implementations_dict", {})
    try:
        sized_already = "sym_min" in inspect.getsource(fake_impls._compute_slice_index)
    except (AttributeError, OSError, TypeError):  # a torch that slices otherwise, or without its sources
        sized_already = True
    if sized_already or slice_op not in table:
        yield
        return
    real = table[slice_op]
    table[slice_op] = _slice_sized_by_min_max
    try:
        yield
    finally:
        table[slice_op] = real


def _slice_index(size: Any, index: Any) -> Any:
    """torch 2.13's fake_impls._compute_slice_index: `index` of a dim of `size` clamped into [0, size]; None where it
    cannot be told."""
    import torch
    from torch.fx.experimental.symbolic_shapes import guard_or_false, sym_and

    if guard_or_false(sym_and(index >= 0, index <= size)):
        return index
    if guard_or_false(sym_and(index < 0, index >= -size)):
        return index + size
    if guard_or_false(index < -size):
        return 0
    if guard_or_false(index > size):
        return size
    if guard_or_false(index >= 0):
        return torch.sym_min(index, size)
    if guard_or_false(index < 0):
        return torch.sym_max(index + size, 0)
    return None


def _slice_sized_by_min_max(
    fake_mode: Any, func: Any, self: Any, dim: int = 0, start: Any = None, end: Any = None, step: int = 1
) -> Any:
    """torch 2.13's fake implementation of aten.slice.Tensor."""
    import torch
    from torch._prims_common import canonicalize_dim
    from torch.fx.experimental.symbolic_shapes import guard_or_false, statically_known_true

    if self.dim() == 0:
        raise RuntimeError("slice() cannot be applied to a 0-dim tensor.")
    if step <= 0:
        raise RuntimeError("slice step must be positive")
    dim = canonicalize_dim(self.dim(), dim)
    sizes, strides = list(self.size()), list(self.stride())
    start_index = 0 if start is None else _slice_index(sizes[dim], start)
    whole = end is None or statically_known_true(end == sys.maxsize)
    end_index = sizes[dim] if whole else _slice_index(sizes[dim], end)
    new_size = None
    if start_index is not None and end_index is not None:
        if guard_or_false(end_index >= start_index):
            new_size = (end_index - start_index + step - 1) // step
        elif guard_or_false(start_index >= end_index):
            new_size = 0
        else:
            new_size = (torch.sym_max(end_index - start_index, 0) + step - 1) // step
    shape_env = fake_mode.shape_env
    if new_size is None:
        new_size = shape_env.create_unbacked_symint()
        torch._check(new_size >= 0)
        torch._check(new_size <= sizes[dim])
    if start_index is not None:
        offset = self.storage_offset() + start_index * strides[dim]
    else:
        offset = shape_env.create_unbacked_symint()
        torch._check(offset >= 0)
    sizes[dim], strides[dim] = new_size, strides[dim] * step
    if self.is_quantized:
        raise NotImplementedError("Slice decomposition for quantized tensors aren't implemented")
    return self.as_strided(sizes, strides, offset)


@contextmanager
def guard_sites() -> Iterator[list[tuple[str, str, int]]]:
    """(condition, file, line) of each condition on sizes that torch adds while tracing in the block, at the first
    frame outside torch that made it; none where this torch has no such hook."""
    import torch
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    found: list[tuple[str, str, int]] = []
    real = getattr(ShapeEnv, "_log_guard", None)
    if real is None:
        yield found
        return
    inside_torch = os.path.dirname(torch.__file__) + os.sep

    def log_guard(self: Any, prefix: str, condition: Any, forcing_spec: bool) -> None:
        frame: FrameType | None = sys._getframe(1)
        while frame is not None and frame.f_code.co_filename.startswith(inside_torch):
            frame = frame.f_back
        if frame is not None:
            found.append((str(condition), frame.f_code.co_filename, frame.f_lineno))
        real(self, prefix, condition, forcing_spec)

    ShapeEnv._log_guard = log_guard  # type: ignore[method-assign,assignment]
    try:
        yield found
    finally:
        ShapeEnv._log_guard = real  # type: ignore[method-assign]


def raised_in_model(exc: BaseException) -> tuple[str, int] | None:
    """(file, line) of the deepest frame outside torch and shimgen in `exc`'s tracebacks and those of the exceptions it
    was raised from: the model's line whose call into torch raised. None where there is no such frame."""
    import torch

    inside = (os.path.dirname(torch.__file__) + os.sep, os.path.dirname(os.path.dirname(__file__)) + os.sep)
    found, seen = None, set()
    chain: list[BaseException] = [exc]
    while chain:
        current = chain.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        chain += [e for e in (current.__context__, current.__cause__) if e is not None]
        for frame in traceback.extract_tb(current.__traceback__):
            if not frame.filename.startswith((*inside, "<")) and frame.lineno:
                found = (frame.filename, frame.lineno)
        if found:
            return found
    return None


@contextmanager
def partial_graph_unprinted() -> Iterator[None]:
    """torch.export prints the graph it had traced to stderr when it fails: hundreds of lines, once per layer of its
    error handling, above shimgen's message (which names the model's failing line). What else the block writes to
    stderr is passed on after it."""
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            yield
    except BaseException as exc:
        partial = getattr(exc, "partial_fx_graph", None)
        sys.stderr.write(captured.getvalue().replace(f"{partial}\n", "") if partial else captured.getvalue())
        raise
    sys.stderr.write(captured.getvalue())


def _report_unphrasable_fixes() -> None:
    """torch.export phrases a fix for a derived dim with a root dim of its own (`seq = 16*_seq - 15`), and asserts
    where that root's range is one size ("Cannot create Dim with inconsistent min=2, max=2"), which hides the
    violated conditions it was about to report. Installed once: torch's suggested fixes are then left as they stand."""
    from torch.fx.experimental.symbolic_shapes import DimConstraints

    process = getattr(DimConstraints, "_process_derived_dim_roots", None)
    if process is None or getattr(process, "reports_unphrasable", False):
        return

    def tolerant(self: Any, results: Any, name_to_dim: Any) -> None:
        try:
            process(self, results, name_to_dim)
        except AssertionError:
            pass

    tolerant.reports_unphrasable = True  # type: ignore[attr-defined]
    DimConstraints._process_derived_dim_roots = tolerant  # type: ignore[method-assign]


def example_sizes(shape_env: Any) -> dict[Any, Any]:
    """A ShapeEnv's example (hint) size of each symbol, as the dict it keeps."""
    hints = getattr(shape_env, "backed_var_to_val", None)  # torch >= 2.12
    return shape_env.var_to_val if hints is None else hints


@contextmanager
def _archive_read_quietly() -> Iterator[None]:
    """torch 2.11's archive reader makes the weights tensors over the archive's read-only bytes (torch.frombuffer),
    which warns at every build that they are not writable; shimgen only reads them."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "The given buffer is not writable", UserWarning)
        yield


def load_exported(path: Path) -> Any:
    """torch.export.load of a program shimgen saved."""
    import torch

    with _archive_read_quietly():
        return torch.export.load(str(path))


def load_program(path: Path) -> Any:
    """torch.export.load, with the example sizes of derived dims restored. A dim declared `k * Dim(...)` comes back
    from the archive with its example size keyed by the expression (`32*s13: 64`), so its own symbol has none, and
    Inductor fails where it needs one (`optimization_hint` of a host-side TMA descriptor's size)."""
    import sympy
    from torch._guards import detect_fake_mode

    program = load_exported(path)
    fake_mode = detect_fake_mode([node.meta.get("val") for node in program.graph.nodes])
    shape_env = getattr(fake_mode, "shape_env", None)
    if shape_env is None:
        return program
    hints = example_sizes(shape_env)
    for expr, value in list(hints.items()):
        if expr.is_Symbol or len(expr.free_symbols) != 1:
            continue
        (symbol,) = expr.free_symbols
        if symbol in hints:
            continue
        try:
            solutions = sympy.solve(sympy.Eq(expr, value), symbol)
        except NotImplementedError:  # e.g. Max(1, s85 - 1) = 16: sympy has no algorithm; not a derived dim's size
            continue
        if len(solutions) == 1 and solutions[0].is_Integer:
            hints[symbol] = sympy.Integer(solutions[0])
    return program


def specialized_sizes(program: Any) -> list[tuple[str, int, int, str]]:
    """The dynamic sizes of the program's inputs that a compile of it has fixed: (input, axis, size, the guard that
    fixed it and where it was added). A guard on a size (an Inductor pass comparing it with a size of the model, which
    its example size happens to equal) makes the shape environment replace the size by its example value, and the
    code compiled after it serves that size alone."""
    import sympy
    from torch._guards import detect_fake_mode

    fake_mode = detect_fake_mode([node.meta.get("val") for node in program.graph.nodes])
    shape_env = getattr(fake_mode, "shape_env", None)
    if shape_env is None:
        return []
    fixed = []
    for name, _, axis, size in _input_sizes(program):
        symbolic = getattr(size, "node", None)
        expr = getattr(symbolic, "_expr", None)  # as traced: `expr` has the replacements applied
        if expr is None or not expr.free_symbols:
            continue
        replaced = shape_env.replace(expr)
        symbols = expr.free_symbols
        ranges = [program.range_constraints.get(symbol) for symbol in symbols]
        # Inductor compiles a dynamic size for 2 and up: a range of [1, 2] leaves it the size 2 alone, rightly
        if not replaced.is_number or all(r is not None and max(int(r.lower), 2) >= r.upper for r in ranges):
            continue
        guard = next(
            (
                f"{g.expr}, added {getattr(g, 'sloc', 'by Inductor')}"
                for g in getattr(shape_env, "guards", ())
                if isinstance(g.expr, sympy.Eq) and g.expr.free_symbols & symbols
            ),
            "",
        )
        fixed.append((name, axis, int(replaced), guard))
    return fixed


def input_size_ranges(program: Any) -> dict[tuple[int, int], tuple[int, int]]:
    """The range the program takes of each dynamic size of its user inputs: (input, axis) -> (lower, upper)."""
    ranges = {}
    for _, index, axis, size in _input_sizes(program):
        expr = getattr(getattr(size, "node", None), "expr", None)
        if expr is not None and expr in program.range_constraints:
            bounds = program.range_constraints[expr]
            ranges[(index, axis)] = (int(bounds.lower), int(bounds.upper))
    return ranges


def program_guards(program: Any) -> list[str]:
    """The conditions on input sizes an exported program checks at each call (`Guard failed: ...` where one is not
    met), as torch prints them: `L['tensors'][0].size()[1] > 1`."""
    return list(getattr(program, "_guards_code", ()))


def _input_sizes(program: Any) -> Iterator[tuple[str, int, int, Any]]:
    """Each size of the program's user input tensors, as traced: (placeholder name, input index, axis, size)."""
    user_inputs = list(program.graph_signature.user_inputs)
    for node in program.graph.find_nodes(op="placeholder"):
        value = node.meta.get("val")
        if node.name in user_inputs and hasattr(value, "shape"):
            for axis, size in enumerate(value.shape):
                yield node.name, user_inputs.index(node.name), axis, size


def saved_program_json(path: Path) -> bytes:
    """A program saved by torch.export.save: its graph, signature and tensor metadata as the archive holds them (the
    weights are files of their own), read back instead of serializing the program a second time."""
    with zipfile.ZipFile(path) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith("/models/model.json")]
        return archive.read(name)


def saved_program_weights(path: Path) -> dict[str, Any]:
    """A program saved by torch.export.save: its state dict and constants by name, read from the archive without
    deserializing the graph where this torch's archive reader allows (torch.export.load takes 0.5 s more for a 90 MB
    BERT)."""
    with _archive_read_quietly():
        weights = _archive_weights(path)
    if weights is None:
        program = load_exported(path)
        weights = {**program.state_dict, **program.constants}
    return weights


def _archive_weights(path: Path) -> dict[str, Any] | None:
    try:
        from torch.export.pt2_archive import _package

        reader, models_dir = _package.PT2ArchiveReader, _package.MODELS_DIR
        parts = _package._load_state_dict, _package._load_constants
    except (ImportError, AttributeError):  # another torch's archive code
        return None
    weights: dict[str, Any] = {}
    with reader(str(path)) as archive:
        models = [n for n in archive.get_file_names() if n.startswith(models_dir) and n.endswith(".json")]
        for model in (n[len(models_dir) : -len(".json")] for n in models):
            for load in parts:
                part = load(archive, model)
                if not isinstance(part, dict):  # torch's legacy format: the weights pickled whole
                    return None
                weights.update(part)
    return weights


def op_schema(name: str) -> Any:
    """The schema of a registered op 'ns::op' or 'ns::op.overload'; RuntimeError where none is registered."""
    import torch

    op, _, overload = name.partition(".")
    return torch._C._get_schema(op, overload)


def node_schema(target: Any) -> Any | None:
    """The schema of an FX node's target where it is an op (OpOverload); None otherwise."""
    return getattr(target, "_schema", None)


def registered_ops() -> set[str]:
    """Every registered op, as 'ns::name' or 'ns::name.overload'."""
    import torch

    return {s.name + (f".{s.overload_name}" if s.overload_name else "") for s in torch._C._jit_get_all_schemas()}


def has_kernel(name: str, dispatch_key: str) -> bool:
    """Whether op `name` has a kernel registered for `dispatch_key` (Meta, CompositeImplicitAutograd, ...)."""
    import torch

    return bool(torch._C._dispatch_has_kernel_for_dispatch_key(name, dispatch_key))


def python_custom_op_file(name: str) -> str | None:
    """The file defining op `name` where it is a Python custom op (torch.library.custom_op); None otherwise."""
    from torch._library.custom_ops import OPDEFS

    opdef = OPDEFS.get(name)
    return None if opdef is None else str(opdef._init_fn.__code__.co_filename)


def python_custom_op_module(name: str) -> str | None:
    """The module defining op `name` where it is a Python custom op (torch.library.custom_op); None otherwise."""
    from torch._library.custom_ops import OPDEFS

    opdef = OPDEFS.get(name)
    return None if opdef is None else str(opdef._init_fn.__module__)


def triton_source_files(program: Any, library_ops: tuple[str, ...]) -> tuple[str, ...]:
    """The files that define the Triton kernels the program launches, and the triton_ops among `library_ops` that launch
    them: Inductor compiles those kernels from their source, but the saved program holds none of it (a triton_op stays a
    call; a kernel launched by wrap_triton is an index into torch's kernel side table). Where this torch keeps no record
    of its triton_ops, every op of `library_ops` with a Python body counts as one."""
    import inspect

    from torch._higher_order_ops import triton_kernel_wrap
    from torch._library import triton
    from torch._library.custom_ops import OPDEFS

    known: dict[str, list[Any]] | None = getattr(triton, "triton_ops_to_kernels", None)
    found: list[Any] = []
    for name in library_ops:
        if known is None or name in known:
            found += [OPDEFS[name]._init_fn] if name in OPDEFS else []
            found += known.get(name, []) if known is not None else []
    launches = (triton_kernel_wrap.triton_kernel_wrapper_functional, triton_kernel_wrap.triton_kernel_wrapper_mutation)
    for module in program.graph_module.modules():
        graph = getattr(module, "graph", None)
        for node in graph.nodes if graph is not None else ():
            if node.target in launches:
                found.append(triton_kernel_wrap.kernel_side_table.get_kernel(node.kwargs["kernel_idx"]))
    files = set()
    for kernel in found:
        for _ in range(4):  # an Autotuner wraps a JITFunction, which wraps the Python function
            kernel = getattr(kernel, "fn", kernel)
        try:
            files.add(inspect.getsourcefile(kernel))
        except TypeError:
            continue
    return tuple(sorted(f for f in files if f))


def import_build_modules() -> None:
    """Import what every build imports (torch, export, Inductor's AOT codegen), without running anything: the build
    server's state before it forks a build."""
    import torch  # noqa: F401
    import torch._inductor.codegen.cpp_wrapper_cpu  # noqa: F401
    import torch._inductor.compile_fx  # noqa: F401
    import torch.export  # noqa: F401


def fork_is_safe() -> bool:
    """Whether a child forked now may use CUDA: torch refuses it ("Cannot re-initialize CUDA in forked subprocess") once
    this process has asked the CUDA driver anything, which `torch.cuda.is_available()` does unless
    PYTORCH_NVML_BASED_CUDA_CHECK=1 makes it ask NVML."""
    import os

    import torch

    pid = os.fork()
    if pid == 0:  # pragma: no cover  (the probe child)
        os._exit(int(torch.cuda._is_in_bad_fork()))
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
