"""Specialized variants: the sizes a graph's dims list in `specialize`, and the graph each variant traces."""

from __future__ import annotations

import dataclasses
import itertools

from .results import unit_name, variant_name
from .spec import Graph, Target


def specializations(graph: Graph) -> list[dict[str, int]]:
    """Each variant's sizes: every combination of the sizes the dims list, in the order of dims."""
    listed = {name: dim.specialize for name, dim in graph.dims.items() if dim.specialize}
    if not listed:
        return []
    return [dict(zip(listed, sizes, strict=True)) for sizes in itertools.product(*listed.values())]


def traced_graph(graph: Graph, sizes: dict[str, int]) -> Graph:
    """The graph a variant traces: the dims in `sizes` written as static sizes, and no dim specializing (the dynamic
    code, `sizes` empty, does not depend on which sizes are specialized)."""
    inputs = [dataclasses.replace(inp, shape=[sizes.get(s, s) if isinstance(s, str) else s for s in inp.shape]) for inp in graph.inputs]
    dims = {name: dataclasses.replace(dim, specialize=[]) for name, dim in graph.dims.items() if name not in sizes}
    return dataclasses.replace(graph, inputs=inputs, dims=dims)


def fully_static(graph: Graph, sizes: dict[str, int]) -> bool:
    """Whether a variant of these sizes has no dynamic dim left (CUDA graphs can capture it)."""
    return set(sizes) == set(graph.dims)


def works(graph: Graph, target: Target) -> list[tuple[str, dict[str, int]]]:
    """(name, sizes) of each trace and codegen of a graph on a target: its dynamic code (no sizes, the unit's name), then
    each variant's (`<unit>__<variant>`)."""
    unit = unit_name(graph, target)
    return [(unit, {})] + [(f"{unit}__{variant_name(sizes)}", sizes) for sizes in specializations(graph)]
