"""TOML spec → ProjectSpec: type-driven conversion plus the checks types cannot express."""

from __future__ import annotations

import dataclasses
import difflib
import keyword
import sys
import types
import typing
from pathlib import Path
from typing import Any, Literal

from ..errors import SpecError
from .model import Graph, ProjectSpec, Target

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

RESERVED_GRAPH_NAMES = {"torch"}


def load_spec(path: Path) -> ProjectSpec:
    """Read, convert and validate a spec file; every problem is a SpecError naming file and key."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError(str(path), "", f"cannot read spec: {exc.strerror}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(str(path), "", f"not valid TOML: {exc}") from None
    try:
        spec = convert(data, ProjectSpec, "")
        validate(spec)
    except SpecError as exc:
        exc.file = str(path)
        raise
    return spec


def convert(value: Any, hint: Any, where: str) -> Any:
    """Convert TOML data to `hint` (a dataclass, list, dict, Literal, union or scalar)."""
    if dataclasses.is_dataclass(hint):
        return _convert_dataclass(value, hint, where)
    origin = typing.get_origin(hint)
    if origin is Literal:
        choices = typing.get_args(hint)
        if value not in choices or type(value) is not type(choices[0]):
            noun = _literal_noun(where)
            raise SpecError("", where, f"{value!r} is not {noun} (expected one of: {', '.join(map(str, choices))})")
        return value
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return convert(value, option, where)
            except SpecError as exc:
                errors.append(exc)
        if len(errors) == 1:
            raise errors[0]
        raise SpecError("", where, f"expected {_type_name(hint)}, got {_value_name(value)}")
    if origin is list:
        if not isinstance(value, list):
            raise SpecError("", where, f"expected a list, got {_value_name(value)}")
        (item,) = typing.get_args(hint)
        return [convert(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise SpecError("", where, f"expected a table, got {_value_name(value)}")
        _, item = typing.get_args(hint)
        return {k: convert(v, item, _join(where, k)) for k, v in value.items()}
    if hint is Any:
        return value
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint in (int, float, str, bool):
        if type(value) is not hint:
            raise SpecError("", where, f"expected {_type_name(hint)}, got {_value_name(value)}")
        return value
    raise TypeError(f"spec model uses an unsupported type: {hint!r}")  # a bug in model.py, not user input


def _convert_dataclass(value: Any, cls: type, where: str) -> Any:
    if not isinstance(value, dict):
        raise SpecError("", where, f"expected a table, got {_value_name(value)}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in value:
        if key not in fields:
            close = difflib.get_close_matches(key, list(fields), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else f" (known keys: {', '.join(fields)})"
            raise SpecError("", _join(where, key), f"unknown key{hint}")
    kwargs = {}
    for name, f in fields.items():
        if name in value:
            kwargs[name] = convert(value[name], hints[name], _join(where, name))
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise SpecError("", _join(where, name), "missing required key")
    return cls(**kwargs)


def validate(spec: ProjectSpec) -> None:
    """Checks that span fields: names, dims, targets and the flags that await later work."""
    _identifier(spec.project.name, "project.name")
    if spec.project.name in ("torch", "shimgen"):
        raise SpecError("", "project.name", f"'{spec.project.name}' would shadow a package the generated one needs")
    if not spec.graph:
        raise SpecError("", "graph", "at least one [[graph]] is required")
    seen: set[str] = set()
    for i, graph in enumerate(spec.graph):
        where = f"graph[{i}]"
        _identifier(graph.name, f"{where}.name")
        if graph.name.startswith("_") or graph.name in RESERVED_GRAPH_NAMES:
            raise SpecError("", f"{where}.name", f"'{graph.name}' is reserved (no leading underscore, not 'torch')")
        if graph.name in seen:
            raise SpecError("", f"{where}.name", f"graph name '{graph.name}' is used twice")
        seen.add(graph.name)
        _validate_graph(graph, where)
    if not spec.target:
        spec.target.append(Target(device="cpu"))
    _validate_targets(spec.target)
    _validate_flags(spec)
    if spec.runtime.instances < 1:
        raise SpecError("", "runtime.instances", f"instances must be at least 1, got {spec.runtime.instances}")
    if spec.custom_op:
        raise SpecError("", "custom_op", "custom ops are not yet supported (they come with the custom-ops work)")


def _validate_graph(graph: Graph, where: str) -> None:
    module, _, attr = graph.entry.partition(":")
    if not module or not attr or not all(p.isidentifier() for p in module.split(".") + attr.split(".")):
        raise SpecError("", f"{where}.entry", f"'{graph.entry}' is not 'package.module:callable'")
    if not graph.inputs:
        raise SpecError("", f"{where}.inputs", "a graph needs at least one input")
    names: set[str] = set()
    used_dims: set[str] = set()
    keyword_seen = False
    for j, inp in enumerate(graph.inputs):
        iw = f"{where}.inputs[{j}]"
        _identifier(inp.name, f"{iw}.name")
        if inp.name in names:
            raise SpecError("", f"{iw}.name", f"input name '{inp.name}' is used twice")
        names.add(inp.name)
        if keyword_seen and not inp.keyword:
            raise SpecError("", f"{iw}.keyword", "a positional input cannot follow a keyword input")
        keyword_seen |= inp.keyword
        for k, size in enumerate(inp.shape):
            if isinstance(size, str):
                if size not in graph.dims:
                    raise SpecError("", f"{iw}.shape[{k}]", f"'{size}' is not a dim of this graph (dims: {', '.join(graph.dims) or 'none'})")
                used_dims.add(size)
            elif size < 0:
                raise SpecError("", f"{iw}.shape[{k}]", f"size {size} is negative")
        if inp.memory_format == "channels_last" and len(inp.shape) != 4:
            raise SpecError("", f"{iw}.memory_format", "channels_last needs a 4-d shape")
        if inp.low is not None and inp.high is not None and inp.low >= inp.high:
            raise SpecError("", f"{iw}.low", f"low {inp.low} must be below high {inp.high}")
    for name, dim in graph.dims.items():
        dw = f"{where}.dims.{name}"
        _identifier(name, dw)
        if name not in used_dims:
            raise SpecError("", dw, "not used by any input shape")
        if dim.min < 1:
            raise SpecError("", f"{dw}.min", f"min must be at least 1, got {dim.min}")
        if dim.max < dim.min:
            raise SpecError("", f"{dw}.max", f"max {dim.max} is below min {dim.min}")
        if dim.example is None:
            dim.example = min(dim.max, max(2, (dim.min + dim.max) // 2))
        elif not dim.min <= dim.example <= dim.max:
            raise SpecError("", f"{dw}.example", f"example {dim.example} is outside [{dim.min}, {dim.max}]")
        if dim.example < 2:
            raise SpecError("", f"{dw}", "a dynamic dim needs max >= 2 (torch.export specializes sizes 0 and 1)")
    if graph.atol < 0 or graph.rtol < 0:
        raise SpecError("", f"{where}.atol", "tolerances must not be negative")


def _validate_targets(targets: list[Target]) -> None:
    devices: set[str] = set()
    for i, target in enumerate(targets):
        where = f"target[{i}]"
        if target.device in devices:
            raise SpecError("", f"{where}.device", f"a second '{target.device}' target: build one package per {target.device} variant")
        devices.add(target.device)
        if target.device == "cpu":
            if target.archs:
                raise SpecError("", f"{where}.archs", "archs applies to cuda targets only")
            target.isa = target.isa or "native"
        else:
            if target.isa is not None:
                raise SpecError("", f"{where}.isa", "isa applies to cpu targets only")
            if not target.archs:
                raise SpecError("", f"{where}.archs", "a cuda target needs archs, such as [\"sm_90\"]")
            for k, arch in enumerate(target.archs):
                if not (arch.startswith("sm_") and arch[3:].rstrip("a").isdigit()):
                    raise SpecError("", f"{where}.archs[{k}]", f"'{arch}' is not a CUDA arch such as 'sm_90'")
                if target.archs.index(arch) != k:
                    raise SpecError("", f"{where}.archs[{k}]", f"'{arch}' is listed twice")


def _validate_flags(spec: ProjectSpec) -> None:
    flags = spec.flags
    cuda = next((t for t in spec.target if t.device == "cuda"), None)
    if flags.split < 1:
        raise SpecError("", "flags.split", f"split must be at least 1, got {flags.split}")
    for name in ("tma", "cuda_graphs"):
        if getattr(flags, name) and cuda is None:
            raise SpecError("", f"flags.{name}", f"{name} applies to cuda targets only; add a [[target]] with device = \"cuda\"")
    if flags.tma:
        without = [a for a in cuda.archs if arch_number(a) < 90]  # type: ignore[union-attr]
        if without:
            raise SpecError("", "flags.tma", f"TMA needs Hopper or newer (sm_90+); the cuda target lists {', '.join(without)}")
    if flags.cuda_graphs:
        for i, graph in enumerate(spec.graph):
            if graph.dims:
                raise SpecError("", "flags.cuda_graphs",
                                f"CUDA graphs replay one static shape; graph[{i}] '{graph.name}' has dynamic dims ({', '.join(graph.dims)})")


def arch_number(arch: str) -> int:
    """90 for 'sm_90' and 'sm_90a'."""
    return int(arch[3:].rstrip("a"))


def _identifier(name: str, where: str) -> None:
    if not name.isidentifier() or keyword.iskeyword(name) or not name.isascii():
        raise SpecError("", where, f"'{name}' is not a valid Python identifier")


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _literal_noun(where: str) -> str:
    last = where.rsplit(".", 1)[-1].split("[")[0]
    return {"dtype": "a dtype", "device": "a device"}.get(last, f"a valid {last}")


def _type_name(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(hint) if a is not type(None))
    if origin is Literal:
        return "one of " + ", ".join(map(repr, typing.get_args(hint)))
    if origin is list:
        return "a list"
    if dataclasses.is_dataclass(hint) or origin is dict:
        return "a table"
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(hint, str(hint))


def _value_name(value: Any) -> str:
    kind = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list", dict: "a table"}
    return f"{kind.get(type(value), type(value).__name__)} ({value!r})" if not isinstance(value, (list, dict)) else kind[type(value)]

