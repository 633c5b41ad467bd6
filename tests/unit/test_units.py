"""Fast unit tests of shimgen's pure functions: no C++ build, no torch.export, no torch import.

Inputs are modelled on what Inductor, Meson and ninja really produce (a wrapper cut from torch
2.13's AOTInductor output, its compile-flags JSON, ninja 1.13's failure log), and every test
asserts exact outputs or properties that a wrong implementation breaks.
"""

from __future__ import annotations

import array
import importlib
import json
import os
import pickle
import platform
import random
import re
import shutil
import subprocess
import sys
import time
import zipfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import jinja2
import pytest
import torch

from shimgen.build.meson import first_error as meson_first_error
from shimgen.build.meson import unit_name
from shimgen.build.process import Completed
from shimgen.errors import BuildError, UserError
from shimgen.files import write_if_changed
from shimgen.inductor.codegen import (
    FUSED_NAME_LIMIT,
    codegen_key,
    compile_flags,
    failure,
    inductor_configs,
    model_source,
    packing_threads,
    shared_interface,
    short_fused_name,
    split_wrapper,
    uses_onednn,
)
from shimgen.inductor.generated import LARGE_KERNEL_BYTES, large_kernels
from shimgen.inductor.kernel_choice import _keeping_input_layouts, locked_keys
from shimgen.inductor.openmp import gemm_threads_from_caller, serial_fast_paths
from shimgen.package import cpp as package_cpp
from shimgen.package import wheel as package_wheel
from shimgen.package.verify import Report
from shimgen.package.wheel import write_wheel
from shimgen.project import escape
from shimgen.project.render import PROBE_FILES, RUNTIME, TEMPLATES, _env, docstring, render_probe, target_id
from shimgen.results import DICT, LIST, NONE, OBJECT, TENSOR, TUPLE, OutNode, OutType, TraceResult
from shimgen.spec import Dim, Flags, Graph, Input, Target, load_spec
from shimgen.toolchain import Toolchain


def first_error(log: str, build: Path) -> str:
    """The head of the message a failed compile shows: the failing unit, then the compiler's error."""
    unit, text = meson_first_error(log, build)
    return f"compile failed{f' in {unit}' if unit else ''}:\n{text}"


# --- split_wrapper: Inductor's one wrapper.cpp cut into interface, model and kernel files ---------------------------

# Written as Inductor writes them (not taken from shimgen.inductor.codegen): the test is about Inductor's real text.
KERNEL_START = "#include <torch/csrc/inductor/cpp_prefix.h>\n"
INCLUDES = [
    "#include <torch/csrc/inductor/aoti_include/cpu.h>",
    "#include <torch/csrc/inductor/aoti_runtime/interface.h>",
    "#include <torch/csrc/inductor/aoti_runtime/model_container.h>",
    "#include <iostream>",
    "#include <vector>",
]
INTERFACE = (
    f"\n{INCLUDES[0]}\n// Definition of AOTI runtime interface functions\n\n{INCLUDES[1]}\n{INCLUDES[2]}\n\n{INCLUDES[3]}\n{INCLUDES[4]}\n\n"
    "static thread_local std::string g_aoti_last_error;\n\n"
    'extern "C" {\n'
    "AOTIRuntimeError AOTInductorModelContainerRun(AOTInductorModelContainerHandle container_handle) {\n"
    "  CONVERT_EXCEPTION_TO_ERROR_CODE({ run(container_handle); })\n"
    "}\n\n"
    '} // extern "C"\n'
)
# Inductor's notes on how it would have compiled the file itself: build-machine temp paths.
COMPILE_NOTES = (
    "// Compile cmd\n"
    "// g++ /tmp/torchinductor_root/cgffx4/cpzz4d.wrapper.cpp -D TORCH_INDUCTOR_CPP_WRAPPER -O3 -march=native "
    "-c -o /tmp/torchinductor_root/cgffx4/cpzz4d.wrapper.o\n"
    "// Link cmd\n"
    "// g++ /tmp/torchinductor_root/cgffx4/cpzz4d.wrapper.o -shared -fPIC -o /tmp/torchinductor_root/cgffx4/cpzz4d.wrapper.so  -ltorch \n"
    "// /usr/bin/clang++ /tmp/torchinductor_root/cgffx4/c5i72g.kernel.cpp -c -o /tmp/torchinductor_root/cgffx4/c5i72g.kernel.o\n"
)


def model_text(kernels: list[str]) -> str:
    """The model class: declarations of the kernels and a run_impl that calls them."""
    declarations = "".join(
        f'extern "C"  void  {k}(float* in_out_ptr0,\n                       const int64_t ks0);\n' for k in kernels
    )
    calls = "".join(f"    {k}((float*)(buf0.data_ptr()), s0);\n" for k in kernels)
    return (
        f"\n{declarations}CACHE_TORCH_DTYPE(float32);\nnamespace torch::aot_inductor {{\n"
        "// Shared constructor for AOTInductorModelCreate\n"
        f"void AOTInductorModel::run_impl(AtenTensorHandle* input_handles) {{\n{calls}}} // AOTInductorModel::run_impl\n"
        "} // namespace torch::aot_inductor\n\n\n\n\n\n"
    )


def kernel_text(name: str, statements: int) -> str:
    """One CPU kernel as Inductor appends it: its own include of cpp_prefix.h, then the function."""
    body = "".join(f"        in_out_ptr0[{i}] = std::max(in_out_ptr0[{i}], 0.0f);\n" for i in range(statements))
    return (
        f'{KERNEL_START}extern "C"  void  {name}(float* in_out_ptr0,\n                       const int64_t ks0)\n{{\n'
        f"    #pragma omp simd\n    {{\n{body}    }}\n}}\n\n"
    )


def wrapper(kernels: dict[str, int], notes: str = COMPILE_NOTES) -> str:
    return INTERFACE + model_text(list(kernels)) + "".join(kernel_text(k, n) for k, n in kernels.items()) + notes


def kernels_by_name(files: list[str]) -> dict[str, str]:
    """Every kernel of the kernel files by name; a kernel found twice fails."""
    found: dict[str, str] = {}
    for text in files:
        assert text.startswith(KERNEL_START), text[:80]
        for chunk in text.split(KERNEL_START)[1:]:
            (name,) = re.findall(r'^extern "C"\s+void\s+(\w+)\(', chunk)
            assert name not in found, f"kernel {name} is in two places"
            found[name] = KERNEL_START + chunk
    return found


KERNELS = {
    "cpp_fused_0": 40,
    "cpp_fused_relu_1": 5,
    "cpp_fused_add_2": 30,
    "cpp_fused_mul_3": 10,
    "cpp_fused_sigmoid_4": 20,
    "cpp_fused_exp_5": 25,
    "cpp_fused_cat_6": 3,
}


@pytest.mark.parametrize("parts", [1, 2, 3, 4, 7, 12])
def test_split_wrapper_keeps_every_kernel_exactly_once(parts: int) -> None:
    interface, model, files = split_wrapper(wrapper(KERNELS), parts)
    assert len(files) == min(parts, len(KERNELS))  # no empty kernel file
    found = kernels_by_name(files)
    assert sorted(found) == sorted(KERNELS)
    # Nothing lost, nothing changed: the pieces put back in order give the wrapper without Inductor's notes.
    clean = wrapper(KERNELS, notes="").rstrip() + "\n"
    assert interface + model.removeprefix("\n".join(INCLUDES) + "\n") + "".join(found[k] for k in KERNELS) == clean
    # Each file holds its kernels in the wrapper's order (stable diffs when one kernel changes).
    for text in files:
        names = re.findall(r'^extern "C"\s+void\s+(\w+)\(', text, re.M)
        assert names == [k for k in KERNELS if k in names]


@pytest.mark.parametrize("parts", [2, 3, 4])
def test_split_wrapper_balances_kernel_files(parts: int) -> None:
    _, _, files = split_wrapper(wrapper(KERNELS), parts)
    sizes = [len(text) for text in files]
    largest_kernel = max(len(text) for text in kernels_by_name(files).values())
    # Largest first into the emptiest file: no file outgrows another by more than one kernel.
    assert max(sizes) - min(sizes) <= largest_kernel, sizes


def test_split_wrapper_gives_a_dominant_kernel_a_file_of_its_own() -> None:
    """A round-robin or in-order split would pair the big kernel with small ones; balancing must not."""
    kernels = {"cpp_fused_big_0": 60, **{f"cpp_fused_small_{k}": 2 for k in range(1, 6)}}
    _, _, files = split_wrapper(wrapper(kernels), 2)
    groups = {frozenset(re.findall(r'^extern "C"\s+void\s+(\w+)\(', text, re.M)) for text in files}
    assert groups == {frozenset({"cpp_fused_big_0"}), frozenset(f"cpp_fused_small_{k}" for k in range(1, 6))}


@pytest.mark.parametrize("share, files", [(0.01, 4), (0.3, 3), (0.5, 2), (0.7, 1), (2.0, 1)])
def test_split_wrapper_gives_each_file_at_least_its_share_of_source(share: float, files: int) -> None:
    """Each kernel file costs the compiler a fixed start: no more files than give each `least_bytes`, `parts` at
    most."""
    text = wrapper(KERNELS)
    total = sum(len(k) for k in kernels_by_name(split_wrapper(text, 1)[2]).values())
    _, _, split = split_wrapper(text, 4, least_bytes=int(share * total))
    assert len(split) == files
    assert sorted(kernels_by_name(split)) == sorted(KERNELS)


# Inductor's error for transformers' DeepSeek-V3 with torch 2.11, as it came (the node's arguments shortened).
INDUCTOR_FAILURE = """AssertionError: Tensor dtype mismatch! Expected: torch.float32, Got: torch.int64

While executing %_assert_tensor_metadata_25 : [num_users=0] = call_function[target=torch.ops.aten._assert_tensor_metadata.default](args = (%view_43,))
Original traceback:
File "/work/main/shimgen/trace/export.py", line 317, in forward
    return output_tensors(call_model(self.model, graph, list(tensors)))
  File "/venv/transformers/models/deepseek_v3/modeling_deepseek_v3.py", line 231, in forward
    hidden_states = self.experts(hidden_states, topk_indices, topk_weights).view(*orig_shape)
  File "/venv/transformers/integrations/moe.py", line 573, in forward
    return experts_forward(self, *args, **kwargs)

Use tlparse to see full graph. (https://github.com/pytorch/tlparse?tab=readme-ov-file#tlparse-parse-structured-pt2-logs)
"""


