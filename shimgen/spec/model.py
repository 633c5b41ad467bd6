"""The spec's tables as dataclasses: the one source for validation, `shimgen schema` and docs.

Each field's `doc` metadata is its documentation. `load.py` turns TOML into these classes by
their type hints; `schema.py` turns the same hints into JSON schema.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Literal

# Spec dtype -> c10::ScalarType enumerator: the binding's checks and messages are rendered from it.
SCALAR_TYPES = {
    "float32": "Float",
    "float64": "Double",
    "float16": "Half",
    "bfloat16": "BFloat16",
    "int64": "Long",
    "int32": "Int",
    "int16": "Short",
    "int8": "Char",
    "uint8": "Byte",
    "bool": "Bool",
}
DTYPES = tuple(SCALAR_TYPES)
OptLevel = Literal["O0", "O1", "O2", "O3", "Os"]
DIM_SIZE_LIMIT = 2**63 - 2  # torch.export's largest dim size (sys.maxsize - 1; it checks derived dims against it)
EXAMPLE_BYTES_LIMIT = 2**32  # example inputs allocated by tracing and `shimgen check`
INSTANCES_LIMIT = 1024
VARIANTS_LIMIT = 16  # specialized variants per graph: each is a compiled copy of the model
NAME_LIMIT = 100  # project and graph names name files and directories, whose names stop at 255 bytes
VERSION_LIMIT = 64  # the version is part of the wheel's file name too


def doc(text: str, check_only: bool = False, **kwargs: Any) -> Any:
    """A dataclass field documented by `text`; `check_only` for what `shimgen check` uses and the build ignores."""
    return field(metadata={"doc": text, "check_only": check_only}, **kwargs)


def build_fields(table: Any) -> dict[str, Any]:
    """A table's fields that the build depends on: all but the check-only ones."""
    return {f.name: getattr(table, f.name) for f in fields(table) if not f.metadata.get("check_only")}


@dataclass
class Project:
    """[project]: the generated package."""

    name: str = doc(f"Import name of the generated package (a Python identifier of at most {NAME_LIMIT} characters).")
    version: str = doc(
        f"Version of the generated package and its wheel: a PEP 440 version such as '1.0' or '0.2.1rc1', at most {VERSION_LIMIT} characters.",
        default="0.1.0",
    )
    description: str = doc(
        "One line of printable text (no line breaks or control characters), used as the package docstring and wheel summary.",
        default="",
    )
    cpp: bool = doc(
        "Also build the C++ package: lib<name>.so with its header, CMake package and pkg-config file, installed under "
        "the build's cpp/ directory and packed as dist/<name>-<version>-<target>-cpp.tar.gz. Graphs that call ops "
        "defined in Python get none.",
        default=True,
    )


@dataclass
class Dim:
    """A dynamic dimension shared by every input shape that names it."""

    max: int = doc(
        "Largest size the package accepts for this dimension: above min, and at most 2**63 - 2, the largest size "
        "torch.export supports for a dim (sys.maxsize - 1). For 'no limit', write a large max and a small example.",
    )
    min: int = doc(
        "Smallest size the package accepts for this dimension (at least 1). A range of [1, 2] builds size 1 as a "
        "specialized variant: a dynamic dim's code is compiled for sizes of 2 and up, which leaves only 2.",
        default=1,
    )
    example: int | None = doc(
        "Size used for tracing and example inputs; default: the middle of [min, max] (rounded down to a multiple "
        "of multiple_of), at least 2 (torch.export specializes sizes 0 and 1). The example inputs together may "
        f"take at most {EXAMPLE_BYTES_LIMIT // 2**30} GiB: tracing allocates them.",
        default=None,
    )
    multiple_of: int = doc(
        "Sizes must be a multiple of this (for models whose kernels or reshapes need it); checked on every call. "
        "min, max and example must be multiples of it.",
        default=1,
    )
    specialize: list[int] = doc(
        "Sizes to build a static variant for, in the same package: a call at one of them runs code compiled for that size "
        "(as fast as a package built for it alone), other sizes run the dynamic code. Where several dims list sizes, "
        f"every combination is a variant (at most {VARIANTS_LIMIT} per graph). Each within [min, max] and a multiple of "
        "multiple_of. Variants share the weights file; each adds its code and the weights Inductor derives for its sizes "
        "(freezing).",
        default_factory=list,
    )


