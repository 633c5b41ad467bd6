"""How close an output must be to what it is compared with: the graph's `atol` and `rtol`, never tighter than the
output's dtype can be held to.

A compiled kernel rounds otherwise than eager: Inductor keeps a fused kernel's intermediates in float32 where eager
rounds every op's result to the tensor's dtype, and orders sums otherwise. In float16 and bfloat16 that leaves errors
of a few units in the last place of the output's largest values, also at outputs near zero (a sum that cancels).
Measured against eager (`torch.compile`, a 2-layer Llama and ResNet-18, random weights): at most 1.1% of the output's
largest magnitude in bfloat16 and 0.1% in float16. So a low-precision output's tolerance has a floor, relative to its
largest magnitude (`LEAST`): a wrong kernel still differs by the size of the values. Some models' own low-precision
rounding goes further (transformers' GPT-OSS of random weights: eager in bfloat16 is 0.14 off eager in float32, at
logits of 0.5): their graphs need atol and rtol of their own, which a difference held to the floor says."""

from __future__ import annotations

from typing import Any

from shimgen.spec import Graph

# by dtype name: the least atol (times the output's largest magnitude, at least 1) and rtol
LEAST = {"bfloat16": 5e-2, "float16": 1e-2}


def allowed(graph: Graph, want: Any, floor: float = 0.0) -> tuple[float, float]:
    """(atol, rtol) an output is held to against `want`: the graph's, or the least its dtype allows (at least
    `floor`), whichever is looser."""
    least = max(floor, LEAST.get(str(want.dtype).removeprefix("torch."), 0.0))
    if not least:
        return graph.atol, graph.rtol
    scale = max(1.0, largest(want)) if want.is_floating_point() else 1.0  # integers: an index is right or wrong
    return max(graph.atol, least * scale), max(graph.rtol, least)


def largest(want: Any) -> float:
    """A tensor's largest magnitude, leaving out infinities, NaN and the sentinels masks are filled with
    (torch.finfo(dtype).min); 0 where it has none."""
    import torch

    magnitudes = want.detach().double().abs()
    if want.is_floating_point():
        magnitudes = magnitudes[magnitudes < torch.finfo(want.dtype).max / 2]
    return magnitudes.max().item() if magnitudes.numel() else 0.0


def difference(graph: Graph, want: Any, got: Any, floor: float = 0.0) -> str:
    """How `got` differs from `want` beyond `allowed` ("max abs error 0.02; atol 0.001, rtol 0.001"); empty where it
    does not. The shapes and dtypes must be equal."""
    import torch

    atol, rtol = allowed(graph, want, floor)
    g, w = got.double(), want.double()
    if torch.allclose(g, w, rtol=rtol, atol=atol, equal_nan=True):
        return ""
    error = (g - w).abs().nan_to_num(float("inf")).max().item() if g.numel() else 0.0
    dtype = str(want.dtype).removeprefix("torch.")
    hint = ""
    if dtype in LEAST and atol > graph.atol:
        hint = (
            f", {dtype}'s least: a model whose eager run in {dtype} is as far from its run in float32 needs the graph's "
            "atol and rtol raised"
        )
    return f"max abs error {error:.3g}; atol {atol:.3g}, rtol {rtol:.3g}{hint}"
