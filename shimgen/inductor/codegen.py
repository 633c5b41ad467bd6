"""Codegen stage: ExportedProgram → C++ sources through Inductor's AOT C++ codegen (cpp-only output).

Inductor writes one `<hash>.wrapper.cpp`: the AOTI runtime interface (an `extern "C"` block that
is the same text for every graph), the model class, then each CPU kernel as an `extern "C"`
function after its own include of `cpp_prefix.h`; plus the weights as an ELF object and the
compile flags as JSON. shimgen cuts that file into translation units that compile in parallel:
interface.cpp (shared by a project's graphs), model.cpp, and `split` kernel files, and takes the
ISA from the spec's target, never from the build machine.

For CUDA, Inductor also leaves one PTX file per Triton kernel, which the model loads from the
symbol `__<kernel>_start` (embed_kernel_binary): the generated Meson project turns each into a
fatbin for the spec's archs and embeds it. The kernels' Triton sources, kept in the wrapper as
comments, are saved beside them for the package.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import logging
import os
import platform
import re
import shutil
import tempfile
import textwrap
import warnings
import zipfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, nullcontext
from pathlib import Path
from typing import Any
from unittest import mock

from shimgen import devices
from shimgen.errors import UserError, cause
from shimgen.files import replace_dir, shimgen_fingerprint, stage_key, write_if_changed
from shimgen.inductor import (
    compat,
    fake_prop,
    internals,
    kernel_choice,
    openmp,
    proxy_executor,
    refit,
    user_triton,
    weights,
)
from shimgen.inductor.lockfile import Timings
from shimgen.results import CodegenResult, CustomOps, TraceResult
from shimgen.spec import Flags, Target
from shimgen.trace import custom_ops, entry
from shimgen.trace import export as trace

KERNEL_START = "#include <torch/csrc/inductor/cpp_prefix.h>"
# Each kernel file costs about a second of compiler time before its first kernel (the precompiled header, the
# prefix): a graph's kernels are split into files of at least this much source, fewer than `split` where they are few.
KERNEL_FILE_BYTES = 24 << 10
INTERFACE_END = '} // extern "C"\n'
TRITON_SOURCE = re.compile(r"async_compile\.triton\('(\w+)', '{3}\n(.*?)'{3}, device_str='cuda'\)", re.S)
# -march and CPU_CAPABILITY per spec isa; 'native' keeps what Inductor picked for this machine.
ISA_FLAGS = {
    "avx512": (512, ["-march=x86-64-v4", "-mfma"], "CPU_CAPABILITY_AVX512"),
    "avx2": (256, ["-march=x86-64-v3"], "CPU_CAPABILITY_AVX2"),
    "default": (1, ["-march=x86-64"], None),
}
# Every Inductor config key shimgen sets (inductor_configs, kernel_choice.recorded): compat checks that this torch has
# them.
CONFIG_KEYS = (
    "aot_inductor.package_cpp_only",
    "aot_inductor.precompile_headers",
    "aot_inductor.package_constants_in_so",
    "aot_inductor.package_constants_on_disk_format",
    "aot_inductor.embed_kernel_binary",
    "aot_inductor.emit_multi_arch_kernel",
    "cpp.vec_isa_ok",
    "cpp.cxx",
    "cpp.weight_prepack",
    "cpp.dynamic_threads",
    "cpp.threads",
    "cpp.simdlen",
    "freezing",
    "max_autotune",
    "max_autotune_gemm",
    "max_autotune_gemm_backends",
    "max_autotune_conv_backends",
    "triton.unique_user_kernel_names",
    "triton.enable_persistent_tma_matmul",
    "test_configs.autotune_choice_name_regex",
    "trace.log_autotuning_results",
)


def inductor_configs(target: Target, flags: Flags, cxx: str | None = None, vectorize: bool = True) -> dict[str, Any]:
    """Inductor settings for one graph; `cxx`, the proved compiler, for what Inductor compiles itself. Without
    `vectorize`, CPU kernels are scalar loops."""
    configs: dict[str, Any] = {
        "aot_inductor.package_cpp_only": True,
        "aot_inductor.precompile_headers": False,
        # Skip Inductor's ISA probe (it compiles test programs: seconds per cold build, pytorch#191715);
        # the CPU's flags still decide which ISAs are valid, and the spec's target picks among them.
        "cpp.vec_isa_ok": True,
        "freezing": flags.freezing,
        "max_autotune": flags.max_autotune,
    }
    if cxx:
        configs["cpp.cxx"] = (None, cxx)
    if (
        flags.weights_apart
    ):  # the weights as one blob beside the code (weights.write_from_blob), the model told not to expect them
        configs.update(
            {
                "aot_inductor.package_constants_in_so": False,
                "aot_inductor.package_constants_on_disk_format": "binary_blob",
            }
        )
    if devices.device(target.device).gpu:
        configs["aot_inductor.embed_kernel_binary"] = True
        configs["aot_inductor.emit_multi_arch_kernel"] = True  # PTX, not a cubin for the build GPU alone
        # A user Triton kernel's PTX is named after its Python function, the symbol the wrapper loads after Inductor's
        # name for it (<fn>_<n>): unique names make them one, and keep two variants of a kernel apart.
        configs["triton.unique_user_kernel_names"] = True
        if flags.gemm_autotune and not flags.max_autotune:  # max_autotune times convolutions too
            configs.update({"max_autotune_gemm": True, "max_autotune_conv_backends": "ATEN"})
        if flags.tma:
            # Autotuning would pick cuBLAS or the plain mm template whenever they time faster; TMA means
            # the persistent TMA template for every GEMM, so the others are left out of the running.
            configs.update(
                {
                    "max_autotune": True,
                    "max_autotune_gemm_backends": "TRITON",
                    "triton.enable_persistent_tma_matmul": True,
                    "test_configs.autotune_choice_name_regex": r"^(?!triton_(mm|bmm)_\d)",
                }
            )
        return configs
    # Inductor's C++ GEMM template packs the weights itself, for the target's ISA; Inductor offers it only with
    # cpp.weight_prepack, which also lets oneDNN and MKL prepack where `uses_onednn` allows.
    # Without freezing the weights stay as they are, so that load_weights() can replace them: nothing packed from them.
    configs["cpp.weight_prepack"] = flags.freezing and (flags.gemm_autotune or uses_onednn(target, flags))
    if flags.gemm_autotune and not flags.max_autotune:
        configs.update({"max_autotune_gemm": True, "max_autotune_gemm_backends": "CPP,ATEN"})
    # Kernels size their OpenMP teams by the calling thread's setting (torch.set_num_threads), not the build machine's.
    # The GEMM template is written for cpp.threads partitions: at least two, so that it has a parallel region
    # (openmp.gemm_threads_from_caller then shares them among the caller's team).
    configs.update({"cpp.dynamic_threads": True, "cpp.threads": max(2, os.cpu_count() or 1)})
    if not vectorize:
        configs["cpp.simdlen"] = 1
    elif target.isa is not None and target.isa != "native":
        configs["cpp.simdlen"] = ISA_FLAGS[target.isa][0]
    return configs


def uses_onednn(target: Target, flags: Flags) -> bool:
    """Whether Inductor may hand CPU convolutions and linear layers to oneDNN and MKL with prepacked weights:
    their packed layouts are made for the build machine's CPU, so native ISA only."""
    return not devices.device(target.device).gpu and flags.onednn and target.isa == "native"