@dataclass
class Input:
    """One tensor input of a graph, in call order."""

    name: str = doc("Parameter name: the callable accepts the input positionally or by this name.")
    shape: list[int | str] = doc("Sizes: an int is a static size, a string names a dynamic dim from `dims`.")
    dtype: Literal[DTYPES] = doc("Element type.", default="float32")  # type: ignore[valid-type]
    keyword: bool = doc(
        "Pass this input to the model as a keyword argument (keyword-only in the generated callable).",
        default=False,
    )
    memory_format: Literal["contiguous", "channels_last"] = doc(
        "Layout the kernels are traced for and that every call must match (checked on each call).",
        default="contiguous",
    )
    low: int | float | None = doc(
        "Lower bound of random example values (default -1, integer dtypes 0); within the dtype's range. Not for bool.",
        default=None,
    )
    high: int | float | None = doc(
        "Upper bound (exclusive) of random example values (default 1, integer dtypes 10); within the dtype's range. "
        "Not for bool.",
        default=None,
    )
    values: Literal["random", "arange"] = doc(
        "Example values: 'random' (between low and high), or 'arange': low, low + 1, ... along the last dim, as positions "
        "are (a KV cache's cache_position).",
        default="random",
    )


@dataclass
class Graph:
    """[[graph]]: one traced graph, one callable in the package."""

    name: str = doc(f"Callable name in the generated package (a Python identifier of at most {NAME_LIMIT} characters).")
    entry: str = doc(
        "'module:callable', imported with the spec's directory on sys.path. A class or a factory "
        "(called with args/kwargs) must give an nn.Module; a function with required parameters is "
        "itself the model."
    )
    inputs: list[Input] = doc("Tensor inputs in call order.")
    args: list[Any] = doc("Positional arguments for the entry callable.", default_factory=list)
    kwargs: dict[str, Any] = doc("Keyword arguments for the entry callable.", default_factory=dict)
    dims: dict[str, Dim] = doc("Dynamic dimensions by name.", default_factory=dict)
    seed: int = doc("Seed set before building the model and its example inputs (deterministic init).", default=0)
    depends: list[str] = doc(
        "Glob patterns, relative to the spec, of further files the model depends on: a change to any of them traces "
        "the graph again. Files the model opens through Python while it is built and traced (weights, configs) and "
        "its modules in the project are found without it; list what native code reads.",
        default_factory=list,
    )
    atol: float = doc(
        "Absolute tolerance of `shimgen check` against eager. A bfloat16 output's is at least 0.05 times its largest "
        "magnitude, a float16 output's 0.01 times (compiled kernels round otherwise than eager).",
        check_only=True,
        default=1e-4,
    )
    rtol: float = doc(
        "Relative tolerance of `shimgen check` against eager; at least 0.05 for a bfloat16 output, 0.01 for float16.",
        check_only=True,
        default=1e-4,
    )


@dataclass
class Target:
    """[[target]]: a device the package is built for."""

    device: Literal["cpu", "cuda"] = doc("Device of the kernels.")
    isa: Literal["native", "avx2", "avx512", "default"] | None = doc(
        "CPU only: instruction set of the kernels. 'native' is this machine's (fastest, not portable); "
        "'default' is baseline x86-64 (portable). Default: native.",
        default=None,
    )
    archs: list[str] = doc(
        "CUDA only: GPU architectures such as 'sm_90'. Each Triton kernel is embedded as a cubin for every "
        "listed arch plus its PTX, which newer GPUs compile when loading. Checked against what the installed "
        "nvcc can target.",
        default_factory=list,
    )
    threads: int | None = doc(
        "CPU only: the threads (torch.set_num_threads) the package is tuned for. With oneDNN (native ISA, freezing), "
        "convolution and linear weights are packed at build time for the threads oneDNN will run them on, and a call "
        "at another count repacks them at every call on CPUs where oneDNN's layout follows the threads (ResNet-18 at "
        "batch 1 on 2 AVX2 cores: 1.6-1.7x slower; on AVX-512 machines the layouts measured the same). Default: the "
        "threads torch runs in the process that builds (in a new process, one per physical core or "
        "$OMP_NUM_THREADS).",
        default=None,
    )


