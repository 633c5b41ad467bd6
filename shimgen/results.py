"""What each stage hands to the next: frozen dataclasses with the key they were made under and the
files they produced, written to and read back from state.json by the same code (`to_json`,
`from_json`), so a stage skipped as up to date yields exactly what running it would."""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from shimgen.spec import Graph, Target

# Output tree nodes in preorder, as the binding rebuilds them (kinds match binding.cpp.j2).
TENSOR, TUPLE, LIST, DICT, NONE, OBJECT = range(6)
# How the binding calls an OBJECT node's own type (binding.cpp.j2's Construct).
POSITIONAL, KEYWORD, SEQUENCE, UNFLATTEN = "positional", "keyword", "sequence", "unflatten"

R = TypeVar("R")


@dataclass(frozen=True, kw_only=True)
class OutType:
    """An output node of any other pytree type (namedtuple, dataclass, transformers ModelOutput...)
    and how the binding rebuilds it: with the type itself when `construct` says how (imported on
    the first call that returns one), else, or when that import fails, with `fallback`."""

    module: str
    qualname: str
    fields: tuple[str, ...] | None  # the children's names, in order; None where the node does not name them
    dropped: tuple[str, ...]  # fields that were None, which the pytree leaves out: passed as None to the type
    construct: (
        str | None
    )  # POSITIONAL cls(*children), KEYWORD cls(**fields), SEQUENCE cls(children), UNFLATTEN; None: fallback always
    fallback: str  # "namedtuple" (same name and fields), "dict" (in field order) or "tuple"
    reason: str = ""  # why construct is None
    unflatten: str = (
        ""  # UNFLATTEN: the pytree registration's unflatten function, "module:qualname", called (children, context)
    )
    context: str = ""  # UNFLATTEN: the node's pytree context, pickled, base64

    @property
    def name(self) -> str:
        return self.qualname.rpartition(".")[2]


@dataclass(frozen=True, kw_only=True)
class OutNode:
    kind: int
    arity: int = 0
    key: str | int | None = None  # key in the parent dict, or the field's name in the parent OBJECT
    type: OutType | None = None  # OBJECT nodes only


@dataclass(frozen=True, kw_only=True)
class TraceResult:
    """The exported program of one graph for one device, and its output's structure."""

    key: str
    program: Path  # torch.export.save'd ExportedProgram
    out_nodes: tuple[OutNode, ...]
    num_outputs: int
    reads: tuple[tuple[str, str], ...]  # (path, sha256) of every project file the trace read
    structure: str = ""  # the saved program without its weights' values (graph, signature, tensor metadata)
    weights: str = ""  # trace.weights_key: the weights' values
    state: tuple[str, ...] = ()  # the buffers the program mutates (trace.mutated_state), by the program's names
    library_ops: tuple[str, ...] = ()  # trace.library_ops: the ops outside aten and prims the program calls
    kernel_sources: tuple[tuple[str, str], ...] = ()  # (path, sha256): internals.triton_source_files
    op_modules: tuple[str, ...] = ()  # custom_ops.installed_op_modules: imported before the program loads
    # (dim, min, max, condition): the program takes the dim from min to max (trace._export_narrowing)
    narrowed: tuple[tuple[str, int, int, str], ...] = ()

    @property
    def files(self) -> tuple[Path, ...]:
        return (self.program,)


@dataclass(frozen=True, kw_only=True)
class DefinedOp:
    """An op a [[custom_op]] entry registered."""

    name: str  # 'ns::op', or 'ns::op.overload'
    entry: int  # index of the entry in the spec
    module: (
        str | None
    )  # the entry's module, where that defined the op (its body runs in Python); None for its library's


@dataclass(frozen=True, kw_only=True)
class CustomOps:
    """The spec's custom ops, loaded in this process: what a trace depends on, and what the package ships."""

    key: str  # the ops' schemas and fake implementations
    libraries: tuple[Path, ...]  # one per entry with sources, in entry order
    ops: tuple[DefinedOp, ...]


@dataclass(frozen=True, kw_only=True)
class KernelChoice:
    """One kernel selection Inductor made by timing: the op, its input sizes, the winner and every candidate's time."""

    op: str  # Inductor's name for the selection: mm, addmm, linear_unary, ...
    sizes: tuple[str, ...]  # each input's sizes at the traced example, "4x32"
    picked: str  # "<kind> <kernel>", as in `us`
    us: dict[str, float]  # microseconds per call of each candidate, fastest first
    count: int = 1  # identical selections in the graph


