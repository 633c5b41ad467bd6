"""A small model calling the custom ops of kernels/shimgen_ops.cpp (C++) and models/pyops.py (Python)."""

import torch


class SoftClampMLP(torch.nn.Module):
    """Linear → soft_clamp (C++) → Linear → topk_mask (C++) → + residual."""

    def __init__(self, width: int = 64, k: int = 8) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(width, width)
        self.fc2 = torch.nn.Linear(width, width)
        self.k = k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.ops.shimgen_ops.soft_clamp(self.fc1(x), 2.0)
        return torch.ops.shimgen_ops.topk_mask(self.fc2(h), self.k) + x


class PyOpModel(torch.nn.Module):
    """Linear → running_max (a Python custom op) → Linear."""

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(width, width)
        self.fc2 = torch.nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.ops.shimgen_pyops.running_max(self.fc1(x).relu()))