def packing_threads(target: Target, flags: Flags) -> int | None:
    """The threads oneDNN's weights are packed for, where the build packs any: the target's, else the threads torch runs
    in this process (the one that plans the build, never a worker: workers run fewer)."""
    if not (flags.freezing and uses_onednn(target, flags)):
        return None
    if target.threads is not None:
        return target.threads
    import torch

    return torch.get_num_threads()


def values_compiled(flags: Flags) -> bool:
    """Whether the generated code depends on the weights' values, not only on their names, dtypes and shapes: it embeds
    them, or freezing folds them at build time."""
    return flags.weights == "embedded" or flags.freezing


def codegen_key(
    traced: TraceResult,
    target: Target,
    flags: Flags,
    locked: list[Timings],
    torch_version: str,
    values: bool | None = None,
    vectorize: bool = True,
) -> str:
    """Holds no path of this machine (the shared cache finds it on another); for a native ISA, this machine's CPU.
    The program counts without its weights' values where the code does not depend on them (`values_compiled`), or
    where `values` is False. Where the program launches Triton kernels (compiled from their source), the files that
    define them and the Python files the trace read count by content; otherwise files count only through the program
    (a Python or C++ custom op is called, not compiled, so an edit of its body leaves the code as it is)."""
    if values is None:
        values = values_compiled(flags)
    host = host_cpu() if not devices.device(target.device).gpu and target.isa == "native" else None
    code_read = (
        sorted({digest for path, digest in (*traced.reads, *traced.kernel_sources) if path.endswith(".py")})
        if traced.kernel_sources
        else []
    )
    return stage_key(
        traced.structure,
        traced.out_nodes,
        traced.weights if values else None,
        code_read,
        torch_version,
        locked,
        host,
        target.isa,
        target.archs,
        inductor_configs(target, flags, vectorize=vectorize),
        flags.onednn,
        flags.split,
        packing_threads(target, flags),
        shimgen_fingerprint(),
    )


class SizeFixed(UserError):
    """Inductor fixed a dynamic size while compiling: the code would serve that size alone. `by_onednn`: the guard comes
    from its oneDNN fusion pass, which a codegen without oneDNN, in a process that never registered the pass, avoids."""

    def __init__(self, message: str, guard: str, by_onednn: bool) -> None:
        super().__init__(message)
        self.guard, self.by_onednn = guard, by_onednn


def _refuse_specialized(program: Any, onednn: bool) -> None:
    """A compile that fixed a dynamic size serves that size alone; the package would compute the wrong shapes at every
    other size (its check would fail at the first), so the codegen stops here, saying why."""
    fixed = internals.specialized_sizes(program)
    if not fixed:
        return
    name, axis, size, guard = fixed[0]
    traced_input = re.fullmatch(r"tensors_(\d+)", name)  # trace.entry passes the spec's inputs as *tensors
    where = f"inputs[{traced_input[1]}]" if traced_input else name
    by = f" (by the guard {guard})" if guard else ""
    raise SizeFixed(
        f"Inductor compiled the dynamic code for {where}.shape[{axis}] = {size} alone{by}: one of its passes compared "
        f"that size with a size of the model, which the example size {size} equals, and the package would compute "
        "wrong shapes at every other size; give that dim another `example` size in its dims table, one that no size "
        "of the model equals",
        guard,
        onednn and "mkldnn" in guard,
    )


