"""Trace stage: a spec graph → torch.export ExportedProgram with the spec's dynamic dims.

The model is wrapped so the exported program takes exactly the spec's inputs, positionally, in
spec order: the binding can hand them to AOTInductor as they come.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .entry import call_model, describe, example_sizes, load_model, make_inputs
from .errors import SpecError
from .spec import Graph

# Output tree nodes in preorder, as the binding rebuilds them (kinds match binding.cpp.j2).
TENSOR, TUPLE, LIST, DICT, NONE = range(5)


@dataclass
class OutNode:
    kind: int
    arity: int = 0
    key: str | None = None


@dataclass
class Traced:
    program: Any  # torch.export.ExportedProgram
    out_nodes: list[OutNode]
    num_outputs: int


def trace(graph: Graph, where: str, spec_dir: Path, device: str) -> Traced:
    """Export on `device`: Inductor generates kernels for the device the program's tensors are on."""
    import torch

    model = load_model(graph, where, spec_dir)
    if isinstance(model, torch.nn.Module):
        model = model.to(device)
    inputs = [t.to(device) for t in make_inputs(graph, example_sizes(graph), graph.seed)]
    with torch.no_grad():
        try:
            call_model(model, graph, inputs)
        except Exception as exc:
            shapes = ", ".join(f"{i.name}={tuple(t.shape)}" for i, t in zip(graph.inputs, inputs))
            raise SpecError("", f"{where}.inputs", f"the model rejected the example inputs ({shapes}): {describe(exc, spec_dir)}") from None
        adapter = _spec_order_module(model, graph)
        dims = {name: torch.export.Dim(name, min=d.min, max=d.max) for name, d in graph.dims.items()}
        dynamic = tuple({k: dims[s] for k, s in enumerate(inp.shape) if isinstance(s, str)} for inp in graph.inputs)
        try:
            program = torch.export.export(adapter, tuple(inputs), dynamic_shapes=(dynamic,))
        except Exception as exc:
            raise SpecError("", where, f"torch.export failed: {_export_message(exc)}") from None
    out_nodes = _out_nodes(program.call_spec.out_spec, f"{where}: output")
    return Traced(program, out_nodes, sum(1 for n in out_nodes if n.kind == TENSOR))


def _spec_order_module(model: Callable[..., Any], graph: Graph) -> Any:
    """An nn.Module taking the spec's inputs positionally in spec order and calling the model."""
    import torch

    class SpecOrderCall(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model  # a Module is registered as a submodule; a function stays an attribute

        def forward(self, *tensors: torch.Tensor) -> Any:
            return call_model(self.model, graph, list(tensors))

    return SpecOrderCall()


def _out_nodes(spec: Any, where: str) -> list[OutNode]:
    nodes: list[OutNode] = []

    def visit(node: Any, key: str | None) -> None:
        if node.is_leaf():
            nodes.append(OutNode(TENSOR, 0, key))
            return
        kind = {tuple: TUPLE, list: LIST, dict: DICT, type(None): NONE}.get(node.type)
        if kind is None:
            raise SpecError("", where, f"{node.type.__name__} outputs are not supported (tensors, tuples, lists, dicts, None)")
        keys = list(node.context) if kind == DICT else [None] * node.num_children
        if any(not isinstance(k, str) and k is not None for k in keys):
            raise SpecError("", where, "dict outputs need string keys")
        nodes.append(OutNode(kind, node.num_children, key))
        for child, child_key in zip(node.children_specs, keys):
            visit(child, child_key)

    visit(spec, None)
    return nodes


def _export_message(exc: Exception) -> str:
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    useful = [line for line in lines if not line.startswith(("For more information", "The error above occurred"))]
    text = "\n  ".join(useful[:8])
    return f"{type(exc).__name__}: {text}" + ("\n  ..." if len(useful) > 8 else "")
