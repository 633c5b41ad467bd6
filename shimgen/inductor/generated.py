"""Inductor's generated code as `shimgen report` describes it: the kernels of a unit's C++ files, the library calls of
its
model, and the ops it leaves to the proxy executor (from Inductor's wrapper.json, kept as extern_nodes.json)."""

from __future__ import annotations

import itertools
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

from shimgen.results import CodegenResult

# An Inductor C++ kernel: an extern "C" function defined in a kernels_<k>.cpp file.
_CPP_KERNEL = re.compile(r'extern\s+"C"\s+[^;{}()]*?\b(\w+)\s*\([^;{}]*?\)\s*\{')
# Library kernels the model calls: AOTInductor's per-device shims of ATen ops, the few device-less ones, ATen itself.
_SHIM_CALL = re.compile(
    r"\b(aoti_torch_(?:cpu|cuda|xpu|mps)_\w+|aoti_torch_(?:_mm_plus_mm_out|index_put_out|scatter_out|"
    r"scatter_reduce_out|call_dispatcher))\s*\("
)
_ATEN_CALL = re.compile(r"\b(at::(?:\w+::)*\w+)\s*\(")
_NOT_KERNELS = re.compile(r"caching_allocator|guard|stream")  # device shims that manage memory or streams
_STRING = re.compile(r'"(?:[^"\\\n]|\\.)*"')
_DECLARATION = re.compile(r'extern\s+"C"[^;{}]*;')
_PROXY_CALL = "aoti_torch_proxy_executor_call_function"


def kernels(code: CodegenResult) -> list[dict[str, Any]]:
    """Inductor's C++ or Triton kernels, then the library and custom-op calls of the model."""
    model = code.model.read_text(errors="replace")
    # Calls only: declarations and message text blanked, their newlines kept for the line numbers.
    calls = _STRING.sub('""', _DECLARATION.sub(lambda m: re.sub(r"[^\n]", " ", m[0]), model))
    found = [k for path in code.kernels for k in _cpp_kernels(path, calls)]
    found += [_triton_kernel(ptx, code.triton) for ptx in code.ptx]
    return found + _library_calls(code.model, calls) + _custom_ops(code, calls)


# A kernel function this large may take GCC minutes at -O3 and seconds at -O2 where its sizes are dynamic: Qwen3-Next's
# chunked scan, its 63 steps fused into one 3.2 MB kernel, compiled in 181 s at -O3 and in 16 s at -O2, and ran faster
# at -O2 (benchmarks/results/large_kernels.md). The usual largest kernel is 15-50 KB.
LARGE_KERNEL_BYTES = 256 << 10


def large_kernels(kernel_files: tuple[Path, ...], kernel_opt: str) -> list[tuple[Path, int]]:
    """The kernel files compiled at -O2 where `kernel_opt` is O3: those that hold a kernel of LARGE_KERNEL_BYTES or
    more, with its size."""
    if kernel_opt != "O3":
        return []
    found = []
    for path in kernel_files:
        text = path.read_text(errors="replace")
        starts = [m.start() for m in _CPP_KERNEL.finditer(text)] + [len(text)]
        largest = max((end - start for start, end in itertools.pairwise(starts)), default=0)
        if largest >= LARGE_KERNEL_BYTES:
            found.append((path, largest))
    return found


def _cpp_kernels(path: Path, model_calls: str) -> list[dict[str, Any]]:
    text = path.read_text(errors="replace")
    matches = list(_CPP_KERNEL.finditer(text))
    kernels = []
    for i, m in enumerate(matches):
        name = m[1]
        body = text[m.start() : matches[i + 1].start() if i + 1 < len(matches) else len(text)]
        kernels.append(
            {
                "name": name,
                "kind": _cpp_kind(name, body, text),
                "source": str(path),
                "line": _line(text, m.start(1)),
                "calls": len(re.findall(rf"\b{name}\s*\(", model_calls)),
            }
        )
    return kernels


def _cpp_kind(name: str, body: str, text: str) -> str:
    # The GEMM template's micro-kernel helpers come before its extern "C" function and carry its name.
    if (
        name.endswith("_template")
        or f"{name}_micro_gemm" in text
        or "micro_gemm" in body
        or "mm_get_thread_blocking" in body
    ):
        return "Inductor C++ GEMM template"
    return "Inductor C++ (fused reduction)" if "tmp_acc" in body else "Inductor C++ (fused pointwise)"


def _triton_kernel(ptx: Path, sources: tuple[Path, ...]) -> dict[str, Any]:
    source = next((s for s in sources if s.stem == ptx.stem), ptx)
    return {"name": ptx.stem, "kind": "Triton", "source": str(source), "line": None, "calls": None, "ptx": str(ptx)}


def _library_calls(model: Path, calls: str) -> list[dict[str, Any]]:
    """Each library function the model calls, once, with the line of its first call."""
    first: dict[str, int] = {}
    counts: Counter[str] = Counter()
    for m in [*_SHIM_CALL.finditer(calls), *_ATEN_CALL.finditer(calls)]:
        if not _NOT_KERNELS.search(m[1]):
            counts[m[1]] += 1
            first[m[1]] = min(first.get(m[1], m.start(1)), m.start(1))
    return [
        {
            "name": name,
            "kind": f"library ({_library(name)})",
            "source": str(model),
            "line": _line(calls, first[name]),
            "calls": counts[name],
        }
        for name in sorted(counts, key=lambda n: first[n])
    ]


def _library(function: str) -> str:
    """Which library a shim function's op runs in, from the op's name."""
    op = re.sub(r"^aoti_torch_(cpu|cuda|xpu|mps)_", "", function)
    cuda = function.startswith("aoti_torch_cuda_")
    if "mkldnn" in op or "onednn" in op or "_pointwise" in op or "linear_prepack" in op:
        return "oneDNN"
    if "mkl" in op:
        return "MKL"
    if "fbgemm" in op:
        return "FBGEMM"
    if cuda and re.search(r"(^|_)(b?mm|addmm|baddbmm|addbmm|_scaled_mm|linear|addmv)(_out)?$", op):
        return "cuBLAS"
    if cuda and ("convolution" in op or "cudnn" in op):
        return "cuDNN"
    return "ATen"


def _custom_ops(code: CodegenResult, calls: str) -> list[dict[str, Any]]:
    """The ops the model calls through AOTInductor's proxy executor, from Inductor's description of them."""
    if code.extern_nodes is None:
        return []
    nodes = json.loads(code.extern_nodes.read_text()).get("nodes", [])
    counts = Counter(str(n["node"]["target"]) for n in nodes)
    at = calls.find(_PROXY_CALL)
    return [
        {
            "name": op,
            "kind": "custom op (proxy executor)",
            "source": str(code.model),
            "line": _line(calls, at) if at >= 0 else None,
            "calls": count,
        }
        for op, count in sorted(counts.items())
    ]


def _line(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1
