"""A bf16 projection: one large GEMM with a fused epilogue."""

import torch
from torch import nn


def projection(d_in: int = 4096, d_out: int = 4096) -> nn.Module:
    return nn.Sequential(nn.Linear(d_in, d_out), nn.GELU()).to(torch.bfloat16)