def test_a_kernel_too_large_for_o3_is_found_in_its_file(tmp_path: Path) -> None:
    """The kernel file holding a kernel of LARGE_KERNEL_BYTES or more is set apart (it compiles at -O2), with the
    kernel's size; the others are not."""
    _, _, files = split_wrapper(wrapper({**KERNELS, "cpp_fused_scan_7": LARGE_KERNEL_BYTES // 60}), 2)
    paths = tuple(tmp_path / f"kernels_{i}.cpp" for i in range(len(files)))
    for path, text in zip(paths, files, strict=True):
        path.write_text(text)
    found = large_kernels(paths, "O3")
    assert [p for p, _ in found] == [p for p in paths if "cpp_fused_scan_7" in p.read_text()]
    assert LARGE_KERNEL_BYTES <= found[0][1] < LARGE_KERNEL_BYTES * 1.1
    assert large_kernels(tuple(p for p, _ in found[1:]), "O3") == []
    assert large_kernels(paths, "O2") == []  # -O2 and below need no exception


def test_inductor_failure_names_the_model_line_not_the_graph_node() -> None:
    assert failure(INDUCTOR_FAILURE) == (
        "AssertionError: Tensor dtype mismatch! Expected: torch.float32, Got: torch.int64\n"
        "(from moe.py:573, in forward: return experts_forward(self, *args, **kwargs))"
    )
    assert failure("RuntimeError: no kernel\nsecond line") == "RuntimeError: no kernel\nsecond line"


def test_model_source_checks_every_shim_call_that_returns_an_error() -> None:
    """torch 2.11 leaves the proxy executor's error code unchecked: an op's failure must stop the model's run. Shim
    functions that return void or a value stay as they are."""
    model = (
        "void run_impl(AOTIProxyExecutorHandle proxy_executor) {\n"
        "    aoti_torch_proxy_executor_call_function(proxy_executor, 0, 0, std::array<int64_t, 0>{}.data(), 2, t);\n"
        "    AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_proxy_executor_call_function(proxy_executor, 1, 0, i, 1, t));\n"
        "    aoti_torch_clone(constant0, &output_handles[0]);\n"
        "    aoti_torch_grad_mode_set_enabled(false);\n"
        "    kernel_0(buf0, buf1);\n"
        "    AOTI_TORCH_ERROR_CODE_CHECK(\n"
        "    aoti_torch_delete_tensor_object(buf2));\n"
        "}\n"
    )
    calls = [line.strip() for line in model_source(model).splitlines() if line.startswith("    ")]
    assert calls == [
        "AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_proxy_executor_call_function(proxy_executor, 0, 0, "
        "std::array<int64_t, 0>{}.data(), 2, t));",
        "AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_proxy_executor_call_function(proxy_executor, 1, 0, i, 1, t));",
        "AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_clone(constant0, &output_handles[0]));",
        "aoti_torch_grad_mode_set_enabled(false);",
        "kernel_0(buf0, buf1);",
        "AOTI_TORCH_ERROR_CODE_CHECK(",
        "aoti_torch_delete_tensor_object(buf2));",
    ]


def test_model_source_declares_the_prebuilt_model_base_before_its_first_use() -> None:
    _, model, _ = split_wrapper(wrapper(KERNELS), 4)
    source = model_source(model)
    lines = source.splitlines()
    base = lines.index('#include "shimgen_model_base.h"')
    assert all(line.startswith("#include") or not line.strip() for line in lines[:base])  # after Inductor's includes
    assert "AOTInductorModel" not in "\n".join(lines[:base])
    assert lines[-1] == '#include "shimgen_model_constants.h"'  # where Inductor's model class is complete
    assert (
        source.replace('#include "shimgen_model_base.h"\n', "").removesuffix('\n#include "shimgen_model_constants.h"\n')
        == model
    )


def test_split_wrapper_interface_and_model() -> None:
    interface, model, files = split_wrapper(wrapper(KERNELS), 4)
    # The interface is the wrapper up to and including the end of the extern "C" block, as it was.
    assert interface == INTERFACE and interface.endswith('} // extern "C"\n')
    # The model gets the interface's includes (it no longer follows them in one file), then the model class.
    assert model == "\n".join(INCLUDES) + "\n" + model_text(list(KERNELS))
    assert KERNEL_START not in model and "std::max" not in model
    assert "// Shared constructor for AOTInductorModelCreate" in model  # ordinary comments stay
    assert "// Definition of AOTI runtime interface functions" in interface
    for text in [interface, model, *files]:
        assert "torchinductor_root" not in text and "Compile cmd" not in text and "Link cmd" not in text


def test_split_wrapper_without_kernels() -> None:
    """A graph of extern calls only (a lone GEMM) has no kernel of its own: no kernel file, no notes left."""
    interface, model, files = split_wrapper(INTERFACE + model_text([]) + COMPILE_NOTES, 4)
    assert files == []
    assert interface == INTERFACE
    assert model == "\n".join(INCLUDES) + "\n" + model_text([]).rstrip() + "\n"


def test_split_wrapper_without_interface_block_is_a_user_error() -> None:
    text = wrapper(KERNELS).replace('} // extern "C"\n', "}\n")
    with pytest.raises(UserError, match="no runtime interface block"):
        split_wrapper(text, 4)


def test_shared_interface_includes_every_graphs_device_headers() -> None:
    """A CUDA graph that computes partly on the CPU includes the CPU's header too (in either order); its interface is
    the others' all the same."""
    cuda = INTERFACE.replace("aoti_include/cpu.h", "aoti_include/cuda.h")
    both = INTERFACE.replace(INCLUDES[0], INCLUDES[0].replace("cpu", "cuda") + "\n" + INCLUDES[0])
    assert shared_interface({"forward_cpu": INTERFACE}) == INTERFACE  # one graph: its own text
    merged = shared_interface({"forward_cuda": both, "forward_cuda__batch1": cuda})
    assert merged == INTERFACE.replace(INCLUDES[0], INCLUDES[0] + "\n" + INCLUDES[0].replace("cpu", "cuda"))
    assert merged == shared_interface({"b": cuda, "a": both.replace("#include", "\n#include", 1)})


def test_shared_interface_refuses_interfaces_that_differ_past_their_headers() -> None:
    other = INTERFACE.replace("run(container_handle);", "run(container_handle, 1);")
    with pytest.raises(UserError, match=r"different runtime interfaces for graphs of one target \(a, c; b\)"):
        shared_interface({"a": INTERFACE, "b": other, "c": INTERFACE})


# --- compile flags: Inductor's flags JSON → the defines and arguments of the kernel translation units ----------------


def flags_json(capability: str, passthrough: str, include_dirs: list[str] | None = None) -> dict[str, Any]:
    """A wrapper_compile_flags.json as torch 2.13 writes it on a machine with `capability`."""
    return {
        "compiler": "g++",
        "definitions": [
            "TORCH_INDUCTOR_CPP_WRAPPER",
            "STANDALONE_TORCH_HEADER",
            "TORCH_INDUCTOR_PRECOMPILE_HEADERS",
            " C10_USING_CUSTOM_GENERATED_MACROS",
            "",
            capability,
        ],
        "include_dirs": include_dirs
        or [
            "/usr/include/python3.11",
            "/venv/lib/python3.11/site-packages/torch/include",
            "/venv/lib/python3.11/site-packages/torch/include/torch/csrc/api/include",
        ],
        "cflags": [
            "O3",
            "DNDEBUG",
            "fno-omit-frame-pointer",
            "g1",
            "fno-trapping-math",
            "funsafe-math-optimizations",
            "ffinite-math-only",
            "fno-signed-zeros",
            "fno-finite-math-only",
            "fno-unsafe-math-optimizations",
            "fmath-errno",
            "ffp-contract=off",
            "fexcess-precision=fast",
            "fno-tree-loop-vectorize",
            "march=native",
            "fPIC",
            "Wall",
            "std=c++20",
            "Wno-unused-variable",
            "Wno-unknown-pragmas",
            "pedantic",
            "fopenmp",
        ],
        "ldflags": [],
        "libraries_dirs": [],
        "libraries": [],
        "passthrough_args": ["", passthrough],
        "aot_mode": True,
        "use_relative_path": False,
        "compile_only": True,
    }


AVX2_MACHINE = flags_json("CPU_CAPABILITY_AVX2", "-mavx2 -mfma -mf16c")
AVX512_MACHINE = flags_json("CPU_CAPABILITY_AVX512", "-mavx512f -mavx512dq -mavx512vl -mavx512bw -mfma")
DEFINES = ["TORCH_INDUCTOR_CPP_WRAPPER", "STANDALONE_TORCH_HEADER", "C10_USING_CUSTOM_GENERATED_MACROS"]
# Inductor's math flags, in its order: they decide numerics, and a later flag overrides an earlier one
# (-fno-finite-math-only after -ffinite-math-only), so order is part of the result.
MATH = [
    "-fno-omit-frame-pointer",
    "-fno-trapping-math",
    "-funsafe-math-optimizations",
    "-ffinite-math-only",
    "-fno-signed-zeros",
    "-fno-finite-math-only",
    "-fno-unsafe-math-optimizations",
    "-fmath-errno",
    "-ffp-contract=off",
    "-fexcess-precision=fast",
    "-fno-tree-loop-vectorize",
]


def test_native_cpu_keeps_this_machines_isa() -> None:
    defines, args = compile_flags(AVX2_MACHINE, Target(device="cpu", isa="native"))
    assert defines == [*DEFINES, "CPU_CAPABILITY_AVX2"]
    assert args == [*MATH, "-march=native", "-mavx2", "-mfma", "-mf16c"]


@pytest.mark.parametrize("machine", [AVX2_MACHINE, AVX512_MACHINE], ids=["built-on-avx2", "built-on-avx512"])
@pytest.mark.parametrize(
    "isa,isa_args,capability",
    [
        ("avx2", ["-march=x86-64-v3"], ["CPU_CAPABILITY_AVX2"]),
        ("avx512", ["-march=x86-64-v4", "-mfma"], ["CPU_CAPABILITY_AVX512"]),
        ("default", ["-march=x86-64"], []),
    ],
)
def test_portable_cpu_isa_comes_from_the_spec_not_the_machine(
    machine: dict[str, Any], isa: str, isa_args: list[str], capability: list[str]
) -> None:
    defines, args = compile_flags(machine, Target(device="cpu", isa=isa))
    assert defines == [*DEFINES, *capability]
    assert args == [*MATH, *isa_args]


def test_cuda_host_code_gets_no_cpu_isa_and_cudas_headers() -> None:
    machine = flags_json(
        "CPU_CAPABILITY_AVX512",
        "-mavx512f -mfma",
        include_dirs=[
            "/usr/include/python3.11",
            "/venv/lib/python3.11/site-packages/torch/include",
            "/venv/lib/python3.11/site-packages/torch/include/torch/csrc/api/include",
            "/usr/local/cuda-13.0/include",
        ],
    )
    defines, args = compile_flags(machine, Target(device="cuda", archs=["sm_90"]))
    assert defines == DEFINES
    assert args == [*MATH, "-I/usr/local/cuda-13.0/include"]


def test_a_spec_cpu_target_without_isa_compiles_native(tmp_path: Path) -> None:
    spec = tmp_path / "spec.toml"
    spec.write_text(
        '[project]\nname = "demo"\n\n[[graph]]\nname = "forward"\nentry = "models.mlp:mlp"\n'
        'inputs = [{ name = "x", shape = [2, 32] }]\n\n[[target]]\ndevice = "cpu"\n'
    )
    (target,) = load_spec(spec).target
    assert compile_flags(AVX2_MACHINE, target) == compile_flags(AVX2_MACHINE, Target(device="cpu", isa="native"))


# --- inductor_configs: spec target and flags → Inductor settings -----------------------------------------------------

CUDA = Target(device="cuda", archs=["sm_90"])


def test_configs_every_graph_gets() -> None:
    for target in (Target(device="cpu", isa="native"), Target(device="cpu", isa="avx2"), CUDA):
        configs = inductor_configs(target, Flags(freezing=False, max_autotune=False), "/usr/bin/g++")
        assert configs["aot_inductor.package_cpp_only"] is True
        assert configs["aot_inductor.precompile_headers"] is False
        assert configs["cpp.vec_isa_ok"] is True  # no ISA probe: the spec's target picks the ISA
        assert configs["freezing"] is False and configs["max_autotune"] is False
        assert configs["cpp.cxx"] == (None, "/usr/bin/g++")
    assert "cpp.cxx" not in inductor_configs(CUDA, Flags())


@pytest.mark.parametrize(
    "isa,onednn,simdlen",
    [
        ("native", True, None),
        ("native", False, None),
        ("avx2", True, 256),
        ("avx512", True, 512),
        ("default", True, 1),
    ],
)
def test_cpu_configs(isa: str, onednn: bool, simdlen: int | None) -> None:
    target = Target(device="cpu", isa=isa)
    configs = inductor_configs(target, Flags(onednn=onednn))
    # oneDNN's and MKL's packed weights are laid out for the build machine's CPU: native only.
    assert uses_onednn(target, Flags(onednn=onednn)) is (onednn and isa == "native")
    assert configs["cpp.weight_prepack"] is True  # Inductor offers its C++ GEMM template only with prepacking on
    assert configs.get("cpp.simdlen") == simdlen
    assert configs["cpp.dynamic_threads"] is True  # OpenMP teams sized by the caller's torch.set_num_threads
    assert configs["cpp.threads"] >= 2  # GEMM templates get a parallel region, partitioned at run time
    # Every GEMM timed on the build machine: Inductor's C++ template against ATen (and oneDNN where prepacked).
    assert configs["max_autotune_gemm"] is True and configs["max_autotune_gemm_backends"] == "CPP,ATEN"
    assert not {k for k in configs if "kernel_binary" in k or "multi_arch" in k}


def test_onednn_weights_are_packed_for_the_targets_threads_else_those_of_the_planning_process() -> None:
    native = Target(device="cpu", isa="native", threads=3)
    assert packing_threads(native, Flags()) == 3
    assert packing_threads(replace(native, threads=None), Flags()) == torch.get_num_threads()
    # Nothing is packed for oneDNN without freezing, for a portable ISA or on a GPU.
    assert packing_threads(native, Flags(freezing=False)) is None
    assert packing_threads(native, Flags(onednn=False)) is None
    assert packing_threads(replace(native, isa="avx2"), Flags()) is None
    assert packing_threads(CUDA, Flags()) is None


def test_cpu_configs_without_gemm_autotune() -> None:
    configs = inductor_configs(Target(device="cpu", isa="native"), Flags(gemm_autotune=False))
    assert not {k for k in configs if k.startswith("max_autotune_")}
    assert configs["cpp.weight_prepack"] is True  # for oneDNN
    assert inductor_configs(Target(device="cpu", isa="avx2"), Flags(gemm_autotune=False))["cpp.weight_prepack"] is False


def test_cuda_configs_default_autotune_gemms_only() -> None:
    configs = inductor_configs(CUDA, Flags())
    assert configs["aot_inductor.embed_kernel_binary"] is True
    assert configs["aot_inductor.emit_multi_arch_kernel"] is True
    assert configs["max_autotune_gemm"] is True and configs["max_autotune_conv_backends"] == "ATEN"
    assert configs["max_autotune"] is False
    assert "cpp.weight_prepack" not in configs and "cpp.simdlen" not in configs  # CPU-only settings
    assert not {k for k in configs if "tma" in k or "regex" in k}


def test_cuda_configs_follow_gemm_autotune_and_max_autotune() -> None:
    off = inductor_configs(CUDA, Flags(gemm_autotune=False))
    assert "max_autotune_gemm" not in off and "max_autotune_conv_backends" not in off
    # max_autotune times every choice, convolutions included: no GEMM-only switch, no restriction to ATen.
    full = inductor_configs(CUDA, Flags(max_autotune=True))
    assert full["max_autotune"] is True
    assert "max_autotune_gemm" not in full and "max_autotune_conv_backends" not in full


def test_cuda_tma_configs_leave_only_the_persistent_tma_template() -> None:
    configs = inductor_configs(CUDA, Flags(tma=True))
    assert configs["max_autotune"] is True
    assert configs["max_autotune_gemm_backends"] == "TRITON"
    assert configs["triton.enable_persistent_tma_matmul"] is True
    keep = re.compile(configs["test_configs.autotune_choice_name_regex"])
    # Choice names as Inductor's select_algorithm makes them: triton_<template name>_<index>.
    assert keep.search("triton_mm_persistent_tma_0") and keep.search("triton_mm_persistent_tma_17")
    assert not keep.search("triton_mm_3") and not keep.search("triton_bmm_12")


# --- the first compile error in a ninja log ---------------------------------------------------------------------------

BINDING_OBJECT = "_forward_cpu.cpython-311-x86_64-linux-gnu.so.p/src_forward_cpu_binding.cpp.o"
MODEL_OBJECT = "_forward_cpu.cpython-311-x86_64-linux-gnu.so.p/src_forward_cpu_model.cpp.o"


def compile_command(obj: str, source: str) -> str:
    return (
        f"/usr/bin/c++ -I_forward_cpu.cpython-311-x86_64-linux-gnu.so.p -I. -I../project -I../project/src -fvisibility=hidden "
        f"-fdiagnostics-color=always -DNDEBUG -std=c++20 -O1 -fPIC -fopenmp -DTORCH_INDUCTOR_CPP_WRAPPER -ffp-contract=off "
        f"-march=native -MD -MQ {obj} -MF {obj}.d -o {obj} -c ../project/{source}"
    )


BINDING_ERROR = [
    "../project/src/forward_cpu/binding.cpp:12:5: error: 'run_model' was not declared in this scope",
    "   12 |     run_model(inputs);",
    "      |     ^~~~~~~~~",
]


def ninja_log(failed: str, model_fails_too: bool = False) -> str:
    """binding.cpp fails to compile; with `model_fails_too`, model.cpp also fails under -j2, after it.
    `failed` is ninja's FAILED line for an output, in the format of one ninja version."""
    lines = [
        "ninja: Entering directory `/home/u/out/build/mlp/meson'",
        "[shimgen 1/6] Compiling C++ object libforward_cpu_kernels.a.p/src_forward_cpu_kernels_0.cpp.o",
        "[shimgen 2/6] Compiling C++ object libforward_cpu_kernels.a.p/src_forward_cpu_kernels_1.cpp.o",
        "[shimgen 3/6] Compiling C++ object " + BINDING_OBJECT,
        failed.format(BINDING_OBJECT),
        compile_command(BINDING_OBJECT, "src/forward_cpu/binding.cpp"),
        "../project/src/forward_cpu/binding.cpp: In function 'PyObject* forward_call(PyObject*, PyObject*)':",
        *BINDING_ERROR,
        "[shimgen 4/6] Compiling C++ object " + MODEL_OBJECT,
    ]
    if model_fails_too:
        lines += [
            failed.format(MODEL_OBJECT),
            compile_command(MODEL_OBJECT, "src/forward_cpu/model.cpp"),
            "../project/src/forward_cpu/model.cpp:7:1: error: expected unqualified-id before '}' token",
        ]
    return "\n".join([*lines, "ninja: build stopped: subcommand failed."]) + "\n"


NINJA_FAILED_LINES = pytest.mark.parametrize(
    "failed", ["FAILED: [code=1] {} ", "FAILED: {} "], ids=["ninja-1.13", "ninja-1.12"]
)


@NINJA_FAILED_LINES
def test_first_error_names_the_failing_unit_and_its_error(
    failed: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    message = first_error(ninja_log(failed), tmp_path / "build" / "mlp" / "meson")
    # The source file (not the object), relative to where the user ran shimgen; then the compiler's
    # error with its source excerpt; ninja's status lines, its FAILED line and the command left out.
    assert message.splitlines() == [
        "compile failed in build/mlp/project/src/forward_cpu/binding.cpp:",
        *BINDING_ERROR,
        "ninja: build stopped: subcommand failed.",
    ]


@NINJA_FAILED_LINES
def test_first_error_of_several_failing_units_is_the_first(
    failed: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    lines = first_error(ninja_log(failed, model_fails_too=True), tmp_path / "build" / "mlp" / "meson").splitlines()
    assert lines[0] == "compile failed in build/mlp/project/src/forward_cpu/binding.cpp:"
    assert lines[1:4] == BINDING_ERROR


def test_first_error_stops_at_the_next_failed_unit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    message = first_error(ninja_log("FAILED: [code=1] {} ", model_fails_too=True), tmp_path / "build" / "mlp" / "meson")
    assert "FAILED" not in message and "model.cpp" not in message, message


def test_first_error_without_an_error_line_gives_the_logs_tail(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A compiler killed from outside (out of memory) prints nothing; the unit and the end of the log are what there is."""
    monkeypatch.chdir(tmp_path)
    log_lines = ["ninja: Entering directory `/home/u/out/build/mlp/meson'"]
    log_lines += [
        f"[shimgen {k}/40] Compiling C++ object libforward_cpu_kernels.a.p/src_forward_cpu_kernels_{k}.cpp.o"
        for k in range(1, 31)
    ]
    log_lines += [
        f"FAILED: [code=137] {MODEL_OBJECT} ",
        compile_command(MODEL_OBJECT, "src/forward_cpu/model.cpp"),
        "ninja: build stopped: subcommand failed.",
    ]
    message = first_error("\n".join(log_lines) + "\n", tmp_path / "build" / "mlp" / "meson")
    header, *tail = message.splitlines()
    assert header == "compile failed in build/mlp/project/src/forward_cpu/model.cpp:"
    assert tail == log_lines[-len(tail) :] and len(tail) < len(log_lines)
    assert tail[-3].startswith("FAILED:") and tail[-1] == "ninja: build stopped: subcommand failed."


@pytest.mark.parametrize(
    "description,unit",
    [
        (
            "Compiling C++ object _forward_cpu.cpython-311-x86_64-linux-gnu.so.p/src_forward_cpu_model.cpp.o",
            "src_forward_cpu_model.cpp",
        ),
        (
            "Compiling C++ object libforward_cpu_kernels.a.p/src_forward_cpu_kernels_0.cpp.o",
            "src_forward_cpu_kernels_0.cpp",
        ),
        ("Linking target _forward_cpu.cpython-311-x86_64-linux-gnu.so", "_forward_cpu.cpython-311-x86_64-linux-gnu.so"),
        ("Linking static target libforward_cpu_kernels.a", "libforward_cpu_kernels.a"),
        # .ninja_log names outputs, not descriptions
        ("_forward_cpu.cpython-311-x86_64-linux-gnu.so.p/src_forward_cpu_binding.cpp.o", "src_forward_cpu_binding.cpp"),
        ("", ""),
    ],
)
def test_unit_name(description: str, unit: str) -> None:
    assert unit_name(description) == unit


# --- render helpers
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "target,expected",
    [
        (Target(device="cpu", isa="native"), "cpu-native"),
        (Target(device="cpu", isa="avx2"), "cpu-avx2"),
        (Target(device="cpu", isa="default"), "cpu-default"),
        (Target(device="cuda", archs=["sm_90"]), "cuda-sm_90"),
        (Target(device="cuda", archs=["sm_80", "sm_90a"]), "cuda-sm_80-sm_90a"),
    ],
)
def test_target_id(target: Target, expected: str) -> None:
    assert target_id(target) == expected
    assert escape.plain(expected) == expected  # templates print it unquoted inside literals


def node(kind: int, arity: int = 0, key: str | int | None = None, out_type: OutType | None = None) -> OutNode:
    return OutNode(kind=kind, arity=arity, key=key, type=out_type)


PROJECT_TYPE = "is defined in the project, which the package does not import"
PAIR = OutType(
    module="models.outputs",
    qualname="Pair",
    fields=("scaled", "shifted"),
    dropped=(),
    construct=None,
    fallback="namedtuple",
    reason=PROJECT_TYPE,
)
STATS = OutType(
    module="models.outputs",
    qualname="Stats",
    fields=("mean", "spread"),
    dropped=("mask",),
    construct=None,
    fallback="dict",
    reason=PROJECT_TYPE,
)
TOPK = OutType(
    module="torch.return_types",
    qualname="topk",
    fields=("values", "indices"),
    dropped=(),
    construct="sequence",
    fallback="namedtuple",
)


def test_docstring_of_a_graph_with_keyword_layout_and_dims() -> None:
    graph = Graph(
        name="heads",
        entry="models.heads:Heads",
        inputs=[
            Input(name="x", shape=["batch", 32]),
            Input(name="img", shape=["batch", 3, 8, 8], dtype="float16", memory_format="channels_last"),
            Input(name="scale", shape=[32], keyword=True),
        ],
        dims={"batch": Dim(min=1, max=16)},
    )
    out_nodes = [node(DICT, 2), node(TENSOR, key="logits"), node(TUPLE, 2, key="stats"), node(TENSOR), node(TENSOR)]
    assert docstring(graph, out_nodes) == "\n".join(
        [
            "heads(x, img, *, scale)",
            "",
            "Inputs (checked on every call):",
            "  x: float32[batch, 32]",
            "  img: float16[batch, 3, 8, 8], channels_last",
            "  scale: float32[32]",
            "Dynamic dims:",
            "  batch: 1..16",
            "Returns: {'logits': Tensor, 'stats': (Tensor, Tensor)}",
        ]
    )


def test_docstring_of_a_static_graph_returning_a_tensor() -> None:
    graph = Graph(name="f", entry="m:f", inputs=[Input(name="a", shape=[4], dtype="int64")])
    assert docstring(graph, [node(TENSOR)]) == "f(a)\n\nInputs (checked on every call):\n  a: int64[4]\nReturns: Tensor"


def test_docstring_says_how_threads_are_chosen() -> None:
    graph = Graph(name="f", entry="m:f", inputs=[Input(name="a", shape=[4])])
    threads, calls, returns = docstring(graph, [node(TENSOR)], instances=3, cpu=True).splitlines()[-3:]
    assert returns == "Returns: Tensor"
    assert threads.startswith("Threads: ") and "torch.set_num_threads" in threads
    assert calls.startswith("Calls from 3 Python threads run at once")
    assert "Threads:" not in docstring(graph, [node(TENSOR)], instances=1)
    packed = docstring(graph, [node(TENSOR)], cpu=True, packed_threads=4).splitlines()[-2]
    assert packed.startswith("oneDNN's weights are packed for 4 threads")


def test_docstring_of_one_object_output_says_what_comes_back_on_the_same_line() -> None:
    graph = Graph(name="pair", entry="models.outputs:pair", inputs=[Input(name="x", shape=[5, 16])])
    returns = docstring(
        graph, [node(OBJECT, 2, out_type=PAIR), node(TENSOR, key="scaled"), node(TENSOR, key="shifted")]
    ).splitlines()[-1]
    assert returns == (
        "Returns: Pair(scaled: Tensor, shifted: Tensor): a namedtuple Pair of the same fields "
        f"(models.outputs.Pair {PROJECT_TYPE})"
    )


def test_docstring_of_nested_objects_notes_each_type_once() -> None:
    graph = Graph(name="nested", entry="models.outputs:nested", inputs=[Input(name="x", shape=[4, 16])])
    out_nodes = [
        node(DICT, 5),
        node(OBJECT, 2, "stats", STATS),
        node(TENSOR, key="mean"),
        node(TENSOR, key="spread"),
        node(LIST, 3, "list"),
        node(TENSOR),
        node(NONE),
        node(TUPLE, 1),
        node(TENSOR),
        node(OBJECT, 2, "top", TOPK),
        node(TENSOR, key="values"),
        node(TENSOR, key="indices"),
        node(OBJECT, 2, "again", STATS),
        node(TENSOR, key="mean"),
        node(TENSOR, key="spread"),
        node(TENSOR, key=7),
    ]
    returns = docstring(graph, out_nodes).split("Returns: ")[1].splitlines()
    assert returns == [
        "{'stats': Stats(mean: Tensor, spread: Tensor), 'list': [Tensor, None, (Tensor,)], 'top': topk(values: Tensor, indices: Tensor), "
        "'again': Stats(mean: Tensor, spread: Tensor), 7: Tensor}",
        f"  Stats: a dict in field order (models.outputs.Stats {PROJECT_TYPE})",
        "  topk: a torch.return_types.topk when that is importable, else a namedtuple topk of the same fields",
    ]


# --- write_if_changed ----------------------------------------------------------------------------------------------


def test_write_if_changed_creates_the_file_and_its_directories(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "model.cpp"
    assert write_if_changed(path, "int x;\n") is True
    assert path.read_bytes() == b"int x;\n"


def test_write_if_changed_leaves_equal_content_untouched(tmp_path: Path) -> None:
    path = tmp_path / "model.cpp"
    path.write_text("int é;\n", encoding="utf-8")
    os.utime(path, ns=(1_000_000_000_000_000_000, 1_000_000_000_000_000_000))  # an old mtime, so a rewrite would show
    before = path.stat()
    assert write_if_changed(path, "int é;\n") is False
    assert write_if_changed(path, "int é;\n".encode()) is False  # the same bytes, given as bytes
    after = path.stat()
    assert (after.st_mtime_ns, after.st_ino) == (before.st_mtime_ns, before.st_ino)
    assert [p.name for p in tmp_path.iterdir()] == ["model.cpp"]


def test_write_if_changed_replaces_changed_content_atomically(tmp_path: Path) -> None:
    path = tmp_path / "model.cpp"
    path.write_text("int x;\n")
    assert write_if_changed(path, b"int y;\n") is True
    assert path.read_bytes() == b"int y;\n"
    assert [p.name for p in tmp_path.iterdir()] == ["model.cpp"]  # no temporary file left beside it


# --- write_wheel: reproducible members, deflated only where that pays
# --------------------------------------------------


def float_bytes(count: int, seed: int) -> bytes:
    """`count` float32 values drawn like initialised weights (normal, std 0.02): what a model's weights look like."""
    rng = random.Random(seed)
    return array.array("f", (rng.gauss(0.0, 0.02) for _ in range(count))).tobytes()


def wheel_members() -> dict[str, tuple[bytes, bool]]:
    code = "".join(f"def f{k}(x):\n    return x * {k} + {k % 7}\n\n" for k in range(4000)).encode()
    weights = float_bytes(600_000, 0)  # 2.4 MB: more than the 1 MiB sample, so it is sampled in pieces
    assert len(code) > 60_000
    return {
        "pkg/__init__.py": (code, False),
        # An extension module with compiled-in weights: code (deflates well) first, then the weights; its first MiB
        # alone would say deflate (to 88%), although nearly all of it is float data (the whole deflates to 91%).
        "pkg/_model.cpython-311-x86_64-linux-gnu.so": (code[:60_000] + weights, True),
        "pkg/weights.bin": (float_bytes(100_000, 1), False),
        "pkg/zeros.safetensors": (bytes(300_000), False),  # compresses to nothing, stored all the same
        "pkg-0.1.dist-info/METADATA": (b"Metadata-Version: 2.1\nName: pkg\nVersion: 0.1\n", False),
        "pkg-0.1.dist-info/WHEEL": (b"Wheel-Version: 1.0\nRoot-Is-Purelib: false\n", False),
        "pkg-0.1.dist-info/RECORD": (b"stale,,\n", False),  # regenerated
    }


def test_write_wheel_stores_float_data_and_deflates_text(tmp_path: Path) -> None:
    members = wheel_members()
    write_wheel(tmp_path / "pkg.whl", members, 315532800)
    with zipfile.ZipFile(tmp_path / "pkg.whl") as zf:
        infos = {info.filename: info for info in zf.infolist()}
        assert list(infos) == [
            *sorted(n for n in members if n.startswith("pkg/")),
            "pkg-0.1.dist-info/METADATA",
            "pkg-0.1.dist-info/WHEEL",
            "pkg-0.1.dist-info/RECORD",
        ]
        assert {name: info.compress_type for name, info in infos.items()} == {
            "pkg/__init__.py": zipfile.ZIP_DEFLATED,
            "pkg/_model.cpython-311-x86_64-linux-gnu.so": zipfile.ZIP_STORED,
            "pkg/weights.bin": zipfile.ZIP_STORED,
            "pkg/zeros.safetensors": zipfile.ZIP_STORED,
            "pkg-0.1.dist-info/METADATA": zipfile.ZIP_DEFLATED,
            "pkg-0.1.dist-info/WHEEL": zipfile.ZIP_STORED,  # 42 bytes that deflate would make longer
            "pkg-0.1.dist-info/RECORD": zipfile.ZIP_DEFLATED,
        }
        assert infos["pkg/__init__.py"].compress_size < infos["pkg/__init__.py"].file_size / 5
        for name, (data, executable) in members.items():
            if not name.endswith("RECORD"):
                assert zf.read(name) == data, name
                assert infos[name].external_attr >> 16 & 0o777 == (0o755 if executable else 0o644), name
        assert zf.read("pkg-0.1.dist-info/RECORD").decode().splitlines()[-1] == "pkg-0.1.dist-info/RECORD,,"
        assert zf.testzip() is None


def test_cpp_archive_stores_weights_deflates_the_rest_and_unpacks_with_tar(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    members = {
        name.replace("pkg/", "lib/pkg/"): data
        for name, (data, _) in wheel_members().items()
        if not name.startswith("pkg-0.1.dist-info")
    }
    for name, data in members.items():
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_bytes(data)
    archive = package_cpp.pack(tree, "pkg-cpp", 315532800)
    assert archive == package_cpp.pack(tree, "pkg-cpp", 315532800)
    code = members["lib/pkg/__init__.py"]
    stored = sum(len(data) for name, data in members.items() if not name.endswith("__init__.py"))
    assert stored < len(archive) < stored + len(code) // 4  # the weights as they are, the code deflated
    (tmp_path / "pkg.tar.gz").write_bytes(archive)
    unpacked = tmp_path / "unpacked"
    unpacked.mkdir()
    subprocess.run(["tar", "-xzf", str(tmp_path / "pkg.tar.gz"), "-C", str(unpacked)], check=True)
    for name, data in members.items():
        assert (unpacked / "pkg-cpp" / name).read_bytes() == data, name


def test_write_wheel_of_the_same_members_is_byte_identical(tmp_path: Path) -> None:
    members = wheel_members()
    write_wheel(tmp_path / "a.whl", members, 315532800)
    write_wheel(tmp_path / "b.whl", dict(reversed(members.items())), 315532800)  # the order given does not matter
    assert (tmp_path / "a.whl").read_bytes() == (tmp_path / "b.whl").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.whl", "b.whl"]  # no temporary file left beside them


def _staged_wheel(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A wheel in a temporary directory, its package staged beside `site`, and `site` holding an earlier package."""
    wheel, staging, site = tmp_path / "tmp" / "pkg-0.1-py3-none-any.whl", tmp_path / "site.new", tmp_path / "site"
    wheel.parent.mkdir()
    (tmp_path / "dist").mkdir()
    write_wheel(wheel, wheel_members(), 315532800)
    (staging / "pkg").mkdir(parents=True)
    (site / "pkg").mkdir(parents=True)
    (site / "pkg" / "earlier").write_text("the last good build")
    return wheel, staging, site


def test_the_package_is_installed_once_its_check_and_the_work_beside_it_passed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wheel, staging, site = _staged_wheel(tmp_path)
    seen: list[str] = []
    monkeypatch.setattr(package_wheel, "_check", lambda *args: seen.append("check") or Report())
    installed = package_wheel._install(
        wheel, staging, tmp_path / "dist", site, "pkg", "key", (), None, beside=lambda tree, _: seen.append(str(tree))
    )
    assert sorted(seen) == sorted(["check", str(staging)])
    assert installed.wheel == tmp_path / "dist" / wheel.name and installed.wheel.is_file()
    assert not (site / "pkg" / "earlier").exists() and not staging.exists()


def test_a_failure_beside_the_check_leaves_the_last_package_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wheel, staging, site = _staged_wheel(tmp_path)
    monkeypatch.setattr(package_wheel, "_check", lambda *args: Report())

    def beside(tree: Path, weights_file: Path | None) -> None:
        raise UserError("the C++ package does not load")

    with pytest.raises(UserError, match="package does not load"):
        package_wheel._install(wheel, staging, tmp_path / "dist", site, "pkg", "key", (), None, beside=beside)
    assert (site / "pkg" / "earlier").is_file() and not staging.exists() and not any((tmp_path / "dist").iterdir())


def test_a_failed_check_waits_for_the_work_beside_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wheel, staging, site = _staged_wheel(tmp_path)
    finished = []

    def check(*args: Any) -> Report:
        raise UserError("the built package 'pkg' does not import")

    def beside(tree: Path, weights_file: Path | None) -> None:
        time.sleep(0.2)
        finished.append(tree)

    monkeypatch.setattr(package_wheel, "_check", check)
    with pytest.raises(UserError, match="does not import"):
        package_wheel._install(wheel, staging, tmp_path / "dist", site, "pkg", "key", (), None, beside=beside)
    assert finished == [staging]  # done before the error reached the caller, who then discards what it made
    assert (site / "pkg" / "earlier").is_file()


# --- templates
# ---------------------------------------------------------------------------------------------------------


def test_every_template_refuses_a_missing_variable() -> None:
    """StrictUndefined: a variable the caller forgot fails the render instead of printing nothing."""
    env = _env()
    assert env.undefined is jinja2.StrictUndefined
    names = sorted(str(p.relative_to(TEMPLATES)) for p in TEMPLATES.rglob("*.j2"))
    assert len(names) >= 6, names
    for name in names:
        with pytest.raises(jinja2.UndefinedError):
            env.get_template(name).render()


def fake_toolchain() -> Toolchain:
    """A toolchain whose paths hold quotes and spaces, as a user's home directory may."""
    return Toolchain(
        python=sys.executable,
        python_version="3.11",
        torch_version="2.13.0",
        torch_includes=("/home/o'neil/my venv/lib/python3.11/site-packages/torch/include", "/usr/include/python3.11"),
        torch_lib="/home/o'neil/my venv/lib/python3.11/site-packages/torch/lib",
        cxx="/usr/bin/g++",
        cxx_identity="g++ (GCC) 13.2.0",
        linker="",
        meson="/usr/bin/meson",
        ninja="/usr/bin/ninja",
        has_last_error=True,
    )


def test_render_probe_writes_the_probe_project(tmp_path: Path) -> None:
    from mesonbuild import mparser

    tc = fake_toolchain()
    render_probe(tc, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["meson.build", *PROBE_FILES])
    for name in PROBE_FILES:
        assert (tmp_path / name).read_bytes() == (RUNTIME / name).read_bytes(), name
    meson_build = (tmp_path / "meson.build").read_text()
    mparser.Parser(meson_build, "meson.build").parse()  # valid Meson, quotes in the paths notwithstanding
    for path in (*tc.torch_includes, tc.torch_lib):
        assert escape.meson(path) in meson_build, path
    assert "py.extension_module('shimgen_probe', 'probe.cpp'" in meson_build

    # Rendering the same toolchain again rewrites nothing (ninja would rebuild the probe otherwise).
    old = 1_000_000_000_000_000_000
    for path in tmp_path.iterdir():
        os.utime(path, ns=(old, old))
    render_probe(tc, tmp_path)
    assert all(path.stat().st_mtime_ns == old for path in tmp_path.iterdir())


# --- serial_fast_paths: OpenMP regions with a serial copy for one-thread callers
# ---------------------------------------

KERNEL_WITH_REGION = """extern "C" void kernel(float* out, int64_t n)
{
    #pragma omp parallel
    {
        int tid = omp_get_thread_num();
        {
            #pragma omp for
            for(int64_t x0=0; x0<n; x0+=1)
            {
                #pragma omp simd
                for(int64_t x1=0; x1<4; x1+=1) { out[4*x0+x1] = x1; }  // a '}' in a comment
            }
        }
        const char* label = "{ not a block";
    }
    #pragma omp parallel num_threads(2)
    {
        out[omp_get_thread_num()] = 0;
    }
}
"""


def test_serial_fast_path_copies_a_dynamic_region_without_its_team_directives() -> None:
    out = serial_fast_paths(KERNEL_WITH_REGION)
    serial, rest = out.split("if (omp_get_max_threads() == 1)\n", 1)[1].split("    else\n", 1)
    assert "#pragma omp for" not in serial and "#pragma omp parallel" not in serial
    assert "#pragma omp simd" in serial and '"{ not a block"' in serial and "omp_get_thread_num()" in serial
    # The original region follows unchanged, in a block of its own; the fixed-size team is left alone.
    region = KERNEL_WITH_REGION[
        KERNEL_WITH_REGION.index("    #pragma omp parallel\n") : KERNEL_WITH_REGION.index(
            "    #pragma omp parallel num"
        )
    ]
    assert region.rstrip() in rest
    assert out.count("omp_get_max_threads() == 1") == 1 and "#pragma omp parallel num_threads(2)" in out


def test_serial_fast_path_leaves_unbalanced_source_alone() -> None:
    broken = "    #pragma omp parallel\n    {\n        f();\n"
    assert serial_fast_paths(broken) == broken


def test_serial_fast_path_compiles_and_matches(tmp_path: Path) -> None:
    """The rewritten kernel compiles with OpenMP and computes what the original does, at one thread and at two."""
    import shutil
    import subprocess

    cxx = shutil.which("g++")
    assert cxx, "these tests need g++"
    main = """#include <omp.h>
#include <cstdint>
#include <cstdio>
{kernel}
int main() {{
    float a[64] = {{}}, b[64] = {{}};
    omp_set_num_threads(1); kernel(a, 16);
    omp_set_num_threads(2); kernel(b, 16);
    for (int i = 0; i < 64; ++i) printf("%g %g\\n", a[i], b[i]);
}}
"""
    for name, kernel in (("original", KERNEL_WITH_REGION), ("rewritten", serial_fast_paths(KERNEL_WITH_REGION))):
        (tmp_path / f"{name}.cpp").write_text(main.format(kernel=kernel.replace('extern "C" ', "")))
        subprocess.run([cxx, "-fopenmp", "-O1", "-o", str(tmp_path / name), str(tmp_path / f"{name}.cpp")], check=True)
    original = subprocess.run([str(tmp_path / "original")], capture_output=True, text=True, check=True).stdout
    rewritten = subprocess.run([str(tmp_path / "rewritten")], capture_output=True, text=True, check=True).stdout
    assert rewritten == original and original.count("\n") == 64


# --- gemm_threads_from_caller: the C++ GEMM template's partitions follow the caller's team ----------------------------

# The shape of Inductor's C++ GEMM template (cpp_gemm_template.py) for a dynamic M, made for 2 threads; `done`
# records which partitions ran, on which thread.
GEMM_TEMPLATE = """extern "C" void cpp_fused_{name}(int* done, const int64_t ks0)
{{
    constexpr int64_t num_threads = {threads};
    constexpr int64_t N = 64;
    constexpr int64_t K = 64;
    const int64_t M = ks0;
    int64_t Mt_blocks, Nt_blocks, Kt_blocks;
    {blocking}
    AOTI_TORCH_CHECK(
        Mt_blocks * Nt_blocks * Kt_blocks * {threads} >= M,
        "Not all partitions are assigned."
    );
    #pragma omp parallel
    {{
        #pragma omp for schedule(static, 1)
        for (int64_t tid = 0; tid < {threads}; tid++) {{ done[tid] = 1 + omp_get_thread_num(); }}
    }}
}}
"""
DYNAMIC_M = "mm_get_thread_blocking(num_threads, 1, M, N, K, 1, 1, 1, Mt_blocks, Nt_blocks, Kt_blocks);"
STATIC_M = "Mt_blocks = 1;"


def test_gemm_threads_follow_the_caller_where_blocking_is_computed_at_run_time() -> None:
    source = GEMM_TEMPLATE.format(name="a", threads=2, blocking=DYNAMIC_M) + GEMM_TEMPLATE.format(
        name="b", threads=2, blocking=STATIC_M
    )
    dynamic, static = gemm_threads_from_caller(source).split('extern "C" void cpp_fused_b')
    assert (
        "int64_t num_threads = omp_get_max_threads();" in dynamic
        and "if (M * N * K < 65536) num_threads = 1;" in dynamic
    )
    assert "tid < num_threads;" in dynamic and "Kt_blocks * num_threads >=" in dynamic and " 2" not in dynamic
    assert "#pragma omp parallel if(num_threads > 1)" in dynamic
    # A region that runs alone, because the caller has one thread or the GEMM is small, takes the serial copy.
    assert "if (omp_get_max_threads() == 1 || !(num_threads > 1))" in serial_fast_paths(dynamic)
    # A constant blocking was made for the build machine's partitions: all of them must still run.
    assert 'extern "C" void cpp_fused_b' + static == GEMM_TEMPLATE.format(name="b", threads=2, blocking=STATIC_M)


def test_gemm_made_for_one_thread_is_left_alone() -> None:
    one = GEMM_TEMPLATE.format(name="a", threads=1, blocking=DYNAMIC_M)
    assert gemm_threads_from_caller(one) == one
    assert gemm_threads_from_caller(KERNEL_WITH_REGION) == KERNEL_WITH_REGION


def test_gemm_partitions_run_on_the_callers_team_and_small_ones_alone(tmp_path: Path) -> None:
    """Rewritten and given its serial copy as codegen does, the template runs one partition per thread of the
    caller's team (3 here, more than the 2 it was made for), and a GEMM below the work threshold on one thread."""
    import shutil
    import subprocess

    cxx = shutil.which("g++")
    assert cxx, "these tests need g++"
    main = """#include <omp.h>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#define AOTI_TORCH_CHECK(cond, msg) if (!(cond)) throw std::runtime_error(msg)
void mm_get_thread_blocking(int64_t threads, int64_t, int64_t M, int64_t, int64_t, int64_t, int64_t, int64_t,
                            int64_t& Mt, int64_t& Nt, int64_t& Kt) {{ Mt = (M + threads - 1) / threads; Nt = 1; Kt = 1;
                            }}
{kernel}
int main() {{
    for (int threads : {{1, 2, 3}}) for (int64_t m : {{3, 3000}}) {{
        int done[8] = {{}};
        omp_set_num_threads(threads);
        cpp_fused_a(done, m);
        printf("%d %ld:", threads, m);
        for (int d : done) printf(" %d", d);
        printf("\\n");
    }}
}}
"""
    kernel = serial_fast_paths(gemm_threads_from_caller(GEMM_TEMPLATE.format(name="a", threads=2, blocking=DYNAMIC_M)))
    (tmp_path / "gemm.cpp").write_text(main.format(kernel=kernel.replace('extern "C" ', "")))
    subprocess.run([cxx, "-fopenmp", "-O1", "-o", str(tmp_path / "gemm"), str(tmp_path / "gemm.cpp")], check=True)
    out = subprocess.run([str(tmp_path / "gemm")], capture_output=True, text=True, check=True).stdout.splitlines()
    # Partition -> 1 + the thread that ran it; 64 x 64 x 3 is below the threshold, 64 x 64 x 3000 above it.
    assert out == [
        "1 3: 1 0 0 0 0 0 0 0",
        "1 3000: 1 0 0 0 0 0 0 0",
        "2 3: 1 0 0 0 0 0 0 0",
        "2 3000: 1 2 0 0 0 0 0 0",
        "3 3: 1 0 0 0 0 0 0 0",
        "3 3000: 1 2 3 0 0 0 0 0",
    ]


class _Layout:
    def __init__(self, size: list[Any], stride: list[Any]) -> None:
        self.size, self.stride = size, stride


class _Node:
    def __init__(self, layout: _Layout) -> None:
        self.layout = layout

    def get_layout(self) -> _Layout:
        return self.layout


class _Caller:
    def __init__(self, *nodes: _Node) -> None:
        self.input_nodes = list(nodes)


def test_timing_candidates_keeps_their_inputs_symbolic_sizes() -> None:
    """Like CppGemmTemplate's preprocessor at its benchmark: a bmm's mat2 with a dynamic batch gets the traced sizes
    written into its layout's own lists, which the ATen candidate's input shares."""
    batch = "64*s95"  # a sympy expression in Inductor; only its identity matters here
    mat1, mat2 = _Node(_Layout([batch, 49, 32], [1568, 32, 1])), _Node(_Layout([batch, 32, 49], [4704, 1, 96]))
    aten, template = _Caller(mat1, mat2), _Caller(mat1, mat2)
    view_size, view_stride = mat2.layout.size, mat2.layout.stride  # what the template's preprocessor holds

    def benchmark(candidates: list[Any]) -> dict[Any, float]:
        view_size[:] = [128, 32, 49]
        view_stride[:] = [4704, 1, 96]
        return {c: 1.0 for c in candidates}

    assert _keeping_input_layouts(benchmark, [aten, template])([aten, template]) == {aten: 1.0, template: 1.0}
    assert mat2.layout.size == [batch, 32, 49] and mat2.layout.size is view_size
    assert mat1.layout.size == [batch, 49, 32]
    assert _keeping_input_layouts(None, [aten]) is None


class _Request:
    def __init__(self, source: str) -> None:
        self.source_code, self.hash_key = source, f"h{abs(hash(source))}"


class _Template:
    """Like Inductor's CppTemplateCaller: its key hashes its benchmark's source."""

    def __init__(self, source: str) -> None:
        self.bmreq = _Request(source)

    def hash_key(self) -> str:
        return f"CppMicroGemmFP32Vec-{self.bmreq.hash_key}"


class _Extern:
    def hash_key(self) -> str:
        return "_linear_pointwise-attr='relu'-cabc"


GEMM_SOURCE = """
    constexpr int64_t num_threads = {threads};
    constexpr int64_t Mt_blocks = 1;
    constexpr int64_t Nt_blocks = {n_blocks};
    for (int64_t tid = 0; tid < {threads}; tid++) {{ cpp_CppMicroGemmFP32Vec_micro_gemm<{register_n}>(); }}
    if (Mt_blocks * Nt_blocks * Kt_blocks * {threads} >= Mr_blocks * Nr_blocks * Kr_blocks) {{}}
"""


def test_a_gemm_templates_lockfile_key_leaves_out_the_machines_core_count() -> None:
    """A lockfile written on 2 cores replays on 16: the template's partitions and blocking are made for the core
    count, the rest of its source is the key. The library's candidate keeps Inductor's key."""
    extern = _Extern()
    two = _Template(GEMM_SOURCE.format(threads=2, n_blocks=11, register_n=32))
    sixteen = _Template(GEMM_SOURCE.format(threads=16, n_blocks=2, register_n=32))
    other_kernel = _Template(GEMM_SOURCE.format(threads=2, n_blocks=11, register_n=16))
    on_two, on_sixteen = locked_keys([extern, two]), locked_keys([extern, sixteen])
    assert on_two[extern] == on_sixteen[extern] == extern.hash_key()
    assert on_two[two] == on_sixteen[sixteen] != two.hash_key()
    assert on_two[two].startswith("CppMicroGemmFP32Vec-portable-")
    assert locked_keys([other_kernel])[other_kernel] != on_two[two]
    # Two candidates of one GEMM that differ only in those constants keep keys of their own.
    assert locked_keys([two, sixteen]) == {two: two.hash_key(), sixteen: sixteen.hash_key()}


@pytest.fixture
def without_models(monkeypatch: pytest.MonkeyPatch) -> None:
    """No `models` package in sys.modules and sys.path as it is, both given back afterwards: what earlier tests in this
    worker imported (a custom op's project package, which import_once keeps for the process) is set aside, as in a new
    process."""
    for name in [name for name in sys.modules if name == "models" or name.startswith("models.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "path", list(sys.path))


def test_a_module_kept_from_another_project_does_not_shadow_this_one(tmp_path: Path, without_models: None) -> None:
    """import_once keeps a custom op's module past its project's scope; another project's scope that has a package of
    the same name imports its own (a build server's child or a test process builds several projects)."""
    from shimgen.trace import entry

    for project, activation in (("a", "ReLU"), ("b", "GELU")):
        package = tmp_path / project / "models"
        package.mkdir(parents=True)
        (package / "__init__.py").write_text("")
        (package / "net.py").write_text(f"ACTIVATION = {activation!r}\n")
        (package / "ops.py").write_text("")
    try:
        entry.import_once("models.ops", tmp_path / "a")
        with entry.project_scope(tmp_path / "b"):
            assert importlib.import_module("models.net").ACTIVATION == "GELU"
        with entry.project_scope(tmp_path / "a"):
            assert importlib.import_module("models.net").ACTIVATION == "ReLU"
        assert sys.modules["models.ops"].__file__ == str(tmp_path / "a" / "models" / "ops.py")
    finally:
        entry._kept.pop("models.ops", None)
        for name in [name for name in sys.modules if name == "models" or name.startswith("models.")]:
            if str(tmp_path) in (getattr(sys.modules[name], "__file__", None) or ""):
                del sys.modules[name]


def test_a_package_the_caller_imported_from_elsewhere_does_not_shadow_the_projects(
    tmp_path: Path, without_models: None
) -> None:
    """A caller that imported a `models` package of its own (a test helper, a notebook) and then builds or checks a
    project with one: the project's scope imports the project's, as a new process would, and gives the caller's back
    after. A library's package of that name stays where the project's directory has only a namespace portion."""
    from shimgen.trace import entry

    for project, activation in (("caller", "ReLU"), ("project", "GELU")):
        package = tmp_path / project / "models"
        package.mkdir(parents=True)
        (package / "__init__.py").write_text("")
        (package / "mlp.py").write_text(f"ACTIVATION = {activation!r}\n")
    (tmp_path / "project" / "json").mkdir()  # a data directory named like the standard library's json
    sys.path.insert(0, str(tmp_path / "caller"))
    try:
        callers = importlib.import_module("models.mlp")
        sys.path.remove(str(tmp_path / "caller"))
        with entry.project_scope(tmp_path / "project"):
            assert importlib.import_module("models.mlp").ACTIVATION == "GELU"
            assert importlib.import_module("json") is sys.modules["json"] and hasattr(sys.modules["json"], "dumps")
        assert sys.modules["models.mlp"] is callers
    finally:
        for name in [name for name in sys.modules if name == "models" or name.startswith("models.")]:
            if str(tmp_path) in (getattr(sys.modules[name], "__file__", None) or ""):
                del sys.modules[name]


def test_a_projects_namespace_package_is_not_left_behind(tmp_path: Path, without_models: None) -> None:
    """A project's `models` directory without __init__.py is a namespace package (no file): it goes with the project's
    scope like its modules, else a later `import models.x` of another directory looks only in this one."""
    from shimgen.trace import entry

    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "net.py").write_text("VALUE = 1\n")
    with entry.project_scope(tmp_path):
        assert importlib.import_module("models.net").VALUE == 1
        assert sys.modules["models"].__file__ is None
    assert "models" not in sys.modules and "models.net" not in sys.modules


def test_python_sources_count_for_the_code_only_where_the_program_calls_triton_ops(tmp_path: Path) -> None:
    """A weight edited in the model's .py file changes only the weights' values (refit keeps the code); a triton_op's
    kernel, compiled from its .py source, makes every read .py file count; a Python or C++ custom op, called and not
    compiled, does not (an edit elsewhere in the file of a model calling transformers' MoE op keeps that model's code)."""
    traced = TraceResult(
        key="k",
        program=tmp_path / "p.pt2",
        out_nodes=(),
        num_outputs=1,
        reads=(("m.py", "a"),),
        structure="s",
        weights="w",
    )

    def key(t: TraceResult, values: bool | None = None, **changes: Any) -> str:
        return codegen_key(replace(t, **changes), Target(device="cpu"), Flags(), {}, "2.13.0", values=values)

    assert key(traced) == key(traced, reads=(("m.py", "b"),))
    assert key(traced) != key(traced, weights="w2")  # freezing (the default) compiles the values in
    assert key(traced, values=False) == key(traced, values=False, weights="w2")
    assert key(traced, values=False) != key(traced, values=False, structure="s2")
    calling = replace(traced, library_ops=("demo::scale",))
    assert key(calling) == key(calling, reads=(("m.py", "b"),))
    compiling = replace(calling, kernel_sources=(("kernels.py", "c"),))
    assert key(compiling) != key(compiling, reads=(("m.py", "b"),))
    assert key(compiling) != key(compiling, kernel_sources=(("kernels.py", "d"),))


def test_a_program_calling_a_python_custom_op_launches_no_triton_kernel() -> None:
    import torch

    from shimgen.inductor import internals
    from shimgen.trace.export import library_ops

    @torch.library.custom_op("shimgen_tests::plain", mutates_args=())
    def plain(x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @plain.register_fake
    def _(x: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(x)

    class Calling(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.ops.shimgen_tests.plain(x) + 1

    program = torch.export.export(Calling(), (torch.ones(3),))
    assert library_ops(program) == ("shimgen_tests::plain",)
    assert internals.triton_source_files(program, library_ops(program)) == ()


# A rotary-embedding kernel of a transformers decoder (mistral, qwen2, mixtral), as torch 2.11 names it on CUDA.
ROTARY_KERNEL = (
    "triton_poi_fused__scaled_dot_product_efficient_attention__to_copy__unsafe_view_add_arange_bitwise_and_bmm_cat_"
    "clone_constant_pad_nd_cos_expand_gt_index_le_mul_neg_new_ones_scalar_tensor_sin_slice_sub_transpose_unsqueeze_"
    "view_where_2"
)


def test_short_fused_name_cuts_only_long_names() -> None:
    fused = ROTARY_KERNEL.removeprefix("triton_poi_").removesuffix("_2")
    assert short_fused_name("fused_add_relu") == "fused_add_relu"
    assert short_fused_name(fused) == fused[:FUSED_NAME_LIMIT].rstrip("_") and len(short_fused_name(fused)) <= 96


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc, which makes Inductor's fatbins")
def test_nvcc_makes_a_fatbin_of_a_shortened_kernel_name_only(tmp_path: Path) -> None:
    """Inductor's fatbin command (codecache, emit_multi_arch_kernel) on a trivial PTX named after the kernel: nvcc
    fails on the full name and succeeds on the shortened one, even with the largest kernel number Inductor appends."""
    ptx = ".version 7.8\n.target sm_90\n.address_size 64\n.visible .entry k() { ret; }\n"
    fused = ROTARY_KERNEL.removeprefix("triton_poi_").removesuffix("_2")
    outcomes = []
    for name in (ROTARY_KERNEL, f"triton_poi_{short_fused_name(fused)}_99999"):
        (tmp_path / f"{name}.ptx").write_text(ptx)
        made = subprocess.run(
            ["nvcc", "-fatbin", f"{name}.ptx", "-o", f"{name}.fatbin"]
            + ["-gencode", "arch=compute_90,code=compute_90", "-gencode", "arch=compute_90,code=sm_90"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
        )
        outcomes.append(made.returncode == 0 and (tmp_path / f"{name}.fatbin").is_file())
    assert outcomes == [False, True]


def test_scalar_kernels_override_the_targets_vector_length(tmp_path: Path) -> None:
    traced = TraceResult(
        key="k", program=tmp_path / "p.pt2", out_nodes=(), num_outputs=1, reads=(), structure="s", weights="w"
    )
    for isa in ("native", "avx512", None):
        target = Target(device="cpu", isa=isa)
        assert inductor_configs(target, Flags(), vectorize=False)["cpp.simdlen"] == 1
        assert codegen_key(traced, target, Flags(), {}, "2.13.0") != codegen_key(
            traced, target, Flags(), {}, "2.13.0", vectorize=False
        )


def test_lockfile_keeps_what_a_unit_fell_back_on(tmp_path: Path) -> None:
    from shimgen.inductor import lockfile

    path = tmp_path / "spec.toml.lock"
    timed = lockfile.Measured({"mm": {"inputs": {"float32": {"choice": 0.5}}}})
    refused = lockfile.Fallbacks(scalar_kernels="‘decltype’ evaluates to ‘float’")
    off = lockfile.Fallbacks(onednn_off="its package computed otherwise")
    lockfile.update(
        path,
        {
            "a torch2.13.0": (lockfile.Measured({}), refused),
            "b torch2.13.0": (timed, lockfile.Fallbacks()),
            "c torch2.13.0": (timed, off),
        },
        set(),
    )
    read = lockfile.read(path)
    assert read.fallbacks == {"a torch2.13.0": refused, "c torch2.13.0": off}
    assert read.units == {"a torch2.13.0": (), "b torch2.13.0": (timed,), "c torch2.13.0": (timed,)}
    # retuned: vectorized, and with oneDNN
    lockfile.update(path, {"a torch2.13.0": (lockfile.Measured({}), lockfile.Fallbacks())}, {"b torch2.13.0"})
    assert lockfile.read(path) == lockfile.Locked(units={"b torch2.13.0": (timed,)})


def _gemms(**records: dict[str, float]) -> dict[str, Any]:
    """Timing records of one op, by inputs key."""
    return {"linear": {inputs: {"highest": record} for inputs, record in records.items()}}


def _same_sets(found: tuple[Any, ...], expected: tuple[Any, ...]) -> bool:
    return len(found) == len(expected) and all(s in found for s in expected)


def test_a_lockfile_keeps_one_set_per_kind_of_machine(tmp_path: Path) -> None:
    """A machine whose GEMM template differs (another vector width) adds its own set beside the first instead of
    replacing it; each machine's later replay leaves the file as it was, whichever wrote last."""
    from shimgen.inductor import lockfile

    path, unit = tmp_path / "spec.toml.lock", "forward_cpu torch2.13.0"
    avx2 = lockfile.Measured(_gemms(a={"template-avx2": 0.1, "onednn": 0.3}, b={"template-avx2": 0.2, "onednn": 0.1}))
    avx512 = lockfile.Measured(
        _gemms(a={"template-avx512": 0.05, "onednn": 0.2}, b={"template-avx512": 0.4, "onednn": 0.2})
    )
    assert lockfile.update(path, {unit: (avx2, lockfile.Fallbacks())}, set())
    assert lockfile.update(path, {unit: (avx512, lockfile.Fallbacks())}, set())
    both = path.read_text()
    assert _same_sets(lockfile.read(path).units[unit], (avx2, avx512))
    for replayed in (avx2, avx512, avx2):
        assert not lockfile.update(path, {unit: (replayed, lockfile.Fallbacks())}, set())
    assert path.read_text() == both
    other_order = tmp_path / "other.lock"
    lockfile.update(other_order, {unit: (avx512, lockfile.Fallbacks())}, set())
    lockfile.update(other_order, {unit: (avx2, lockfile.Fallbacks())}, set())
    assert other_order.read_text() == both

    # The avx2 machine's spec gained a GEMM: its set is replaced by the new one, the avx512 set stays.
    grown = lockfile.Measured(
        {"linear": {**avx2.timings["linear"], **_gemms(c={"template-avx2": 1.0, "onednn": 2.0})["linear"]}}
    )
    assert lockfile.update(path, {unit: (grown, lockfile.Fallbacks())}, set())
    assert _same_sets(lockfile.read(path).units[unit], (grown, avx512))
    # --retune on the avx512 machine measures again: its new timings replace its old ones.
    retuned = lockfile.Measured(
        _gemms(a={"template-avx512": 0.06, "onednn": 0.2}, b={"template-avx512": 0.3, "onednn": 0.2})
    )
    assert lockfile.update(path, {unit: (retuned, lockfile.Fallbacks())}, set())
    assert _same_sets(lockfile.read(path).units[unit], (grown, retuned))
    assert lockfile.used_by(lockfile.read(path).units[unit], retuned.timings) == retuned
    # A unit that times nothing any more has no sets left.
    lockfile.update(path, {unit: (lockfile.Measured({}), lockfile.Fallbacks())}, set())
    assert unit not in lockfile.read(path).units


def test_a_format_1_lockfile_is_read_and_rewritten_as_format_2(tmp_path: Path) -> None:
    from shimgen.inductor import lockfile

    path, unit = tmp_path / "spec.toml.lock", "forward_cpu torch2.13.0"
    old = {"choices": [{"op": "linear"}], "timings": _gemms(a={"template": 0.1, "onednn": 0.3})}
    path.write_text(json.dumps({"format": 1, "units": {unit: old}}))
    measured = lockfile.Measured(old["timings"], old["choices"])
    assert lockfile.read(path).units == {unit: (measured,)}
    assert lockfile.update(path, {}, {unit})  # another unit's build keeps this one, in the new shape
    data = json.loads(path.read_text())
    assert data["format"] == lockfile.FORMAT and data["units"][unit] == {"machines": [old]}
    path.write_text(json.dumps({"format": 2, "units": {unit: {"machines": [{"timings": _gemms(a={"t": "fast"})}]}}}))
    with pytest.raises(UserError, match="not a shimgen lockfile this version reads"):
        lockfile.read(path)


@pytest.mark.skipif(platform.machine() != "x86_64", reason="Inductor's x86 vector ISAs")
def test_the_vector_isa_check_is_kept_and_later_codegens_take_it(tmp_path: Path) -> None:
    """The first codegen keeps Inductor's answer; a later one takes the kept answer (here: AVX2 alone) without
    compiling a test program."""
    from unittest import mock

    from torch._inductor import config, cpu_vec_isa

    from shimgen.inductor.codegen import _vec_isas_kept

    record = tmp_path / "vec_isa.json"
    with config.patch({"cpp.vec_isa_ok": True}):
        cpu_vec_isa.valid_vec_isa_list.cache_clear()
        with _vec_isas_kept(record):
            found = [str(isa) for isa in cpu_vec_isa.valid_vec_isa_list()]
        assert [item["isa"] for item in json.loads(record.read_text())] == found
        record.write_text(json.dumps([{"isa": "avx2", "state": {}}]))
        compiled = mock.patch.object(cpu_vec_isa.VecISA, "check_build", side_effect=AssertionError("compiled"))
        with _vec_isas_kept(record), compiled:
            assert [str(isa) for isa in cpu_vec_isa.valid_vec_isa_list()] == ["avx2"]
            assert {str(isa): bool(isa) for isa in cpu_vec_isa.supported_vec_isa_list}["avx2"]
            assert sum(bool(isa) for isa in cpu_vec_isa.supported_vec_isa_list) == 1
        cpu_vec_isa.valid_vec_isa_list.cache_clear()


def test_a_lock_wait_names_the_holders_pid(tmp_path: Path) -> None:
    """`exclusive` tells who holds the lock: the warm-up's own waits are told apart by that pid (LazyTools.waiting)."""
    from shimgen.files import LockHeld, exclusive

    lock, ready = tmp_path / "x.lock", tmp_path / "ready"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time, pathlib; from shimgen.files import exclusive\n"
            "with exclusive(pathlib.Path(sys.argv[1])):\n"
            "    pathlib.Path(sys.argv[2]).touch(); time.sleep(1)",
            str(lock),
            str(ready),
        ]
    )
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert holder.poll() is None and time.monotonic() < deadline, "the other process never took the lock"
        time.sleep(0.02)
    waits: list[LockHeld] = []
    with exclusive(lock, waits.append):
        pass
    holder.wait()
    assert waits == [LockHeld(lock, holder.pid)]
    assert str(waits[0]) == f"waiting for shimgen process {holder.pid} (lock {lock})"


def test_the_warm_up_follows_the_probes_choice_of_compiler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the first candidate compiler is known to fail (its verdict cached), the warm-up is needed only while the
    compiler the probe picks instead lacks its verdict or runtime library."""
    from shimgen import toolchain
    from shimgen.toolchain import probe, runtime_lib, warmup

    broken = tmp_path / "broken-c++"
    broken.write_text(f'#!/bin/sh\nexec {shutil.which("c++")} "$@"\n')
    broken.chmod(0o755)
    monkeypatch.setenv("CXX", str(broken))
    monkeypatch.setenv("SHIMGEN_CACHE_DIR", str(tmp_path / "cache"))
    # Each compiler is proved with the fastest linker installed, then with its default linker where that fails.
    first, second = (probe.candidates(cxx) for cxx in toolchain.candidate_compilers()[:2])
    assert {tc.cxx for tc in first} == {str(broken)} and [tc.linker for tc in first][-1] == ""

    def verdict(tc: toolchain.Toolchain, ok: bool) -> None:
        stamp = toolchain.cache_dir() / probe.probe_key(tc) / "verdict.json"
        stamp.parent.mkdir(parents=True)
        stamp.write_text(json.dumps({"cxx": tc.cxx, "identity": tc.cxx_identity, "ok": ok, "linker": tc.linker}))

    assert warmup.needed(["cpu"])
    for tc in first:
        assert probe.selected_before() is None and warmup.needed(["cpu"])
        verdict(tc, False)
    assert probe.selected_before() is None and warmup.needed(["cpu"])
    picked = second[0]
    verdict(picked, True)
    assert probe.selected_before() == picked and warmup.needed(["cpu"])
    done = runtime_lib.location(picked, "cpu") / "done"
    done.parent.mkdir(parents=True)
    done.touch()
    assert not warmup.needed(["cpu"])


def test_error_message_is_the_compilers_first_error_without_its_place() -> None:
    from shimgen.build.meson import error_message

    detail = (
        "../project/src/model_cpu/kernels_0.cpp:777:52: error: ‘decltype’ evaluates to ‘float’, which is not a class\n"
        "  777 |     auto tmp = decltype(x)::blendv(a, b, m);\n"
    )
    assert error_message(detail) == "‘decltype’ evaluates to ‘float’, which is not a class"


# --- package check: the traced programs' references computed ahead ---------------------------------------------------


class _Counting(torch.nn.Module):
    """out = x * count after count += 1: a graph with state, its outputs flat as shimgen traces them."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        self.count.add_(1.0)
        return (x * self.count,)


class _CountingPackage:
    """What a built package of `_Counting` offers the check: it computes `x * count * scale` and reports its count
    times `reported`."""

    def __init__(self, scale: float, reported: float = 1.0) -> None:
        self.scale, self.reported, self.count = scale, reported, torch.zeros(())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.count += 1.0
        return x * self.count * self.scale

    def reset_state(self) -> None:
        self.count = torch.zeros(())

    def state(self, device: str, graph: str) -> dict[str, torch.Tensor]:
        return {"count": self.count * self.reported}


def _counting_plan(tmp_path: Path) -> Any:
    """A verify.Plan of `_Counting` traced for batch 1-8, pickled to tmp_path/plan.pickle."""
    from shimgen.package import verify

    graph = Graph(
        name="forward",
        entry="models.counting:counting",
        inputs=[Input(name="x", shape=["batch", 4])],
        dims={"batch": Dim(min=1, max=8, example=2)},
    )
    program = torch.export.export(
        _Counting(), (torch.ones(2, 4),), dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=8)},)
    )
    torch.export.save(program, tmp_path / "forward.pt2")
    (name,) = [n for n, _ in program.named_buffers()]
    plan = verify.Plan(
        package="counting",
        graphs=(
            verify.GraphModels(
                graph=graph, where="graph[0]", device="cpu", programs=(((), tmp_path / "forward.pt2"),), state=(name,)
            ),
        ),
    )
    (tmp_path / "plan.pickle").write_bytes(pickle.dumps(plan))
    return plan


def test_package_check_takes_the_references_computed_ahead_state_included(tmp_path: Path) -> None:
    from shimgen.package import verify

    plan = _counting_plan(tmp_path)
    assert verify.references([str(tmp_path / "plan.pickle"), str(tmp_path / "references.pt")]) == 0
    ahead = replace(plan, references=tmp_path / "references.pt")
    for checked, beforehand in ((ahead, 3), (plan, 0)):
        report = verify.Report()
        verify.run(checked, _CountingPackage(1.0), report, lambda r: None)
        assert (report.failure, len(report.cases), report.beforehand) == ("", 3, beforehand)
        report = verify.Report()
        verify.run(checked, _CountingPackage(1.5), report, lambda r: None)
        assert report.failure.startswith("graph[0] (forward, cpu) at example (batch=2): output 0 differs"), report
        report = verify.Report()
        verify.run(checked, _CountingPackage(1.0, reported=2.0), report, lambda r: None)
        assert "at example (batch=2): the state 'count' differs from the traced program's" in report.failure


class _WrongAtOne(_CountingPackage):
    """`_CountingPackage` that computes otherwise at batch 1 alone."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) * (1.5 if x.shape[0] == 1 else 1.0)


def test_a_difference_of_the_dynamic_code_at_size_one_suggests_a_variant(tmp_path: Path) -> None:
    """Inductor compiles a dynamic dim for sizes of 2 and up: where the dynamic code is wrong at size 1 alone, the
    message names the dims at 1 and `specialize = [1]`; where it is wrong at the example too, or a variant of size 1
    ran, it does not."""
    from shimgen.package import verify

    plan = _counting_plan(tmp_path)
    report = verify.Report()
    verify.run(plan, _WrongAtOne(1.0), report, lambda r: None)
    assert "at smallest (batch=1): output 0 differs" in report.failure
    assert report.failure.endswith(
        "of 'batch': Inductor compiles a dynamic dim for sizes of 2 and up; "
        "`specialize = [1]` in the dim's table builds size 1 as a variant of its own)"
    )
    report = verify.Report()
    verify.run(plan, _CountingPackage(1.5), report, lambda r: None)
    assert "at example (batch=2): output 0 differs" in report.failure and "specialize" not in report.failure
    shutil.copy(tmp_path / "forward.pt2", tmp_path / "forward_batch1.pt2")
    dynamic = plan.graphs[0].programs[0]
    variant = replace(plan.graphs[0], programs=(dynamic, ((("batch", 1),), tmp_path / "forward_batch1.pt2")))
    report = verify.Report()
    verify.run(replace(plan, graphs=(variant,)), _WrongAtOne(1.0), report, lambda r: None)
    assert "at smallest (batch=1): output 0 differs" in report.failure and "specialize" not in report.failure


def test_package_check_computes_what_the_references_left_from_the_state_they_reached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from shimgen.package import verify

    plan = _counting_plan(tmp_path)
    monkeypatch.setattr(verify, "REFERENCE_BYTES_LIMIT", 36)  # the first case's output (2 x 4 floats) and count
    assert verify.references([str(tmp_path / "plan.pickle"), str(tmp_path / "references.pt")]) == 0
    report = verify.Report()
    verify.run(replace(plan, references=tmp_path / "references.pt"), _CountingPackage(1.0), report, lambda r: None)
    assert (report.failure, len(report.cases), report.beforehand) == ("", 3, 1)


class _WatchedPackage(_CountingPackage):
    """`_CountingPackage` that records, at each call, whether `references` existed yet."""

    def __init__(self, references: Path) -> None:
        super().__init__(1.0)
        self.references, self.seen = references, []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(self.references.exists())
        return super().forward(x)


def test_package_check_calls_the_package_while_its_references_are_written(tmp_path: Path) -> None:
    from shimgen.package import verify

    plan = _counting_plan(tmp_path)
    script = (
        "import sys, time; delay = float(sys.argv[3]); delay < 0 and sys.exit(1); time.sleep(delay); "
        "from shimgen.package import verify; sys.exit(verify.references(sys.argv[1:3]))"
    )
    for delay, beforehand in ((3.0, 3), (-1.0, 0)):  # -1: the writer ends without writing anything
        out = tmp_path / f"references{delay}.pt"
        writer = subprocess.Popen([sys.executable, "-c", script, str(tmp_path / "plan.pickle"), str(out), str(delay)])
        try:
            package = _WatchedPackage(out)
            report = verify.Report()
            verify.run(replace(plan, references=out, references_writer=writer.pid), package, report, lambda r: None)
            assert (report.failure, len(report.cases), report.beforehand) == ("", 3, beforehand)
            assert package.seen == [False] * 3
            assert out.exists() == (beforehand > 0)
        finally:
            writer.kill()
            writer.wait()


def test_package_check_runs_code_that_passed_every_size_before_at_one_size(tmp_path: Path) -> None:
    from shimgen.package import verify

    plan = _counting_plan(tmp_path)
    (models,) = plan.graphs
    report = verify.Report()
    verify.run(replace(plan, graphs=(replace(models, settled=(True,)),)), _CountingPackage(1.0), report, lambda r: None)
    assert report.cases == ["graph[0] (forward, cpu) at example (batch=2)"], report
    assert [c.rpartition(" at ")[2] for c in report.settled] == ["smallest (batch=1)", "largest (batch=8)"]
    report = verify.Report()
    verify.run(replace(plan, graphs=(replace(models, settled=(True,)),)), _CountingPackage(1.5), report, lambda r: None)
    assert "at example (batch=2): output 0 differs" in report.failure, report

    # A variant's program serves its own sizes: the dynamic program's settled cases leave it be, and the other way round.
    variant = replace(models, programs=(*models.programs, ((("batch", 1),), tmp_path / "forward__batch1.pt2")))
    listed = verify.cases(models.graph, [{"batch": 1}])
    assert [label for label, _ in listed] == ["example (batch=2)", "smallest (batch=1)", "largest (batch=8)"]
    assert verify.settled_cases(replace(variant, settled=(True, False)), listed) == {2}
    assert verify.settled_cases(replace(variant, settled=(False, True)), listed) == set()
    assert verify.settled_cases(replace(variant, settled=(False, False)), listed) == set()


def test_a_unit_weights_file_is_made_again_only_when_what_it_is_made_from_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from types import SimpleNamespace

    from shimgen.project import render

    made: list[Any] = []
    monkeypatch.setattr(render.weights, "unit_file", lambda *args: made.append(args) or b"weights")
    source = tmp_path / "codegen.safetensors"
    source.write_bytes(b"codegen's")
    unit: Any = SimpleNamespace(code=SimpleNamespace(weights_file=source), variants=[])
    path = tmp_path / "src" / "forward_cpu.safetensors"
    record = path.with_name(path.name + ".made-from")

    def unit_weights(key: str) -> bytes | None:
        return render._unit_weights(unit, "layout", path, key, [source])

    assert unit_weights("key 1") == b"weights"  # no file yet
    path.parent.mkdir()
    path.write_bytes(b"weights")
    assert unit_weights("key 1") == b"weights"  # no record of what it was made from
    record.write_text(render._made_from("key 1", path, [source]))  # as render writes it, after the file
    assert unit_weights("key 1") is None and len(made) == 2
    assert unit_weights("key 2") == b"weights" and len(made) == 3
    assert not record.exists()  # until the new file is written
    record.write_text(render._made_from("key 1", path, [source]))
    time.sleep(0.01)
    source.write_bytes(b"changed outside a build")
    assert unit_weights("key 1") == b"weights" and len(made) == 4


REGEX_USER = """#include <regex>
#include <string>
#include "shimgen_regex_once.h"
// What AOTInductor's model_base.h does in an inline function: every model.cpp includes it.
inline bool device_index(const std::string& device, int& index) {
  std::regex re("(cpu|cuda|xpu|mps)(:([0-9]+))?");
  std::smatch match;
  if (!std::regex_match(device, match, re)) return false;
  index = match[3].matched ? std::stoi(match[3].str()) : -1;
  return true;
}
int parsed(const char* device) { int index = -2; return device_index(device, index) ? index : -2; }
"""
REGEX_INSTANCE = """#include <cstdio>
#include <regex>
#include <string>
#include "shimgen_regex_once.h"
#ifdef SHIMGEN_REGEX_ONCE
SHIMGEN_REGEX_ONCE(template)
#endif
int parsed(const char* device);
int main() { std::printf("%d %d %d\\n", parsed("cuda:3"), parsed("cpu"), parsed("tpu")); }
"""


def test_std_regex_is_instantiated_once_in_the_model_base_object(tmp_path: Path) -> None:
    """shimgen_regex_once.h: a translation unit that uses std::regex the way AOTInductor's model base header does leaves
    std::regex's largest templates to the object that instantiates them (the prebuilt model base), and the two link
    into a program that matches as std::regex does."""
    cxx = shutil.which("g++")
    if cxx is None:
        pytest.skip("needs g++ on PATH")
    from shimgen.project.render import MODEL_BASE_INSTANCE, REGEX_ONCE, RUNTIME

    assert b"SHIMGEN_REGEX_ONCE(template)" in MODEL_BASE_INSTANCE
    shutil.copy(RUNTIME / REGEX_ONCE, tmp_path / REGEX_ONCE)
    (tmp_path / "user.cpp").write_text(REGEX_USER)
    (tmp_path / "instance.cpp").write_text(REGEX_INSTANCE)
    release = subprocess.run(
        [cxx, "-std=c++20", "-dM", "-E", "-x", "c++", "-include", "regex", "/dev/null"], capture_output=True, text=True
    ).stdout
    found = re.search(r"#define _GLIBCXX_RELEASE (\d+)", release)
    if not found or not 12 <= int(found[1]) <= 16:
        pytest.skip(
            f"shimgen_regex_once.h declares nothing for this C++ library ({found[0] if found else 'not libstdc++'})"
        )
    for name in ("user", "instance"):
        subprocess.run(
            [cxx, "-std=c++20", "-O1", "-c", str(tmp_path / f"{name}.cpp"), "-o", str(tmp_path / f"{name}.o")],
            check=True,
        )
    symbols = {
        name: subprocess.run(
            ["nm", "-C", "--defined-only", str(tmp_path / f"{name}.o")], capture_output=True, text=True, check=True
        ).stdout
        for name in ("user", "instance")
    }
    compiler = "std::__detail::_Compiler<std::__cxx11::regex_traits<char> >::_M_disjunction()"
    assert compiler not in symbols["user"] and compiler in symbols["instance"]
    subprocess.run(
        [cxx, str(tmp_path / "user.o"), str(tmp_path / "instance.o"), "-o", str(tmp_path / "parse")], check=True
    )
    assert subprocess.run([str(tmp_path / "parse")], capture_output=True, text=True, check=True).stdout == "3 -1 -2\n"


def test_the_header_a_custom_op_source_includes_first_is_found_where_it_is_torchs(tmp_path: Path) -> None:
    from shimgen.trace.custom_ops import first_torch_header

    torch_include = tmp_path / "include"
    for header in ("ATen/ATen.h", "torch/extension.h"):
        (torch_include / header).parent.mkdir(parents=True, exist_ok=True)
        (torch_include / header).write_text("")
    cases = {
        "// ops\n/* a block\n   #include <vector> */\n#pragma once\n#include <ATen/ATen.h>\n#include <vector>\n": "ATen/ATen.h",
        '#define X 1\n#  include "torch/extension.h"  // the usual one\n': "torch/extension.h",
        "#include <vector>\n#include <ATen/ATen.h>\n": None,  # not torch's: nothing worth precompiling
        "int before;\n#include <ATen/ATen.h>\n": None,  # code first: no header can be precompiled
        "#include <torch/missing.h>\n": None,
        "": None,
    }
    for k, (text, want) in enumerate(cases.items()):
        source = tmp_path / f"ops{k}.cpp"
        source.write_text(text)
        assert first_torch_header(source, ("/nonexistent", str(torch_include))) == want, text


def test_a_package_that_crashes_in_its_check_is_named_with_what_it_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A package the build's check ran into an abort (heap corruption, say) fails the build with the case it crashed
    in and the last line it wrote, and is removed."""

    def crashing(entry: str, args: list[str], **_: object) -> Completed:
        Path(args[2]).write_text(json.dumps({"running": "graph[0] (model, cpu) at smallest (batch=1)"}))
        return Completed(("python",), -6, "calling\ndouble free or corruption (!prev)\n", None)

    site = tmp_path / "site"
    staging = tmp_path / "site.new"
    staging.mkdir()
    monkeypatch.setattr(package_wheel, "run_python", crashing)
    with pytest.raises(BuildError) as raised:
        package_wheel._check(staging, site, "demo", (), None, None)
    assert str(raised.value).endswith(
        "the built package 'demo' crashed with signal 6 (double free or corruption (!prev)) at graph[0] (model, cpu) at "
        "smallest (batch=1); no package is written"
    )
    assert not staging.exists()
    site.mkdir()  # a package of an earlier build
    staging.mkdir()
    with pytest.raises(BuildError) as raised:
        package_wheel._check(staging, site, "demo", (), None, None)
    assert str(raised.value).endswith("; the previous package is left in place") and site.is_dir()
