"""Models whose outputs are structures of their own (tests/test_outputs.py): a transformers
ModelOutput, a namedtuple and a registered dataclass defined here, and a nested mix of them with
None, a list, an int key and one of torch's own named results."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import torch
from torch import nn


class Pair(NamedTuple):
    scaled: torch.Tensor
    shifted: torch.Tensor


@dataclasses.dataclass
class Stats:
    mean: torch.Tensor
    mask: torch.Tensor | None  # None here: the pytree leaves it out, the binding passes it back
    spread: torch.Tensor


torch.export.register_dataclass(Stats)


def bert(hidden: int = 32, layers: int = 1, heads: int = 2, intermediate: int = 37, vocab: int = 99) -> nn.Module:
    """A tiny BERT from a config (no download), returning BaseModelOutputWithPoolingAndCrossAttentions."""
    import transformers

    config = transformers.BertConfig(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=intermediate,
        vocab_size=vocab,
    )
    return transformers.BertModel(config)


def pair(x: torch.Tensor) -> Pair:
    return Pair(x * 2, x + 1)


def nested(x: torch.Tensor) -> dict[object, object]:
    h = torch.tanh(x)
    return {
        "stats": Stats(mean=h.mean(dim=-1), mask=None, spread=h.std(dim=-1)),
        "list": [h.softmax(dim=-1), None, (h.sum(),)],
        "pair": pair(h),
        "top": h.topk(3, dim=-1),
        7: h.abs(),
    }
