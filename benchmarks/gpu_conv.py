"""How a GPU ResNet's convolutions are lowered, and what it does to a call at batch 1 (issue 29, item 3).

    python benchmarks/gpu_conv.py [--out benchmarks/results] [--batch 1]

AOTInductor packages of torchvision's ResNet-18 (freezing) built with each convolution lowering, each in its own
subprocess with fresh Inductor and Triton caches (built two at a time), then timed in one process, alternating:
µs per call (median of blocks of 200 back-to-back calls), host µs for one call to return, and kernels per call.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

LOWERINGS = {
    "cudnn (AOTI default)": {},
    "cudnn, GEMMs tuned (shimgen today)": {"max_autotune_gemm": True, "max_autotune_conv_backends": "ATEN"},
    # Timing every Triton config against cuDNN ("ATEN,TRITON") made the build 3-6x longer (results/gpu_h100_resnet_profile.md).
    "Triton template, Inductor's first config, untimed": {
        "max_autotune_gemm": True,
        "max_autotune_conv_backends": "TRITON",
        "test_configs.max_mm_configs": 1,
    },
}

BUILD = """
import json, sys, time, torch, torchvision
torch.manual_seed(0)
model = torchvision.models.resnet18().eval().cuda()
start = time.perf_counter()
with torch.no_grad():
    program = torch.export.export(model, (torch.randn({batch}, 3, 224, 224, device="cuda"),))
    torch._inductor.aoti_compile_and_package(program, package_path=sys.argv[1], inductor_configs=json.loads(sys.argv[2]))
print(time.perf_counter() - start)
"""


def build(name: str, configs: dict, work: Path, batch: int) -> tuple[str, float]:
    cache = Path(tempfile.mkdtemp(dir=work))
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(cache / "inductor"), TRITON_CACHE_DIR=str(cache / "triton"))
    package = work / f"{abs(hash(name))}.pt2"
    done = subprocess.run(
        [sys.executable, "-c", BUILD.format(batch=batch), str(package), json.dumps({"freezing": True, **configs})],
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode:
        raise SystemExit(f"{name}: build failed\n{done.stderr[-4000:]}")
    (work / f"{abs(hash(name))}.log").write_text(done.stderr)
    print(f"built {name} in {done.stdout.split()[-1]} s", file=sys.stderr, flush=True)
    return str(package), float(done.stdout.split()[-1])


def per_call(run, x: torch.Tensor) -> tuple[float, float]:
    blocks, hosts = [], []
    for _ in range(10):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(200):
            run(x)
        torch.cuda.synchronize()
        blocks.append((time.perf_counter() - start) / 200 * 1e6)
    for _ in range(200):
        torch.cuda.synchronize()
        start = time.perf_counter()
        run(x)
        hosts.append((time.perf_counter() - start) * 1e6)
    return statistics.median(blocks), statistics.median(hosts)


def kernels(run, x: torch.Tensor) -> tuple[float, float]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            run(x)
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return len(events) / 20, sum(e.device_time for e in events) / 20


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path)
    parser.add_argument("--batch", type=int, default=1)
    args = parser.parse_args()
    import torchvision

    work = Path(tempfile.mkdtemp())
    with ThreadPoolExecutor(len(LOWERINGS)) as pool:
        built = dict(zip(LOWERINGS, pool.map(lambda kv: build(*kv, work, args.batch), LOWERINGS.items()), strict=True))
    torch.manual_seed(0)
    model = torchvision.models.resnet18().eval().cuda()
    x = torch.randn(args.batch, 3, 224, 224, device="cuda")
    with torch.no_grad():
        expected = model(x)
    runners = {name: torch._inductor.aoti_load_package(package) for name, (package, _) in built.items()}
    rows = []
    for name, runner in runners.items():
        error = (runner(x) - expected).abs().max().item()
        rows.append([name, built[name][1], error, [], [], *kernels(runner, x)])
    for _ in range(3):  # alternating rounds
        for row, runner in zip(rows, runners.values(), strict=True):
            us, host = per_call(runner, x)
            row[3].append(us)
            row[4].append(host)
    base = min(rows[0][3])
    lines = [
        f"{torch.cuda.get_device_name()}, torch {torch.__version__}, ResNet-18 batch {args.batch}, freezing, "
        "no CUDA graphs.",
        "",
        "| convolutions | build s (all at once) | max abs error vs eager | µs per call (best of 3 rounds) "
        "| x AOTI default | host µs | kernels per call | GPU µs per call |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, seconds, error, us, host, count, gpu in rows:
        lines.append(
            f"| {name} | {seconds:.1f} | {error:.1e} | {min(us):.1f} | {min(us) / base:.2f} | {min(host):.1f} | {count:.0f} | {gpu:.1f} |"
        )
    print("\n".join(lines))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        for name in LOWERINGS:
            log = work / f"{abs(hash(name))}.log"
            autotune = [line for line in log.read_text().splitlines() if "AUTOTUNE" in line or line.startswith("  ")]
            (args.out / f"autotune_{abs(hash(name))}.log").write_text("\n".join(autotune[:400]))
        (args.out / f"gpu_conv_b{args.batch}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
