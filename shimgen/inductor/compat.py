"""What shimgen relies on in torch's and Inductor's internals, checked on the running torch before the first trace or
codegen of a process: a torch that changed one of them is refused by name, never built with wrongly.

Each requirement is a private thing that shimgen/inductor/ uses, patches or whose generated text it edits: that it
exists, that a patched function still takes the parameters its replacement takes, the Inductor config keys codegen
sets, and, where cheap, a probe of the behaviour relied on (the C++ GEMM template still holds the text
openmp.gemm_threads_from_caller edits). Checks are per stage: a trace needs none of Inductor.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from shimgen.errors import UserError

TRACE = "trace"
CODEGEN = "codegen"


@dataclass(frozen=True)
class Requirement:
    what: str  # named for the message: "Inductor's PersistentCache.lookup"
    stage: str  # TRACE or CODEGEN: the stage that uses it
    probe: Callable[[], str | None]  # what is wrong with it on this torch; None when it is as shimgen expects


class _Missing(Exception):
    pass


def _resolve(module: str, path: str) -> Any:
    try:
        found: Any = importlib.import_module(module)
    except ModuleNotFoundError:
        raise _Missing(f"module {module} is gone") from None
    except ImportError as exc:
        raise _Missing(f"module {module} does not import ({exc})") from None
    for part in path.split(".") if path else []:
        if not hasattr(found, part):
            raise _Missing(f"{module} has no {path}")
        found = getattr(found, part)
    return found


def _attribute(
    module: str, path: str, params: tuple[str, ...] | None = None, exact: bool = False, static: bool = False
) -> Callable[[], str | None]:
    """A probe that `module.path` exists; with `params`, that its signature starts with those parameters (is exactly
    them with `exact`: shimgen's replacement takes no others); with `static`, that it is a staticmethod."""

    def probe() -> str | None:
        try:
            found = _resolve(module, path)
        except _Missing as exc:
            return str(exc)
        if static:
            owner, _, name = path.rpartition(".")
            if not isinstance(inspect.getattr_static(_resolve(module, owner), name, None), staticmethod):
                return f"{path} is no longer a staticmethod"
        if params is not None:
            try:
                have = tuple(inspect.signature(found).parameters)
            except (TypeError, ValueError):
                return f"{path} has no inspectable signature"
            if (have != params) if exact else (have[: len(params)] != params):
                return (
                    f"{path} takes ({', '.join(have)}), shimgen expects ({', '.join(params)}{'' if exact else ', ...'})"
                )
        return None

    return probe


def _operator(namespace: str, name: str) -> Callable[[], str | None]:
    """A probe that torch has the operator `namespace::name`."""

    def probe() -> str | None:
        import torch

        return None if hasattr(getattr(torch.ops, namespace), name) else f"torch has no operator {namespace}::{name}"

    return probe


def _either(first: Callable[[], str | None], second: Callable[[], str | None]) -> Callable[[], str | None]:
    """A probe that passes where either of two does (two forms a torch may have); else the first's problem."""

    def probe() -> str | None:
        problem = first()
        return None if problem is None or second() is None else problem

    return probe


def _source_holds(module: str, path: str, *texts: str) -> Callable[[], str | None]:
    """A probe that the source (or string value) of `module.path` holds each of `texts`: text Inductor generates
    from it that shimgen edits or reads."""

    def probe() -> str | None:
        try:
            found = _resolve(module, path)
        except _Missing as exc:
            return str(exc)
        try:
            text = found if isinstance(found, str) else inspect.getsource(found)
        except (OSError, TypeError):
            return f"the source of {path or module} is not available"
        lost = [t for t in texts if t not in text]
        return f"{path or module} no longer holds {', '.join(map(repr, lost))}" if lost else None

    return probe


def _config_keys() -> str | None:
    from torch._inductor import config

    from shimgen.inductor.codegen import CONFIG_KEYS

    known = config.get_config_copy()
    gone = [k for k in CONFIG_KEYS if k not in known]
    return f"no config key {', '.join(gone)}" if gone else None


def _schema_marks_writes() -> str | None:
    import torch

    from shimgen.inductor.internals import node_schema

    schema: Any = node_schema(torch.ops.aten.add_.Tensor)
    try:
        written = schema.arguments[0].alias_info.is_write
    except AttributeError:
        written = False
    return None if written else "an OpOverload's _schema no longer marks aten::add_'s self as written"


def _serialized_names() -> str | None:
    import torch
    from torch._export.serde import serialize

    try:
        ok = (
            serialize._SERIALIZE_TO_TORCH_DTYPE[serialize.ScalarType.FLOAT] == torch.float32
            and serialize._SERIALIZE_TO_TORCH_LAYOUT[serialize.Layout.Strided] == torch.strided
            and serialize._SERIALIZE_TO_TORCH_MEMORY_FORMAT[serialize.MemoryFormat.ContiguousFormat]
            == torch.contiguous_format
        )
    except (AttributeError, KeyError):
        ok = False
    return (
        None
        if ok
        else "torch._export.serde.serialize's _SERIALIZE_TO_TORCH_{DTYPE,LAYOUT,MEMORY_FORMAT} tables changed"
    )


def _example_sizes() -> str | None:
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    from shimgen.inductor.internals import example_sizes

    try:
        ok = isinstance(example_sizes(ShapeEnv()), dict)
    except AttributeError:
        ok = False
    return None if ok else "torch's ShapeEnv keeps its example sizes in neither backed_var_to_val nor var_to_val"


def _escapes_backslashes() -> str | None:
    from packaging.version import Version
    from torch._inductor.codegen import wrapper

    from shimgen.inductor.user_triton import doubles_backslashes

    if Version(torch_version()) >= Version("2.13") and not doubles_backslashes(wrapper):
        return "no longer found escaping backslashes in a user Triton kernel's source (pytorch#183433)"
    return None


_INDUCTOR = "torch._inductor"
REQUIREMENTS: tuple[Requirement, ...] = (
    # trace/ (through internals): pytree, export's config and saved archive, the op registry.
    Requirement("torch.utils._pytree", TRACE, _attribute("torch.utils._pytree", "tree_leaves")),
    Requirement("torch.utils._pytree's node registry", TRACE, _attribute("torch.utils._pytree", "SUPPORTED_NODES")),
    Requirement("torch.utils._pytree._get_node_type", TRACE, _attribute("torch.utils._pytree", "_get_node_type")),
    Requirement(
        "torch.utils._pytree.NodeDef",
        TRACE,
        _attribute("torch.utils._pytree", "NodeDef", ("type", "flatten_fn", "unflatten_fn", "flatten_with_keys_fn")),
    ),
    Requirement("torch.utils._pytree's key entries", TRACE, _attribute("torch.utils._pytree", "GetAttrKey", ("name",))),
    Requirement("torch.utils._pytree.MappingKey", TRACE, _attribute("torch.utils._pytree", "MappingKey", ("key",))),
    Requirement(
        "torch.fx's backed_size_oblivious config",
        TRACE,
        _attribute("torch.fx.experimental._config", "backed_size_oblivious"),
    ),
    Requirement("torch.fx.experimental._config.patch", TRACE, _attribute("torch.fx.experimental._config", "patch")),
    Requirement(
        "torch.export.save's archive holding the program as models/<name>.json",
        TRACE,
        _source_holds("torch.export.pt2_archive.constants", "MODELS_FILENAME_FORMAT", "models/{}.json"),
    ),
    Requirement("torch._C._get_schema", TRACE, _attribute("torch._C", "_get_schema")),
    Requirement("torch._C._jit_get_all_schemas", TRACE, _attribute("torch._C", "_jit_get_all_schemas")),
    Requirement(
        "torch._C._dispatch_has_kernel_for_dispatch_key",
        TRACE,
        _attribute("torch._C", "_dispatch_has_kernel_for_dispatch_key"),
    ),
    Requirement("torch._library.custom_ops.OPDEFS", TRACE, _attribute("torch._library.custom_ops", "OPDEFS")),
    Requirement(
        "torch._library's CustomOpDef._init_fn",
        TRACE,
        _source_holds("torch._library.custom_ops", "CustomOpDef.__init__", "self._init_fn"),
    ),
    Requirement("OpOverload._schema", TRACE, _schema_marks_writes),
    # codegen.py; compile_fx first: Inductor's modules import each other, and only in its order (cpp_gemm_template alone
    # fails).
    Requirement("Inductor's compile_fx", CODEGEN, _attribute(f"{_INDUCTOR}.compile_fx", "compile_fx")),
    Requirement(
        "torch._inductor.aoti_compile_and_package",
        CODEGEN,
        _attribute(_INDUCTOR, "aoti_compile_and_package", ("exported_program",)),
    ),
    Requirement("Inductor's config", CODEGEN, _config_keys),
    Requirement("Inductor's cache_dir", CODEGEN, _attribute(f"{_INDUCTOR}.runtime.cache_dir_utils", "cache_dir", ())),
    Requirement(
        "Inductor's pick_vec_isa choosing among valid_vec_isa_list()",
        CODEGEN,
        _source_holds(f"{_INDUCTOR}.cpu_vec_isa", "pick_vec_isa", "valid_vec_isa_list()", "return invalid_vec_isa"),
    ),
    # codegen._vec_isas_kept: the check's answer replayed (each ISA's own __bool__), AMX permission asked as it would
    Requirement(
        "Inductor's VecISA.__bool__", CODEGEN, _attribute(f"{_INDUCTOR}.cpu_vec_isa", "VecISA.__bool__", ("self",))
    ),
    Requirement("torch.cpu._init_amx", CODEGEN, _attribute("torch.cpu", "_init_amx", ())),
    Requirement(
        "Inductor's ConstantFolder.run_node",
        CODEGEN,
        _attribute(f"{_INDUCTOR}.constant_folding", "ConstantFolder.run_node", ("self", "node"), exact=True),
    ),
    Requirement(
        "Inductor's ConstantFolder.unknown_value",
        CODEGEN,
        _source_holds(f"{_INDUCTOR}.constant_folding", "ConstantFolder.__init__", "self.unknown_value"),
    ),
    # codegen._scalar_folds_kept_apart
    Requirement(
        "Inductor's freezing binary_folding_pass.apply",
        CODEGEN,
        _attribute(f"{_INDUCTOR}.fx_passes.freezing_patterns", "binary_folding_pass.apply", ("gm",), exact=True),
    ),
    Requirement(
        "torch.fx's Graph.create_node", CODEGEN, _attribute("torch.fx", "Graph.create_node", ("self", "op", "target"))
    ),
    Requirement(
        "Inductor's Triton kernel names (codegen.triton.get_fused_kernel_name)",
        CODEGEN,
        _attribute(f"{_INDUCTOR}.codegen.triton", "get_fused_kernel_name", ("node_schedule", "descriptive_names")),
    ),
    Requirement(
        "Inductor's KernelTemplate._template_from_string",
        CODEGEN,
        _attribute(
            f"{_INDUCTOR}.codegen.common", "KernelTemplate._template_from_string", ("source",), exact=True, static=True
        ),
    ),
    Requirement(
        "Inductor's CppKernel.decide_parallel_depth",
        CODEGEN,
        _attribute(
            f"{_INDUCTOR}.codegen.cpp",
            "CppKernel.decide_parallel_depth",
            ("self", "max_parallel_depth", "threads"),
            exact=True,
        ),
    ),
    Requirement(
        "Inductor's CppTile2DKernel.store",
        CODEGEN,
        _attribute(
            f"{_INDUCTOR}.codegen.cpp", "CppTile2DKernel.store", ("self", "name", "index", "value", "mode"), exact=True
        ),
    ),
    Requirement("Inductor's autotuning loggers", CODEGEN, _attribute(f"{_INDUCTOR}.autotune_process", "")),
    Requirement(
        "Inductor's C++ kernels (their include of cpp_prefix.h)",
        CODEGEN,
        _source_holds(f"{_INDUCTOR}.codegen.cpp_template", "", "#include <torch/csrc/inductor/cpp_prefix.h>"),
    ),
    # kernel_choice.py
    Requirement(
        "Inductor's AlgorithmSelectorCache.log_results",
        CODEGEN,
        _attribute(
            f"{_INDUCTOR}.select_algorithm",
            "AlgorithmSelectorCache.log_results",
            ("name", "input_nodes", "timings"),
            static=True,
        ),
    ),
    Requirement(
        "Inductor's ChoiceCaller.hash_key (the lockfile's key of a candidate)",
        CODEGEN,
        _attribute(f"{_INDUCTOR}.ir", "ChoiceCaller.hash_key", ("self",), exact=True),
    ),
    Requirement(
        "Inductor's ExternKernelCaller", CODEGEN, _attribute(f"{_INDUCTOR}.select_algorithm", "ExternKernelCaller")
    ),
    Requirement(
        "Inductor's PersistentCache.lookup",
        CODEGEN,
        _attribute(
            f"{_INDUCTOR}.codecache",
            "PersistentCache.lookup",
            ("self", "choices", "op", "inputs", "benchmark", "hint_override"),
            exact=True,
        ),
    ),
    Requirement(
        "Inductor's CacheBase.get_local_cache_path",
        CODEGEN,
        _attribute(f"{_INDUCTOR}.codecache", "CacheBase.get_local_cache_path", (), exact=True, static=True),
    ),
    Requirement("Inductor's V.graph", CODEGEN, _attribute(f"{_INDUCTOR}.virtualized", "V.graph")),
    Requirement(
        "Inductor's use_cpp_gemm_template (asked by its linear lowerings)",
        CODEGEN,
        _attribute(f"{_INDUCTOR}.mkldnn_lowerings", "use_cpp_gemm_template", ("layout", "mat1", "mat2")),
    ),
    Requirement(
        "Inductor's use_triton_template (asked by its GEMM lowerings)",
        CODEGEN,
        _attribute(f"{_INDUCTOR}.kernel.mm", "use_triton_template", ("layout",)),
    ),
    # refit.py
    Requirement(
        "Inductor's ConstantFolder.run", CODEGEN, _attribute(f"{_INDUCTOR}.constant_folding", "ConstantFolder.run")
    ),
    Requirement("Inductor's GraphLowering.run", CODEGEN, _attribute(f"{_INDUCTOR}.graph", "GraphLowering.run")),
    Requirement(
        "Inductor's GraphLowering.allocate_non_dup_const_name",
        CODEGEN,
        _attribute(f"{_INDUCTOR}.graph", "GraphLowering.allocate_non_dup_const_name", ("self", "name", "data")),
    ),
    Requirement(
        "Inductor's GraphLowering.get_attr",
        CODEGEN,
        _attribute(f"{_INDUCTOR}.graph", "GraphLowering.get_attr", ("self", "target", "args", "kwargs")),
    ),
    Requirement(
        "torch.utils.weak.WeakTensorKeyDictionary", CODEGEN, _attribute("torch.utils.weak", "WeakTensorKeyDictionary")
    ),
    Requirement("oneDNN's buffer size of a prepacked tensor", CODEGEN, _operator("mkldnn", "_nbytes")),
    Requirement("oneDNN's buffer of a prepacked tensor", CODEGEN, _operator("mkldnn", "data_ptr")),
    Requirement(
        "oneDNN's description of a prepacked tensor", CODEGEN, _operator("mkldnn", "_get_mkldnn_serialized_md")
    ),
    Requirement(
        "Inductor's SizeVarAllocator.optimization_hints",
        CODEGEN,
        _attribute(f"{_INDUCTOR}.sizevars", "SizeVarAllocator.optimization_hints", ("self", "exprs")),
    ),
    # user_triton.py
    Requirement(
        "Inductor's user_defined_triton_kernel_transitive_closure_source_code",
        CODEGEN,
        _attribute(
            f"{_INDUCTOR}.codegen.wrapper", "user_defined_triton_kernel_transitive_closure_source_code", ("kernel",)
        ),
    ),
    Requirement(
        "Inductor's PythonWrapperCodegen.define_user_defined_triton_kernel",
        CODEGEN,
        _attribute(
            f"{_INDUCTOR}.codegen.wrapper", "PythonWrapperCodegen.define_user_defined_triton_kernel", ("self", "kernel")
        ),
    ),
    Requirement(
        "torch's TracingTritonHOPifier.call_HOP",
        CODEGEN,
        _attribute(
            "torch._higher_order_ops.triton_kernel_wrap",
            "TracingTritonHOPifier.call_HOP",
            ("self", "variable", "grids", "combined_args"),
        ),
    ),
    Requirement(
        "torch's TracingTritonHOPifier.call_HOP calling triton_kernel_wrapper_mutation with TMA descriptor metadata",
        CODEGEN,
        _source_holds(
            "torch._higher_order_ops.triton_kernel_wrap",
            "TracingTritonHOPifier.call_HOP",
            "triton_kernel_wrapper_mutation(",
            "tma_descriptor_metadata=",
        ),
    ),
    Requirement(
        "torch's create_tma_stable_metadata",
        CODEGEN,
        _attribute("torch._higher_order_ops.triton_kernel_wrap", "create_tma_stable_metadata", ("block_shape",)),
    ),
    Requirement("Inductor's embedding of user Triton kernel sources", CODEGEN, _escapes_backslashes),
    # internals.load_program
    Requirement("torch's ShapeEnv example sizes", CODEGEN, _example_sizes),
    # proxy_executor.py
    Requirement("torch._export's serialized dtype, layout and memory format names", CODEGEN, _serialized_names),
    # openmp.py: the C++ GEMM template's text that gemm_threads_from_caller edits. Its parallel region is either a
    # worksharing loop over the partitions (torch >= 2.12) or a team told its size (torch 2.11).
    Requirement(
        "Inductor's C++ GEMM template",
        CODEGEN,
        _either(
            _source_holds(
                f"{_INDUCTOR}.codegen.cpp_gemm_template",
                "",
                "constexpr int64_t num_threads = {{num_threads}};",
                "mm_get_thread_blocking(num_threads,",
                "for (int64_t tid = 0; tid < {{num_threads}}; tid++)",
                "Kt_blocks * {{num_threads}} >=",
                "#pragma omp parallel\n",
            ),
            _source_holds(
                f"{_INDUCTOR}.codegen.cpp_gemm_template",
                "",
                "constexpr int64_t num_threads = {{num_threads}};",
                "mm_get_thread_blocking(num_threads,",
                "Kt_blocks * {{num_threads}} >=",
                "#pragma omp parallel num_threads({{num_threads}})",
            ),
        ),
    ),
)

_checked: set[str] = set()


def problems(stage: str) -> list[tuple[Requirement, str]]:
    """Each requirement of `stage` this torch does not meet, with what is wrong."""
    found = []
    for requirement in REQUIREMENTS:
        if requirement.stage == stage:
            try:
                problem = requirement.probe()
            except Exception as exc:  # a probe that fails outright: the thing it looks at changed shape
                problem = f"{type(exc).__name__}: {exc}"
            if problem:
                found.append((requirement, problem))
    return found


def check(stage: str) -> None:
    """Refuse this torch, by name, where it lacks something `stage` relies on; once per process and stage."""
    if stage in _checked:
        return
    wrong = problems(stage)
    if wrong:
        raise changed("; ".join(f"{requirement.what} changed ({problem})" for requirement, problem in wrong))
    _checked.add(stage)


def changed(what: str) -> UserError:
    """The error for a torch whose internals are not what shimgen relies on: `what` names the change."""
    return UserError(f"torch {torch_version()}: {what}; shimgen supports torch {supported_range()}")


def torch_version() -> str:
    try:
        return importlib.metadata.version("torch").split("+")[0]
    except importlib.metadata.PackageNotFoundError:
        return "(not installed)"


def supported_range() -> str:
    """pyproject's torch range, lower bounds first: '>=2.11,<2.15'."""
    from shimgen.toolchain import supported_torch

    return ",".join(sorted((str(s) for s in supported_torch()), key=lambda s: (not s.startswith(">"), s)))
