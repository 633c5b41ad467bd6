"""Runs the installed `resnet` package against eager PyTorch: agreement, then latency at batch 1."""

import importlib.util
import sys
import time
from pathlib import Path

import resnet
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "projects"))
from models.resnet import resnet18  # noqa: E402  (the eager reference: plain PyTorch, no shimgen)

assert importlib.util.find_spec("shimgen") is None, "this environment must not have shimgen"
print(f"resnet from {resnet.__file__}\n{resnet.forward.__doc__}\n")

torch.manual_seed(0)  # the spec's seed: same weights as the build
model = resnet18(num_classes=1000).eval()
for batch in (1, 4, 64):
    x = torch.randn(batch, 3, 224, 224)
    with torch.no_grad():
        err = (resnet.forward(x) - model(x)).abs().max().item()
    print(f"batch {batch:>2}: max abs difference vs eager {err:.2e}")
    assert err < 1e-3, "mismatch with eager"


def latency_ms(fn, x, reps=30):  # type: ignore[no-untyped-def]
    with torch.no_grad():
        for _ in range(5):
            fn(x)
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            fn(x)
            times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2] * 1e3


x = torch.randn(1, 3, 224, 224)
eager, shim = latency_ms(model, x), latency_ms(resnet.forward, x)
print(
    f"\nResNet-18 batch 1, {torch.get_num_threads()} threads, median ms: eager {eager:.2f}, shimgen {shim:.2f} "
    f"(shimgen / eager = {shim / eager:.2f})"
)
