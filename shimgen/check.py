"""`shimgen check`: the built package against eager PyTorch, on the example inputs and on random
inputs at min, middle and max of every dynamic dim, on each target's device this machine has."""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .entry import call_model, example_sizes, load_model, make_inputs
from .spec import Graph, ProjectSpec


@dataclass
class Comparison:
    graph: str
    case: str
    output: str
    max_abs: float
    max_rel: float
    ok: bool


def cases(graph: Graph) -> list[tuple[str, dict[str, int]]]:
    """(label, dim sizes): the example, then each dim at min, middle, max with the others at their example."""
    base = example_sizes(graph)
    out = [("example", base)]
    for name, dim in graph.dims.items():
        for size in dict.fromkeys((dim.min, (dim.min + dim.max) // 2, dim.max)):
            out.append((f"{name}={size}", {**base, name: size}))
    return out


def compare(spec: ProjectSpec, spec_dir: Path, package_dir: Path) -> list[Comparison]:
    import torch
    import torch.utils._pytree as pytree

    sys.path.insert(0, str(package_dir))
    try:
        pkg = importlib.import_module(spec.project.name)
    finally:
        sys.path.remove(str(package_dir))
    rows = []
    devices = [t.device for t in spec.target if t.device == "cpu" or torch.cuda.is_available()]
    for device, (i, graph) in ((d, g) for d in devices for g in enumerate(spec.graph)):
        model = load_model(graph, f"graph[{i}]", spec_dir)
        if isinstance(model, torch.nn.Module):
            model = model.to(device)
        compiled = getattr(pkg, graph.name)
        for n, (label, sizes) in enumerate(cases(graph)):
            inputs = [t.to(device) for t in make_inputs(graph, sizes, graph.seed + n)]
            label = label if len(spec.target) == 1 else f"{device}: {label}"
            with torch.no_grad():
                expected = call_model(model, graph, inputs)
                got = call_model(compiled, graph, inputs)
            want_leaves, want_spec = pytree.tree_flatten(expected)
            got_leaves, got_spec = pytree.tree_flatten(got)
            if want_spec != got_spec:
                rows.append(Comparison(graph.name, label, f"structure {got_spec} != {want_spec}", float("inf"), float("inf"), False))
                continue
            for path, want, have in zip(_paths(expected), want_leaves, got_leaves):
                rows.append(_compare_tensors(graph, label, path, want, have))
    return rows


def _compare_tensors(graph: Graph, label: str, path: str, want: Any, have: Any) -> Comparison:
    import torch

    if want.shape != have.shape or want.dtype != have.dtype:
        return Comparison(graph.name, label, f"{path} {tuple(have.shape)}/{have.dtype} != {tuple(want.shape)}/{want.dtype}", float("inf"), float("inf"), False)
    a, b = have.double(), want.double()
    diff = (a - b).abs()
    max_abs = diff.max().item() if diff.numel() else 0.0
    max_rel = (diff / b.abs().clamp_min(1e-12)).max().item() if diff.numel() else 0.0
    ok = bool(torch.allclose(a, b, rtol=graph.rtol, atol=graph.atol, equal_nan=True))
    return Comparison(graph.name, label, path, max_abs, max_rel, ok)


def _paths(tree: Any) -> list[str]:
    import torch.utils._pytree as pytree

    leaves = pytree.tree_flatten_with_path(tree)[0]
    return ["out" + pytree.keystr(p) for p, _ in leaves]
