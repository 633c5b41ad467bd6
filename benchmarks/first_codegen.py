"""Where a fresh process's first AOTInductor codegen of ResNet-18 spends the time a second codegen in the same process
does not: each function's inclusive seconds in the first minus the second (stack sampling, as profile_build.py does).
The process has imported what a build server imports before it forks a build (`internals.import_build_modules`);
Inductor's settings are shimgen's for the device's target with default flags (`codegen.inductor_configs`; for CUDA, no
CPU ISA check, as `codegen.scalar_host_kernels`); each codegen gets a fresh Inductor cache, as a build's does; the
Triton cache is shared, warmed by a first child.

    python benchmarks/first_codegen.py [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "benchmarks"), str(REPO / "projects")]


def program_file(device: str) -> Path:
    return Path(tempfile.gettempdir()) / f"shimgen-first-codegen-resnet18-{device}.pt2"


def codegen(label: str, device: str) -> object:
    import torch
    from profile_build import StackSampler

    from shimgen.inductor import codegen as shimgen_codegen
    from shimgen.spec import Flags, Target
    from shimgen.toolchain import probe

    configs = shimgen_codegen.inductor_configs(Target(device=device), Flags(), probe.select()[0].cxx)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp()
    # As shimgen's CUDA codegen: without Inductor's CPU ISA check (codegen.scalar_host_kernels).
    host = shimgen_codegen.scalar_host_kernels() if device == "cuda" else contextlib.nullcontext()
    start = time.perf_counter()
    with StackSampler(threading.get_ident()) as sampler, torch.no_grad(), host:
        package = Path(tempfile.mkdtemp()) / "model.pt2"
        torch._inductor.aoti_compile_and_package(
            torch.export.load(str(program_file(device))), package_path=str(package), inductor_configs=configs
        )
    print(f"{label} codegen {time.perf_counter() - start:.2f}s", flush=True)
    return sampler


def child(device: str) -> None:
    start = time.perf_counter()
    from shimgen.inductor import internals

    internals.import_build_modules()
    print(f"import {time.perf_counter() - start:.2f}s", flush=True)
    first, second = codegen("first", device), codegen("second", device)
    for table in ("inclusive", "own"):
        a, b = getattr(first, table), getattr(second, table)
        print(f"{table}, first minus second:")
        for name, seconds in sorted(((n, a[n] - b.get(n, 0)) for n in a), key=lambda item: -item[1])[:25]:
            print(f"  {seconds:7.2f}s  {name}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.device)
    import torch
    from models.resnet import resnet18

    model = resnet18().eval().to(args.device)
    example = (torch.randn(1, 3, 224, 224, device=args.device),)
    torch.export.save(torch.export.export(model, example), str(program_file(args.device)))
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp()
    for _ in range(2):  # the first child warms the Triton cache, as earlier builds have on a user's machine
        subprocess.run([sys.executable, __file__, "--device", args.device, "--child"], check=True)


if __name__ == "__main__":
    main()