@dataclass(frozen=True, kw_only=True)
class CodegenResult:
    """Inductor's C++ for one graph on one target, cut into translation units, and how to compile it."""

    key: str
    interface: Path  # the AOTI runtime interface: the same text for every graph of a target
    model: Path
    kernels: tuple[Path, ...]
    weights: Path  # ELF object holding the weights
    ptx: tuple[Path, ...]  # CUDA: one per Triton kernel, named after it
    triton: tuple[Path, ...]  # CUDA: the kernels' Triton sources, shipped for inspection
    defines: tuple[str, ...]
    inductor_args: tuple[str, ...]
    out_nodes: tuple[OutNode, ...]
    num_outputs: int
    kernel_choices: tuple[KernelChoice, ...] = ()
    # GEMMs given a kernel without timing (kernel_choice.untimed_kernel): ((input sizes, "library" or "template"), count)
    untimed_gemms: tuple[tuple[tuple[tuple[str, ...], str], int], ...] = ()
    extern_nodes: Path | None = (
        None  # Inductor's description of the ops it leaves to run time (its <hash>.wrapper.json)
    )
    run_time_modules: tuple[str, ...] = ()  # Python modules the package imports first: they define ops the graph calls
    autotune_timings: dict[str, Any] = field(
        default_factory=dict
    )  # the timing records its kernel choices used (lockfile.Timings)
    constants: Path | None = None  # the model's constants described (weights.Constant, as JSON)
    refit: Path | None = None  # how the constants Inductor computed from the weights are computed again (refit.py)
    weights_file: Path | None = None  # flags.weights = "file": the weights as safetensors
    weights_digest: str = ""  # the trace's weights_key the weights file was made from
    structure_key: str = ""  # codegen_key without the weights' values: a weights-only edit keeps it (refit)
    unused_weights: tuple[str, ...] = ()  # the program's weights the model does not take (weights.unused_weights)
    state: tuple[str, ...] = ()  # the weights the model mutates (TraceResult.state)
    scalar_kernels: str = ""  # why its CPU kernels are not vectorized: the compiler refused the vectorized ones
    onednn_off: str = ""  # why it was generated without oneDNN
    gemm_templates_off: str = ""  # why its GEMMs were not timed against Inductor's templates (flags.gemm_autotune)
    packed_threads: int | None = None  # the threads its oneDNN weights are packed for, where it has any
    checked: bool = False  # a package check ran this code at every size (its weights may since have been refitted)

    @property
    def files(self) -> tuple[Path, ...]:
        extra = tuple(p for p in (self.extern_nodes, self.constants, self.refit, self.weights_file) if p)
        return (self.interface, self.model, *self.kernels, self.weights, *self.ptx, *self.triton, *extra)

    @property
    def compile_args(self) -> list[str]:
        """Compile arguments of Inductor's code: its defines, math flags and the target's ISA."""
        return [f"-D{d}" for d in self.defines] + list(self.inductor_args)


@dataclass(frozen=True, kw_only=True)
class Variant:
    """A graph compiled for sizes its spec specializes (dims.<name>.specialize): a library of its own,
    `_<unit>__<name>.so`,
    that the unit's extension loads and calls for inputs of those sizes."""

    sizes: tuple[tuple[str, int], ...]  # (dim, size) in the graph's order of dims
    code: CodegenResult
    automatic: str = ""  # why the build made it, where the spec did not list it: the condition torch.export needs

    @property
    def name(self) -> str:
        return variant_name(dict(self.sizes))


@dataclass(frozen=True, kw_only=True)
class Unit:
    """One graph compiled for one target: its codegen dir, its sources dir and extension module `_<name>`, which holds
    the
    dynamic code and dispatches to the specialized variants."""

    graph: Graph
    target: Target
    code: CodegenResult
    variants: tuple[Variant, ...] = ()

    @property
    def name(self) -> str:
        return unit_name(self.graph, self.target)

    @property
    def generated(self) -> list[tuple[str, CodegenResult]]:
        """The dynamic code and each variant's, by the name of their trace and codegen (shimgen/trace/variants.py's works)."""
        return [(self.name, self.code)] + [(f"{self.name}__{v.name}", v.code) for v in self.variants]

    @property
    def packed_threads(self) -> int | None:
        """The threads its oneDNN weights are packed for, where its dynamic code or a variant has any (the dynamic code
        of a convolution over a dynamic batch packs none)."""
        return next((code.packed_threads for _, code in self.generated if code.packed_threads), None)

    def library(self, variant: Variant) -> str:
        """The variant's library name, without its suffix."""
        return f"_{self.name}__{variant.name}"


def target_compile_args(units: list[Unit]) -> list[str]:
    """The compile arguments of Inductor's code for the units of one target: a vectorized unit's, since a unit with
    scalar kernels has no ISA define (at::vec's headers would pick their generic code for the others)."""
    codes = [code for u in units for _, code in u.generated]
    return next((code for code in codes if not code.scalar_kernels), codes[0]).compile_args


def wrapper_compile_args(compile_args: list[str]) -> list[str]:
    """The compile arguments of the wrapper's side (model code, bindings, entry points, data, and the prebuilt pieces they
    share) from the target's: its defines, include directories and ISA baseline (-march), without what only Inductor's
    kernels need (math flags, ISA extensions, the vector-capability define). One prebuilt set then serves every kernel
    flag set of a target: scalar kernels, or math flags that differ with the name Inductor finds the compiler by."""
    return [a for a in compile_args if a.startswith(("-D", "-I", "-march=")) and not a.startswith("-DCPU_CAPABILITY")]