def host_cpu() -> str:
    """The CPU model and its feature flags, what -march=native and Inductor's ISA pick depend on."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.machine()
    wanted = [line.split(":", 1)[1].strip() for line in lines if line.split(":")[0].strip() in ("model name", "flags")]
    return stage_key(wanted[:2])


def generate(
    traced: TraceResult,
    target: Target,
    flags: Flags,
    cxx: str | None,
    out_dir: Path,
    key: str,
    ops: CustomOps | None,
    locked: list[Timings],
    retune: bool = False,
    scalar_kernels: str = "",
    vec_isas: Path | None = None,
    onednn_threads: int | None = None,
    onednn_off: str = "",
    gemm_templates_off: str = "",
) -> CodegenResult:
    """Write interface.cpp, model.cpp, kernels_<k>.cpp and weights.o for one graph and target into out_dir;
    for CUDA also `<kernel>.ptx` and `triton/<kernel>.py`; extern_nodes.json where the graph calls ops through the
    dispatcher at run time. Kernel choices come from the `locked` timings where they have them (unless `retune`).
    With `scalar_kernels` (why), the CPU kernels are not vectorized. `vec_isas` keeps which vector ISAs the compiler
    and CPU support (`_vec_isas_kept`); oneDNN's weights are packed for `onednn_threads` (`packing_threads`). With
    `onednn_off` (why), the graph is generated without oneDNN; with `gemm_templates_off` (why), without timing its
    GEMMs against Inductor's templates. The directory is replaced whole, only on success."""
    import torch

    if onednn_off:
        flags = dataclasses.replace(flags, onednn=False)
    if gemm_templates_off:
        flags = dataclasses.replace(flags, gemm_autotune=False)

    staging = out_dir.with_name(out_dir.name + ".new")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    entry.import_op_modules(traced.op_modules, "codegen")
    program = internals.load_program(traced.program)
    program_weights = {**program.state_dict, **program.constants}
    with tempfile.TemporaryDirectory(prefix="shimgen-codegen-") as tmp:
        package = Path(tmp) / "model.pt2"
        try:
            # Inference: without no_grad, freezing skips oneDNN weight prepacking and conv/linear fusion;
            # with oneDNN off, Inductor keeps aten GEMMs/convolutions and fuses the epilogues itself.
            per_device = _cuda_codegen(Path(tmp)) if devices.device(target.device).gpu else _cpu_codegen(vec_isas)
            with (
                torch.no_grad(),
                torch.backends.mkldnn.flags(enabled=uses_onednn(target, flags), allow_tf32=None),
                _quiet_autotuning(),
                per_device,
                _state_not_folded(),
                _scalar_folds_kept_apart(),
                _folded_at_threads(onednn_threads),
                _templates_compiled_once(),
                fake_prop.incremental(),
                kernel_choice.recorded(target.device, locked, retune, flags.max_autotune or flags.tma) as recording,
                refit.recorded(program_weights) as refitting,
            ):
                _refuse_unquotable_cache_dir()
                torch._inductor.aoti_compile_and_package(
                    program,
                    package_path=str(package),
                    inductor_configs=inductor_configs(target, flags, cxx, vectorize=not scalar_kernels),
                )
        except UserError:
            raise
        except Exception as exc:  # Inductor raises many types; all mean "this graph cannot be compiled"
            refused = cause(exc, user_triton.UserKernelError)
            if isinstance(refused, user_triton.UserKernelError):
                raise UserError(refused.message) from None
            failed = f"{type(exc).__name__}: {failure(str(exc))}"
            if uses_gemm_templates(flags):
                raise TemplatesFailed(failed) from exc
            raise UserError(f"Inductor could not compile the graph: {failed}") from exc
        files, ptx = _extract(package)
    _refuse_specialized(program, uses_onednn(target, flags))
    interface, model, kernels = split_wrapper(files[".wrapper.cpp"].decode(), flags.split, KERNEL_FILE_BYTES)
    for k, text in enumerate(kernels):
        if not devices.device(target.device).gpu:
            text = openmp.serial_fast_paths(openmp.gemm_threads_from_caller(text))
        (staging / f"kernels_{k}.cpp").write_text(text)
    (staging / "interface.cpp").write_text(interface)
    (staging / "model.cpp").write_text(model_source(model))
    (staging / "weights.o").write_bytes(files[".weights.o"])
    constants = weights.mark_plain(weights.parse_constants(model), program_weights)
    weights.write_constants(constants, staging / "constants.json")
    derived = [c for c in constants if not c.plain and not c.from_folded]
    (staging / "refit.json").write_text(json.dumps(refitting.program(derived, program_weights), sort_keys=True) + "\n")
    if flags.weights_apart:
        weights.write_from_blob(constants, files.get(".wrapper_weights.blob", b""), staging / "weights.safetensors")
    extern = json.loads(files[".wrapper.json"]) if ".wrapper.json" in files else {}
    called = proxy_executor.ops_called(extern)
    if called:
        proxy_executor.extern_nodes(extern)  # refuses here what the binding could not call
        (staging / "extern_nodes.json").write_bytes(files[".wrapper.json"])
    ptx_names, triton_names = (
        _write_cuda_kernels(model, ptx, staging) if devices.device(target.device).gpu else ([], [])
    )
    defines, args = compile_flags(json.loads(files[".wrapper_compile_flags.json"]), target)
    replace_dir(staging, out_dir)
    return CodegenResult(
        key=key,
        interface=out_dir / "interface.cpp",
        model=out_dir / "model.cpp",
        kernels=tuple(out_dir / f"kernels_{k}.cpp" for k in range(len(kernels))),
        weights=out_dir / "weights.o",
        ptx=tuple(out_dir / name for name in ptx_names),
        triton=tuple(out_dir / "triton" / name for name in triton_names),
        defines=tuple(defines),
        inductor_args=tuple(args),
        out_nodes=traced.out_nodes,
        num_outputs=traced.num_outputs,
        kernel_choices=kernel_choice.merged(recording.choices),
        untimed_gemms=tuple(recording.untimed.items()),
        extern_nodes=out_dir / "extern_nodes.json" if called else None,
        run_time_modules=custom_ops.run_time_modules(called, ops, traced.op_modules),
        autotune_timings=recording.timings,
        constants=out_dir / "constants.json",
        refit=out_dir / "refit.json",
        weights_file=out_dir / "weights.safetensors" if flags.weights_apart else None,
        weights_digest=traced.weights,
        unused_weights=tuple(weights.unused_weights(constants, program_weights)),
        state=traced.state,
        scalar_kernels=scalar_kernels,
        packed_threads=onednn_threads if any(c.layout == "_mkldnn" for c in constants) else None,
        onednn_off=onednn_off,
        gemm_templates_off=gemm_templates_off,
    )


