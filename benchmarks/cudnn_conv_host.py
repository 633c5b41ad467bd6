"""What a convolution call costs the host with cuDNN's plan kept, against ATen's paths (issue 29, item 3).

    python benchmarks/cudnn_conv_host.py

GPU ResNet-18 at batch 1 is bound by the host: about 15 µs of CPU per cuDNN convolution, 20 per call. This builds
cudnn_conv_host.cpp as a torch extension and times, for ResNet-18's convolution shapes (batch 1, channels-last,
float32, torch's default TF32 setting), 2000 back-to-back calls of each way, twice, alternating.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path

import torch
from torch.utils.cpp_extension import load

SHAPES = [  # in channels, out channels, height = width, kernel, stride, padding
    (64, 64, 56, 3, 1, 1),
    (128, 128, 28, 3, 1, 1),
    (64, 128, 56, 1, 2, 0),
    (3, 64, 224, 7, 2, 3),
    (512, 512, 7, 3, 1, 1),
]
WAYS = ["at::convolution", "at::cudnn_convolution", "cuDNN plan kept"]


def main() -> None:
    import nvidia

    [header] = glob.glob(os.path.join(list(nvidia.__path__)[0], "cudnn", "include", "cudnn.h"))
    include = os.path.dirname(header)
    library = os.path.join(os.path.dirname(include), "lib")
    extension = load(
        "cudnn_conv_host",
        [str(Path(__file__).with_suffix(".cpp"))],
        extra_include_paths=[include],
        extra_ldflags=[f"-L{library}", "-l:libcudnn.so.9"],
        with_cuda=True,
    )
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}")
    print("\n| convolution (in, out, size, kernel, stride) | " + " | ".join(WAYS) + " |")
    print("| --- |" + " --- |" * len(WAYS))
    for c, k, size, kernel, stride, pad in SHAPES:
        x = torch.randn(1, c, size, size, device="cuda").to(memory_format=torch.channels_last)
        w = torch.randn(k, c, kernel, kernel, device="cuda").to(memory_format=torch.channels_last)
        cells: dict[int, list[str]] = {mode: [] for mode in range(len(WAYS))}
        for _ in range(2):
            for mode in cells:
                enqueue, total, error = extension.bench(x, w, [stride] * 2, [pad] * 2, [1, 1], 1, mode, 2000)
                assert error < 1e-3, (WAYS[mode], error)
                cells[mode].append(
                    f"{enqueue:.1f}" if abs(enqueue - total) < 0.5 else f"{enqueue:.1f} (GPU {total:.1f})"
                )
        name = f"{c}, {k}, {size}, {kernel}x{kernel}, {stride}"
        print(f"| {name} | " + " | ".join(" / ".join(cells[mode]) for mode in cells) + " |")
    print("\nµs of host time per call to enqueue, two rounds; where the GPU took longer, its time per call too.")


if __name__ == "__main__":
    main()
