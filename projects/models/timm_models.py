"""timm vision models from small configs (random weights, no downloads): a CNN and vision transformers."""

from __future__ import annotations

import timm
from torch import nn


def convnext(dims: tuple[int, ...] = (16, 32, 64, 128), depths: tuple[int, ...] = (1, 1, 1, 1)) -> nn.Module:
    """ConvNeXt: depthwise convolutions, LayerNorm over channels; torch.export cannot keep batch 1 in a dynamic range."""
    return timm.create_model(
        "convnext_atto", pretrained=False, num_classes=10, dims=tuple(dims), depths=tuple(depths)
    ).eval()


def swin(
    embed_dim: int = 32, depths: tuple[int, ...] = (1, 1, 1, 1), num_heads: tuple[int, ...] = (1, 2, 2, 4)
) -> nn.Module:
    """Swin-T's layout at a small width: windowed attention, batched matmuls over batch x windows x heads."""
    return timm.create_model(
        "swin_tiny_patch4_window7_224",
        pretrained=False,
        embed_dim=embed_dim,
        depths=tuple(depths),
        num_heads=tuple(num_heads),
    ).eval()


def levit(
    embed_dim: tuple[int, ...] = (64, 96, 128),
    depth: tuple[int, ...] = (1, 1, 1),
    num_heads: tuple[int, ...] = (2, 3, 4),
) -> nn.Module:
    """LeViT-128S's layout at a small width: attention with batched matmuls after convolutional stages."""
    return timm.create_model(
        "levit_128s", pretrained=False, embed_dim=tuple(embed_dim), depth=tuple(depth), num_heads=tuple(num_heads)
    ).eval()