class TemplatesFailed(UserError):
    """Inductor failed on a graph whose GEMMs had its templates as candidates (flags.gemm_autotune). Its C++ GEMM
    template fails on some epilogues that the library kernels take (a linear layer's output viewed 3-D, in
    transformers' LeViT), so the graph is generated again without them."""

    def __init__(self, failure: str) -> None:
        super().__init__(f"Inductor could not compile the graph: {failure}")
        self.failure = failure


def uses_gemm_templates(flags: Flags) -> bool:
    """Whether Inductor's GEMM templates are timed by `gemm_autotune` alone; with max_autotune or tma the user asked for
    them."""
    return flags.gemm_autotune and not (flags.max_autotune or flags.tma)


def _write_cuda_kernels(model: str, ptx: dict[str, bytes], out_dir: Path) -> tuple[list[str], list[str]]:
    """The PTX files and Triton sources written, by file name."""
    wanted = set(re.findall(r"loadKernel\(__(\w+)_start,", model))
    if wanted - set(ptx):
        raise compat.changed(f"Inductor left no PTX for kernels {', '.join(sorted(wanted - set(ptx)))}")
    for name in sorted(wanted):
        (out_dir / f"{name}.ptx").write_bytes(ptx[name])
    (out_dir / "triton").mkdir()
    triton = []
    for name, source in TRITON_SOURCE.findall(model):
        (out_dir / "triton" / f"{name}.py").write_text(textwrap.dedent(source))
        triton.append(f"{name}.py")
    return [f"{name}.ptx" for name in sorted(wanted)], sorted(set(triton))


@contextmanager
def _cuda_codegen(tmp: Path) -> Iterator[None]:
    with _private_inductor_cache(tmp), scalar_host_kernels(), user_triton.guarded(), _short_kernel_names():
        yield


@contextmanager
def scalar_host_kernels() -> Iterator[None]:
    """A CUDA graph's host code is compiled for baseline x86-64 (compile_flags), so any CPU kernel such a graph has is
    generated scalar, not for the build machine's vector ISA. This also skips Inductor's ISA check, which compiles and
    loads test programs (AMX, AVX512-BF16): with torch 2.11 each load imports torch in a new interpreter, 26 s of every
    graph's codegen on the H100 machine."""
    from torch._inductor import cpu_vec_isa

    with mock.patch.object(cpu_vec_isa, "valid_vec_isa_list", lambda: []):
        yield


FUSED_NAME_LIMIT = 96


def short_fused_name(name: str) -> str:
    """A fused kernel's descriptive name cut to FUSED_NAME_LIMIT characters; the kernel's number that Inductor appends
    keeps names unique."""
    return name if len(name) <= FUSED_NAME_LIMIT else name[:FUSED_NAME_LIMIT].rstrip("_")


