"""A tiny MLP: 8 x (Linear 32 -> ReLU). Small enough for fast end-to-end tests."""

import torch
from torch import nn


def mlp(width: int = 32, depth: int = 8) -> nn.Module:
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers)


class Heads(nn.Module):
    """Shared trunk, two outputs in a dict: exercises structured outputs and a keyword input."""

    def __init__(self, width: int = 32, classes: int = 10) -> None:
        super().__init__()
        self.trunk = mlp(width, 2)
        self.norm = nn.LayerNorm(width)
        self.classify = nn.Linear(width, classes)

    def forward(
        self, x: torch.Tensor, *, scale: torch.Tensor
    ) -> dict[str, torch.Tensor | tuple[torch.Tensor, torch.Tensor]]:
        h = self.norm(self.trunk(x)) * scale
        logits = self.classify(h)
        return {"logits": logits, "stats": (h.mean(dim=-1), torch.softmax(logits, dim=-1))}


class ResidualGelu(nn.Module):
    """depth x (x + gelu(Linear(x))): the shape of a transformer's small MLP blocks."""

    def __init__(self, width: int = 32, depth: int = 8) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = x + nn.functional.gelu(layer(x))
        return x
