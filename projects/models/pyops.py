"""A custom op with a Python body (torch.library.custom_op): compiled graphs call back into Python for it."""

import torch


@torch.library.custom_op("shimgen_pyops::running_max", mutates_args=())
def running_max(x: torch.Tensor) -> torch.Tensor:
    """Running maximum along the last dimension."""
    return torch.cummax(x, dim=-1).values.clone()


@running_max.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)
