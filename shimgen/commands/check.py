"""`shimgen check`: the built package against eager PyTorch, on the example inputs and on random
inputs at min, middle and max of every dynamic dim, on each target's device this machine has."""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shimgen import devices, tolerance
from shimgen.spec import Graph, ProjectSpec
from shimgen.trace.entry import call_model, example_sizes, float32_as_float32, load_model, make_inputs, project_scope
from shimgen.trace.export import describe_type, node_parts
from shimgen.trace.variants import specializations


@dataclass
class Comparison:
    graph: str
    case: str
    output: str
    max_abs: float
    largest: float  # eager's largest magnitude (tolerance.largest)
    ok: bool
    dtype: str = ""  # eager's output's


def cases(graph: Graph, made: list[dict[str, int]] | None = None) -> list[tuple[str, dict[str, int]]]:
    """(label, dim sizes): the example, then each dim at min, middle, max with the others at their example, then each
    variant's sizes (`made`: those the build made, automatic ones too; default: those the spec lists)."""
    base = example_sizes(graph)
    out = [("example", base)]
    for name, dim in graph.dims.items():
        middle = (dim.min + dim.max) // 2 // dim.multiple_of * dim.multiple_of
        for size in dict.fromkeys((dim.min, max(dim.min, middle), dim.max)):
            out.append((f"{name}={size}", {**base, name: size}))
    for sizes in specializations(graph) if made is None else made:
        out.append(("variant " + ",".join(f"{name}={size}" for name, size in sizes.items()), {**base, **sizes}))
    return out


def compare(
    spec: ProjectSpec,
    spec_dir: Path,
    package_dir: Path,
    made: dict[str, list[dict[str, int]]] | None = None,
    weights_file: Path | None = None,
) -> list[Comparison]:
    """Each graph of the built package against eager at the example, min, middle and max sizes and each variant's
    (`made`: by graph, the sizes of the variants the build made); `weights_file`: the weights of a package built with
    flags.weights = "external"."""
    import torch

    sys.path.insert(0, str(package_dir))
    try:
        pkg = importlib.import_module(spec.project.name)
    finally:
        sys.path.remove(str(package_dir))
    if weights_file is not None:
        pkg.load_weights(str(weights_file))
    rows = []
    runnable = [t.device for t in spec.target if devices.device(t.device).available()]
    # The models' modules, and the types of their outputs, stay importable while they run.
    with project_scope(spec_dir):
        for device, (i, graph) in ((d, g) for d in runnable for g in enumerate(spec.graph)):
            model = load_model(graph, f"graph[{i}]", spec_dir)
            if isinstance(model, torch.nn.Module):
                model = model.to(device)
            compiled = getattr(pkg, graph.name)
            if hasattr(pkg, "reset_state"):  # the graph and a fresh model start from the same state
                pkg.reset_state()
            for n, (label, sizes) in enumerate(cases(graph, made.get(graph.name) if made is not None else None)):
                inputs = [t.to(device) for t in make_inputs(graph, sizes, graph.seed + n)]
                label = label if len(spec.target) == 1 else f"{device}: {label}"
                with torch.no_grad(), float32_as_float32():
                    expected = call_model(model, graph, inputs)
                    got = call_model(compiled, graph, inputs)
                try:
                    pairs = _tensor_pairs(expected, got, spec_dir)
                except StructureMismatch as exc:
                    rows.append(Comparison(graph.name, label, f"structure: {exc}", float("inf"), float("nan"), False))
                    continue
                for path, want, have in pairs:
                    rows.append(_compare_tensors(graph, label, path, want, have))
    return rows


class StructureMismatch(Exception):
    """The package's output is not what it promises for eager's: says where and how."""


