"""Models whose sizes are derived from the inputs' dims, and outputs that are not a plain tensor."""

import torch


def cat_slices(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Concatenates `a` with `b` minus its first column: the result's width is 2 * q - 1."""
    return torch.cat([a, b[:, 1:]], dim=1)


def pairs(x: torch.Tensor) -> torch.Tensor:
    """Sums neighbouring rows: needs an even number of rows (multiple_of = 2 in the spec)."""
    return x.view(x.shape[0] // 2, 2, x.shape[1]).sum(1)


class TopK(torch.nn.Module):
    """Scores, then the top 3 per row (values and int64 indices) and a view of the scores."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        scores = self.proj(x).relu()
        values, indices = scores.topk(3, dim=-1)
        return values, indices, scores.view(-1, 2, scores.shape[-1] // 2)


class HostMask(torch.nn.Module):
    """As timm's EdgeNeXt does: a mask made on the CPU from the input's shape, then moved to the input's device."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = ~torch.zeros(x.shape[0], x.shape[1], dtype=torch.bool)
        return self.proj(x) * mask.to(x.device).cumsum(0, dtype=torch.float32)


def chunked_scan(x: torch.Tensor, steps: int = 16) -> torch.Tensor:
    """Row i of each trailing square takes the rows before it, one step at a time (the shape of a chunked linear
    attention's reference code): Inductor fuses the steps into one large kernel."""
    a = x.clone()
    for i in range(1, steps):
        row = a[..., i, :i].clone()
        sub = a[..., :i, :i].clone()
        a[..., i, :i] = row + (row.unsqueeze(-1) * sub).sum(-2)
    return a
