"""Plain functions as graphs."""

import torch


def pairwise_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Squared distances between two point sets."""
    return (a.unsqueeze(1) - b.unsqueeze(0)).pow(2).sum(-1)
