"""Where a fresh process's first AOTInductor CUDA codegen of torchvision's ResNet-18 spends the time a second codegen
in the same process does not: each function's inclusive seconds in the first minus the second (stack sampling, as
profile_build.py does). Inductor's settings are shimgen's for a CUDA target; each codegen gets a fresh Inductor cache,
as shimgen's CUDA codegen does; the Triton cache is shared, warmed by a first child. Needs a GPU.

    python benchmarks/first_codegen.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

PROGRAM = Path(tempfile.gettempdir()) / "shimgen-first-codegen-resnet18.pt2"
CONFIGS = {
    "cpp.cxx": (None, "/usr/bin/c++"),
    "cpp.vec_isa_ok": True,
    "freezing": True,
    "aot_inductor.package_cpp_only": True,
    "aot_inductor.precompile_headers": False,
    "aot_inductor.embed_kernel_binary": True,
    "aot_inductor.emit_multi_arch_kernel": True,
    "max_autotune_gemm": True,
    "max_autotune_conv_backends": "ATEN",
}


def codegen(label: str) -> object:
    import torch
    from profile_build import StackSampler

    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp()
    start = time.perf_counter()
    with StackSampler(threading.get_ident()) as sampler, torch.no_grad():
        package = Path(tempfile.mkdtemp()) / "model.pt2"
        torch._inductor.aoti_compile_and_package(
            torch.export.load(str(PROGRAM)), package_path=str(package), inductor_configs=CONFIGS
        )
    print(f"{label} codegen {time.perf_counter() - start:.2f}s", flush=True)
    return sampler


def child() -> None:
    start = time.perf_counter()
    import torch._inductor.codegen.cpp_wrapper_cpu  # noqa: F401  (what a build server has imported before it forks)
    import torch._inductor.compile_fx  # noqa: F401

    print(f"import {time.perf_counter() - start:.2f}s", flush=True)
    first, second = codegen("first"), codegen("second")
    for table in ("inclusive", "own"):
        a, b = getattr(first, table), getattr(second, table)
        print(f"{table}, first minus second:")
        for name, seconds in sorted(((n, a[n] - b.get(n, 0)) for n in a), key=lambda item: -item[1])[:25]:
            print(f"  {seconds:7.2f}s  {name}")


def main() -> None:
    import torch
    import torchvision

    model = torchvision.models.resnet18().eval().cuda()
    torch.export.save(torch.export.export(model, (torch.randn(1, 3, 224, 224, device="cuda"),)), str(PROGRAM))
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp()
    for _ in range(2):  # the first child warms the Triton cache, as earlier builds have on a user's machine
        subprocess.run([sys.executable, __file__, "--child"], check=True)


if __name__ == "__main__":
    child() if sys.argv[1:] == ["--child"] else main()