@contextmanager
def _short_kernel_names() -> Iterator[None]:
    """Inductor names a Triton kernel after every op fused into it (its kernel_name_max_ops is never applied): a
    decoder's rotary-embedding kernel gets a 230-character name, and nvcc, which writes `<name>.ptx` into a temporary
    file of a longer name when it makes the fatbin, fails (the file name is over 255 bytes)."""
    from torch._inductor.codegen import triton as triton_codegen

    named = triton_codegen.get_fused_kernel_name

    def shortened(*args: Any, **kwargs: Any) -> str:
        return short_fused_name(named(*args, **kwargs))

    with mock.patch.object(triton_codegen, "get_fused_kernel_name", shortened):
        yield


# What a shell splits, expands or globs: Inductor runs the compiler through a command line that it does not quote.
_SHELL_CHARACTERS = frozenset(" \t\n'\"\\$`;&|<>()*?")


def _refuse_unquotable_cache_dir() -> None:
    """Inductor compiles the weights (and, on CPU, GEMM candidates) in its cache directory: where that path holds a
    space or a shell character, every compile fails with a linker error naming a path cut in two."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    path = cache_dir()
    found = sorted({c for c in path if c in _SHELL_CHARACTERS})
    if found:
        raise UserError(
            f"Inductor's cache directory {path!r} holds {', '.join(map(repr, found))}: Inductor runs the compiler "
            "through a command line it does not quote, so its compiles fail there. Set TORCHINDUCTOR_CACHE_DIR (or "
            "TMPDIR, where Inductor's default cache is) to a directory whose path has no spaces, quotes or shell "
            "characters"
        )


@contextmanager
def _private_inductor_cache(tmp: Path) -> Iterator[None]:
    """AOTInductor writes each CUDA kernel's PTX as <kernel name>.ptx into a cache directory keyed by the
    graph's Python code, which ignores shapes, and never overwrites a file there: a graph traced again with
    other shapes (a static and a dynamic batch, say) would package the other's kernels. So CUDA codegen
    gets a fresh Inductor cache; Triton's compile cache stays shared."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    triton_cache = os.environ.get("TRITON_CACHE_DIR") or os.path.join(cache_dir(), "triton", "0")
    with mock.patch.dict(
        os.environ, {"TRITON_CACHE_DIR": triton_cache, "TORCHINDUCTOR_CACHE_DIR": str(tmp / "inductor")}
    ):
        yield


@contextmanager
def _state_not_folded() -> Iterator[None]:
    """Inductor's constant folding (at joint-graph time, and freezing's) takes every attribute of the graph module for a
    constant, also a buffer the graph mutates: `count.add_(1)` over a zero-initialized counter folds to 1 on every call
    (plain AOTInductor computes it so). A mutated attribute is state: its value is never known at build time."""
    from torch._inductor.constant_folding import ConstantFolder

    run_node = ConstantFolder.run_node

    def run_node_keeping_state(self: Any, node: Any) -> Any:
        if node.op == "get_attr" and trace.writes_into(node):
            return self.unknown_value
        return run_node(self, node)

    with mock.patch.object(ConstantFolder, "run_node", run_node_keeping_state):
        yield


@contextmanager
def _scalar_folds_kept_apart() -> Iterator[None]:
    """Freezing folds `conv(x) * 0.2` into the convolution's weights through a buffer that it registers under one fixed
    name, "other_tensor", so every scalar folded in the same pass takes the value of the last one: timm's
    Inception-ResNet-v2 (residual scales 0.17, 0.1, 0.2 and 1.0) computed 20% off eager. Each such buffer is
    registered again under a name of its own, which the folded graph reads."""
    from torch._inductor.fx_passes import freezing_patterns
    from torch.fx import Graph

    apply = freezing_patterns.binary_folding_pass.apply
    create_node = Graph.create_node

    def create_node_apart(self: Any, op: str, target: Any, *args: Any, **kwargs: Any) -> Any:
        if op == "get_attr" and target == "other_tensor":
            module = self.owning_module
            target = next(f"other_tensor_{k}" for k in itertools.count() if not hasattr(module, f"other_tensor_{k}"))
            module.register_buffer(target, module.other_tensor)
        return create_node(self, op, target, *args, **kwargs)

    def apply_apart(graph: Any) -> Any:
        with mock.patch.object(Graph, "create_node", create_node_apart):
            return apply(graph)

    with mock.patch.object(freezing_patterns.binary_folding_pass, "apply", apply_apart):
        yield


@contextmanager
def _folded_at_threads(threads: int | None) -> Iterator[None]:
    """Freezing's constant folding packs weights for oneDNN, which picks a packed layout by the threads it would run,
    and repacks at every call a weight packed for other threads (ResNet-18 at batch 1 on 2 cores: 61 ms a call packed
    at 1 thread, 39 ms at 2). The codegen worker runs fewer threads (1 while CPU GEMMs are timed), so folding runs at
    the package's."""
    if threads is None:
        yield
        return
    import torch
    from torch._inductor.constant_folding import ConstantFolder

    run = ConstantFolder.run

    def run_at_threads(self: Any, *args: Any, **kwargs: Any) -> Any:
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            return run(self, *args, **kwargs)
        finally:
            torch.set_num_threads(before)

    with mock.patch.object(ConstantFolder, "run", run_at_threads):
        yield


_COMPILED_TEMPLATES: dict[str, Any] = {}


