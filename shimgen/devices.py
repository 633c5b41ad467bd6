"""What differs between the devices a target builds for, as data: a decision that depends on the device reads a field
of its `Device` rather than comparing names."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

DeviceName = Literal["cpu", "cuda"]


@dataclass(frozen=True, kw_only=True)
class Device:
    name: DeviceName
    gpu: bool
    """Kernels run on a GPU: Inductor tunes and compiles them on one (a build needs it, and nvcc and torch's CUDA), the
    package's calls run only where torch sees one, and the wheel's label names the CUDA version."""
    build_order: int
    """Units build in this order: in one process, the first CPU freezing decides whether Inductor's oneDNN passes are
    registered, so CPU units go first."""
    target_field: str
    """The [[target]] field that says what code to generate: the CPU's instruction set, or the GPU architectures."""

    def available(self) -> bool:
        """Whether this machine can run the device's code (imports torch for a GPU)."""
        if not self.gpu:
            return True
        import torch

        return bool(torch.cuda.is_available())


CPU = Device(name="cpu", gpu=False, build_order=0, target_field="isa")
CUDA = Device(name="cuda", gpu=True, build_order=1, target_field="archs")
DEVICES: dict[str, Device] = {d.name: d for d in (CPU, CUDA)}


def device(name: str) -> Device:
    return DEVICES[name]