def kernel_compile_args(compile_args: list[str]) -> list[str]:
    """The compile arguments of Inductor's kernels from the target's: without the defines that say where the weights
    are (only the model base class reads them), so that projects with embedded and external weights share the kernels'
    precompiled header."""
    return [a for a in compile_args if a not in ("-DUSE_MMAP_SELF", "-DUSE_MMAP_EXTERNAL")]


def unit_name(graph: Graph, target: Target) -> str:
    return f"{graph.name}_{target.device}"


def variant_name(sizes: dict[str, int]) -> str:
    """batch1_seq128: unique within a graph, whose dims are fixed and end where the digits do."""
    return "_".join(f"{dim}{size}" for dim, size in sizes.items())


@dataclass(frozen=True, kw_only=True)
class Prebuilt:
    """What every project with the same toolchain and flags links: built once per user."""

    key: str
    interface_lib: Path
    wrapper_pch: Path | None  # force-include this path; GCC uses the .gch beside it
    kernel_pch: Path | None
    runtime_pch: Path | None  # for what includes shimgen's runtime headers, not the model's (binding, entry points)
    runtime_libs: tuple[
        Path, ...
    ] = ()  # shimgen's runtime library for the device (toolchain/runtime_lib.py), in link order
    extern_ops_lib: Path  # the runtime's proxy executor, for graphs that call ops through the dispatcher

    @property
    def files(self) -> tuple[Path, ...]:
        return tuple(
            p
            for p in (
                self.interface_lib,
                self.wrapper_pch,
                self.kernel_pch,
                self.runtime_pch,
                *self.runtime_libs,
                self.extern_ops_lib,
            )
            if p
        )


@dataclass(frozen=True, kw_only=True)
class CppPackageResult:
    key: str
    prefix: Path  # include/, lib/ (lib<name>.so, lib/<name>/, cmake/, pkgconfig/)
    archive: Path  # the prefix's contents as dist/<name>-<version>-<target>-cpp.tar.gz

    @property
    def files(self) -> tuple[Path, ...]:
        return (self.prefix, self.archive)


@dataclass(frozen=True, kw_only=True)
class RenderedProject:
    key: str  # hash of every file of the project
    root: Path
    sources: tuple[Path, ...]

    @property
    def files(self) -> tuple[Path, ...]:
        return self.sources


@dataclass(frozen=True, kw_only=True)
class CompileResult:
    key: str  # hash of the project's and the built extensions' content
    extensions: tuple[Path, ...]  # what Meson says it built for installation
    units_done: int = 0
    units_total: int = 0
    unit_seconds: dict[str, float] = field(default_factory=dict)

    @property
    def files(self) -> tuple[Path, ...]:
        return self.extensions


@dataclass(frozen=True, kw_only=True)
class PackageResult:
    key: str
    wheel: Path
    site: Path  # the unpacked wheel: a directory to put on sys.path
    verified: tuple[
        str, ...
    ] = ()  # the calls compared with the traced programs before the package was installed (verify.py)
    verify_skipped: tuple[str, ...] = ()
    verify_seconds: float = 0.0
    verify_beforehand: int = 0  # verify.Report.beforehand
    verify_settled: tuple[str, ...] = ()  # verify.Report.settled
    weights_file: Path | None = None  # flags.weights = "external": the weights, beside the wheel
    platform_reason: str = ""  # why the wheel has no manylinux tag, where it has none

    @property
    def files(self) -> tuple[Path, ...]:
        return (self.wheel, self.site) + ((self.weights_file,) if self.weights_file else ())


def to_json(value: Any) -> Any:
    """A result as JSON data: dataclasses as dicts, paths as strings, tuples as lists."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    if isinstance(value, Path):
        return str(value)
    return value


def from_json(cls: type[R], data: Any) -> R:
    """The inverse of to_json, guided by `cls`'s type hints."""
    return typing.cast(R, _convert(cls, data))


def _convert(hint: Any, data: Any) -> Any:
    if data is None:
        return None
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        hints = typing.get_type_hints(hint)
        return hint(
            **{f.name: _convert(hints[f.name], data[f.name]) for f in dataclasses.fields(hint) if f.name in data}
        )
    if origin in (typing.Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        return _convert(options[0], data) if len(options) == 1 else data
    if origin is tuple:
        item = args[0] if args[-1] is Ellipsis else None
        return tuple(_convert(item or args[k], v) for k, v in enumerate(data))
    if origin is dict:
        return {k: _convert(args[1], v) for k, v in data.items()}
    if hint is Path:
        return Path(data)
    return data


@dataclass(frozen=True, kw_only=True)
class Stamp:
    """A key alone: what a unit of work was last done for, when it leaves no files of its own."""

    key: str

    @property
    def files(self) -> tuple[Path, ...]:
        return ()