@contextmanager
def _templates_compiled_once() -> Iterator[None]:
    """Inductor compiles a kernel template's Jinja source in a new Environment each time it renders one: the C++ GEMM
    template's five sources, twice per GEMM (as a candidate and as the chosen kernel). Compiled once per source
    instead, the templates render the same text; this was 40% of a small MLP's codegen."""
    from torch._inductor.codegen.common import KernelTemplate

    compile_template = KernelTemplate._template_from_string

    def compiled_once(source: str) -> Any:
        if source not in _COMPILED_TEMPLATES:
            _COMPILED_TEMPLATES[source] = compile_template(source)
        return _COMPILED_TEMPLATES[source]

    with mock.patch.object(KernelTemplate, "_template_from_string", staticmethod(compiled_once)):
        yield


@contextmanager
def _cpu_codegen(vec_isas: Path | None) -> Iterator[None]:
    # A CUDA build of torch on a machine without CUDA's runtime logs where it guessed CUDA_HOME when Inductor's C++
    # builder imports torch.utils.cpp_extension: nothing a CPU target uses.
    cpp_extension_log = logging.getLogger("torch.utils.cpp_extension")
    level = cpp_extension_log.level
    cpp_extension_log.setLevel(logging.ERROR)
    try:
        with (
            _parallel_only_with_enough_work(),
            _tiled_atomic_adds_indexed_once(),
            _vec_isas_kept(vec_isas) if vec_isas else nullcontext(),
        ):
            yield
    finally:
        cpp_extension_log.setLevel(level)


@contextmanager
def _tiled_atomic_adds_indexed_once() -> Iterator[None]:
    """Inductor before torch 2.14 (pytorch/pytorch#191837): a CPU kernel tiled in two dimensions that scatters with
    atomic adds (a fold's col2im, an index_put that accumulates; atomic at more than one thread) applies the tile's
    inner offset to the index twice, and writes out of bounds: timm's VOLO corrupted the heap at every call. Where
    Inductor lacks the fix (its CppKernel._use_parallel_atomic_add), its fix: such a store goes to the vectorized
    store with the index untransformed, which that store transforms once."""
    from torch._inductor import config
    from torch._inductor.codegen.cpp import CppKernel, CppTile2DKernel, CppVecKernel

    if hasattr(CppKernel, "_use_parallel_atomic_add"):
        yield
        return
    store = CppTile2DKernel.store

    def store_indexed_once(self: Any, name: str, index: Any, value: Any, mode: Any = None) -> Any:
        parallel = config.cpp.dynamic_threads or self.num_threads != 1
        if mode == "atomic_add" and parallel and not self.need_vec_transpose(self.rename_indexing(index)):
            return CppVecKernel.store(self, name, index, value, mode)
        return store(self, name, index, value, mode)

    with mock.patch.object(CppTile2DKernel, "store", store_indexed_once):
        yield


@contextmanager
def _vec_isas_kept(record: Path) -> Iterator[None]:
    """Inductor's check of which vector ISAs the compiler and CPU support compiles and loads a test program for each
    of VNNI, AVX512-BF16 and AMX (with torch 2.11 and 2.12 each load imports torch in a new interpreter: about 25 s of
    every CPU graph's codegen on an AMX machine). Its answer is kept in `record` (per compiler, torch and CPU) by the
    first codegen, and later ones take it from there."""
    import torch
    from torch._inductor import cpu_vec_isa

    supported = getattr(cpu_vec_isa, "supported_vec_isa_list", [])
    answered = getattr(cpu_vec_isa.valid_vec_isa_list, "cache_info", None)
    kept = _kept_vec_isas(record, {str(isa): isa for isa in supported})
    if kept is None or answered is None:
        before = answered().currsize if answered else 1
        yield
        if answered and not before and answered().currsize:  # answered here, under the build's compiler
            found = [{"isa": str(isa), "state": _plain_state(isa)} for isa in cpu_vec_isa.valid_vec_isa_list()]
            write_if_changed(record, json.dumps(found, sort_keys=True))
        return
    valid = []
    for isa, state in kept:
        vars(isa).update(state)
        valid.append(isa)
    names = {str(isa) for isa in valid}
    if any("amx" in name for name in names):
        torch.cpu._init_amx()  # what the check would have done: AMX kernels timed here need the kernel's permission
    checks = {
        cls
        for isa in supported
        for cls in type(isa).__mro__
        if "__bool__" in vars(cls) and issubclass(cls, cpu_vec_isa.VecISA)
    }
    with ExitStack() as stack:
        stack.enter_context(mock.patch.object(cpu_vec_isa, "valid_vec_isa_list", lambda: list(valid)))
        for cls in checks:
            stack.enter_context(mock.patch.object(cls, "__bool__", lambda self: str(self) in names))
        yield


def _kept_vec_isas(record: Path, by_name: dict[str, Any]) -> list[tuple[Any, dict[str, Any]]] | None:
    """The ISAs `record` holds, each with the state its check set; None where there is no such record."""
    try:
        kept = json.loads(record.read_text())
        found = [(by_name[item["isa"]], dict(item["state"])) for item in kept]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return found