@dataclass
class Flags:
    """[flags]: compile options."""

    wrapper_opt: OptLevel = doc("Optimization level of the wrapper and binding translation units.", default="O1")
    kernel_opt: OptLevel = doc("Optimization level of the kernel translation units.", default="O3")
    pch: bool = doc(
        "Force-include precompiled AOTI runtime and kernel headers, and precompile the torch header that each custom "
        "op's C++ source includes first once the sources are edited (GCC); built once per toolchain and flag set and "
        "cached per user.",
        default=True,
    )
    split: int = doc(
        "At most this many kernel translation units per graph, compiled in parallel; fewer where its kernels are small "
        "(each file gets 24 KiB of source or more).",
        default=4,
    )
    freezing: bool = doc(
        "Fold weights into the graph as constants (Inductor freezing): faster inference. The folded constants (batch "
        "norms merged into convolutions, weights packed for their kernels) are computed at build time; the package's "
        "load_weights() computes them again from new weights by the operations the build recorded. A graph whose "
        "package computes otherwise with freezing is generated again without it (the build summary says so).",
        default=True,
    )
    weights: Literal["embedded", "file", "external"] = doc(
        "Where the package keeps the weights: 'file' ships them beside each graph's extension as a safetensors file "
        "(64-byte aligned where sizes allow), mapped at import and shared by every process that loads the package; "
        "'embedded' compiles them into the extension, which copies them to memory at import; 'external' ships none: "
        "the build writes them to one file beside the wheel (dist/<name>-<version>.safetensors), which the package "
        "maps from the path in $<NAME>_WEIGHTS at import or given to load_weights() (Python) or load() (C++), after "
        "checking that it was made for this build's compiled code. 'file' and 'external' build faster (no weights to "
        "link or compress), and a new checkpoint rebuilds only the weights file (with freezing, the constants it "
        "folded computed again by the refit programs the build recorded).",
        default="file",
    )

    @property
    def weights_apart(self) -> bool:
        """The extension holds no weights: they come from a weights file ('file' or 'external')."""
        return self.weights != "embedded"

    onednn: bool = doc(
        "Native ISA, with freezing: let Inductor hand convolutions and linear layers to oneDNN (and MKL) with "
        "weights prepacked for the build machine's CPU. Much faster for convolutions (ResNet-18 batch 1: 12 vs 22 ms "
        "here); with gemm_autotune each linear layer's oneDNN kernel is only a candidate, timed against the others. "
        "Portable ISAs never prepack for a library.",
        default=True,
    )
    max_autotune: bool = doc(
        "Let Inductor benchmark all its kernel choices at build time: GEMM and convolution templates and "
        "pointwise kernel configs. Minutes for a ResNet on a GPU.",
        default=False,
    )
    tma: bool = doc(
        "CUDA only, sm_90 and newer: every GEMM runs Inductor's persistent TMA matmul template (tiles load "
        "through TMA descriptors), autotuned among its configs. A GEMM TMA cannot take (sizes not 16-byte "
        "aligned) fails the build.",
        default=False,
    )
    gemm_autotune: bool = doc(
        "Time every matmul's kernel candidates on the build machine for the traced sizes (the dims' examples) and keep "
        "the fastest, with the following pointwise ops fused in; the build summary lists each choice and its timings. "
        "CPU: Inductor's C++ GEMM template (for the target's ISA) against ATen, and oneDNN where onednn prepacks, "
        "timed with one thread so that a busy build machine ranks them alike (8 x (Linear 32, gelu, residual), "
        "batch 4, 1 thread: 2.3 vs 154 us without). CUDA: Inductor's Triton GEMM templates against cuBLAS; "
        "convolutions stay on cuDNN. Where timing does not pay, measured, a kernel is taken untimed: on a CPU the "
        "library's from 16 rows (batch x sequence) and, in float32 against oneDNN, Inductor's template up to 4 rows; "
        "on a GPU the library's below 4096 rows. "
        "Costs seconds per distinct GEMM shape at cold builds; off for fast builds. "
        "The measured choice may differ between builds. A graph that Inductor fails on with its templates as candidates "
        "is generated again without them; the build says so and the lockfile keeps it.",
        default=True,
    )
    cuda_graphs: bool = doc(
        "CUDA only: the binding captures each model of static shape into a CUDA graph on its first call and "
        "replays it on later calls, copying inputs in and outputs out (returned tensors are never reused): graphs without "
        "dynamic dims, and the variants whose every dim is fixed (dims.<name>.specialize, or sizes the build makes "
        "variants of their own). The dynamic code of a graph runs uncaptured.",
        default=False,
    )


