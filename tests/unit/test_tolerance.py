"""The tolerance an output is held to: the graph's, or its dtype's floor relative to its largest magnitude."""

from __future__ import annotations

import torch

from shimgen import tolerance
from shimgen.spec import Graph


def _graph(atol: float = 1e-4, rtol: float = 1e-4) -> Graph:
    return Graph(name="forward", entry="m:f", inputs=[], atol=atol, rtol=rtol)


def test_float32_outputs_keep_the_graphs_tolerances() -> None:
    want = torch.tensor([300.0, 0.5, -2.0])
    assert tolerance.allowed(_graph(), want) == (1e-4, 1e-4)
    assert tolerance.difference(_graph(), want, want + 0.0625) == "max abs error 0.0625; atol 0.0001, rtol 0.0001"


def test_low_precision_outputs_are_held_to_what_their_dtype_rounds_to_at_their_largest_value() -> None:
    want = torch.tensor([300.0, 0.5, -2.0], dtype=torch.bfloat16)
    # a sum that cancels near zero, rounded otherwise: off by units in the last place of the largest values
    rounded = want + torch.tensor([2.0, 1.0, 0.0], dtype=torch.bfloat16)
    assert tolerance.allowed(_graph(), want) == (15.0, 5e-2)
    assert tolerance.difference(_graph(), want, rounded) == ""
    assert tolerance.difference(_graph(), want, want * 1.2) == (
        "max abs error 60; atol 15, rtol 0.05, bfloat16's least: a model whose eager run in bfloat16 is as far from its "
        "run in float32 needs the graph's atol and rtol raised"
    )
    assert tolerance.difference(_graph(atol=20.0), want, want * 1.2) == "max abs error 60; atol 20, rtol 0.05"
    half = torch.tensor([1.0, 0.25], dtype=torch.float16)
    assert tolerance.allowed(_graph(), half) == (1e-2, 1e-2)
    assert tolerance.allowed(_graph(atol=1.0, rtol=0.5), half) == (1.0, 0.5)  # the graph's, where looser


def test_the_builds_floor_scales_with_float_outputs_and_leaves_integers_exact() -> None:
    logits = torch.tensor([342.0, -0.01])
    assert tolerance.allowed(_graph(atol=0.0, rtol=0.0), logits, floor=1e-4) == (342.0 * 1e-4, 1e-4)
    tokens = torch.tensor([50000, 3])
    assert tolerance.allowed(_graph(atol=0.0, rtol=0.0), tokens, floor=1e-4) == (1e-4, 1e-4)
    assert tolerance.difference(_graph(atol=0.0, rtol=0.0), tokens, tokens + 1, floor=1e-4) != ""


def test_infinities_and_mask_sentinels_do_not_scale_the_tolerance() -> None:
    masked = torch.tensor([2.0, torch.finfo(torch.float32).min, float("-inf"), float("nan")])
    assert tolerance.allowed(_graph(atol=0.0, rtol=0.0), masked, floor=1e-4) == (2e-4, 1e-4)