def _plain_state(isa: Any) -> dict[str, Any]:
    """What an ISA's check set on it (`_is_avx512_bf16_supported`, say) that JSON keeps."""
    return {k: v for k, v in vars(isa).items() if isinstance(v, (bool, int, float, str))}


@contextmanager
def _parallel_only_with_enough_work() -> Iterator[None]:
    """With cpp.dynamic_threads, Inductor gives every CPU kernel an OpenMP region, however little work it has, and
    leaves the rest to the OpenMP runtime; libgomp then wakes a team for a 64-element copy (3 us instead of 1 per call of a
    tiny graph at 2 threads, milliseconds on a busy machine). Inductor's own rule decides instead: a loop runs in
    parallel where its work at the traced sizes is enough for the threads, as without dynamic threads; the regions
    that remain still take the caller's team."""
    from torch._inductor import config
    from torch._inductor.codegen.cpp import CppKernel

    decide = CppKernel.decide_parallel_depth

    def decide_by_work(self: Any, max_parallel_depth: Any, threads: int) -> Any:
        with config.patch({"cpp.dynamic_threads": False}):
            return decide(self, max_parallel_depth, threads)

    with mock.patch.object(CppKernel, "decide_parallel_depth", decide_by_work):
        yield


@contextmanager
def _quiet_autotuning() -> Iterator[None]:
    """Autotuning logs a traceback for every candidate kernel that fails to compile or run (too much
    shared memory, say) and then drops it; the build is fine, so users need not see them. Nor the JSON of each
    selection's timings that torch >= 2.13 writes to stderr: the build summary lists the choices, nor torch 2.13's
    warning that its own GEMM autotuning uses a deprecated storage API."""
    import torch._inductor.config as inductor_config

    loggers = [
        logging.getLogger(name) for name in ("torch._inductor.select_algorithm", "torch._inductor.autotune_process")
    ]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    stats = (
        {"max_autotune_report_choices_stats": False}
        if hasattr(inductor_config, "max_autotune_report_choices_stats")
        else {}
    )
    try:
        with inductor_config.patch(stats), warnings.catch_warnings():
            warnings.filterwarnings("ignore", "TypedStorage is deprecated", UserWarning)
            yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def _extract(package: Path) -> tuple[dict[str, bytes], dict[str, bytes]]:
    """The wrapper's files by suffix, and the CUDA kernels' PTX by kernel name."""
    found: dict[str, bytes] = {}
    ptx: dict[str, bytes] = {}
    with zipfile.ZipFile(package) as zf:
        for name in zf.namelist():
            if name.endswith(".ptx"):
                ptx[Path(name).stem] = zf.read(name)
            for suffix in (
                ".wrapper.cpp",
                ".wrapper_compile_flags.json",
                ".weights.o",
                ".wrapper.json",
                ".wrapper_weights.blob",
            ):
                if name.endswith(suffix):
                    if suffix in found:
                        raise UserError(f"Inductor produced more than one {suffix} ({name}); unsupported graph")
                    found[suffix] = zf.read(name)
    missing = {".wrapper.cpp", ".wrapper_compile_flags.json", ".weights.o"} - set(found)
    if missing:
        raise compat.changed(f"Inductor's package layout changed (its output lacks {', '.join(sorted(missing))})")
    return found, ptx