def _tensor_pairs(want: Any, got: Any, spec_dir: Path, path: str = "out") -> list[tuple[str, Any, Any]]:
    """(path, eager tensor, package tensor) for every tensor of the output, once `got` is shown to be
    what the package promises for `want`: the same structure, each node of a type of its own either
    that type or, where the build found the package cannot rebuild it (a type of the project's own,
    one that cannot be imported or called with its fields), its documented fallback with the same
    field names in the same order. Anything else raises StructureMismatch."""
    import torch

    if want is None:
        if got is not None:
            raise StructureMismatch(f"{path} is {_kind(got)}, eager returns None")
        return []
    if isinstance(want, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            raise StructureMismatch(f"{path} is {_kind(got)}, eager returns a tensor")
        return [(path, want, got)]
    parts = node_parts(want)
    if parts is None:
        raise StructureMismatch(f"{path}: eager returns {_kind(want)}, which the package cannot return")
    children, names = parts
    got_children = _matching_children(want, got, children, names, spec_dir, path)
    pairs = []
    for k, (child, got_child) in enumerate(zip(children, got_children, strict=True)):
        pairs += _tensor_pairs(child, got_child, spec_dir, path + _step(want, k, names))
    return pairs


def _step(node: Any, k: int, names: list[str] | None) -> str:
    if type(node) is dict:
        return f"[{list(node)[k]!r}]"
    return f".{names[k]}" if names and type(node) not in (tuple, list) else f"[{k}]"


def _matching_children(
    want: Any, got: Any, children: list[Any], names: list[str] | None, spec_dir: Path, path: str
) -> list[Any]:
    """`got`'s children, in `want`'s order, where `got` is the node the package promises for `want`."""
    expected: type | None
    if type(want) in (tuple, list, dict):
        expected, fallback = type(want), None
    else:
        out_type = describe_type(want, children, names, spec_dir)
        expected, fallback = (type(want), None) if out_type.construct else (None, out_type.fallback)
    if expected is not None:
        if type(got) is not expected:
            raise StructureMismatch(f"{path} is {_kind(got)}, eager returns {_kind(want)}")
        got_parts = node_parts(got)
        assert got_parts is not None
        got_children, got_names = got_parts
        if (
            (isinstance(want, dict) and list(got) != list(want))
            or got_names != names
            or len(got_children) != len(children)
        ):
            raise StructureMismatch(
                f"{path}: {_fields(got, got_children, got_names)}, eager {_fields(want, children, names)}"
            )
        return got_children
    if fallback == "namedtuple":
        ok = (
            isinstance(got, tuple)
            and type(got).__name__ == type(want).__name__
            and list(getattr(got, "_fields", ())) == names
        )
    elif fallback == "dict":
        ok = type(got) is dict and list(got) == names
    else:
        ok = type(got) is tuple and len(got) == len(children)
    if not ok:
        raise StructureMismatch(
            f"{path} is {_kind(got)}, but for eager's {_kind(want)} ({_fields(want, children, names)}) "
            f"the package returns a {fallback} of the same fields"
        )
    return list(got.values()) if fallback == "dict" else list(got)


def _kind(value: Any) -> str:
    cls = type(value)
    return (
        "None"
        if value is None
        else f"{cls.__module__}.{cls.__qualname__}"
        if cls.__module__ != "builtins"
        else cls.__name__
    )


def _fields(value: Any, children: list[Any], names: list[str] | None) -> str:
    if isinstance(value, dict):
        return f"keys {list(value)}"
    return f"fields {names}" if names is not None else f"{len(children)} items"


def _compare_tensors(graph: Graph, label: str, path: str, want: Any, have: Any) -> Comparison:
    import torch

    if want.shape != have.shape or want.dtype != have.dtype:
        mismatch = f"{path} {tuple(have.shape)}/{have.dtype} != {tuple(want.shape)}/{want.dtype}"
        return Comparison(graph.name, label, mismatch, float("inf"), float("nan"), False)
    a, b = have.double(), want.double()
    diff = (a - b).abs()
    max_abs = diff.max().item() if diff.numel() else 0.0
    atol, rtol = tolerance.allowed(graph, want)
    ok = bool(torch.allclose(a, b, rtol=rtol, atol=atol, equal_nan=True))
    dtype = str(want.dtype).removeprefix("torch.")
    return Comparison(graph.name, label, path, max_abs, tolerance.largest(want), ok, dtype)
