"""Specialized variants: the sizes a graph's dims list in `specialize`, and the graph each variant traces."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

from shimgen.errors import SpecError
from shimgen.results import TraceResult, unit_name, variant_name
from shimgen.spec import Graph, Target
from shimgen.spec.model import VARIANTS_LIMIT


def specializations(graph: Graph) -> list[dict[str, int]]:
    """Each variant's sizes: every combination of the sizes the dims list, in the order of dims."""
    listed = {name: dim.specialize for name, dim in graph.dims.items() if dim.specialize}
    if not listed:
        return []
    return [dict(zip(listed, sizes, strict=True)) for sizes in itertools.product(*listed.values())]


def traced_graph(graph: Graph, sizes: dict[str, int]) -> Graph:
    """The graph a variant traces: the dims in `sizes` written as static sizes, and no dim specializing (the dynamic
    code, `sizes` empty, does not depend on which sizes are specialized)."""
    inputs = [
        dataclasses.replace(inp, shape=[sizes.get(s, s) if isinstance(s, str) else s for s in inp.shape])
        for inp in graph.inputs
    ]
    dims = {name: dataclasses.replace(dim, specialize=[]) for name, dim in graph.dims.items() if name not in sizes}
    return dataclasses.replace(graph, inputs=inputs, dims=dims)


def fully_static(graph: Graph, sizes: dict[str, int]) -> bool:
    """Whether a variant of these sizes has no dynamic dim left (CUDA graphs can capture it)."""
    return set(sizes) == set(graph.dims)


def works(graph: Graph, target: Target) -> list[tuple[str, dict[str, int]]]:
    """(name, sizes) of each trace and codegen of a graph on a target: its dynamic code (no sizes, the unit's name),
    then
    each variant's (`<unit>__<variant>`)."""
    unit = unit_name(graph, target)
    return [(unit, {})] + [(f"{unit}__{variant_name(sizes)}", sizes) for sizes in specializations(graph)]


def left_out(works: list[tuple[str, int, Graph, Target, dict[str, int]]], traced: dict[str, TraceResult]) -> list[Any]:
    """The works (as in pipeline: name, graph index, graph, target, sizes) of the sizes each traced work left out of its
    dynamic range (TraceResult.narrowed), each fixed in a variant of its own, that `works` lacks."""
    known = {name for name, *_ in works}
    new = []
    for name, i, graph, target, sizes in works:
        for dim, kept_min, kept_max, condition in traced[name].narrowed if name in traced else ():
            declared = graph.dims[dim]
            for size in range(declared.min, declared.max + 1, declared.multiple_of):
                if kept_min <= size <= kept_max:
                    continue
                fixed = {d: ({**sizes, dim: size})[d] for d in graph.dims if d in sizes or d == dim}
                variant = f"{unit_name(graph, target)}__{variant_name(fixed)}"
                if variant not in known:
                    known.add(variant)
                    new.append((variant, i, graph, target, fixed))
            count = sum(1 for n, *_ in works + new if n.startswith(unit_name(graph, target) + "__"))
            if count > VARIANTS_LIMIT:
                raise SpecError(
                    "",
                    f"graph[{i}].dims.{dim}",
                    f"the model cannot take every size of '{dim}' in [{declared.min}, {declared.max}]: it "
                    f"needs {condition}, and building the sizes outside [{kept_min}, {kept_max}] as variants of their own "
                    f"would make {count} variants (at most {VARIANTS_LIMIT}); write dims.{dim} = {{ min = {kept_min}, "
                    f"max = {kept_max} }}",
                )
    return new


def reason(graph: Graph, target: Target, sizes: dict[str, int], traced: dict[str, TraceResult]) -> str:
    """Why the build made the variant of `sizes`, where the spec does not list it; empty where it does."""
    if sizes in specializations(graph):
        return ""
    unit = unit_name(graph, target)
    for name, result in traced.items():
        for dim, kept_min, kept_max, condition in (
            result.narrowed if name == unit or name.startswith(unit + "__") else ()
        ):
            if not kept_min <= sizes.get(dim, kept_min) <= kept_max:
                return f"torch.export cannot keep {dim}={sizes[dim]} in the dynamic range (the model needs {condition} there)"
    return ""