def split_wrapper(text: str, parts: int, least_bytes: int = 0) -> tuple[str, str, list[str]]:
    """(interface, model, kernel files): the kernels dealt into at most `parts` files of similar size, and no more
    files than give each `least_bytes` of source."""
    # Drop Inductor's trailing "// g++ ..." notes: they hold build-machine temp paths.
    text = re.sub(r"\n// (Compile cmd|Link cmd|\S*(g\+\+|c\+\+|clang\+\+) )[^\n]*", "", text).rstrip() + "\n"
    # Inductor's messages hold Python reprs with the object's address (`<function fn at 0x7f...>`), new in every
    # process.
    text = re.sub(r" at 0x[0-9a-f]+>", ">", text)
    end = text.find(INTERFACE_END)
    if end < 0:
        raise compat.changed(
            "Inductor's wrapper.cpp changed (no runtime interface block ending in '} // extern \"C\"')"
        )
    end += len(INTERFACE_END)
    interface, rest = text[:end], text[end:]
    includes = "".join(line + "\n" for line in interface.splitlines() if line.startswith("#include"))
    model, *kernels = rest.split(KERNEL_START + "\n")
    kernels = [KERNEL_START + "\n" + k for k in kernels]
    total = sum(map(len, kernels))
    count = min(parts, len(kernels), max(1, total // least_bytes) if least_bytes else parts)
    bins: list[list[int]] = [[] for _ in range(count)]
    sizes = [0] * len(bins)
    for k in sorted(range(len(kernels)), key=lambda k: -len(kernels[k])):  # largest first, into the emptiest file
        emptiest = sizes.index(min(sizes))
        bins[emptiest].append(k)
        sizes[emptiest] += len(kernels[k])
    return interface, includes + model, ["".join(kernels[k] for k in sorted(b)) for b in bins]


# Inductor emits some C shim calls as bare statements, their error code dropped: torch 2.11 calls the proxy executor
# (the ops the model runs through the dispatcher) that way, so an op that raised went unnoticed and the model ran on
# with the op's outputs unset; torch 2.13 still clones a constant returned as an output that way.
_STATEMENT_CALL = re.compile(r"^(\s*)((\w+)\(.*\));$", re.MULTILINE)


@functools.cache
def _shim_functions_returning_errors() -> frozenset[str]:
    """The C shim functions that return an AOTITorchError, as the running torch's headers declare them (some return
    void or a value, and must not be checked)."""
    import torch

    csrc = Path(torch.__file__).parent / "include" / "torch" / "csrc"
    headers = [h for folder in ("inductor/aoti_torch", "stable") for h in (csrc / folder).rglob("*.h")]
    return frozenset(
        name for h in headers for name in re.findall(r"AOTITorchError\s+(\w+)\s*\(", h.read_text(errors="replace"))
    )


def model_source(model: str) -> str:
    """A graph's model.cpp: Inductor's model code, with the model base class declared as compiled elsewhere (after
    Inductor's includes, before its first use), every C shim call's error checked and, at its end, where Inductor's
    model class is complete, the description of its constants for the binding (load_weights)."""
    checked = _shim_functions_returning_errors()

    def check(call: re.Match[str]) -> str:
        whole = call[2].count("(") == call[2].count(")")  # not the end of a check opened on the line before
        return f"{call[1]}AOTI_TORCH_ERROR_CODE_CHECK({call[2]});" if call[3] in checked and whole else call[0]

    model = _STATEMENT_CALL.sub(check, model)
    lines = model.splitlines(keepends=True)
    k = next((k for k, line in enumerate(lines) if line.strip() and not line.startswith("#include")), len(lines))
    return (
        "".join(lines[:k])
        + '#include "shimgen_model_base.h"\n'
        + "".join(lines[k:])
        + '\n#include "shimgen_model_constants.h"\n'
    )


def shared_interface(texts: dict[str, str]) -> str:
    """The runtime interface for every graph of a target, from each graph's interface.cpp (by unit name).

    The interface is the same text for every graph after the device headers it starts with: Inductor includes one
    per device the graph computes on, and a graph that computes partly on the CPU (a mask made with torch.zeros and
    moved to the GPU, say) includes the CPU's too. The shared interface includes every graph's headers."""
    headers: dict[str, None] = {}
    bodies: dict[str, list[str]] = {}
    for unit in sorted(texts):
        lines = texts[unit].splitlines(keepends=True)
        k = next((k for k, line in enumerate(lines) if line.strip() and not line.startswith("#include")), len(lines))
        headers.update(dict.fromkeys(sorted(line for line in lines[:k] if line.strip())))
        bodies.setdefault("".join(lines[k:]), []).append(unit)
    if len(bodies) != 1:
        groups = "; ".join(", ".join(units) for units in bodies.values())
        raise compat.changed(f"Inductor emitted different runtime interfaces for graphs of one target ({groups})")
    return "\n" + "".join(sorted(headers)) + next(iter(bodies))


def compile_flags(flags_json: dict[str, Any], target: Target) -> tuple[list[str], list[str]]:
    """(defines, compile args) of Inductor's code from its compile-flags JSON, for the spec's target."""
    defines = [
        d.strip() for d in flags_json["definitions"] if d.strip() and d.strip() != "TORCH_INDUCTOR_PRECOMPILE_HEADERS"
    ]
    # Inductor's math flags decide numerics (e.g. -ffp-contract=off); keep them, drop opt/debug/warning/ISA choices.
    drop = re.compile(r"^(O\d|Os|g\d?|march=.*|std=.*|W.*|pedantic|fPIC|shared|fopenmp|DNDEBUG)$")
    args = [f"-{c}" for c in flags_json["cflags"] if not drop.match(c)]
    if devices.device(target.device).gpu:
        # The host side of a CUDA graph is glue code: baseline x86-64, portable like the fatbins.
        args += [
            f"-I{d}" for d in flags_json["include_dirs"] if "torch/include" not in d and "python" not in d
        ]  # CUDA's headers
        return [d for d in defines if not d.startswith("CPU_CAPABILITY")], args
    if target.isa == "native":
        args.append("-march=native")
        args += [a for p in flags_json.get("passthrough_args", []) for a in p.split()]
    elif target.isa is not None:
        _, isa_args, capability = ISA_FLAGS[target.isa]
        args += isa_args
        defines = [d for d in defines if not d.startswith("CPU_CAPABILITY")]
        if capability:
            defines.append(capability)
    return defines, args


_TRACEBACK_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\w+)\n[ \t]*(\S[^\n]*)')


def failure(text: str) -> str:
    """Inductor's error as a user reads it: without the graph node it was running and torch's hints that follow, but
    with the line of the model that node came from (the last frame of the traceback Inductor appends)."""
    error, _, node = text.partition("\nWhile executing %")
    frames = _TRACEBACK_FRAME.findall(node)
    if not frames:
        return _first_lines(error)
    file, line, function, code = frames[-1]
    return f"{_first_lines(error)}\n(from {Path(file).name}:{line}, in {function}: {code.strip()})"


def _first_lines(text: str, n: int = 6) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return "\n".join(lines[:n]) + ("\n..." if len(lines) > n else "")