@dataclass
class Runtime:
    """[runtime]: behaviour of the generated package."""

    instances: int = doc(
        f"Model instances per graph (1 to {INSTANCES_LIMIT}): this many threads can run a graph at once, more wait their turn. "
        "Instances share the weights; each has its own intermediate buffers.",
        default=2,
    )
    keep_buffers: bool = doc(
        "CPU: each compiled model of a graph (its dynamic model, each variant) keeps its buffers of 64 KiB or more "
        "(Inductor's, those of the library ops it calls, and its outputs once the caller frees them) for its next call "
        "instead of handing them back to the system, so a call does not fault in fresh pages that the kernel zeroes "
        "(MiniLM at batch 8: 2,100 a call, 3% of its time). Between calls each model holds about its last call's memory.",
        default=True,
    )


@dataclass
class CustomOp:
    """[[custom_op]]: ops the graphs call that torch does not define, built and shipped with the package."""

    sources: list[str] = doc(
        "C++ files (.cpp, .cc, .cxx) and, for a cuda target, CUDA files (.cu), relative to the spec, that define ops with "
        "TORCH_LIBRARY / TORCH_LIBRARY_IMPL. Meson compiles them into one library, loaded before tracing and shipped in "
        "the package, which registers the ops on import (torch.ops.<ns>.<op> then works too). The graphs call them "
        "through the dispatcher. An op needs a Meta kernel here or a fake implementation in `module`.",
        default_factory=list,
    )
    module: str | None = doc(
        "A Python module, imported with the spec's directory on sys.path, that registers ops with torch.library "
        "(custom_op, register_fake, triton_op). Imported before tracing; the package imports it too where a built graph "
        "still calls an op's Python body (triton_op kernels are compiled into the package and need no import).",
        default=None,
    )


@dataclass
class Matrix:
    """[matrix]: the builds `shimgen matrix` lists for CI, one job each: every target x torch x Python (x CUDA for cuda targets)."""

    torch: list[str] = doc(
        "torch versions to build for, such as '2.13.0', each within the range shimgen supports. A package is compiled "
        "against one exact torch. Default: the torch shimgen runs with.",
        default_factory=list,
    )
    python: list[str] = doc(
        "Python versions such as '3.11'. Default: the Python shimgen runs with.", default_factory=list
    )
    cuda: list[str] = doc(
        "CUDA versions of the torch builds for the cuda target, such as '13.0'. Default: the CUDA of the torch shimgen "
        "runs with; required where that torch is a CPU build.",
        default_factory=list,
    )


@dataclass
class ProjectSpec:
    """A shimgen spec file."""

    project: Project = doc("The generated package.")
    graph: list[Graph] = doc("Graphs to trace and compile; one callable each.")
    target: list[Target] = doc("Devices to build for. Default: one native CPU target.", default_factory=list)
    flags: Flags = doc("Compile options.", default_factory=Flags)
    runtime: Runtime = doc("Behaviour of the generated package.", default_factory=Runtime)
    custom_op: list[CustomOp] = doc(
        "Custom ops the graphs call: C++/CUDA sources or a Python module.", default_factory=list
    )
    matrix: Matrix = doc("The CI build matrix: torch, Python and CUDA versions.", default_factory=Matrix)
