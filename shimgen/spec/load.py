"""TOML spec → ProjectSpec: type-driven conversion plus the checks types cannot express."""

from __future__ import annotations

import dataclasses
import difflib
import keyword
import math
import re
import sys
import types
import typing
from pathlib import Path
from typing import Any, Literal

from packaging.version import InvalidVersion, Version

from shimgen import devices
from shimgen.errors import SpecError
from shimgen.spec.model import (
    DIM_SIZE_LIMIT,
    EXAMPLE_BYTES_LIMIT,
    INSTANCES_LIMIT,
    NAME_LIMIT,
    VARIANTS_LIMIT,
    VERSION_LIMIT,
    Dim,
    Graph,
    Input,
    ProjectSpec,
    Target,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

RESERVED_GRAPH_NAMES = {"torch"}
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1  # TOML's integer range
MAX_SPEC_BYTES = 16 * 2**20  # a spec is a page of text; more is a wrong path (a model file, /dev/zero)
MAX_NESTING = 64  # of arrays and tables in args/kwargs; the TOML parser itself recurses out near 450
# Leading bytes of files passed by mistake, for a more useful message than "invalid byte".
MAGIC = {
    b"\x7fELF": "an ELF binary (a program or compiled extension)",
    b"PK\x03\x04": "a zip archive (a wheel, or a .pt2?)",
    b"\x1f\x8b": "a gzip archive",
    b"\xff\xfe": "UTF-16 text",
    b"\xfe\xff": "UTF-16 text",
}
FLOAT32_MAX = 3.4028234663852886e38
ITEM_BYTES = {
    "float64": 8,
    "int64": 8,
    "float32": 4,
    "int32": 4,
    "float16": 2,
    "bfloat16": 2,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
}
# Finite values of each dtype that random example values may take (integer `high` is exclusive).
VALUE_RANGE = {
    "float32": (-FLOAT32_MAX, FLOAT32_MAX),
    "bfloat16": (-3.3895313892515355e38, 3.3895313892515355e38),
    "float16": (-65504.0, 65504.0),
    "int64": (INT64_MIN, INT64_MAX),
    "int32": (-(2**31), 2**31 - 1),
    "int16": (-(2**15), 2**15 - 1),
    "int8": (-128, 127),
    "uint8": (0, 255),
}


def load_spec(path: Path) -> ProjectSpec:
    """Read, convert and validate a spec file; every problem is a SpecError naming file and key."""
    text = _read_text(path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(str(path), "", f"not valid TOML: {exc}") from None
    except RecursionError:
        raise SpecError(str(path), "", "not valid TOML: arrays or tables nested too deeply to parse") from None
    except ValueError:  # int() refusing a literal of thousands of digits
        raise SpecError(
            str(path), "", "not valid TOML: an integer has thousands of digits; TOML integers are 64-bit"
        ) from None
    try:
        spec = convert(data, ProjectSpec, "")
        validate(spec)
    except SpecError as exc:
        exc.file = str(path)
        raise
    return spec


def _read_text(path: Path) -> str:
    """The spec's text; a directory, a binary file or another encoding is a SpecError saying which."""
    if path.is_dir():
        raise SpecError(str(path), "", "is a directory; give the spec file inside it, such as projects/mlp.toml")
    if not path.name.isprintable():  # also bytes that are not UTF-8, which Python keeps as unencodable surrogates
        raise SpecError(
            str(path),
            "",
            "the file name is not printable UTF-8 text; rename the spec (the name goes into generated files)",
        )
    try:
        with path.open("rb") as f:
            data = f.read(MAX_SPEC_BYTES + 1)
    except OSError as exc:
        raise SpecError(str(path), "", f"cannot read spec: {exc.strerror or exc}") from None
    if len(data) > MAX_SPEC_BYTES:
        raise SpecError(str(path), "", f"larger than {MAX_SPEC_BYTES // 2**20} MiB: not a spec file")
    kind = next((name for magic, name in MAGIC.items() if data.startswith(magic)), None)
    nul = data.find(b"\0")
    if kind is None and nul >= 0:
        kind = f"a binary file (NUL byte at offset {nul})"
    if kind is not None:
        raise SpecError(str(path), "", f"{kind}, not a TOML spec; give the spec's .toml file, saved as UTF-8")
    try:
        return data.decode("utf-8").removeprefix("\ufeff")  # editors on Windows write a byte order mark
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise SpecError(
            str(path),
            "",
            f"not UTF-8 text (invalid byte 0x{data[exc.start]:02x} at offset {exc.start}, "
            f"line {line}); save the spec as UTF-8",
        ) from None


def convert(value: Any, hint: Any, where: str) -> Any:
    """Convert TOML data to `hint` (a dataclass, list, dict, Literal, union or scalar)."""
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
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
        if type(value) in options:  # an integer for `int | float` is checked as an integer, not as either
            return convert(value, type(value), where)
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
        return _check_any(value, where, where, 0)
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(_check_int(value, where))
    if hint in (int, float, str, bool):
        if type(value) is not hint:
            raise SpecError("", where, f"expected {_type_name(hint)}, got {_value_name(value)}")
        if hint is int:
            _check_int(value, where)
        if hint is float and not math.isfinite(value):
            raise SpecError("", where, f"expected a finite number, got {value}")
        return value
    raise TypeError(f"spec model uses an unsupported type: {hint!r}")  # a bug in model.py, not user input


def _check_int(value: int, where: str) -> int:
    """TOML integers are 64-bit; Python's parser takes any size, which torch and C++ then cannot."""
    if not INT64_MIN <= value <= INT64_MAX:
        raise SpecError("", where, f"{value} does not fit in 64 bits: TOML integers go from -2**63 to 2**63 - 1")
    return value


def _check_any(value: Any, where: str, top: str, depth: int) -> Any:
    """Free-form values (args, kwargs): 64-bit integers, and nesting that later stages can walk."""
    if depth > MAX_NESTING:
        raise SpecError("", top, f"arrays or tables nested more than {MAX_NESTING} levels deep")
    if isinstance(value, int) and not isinstance(value, bool):
        _check_int(value, where)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_any(item, f"{where}[{i}]", top, depth + 1)
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_any(item, _join(where, key), top, depth + 1)
    return value


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


# The members of the C++ package's class besides its graphs, and C++'s keywords (with the namespaces a C++ program of
# torch uses): neither can name a graph, nor the latter the package.
CPP_TAKEN = {"run", "graphs", "load_weights", "load", "Package", "kVersion", "kTorchVersion"}
CPP_KEYWORDS = set(
    """alignas alignof and and_eq asm auto bitand bitor bool break case catch char char8_t char16_t char32_t class compl
    concept const consteval constexpr constinit const_cast continue co_await co_return co_yield decltype default delete
    do double dynamic_cast else enum explicit export extern false float for friend goto if inline int long mutable
    namespace new noexcept not not_eq nullptr operator or or_eq private protected public register reinterpret_cast
    requires return short signed sizeof static static_assert static_cast struct switch template this thread_local throw
    true try typedef typeid typename union unsigned using virtual void volatile wchar_t while xor xor_eq std at c10
    torch shimgen""".split()
)


def validate(spec: ProjectSpec) -> None:
    """Checks that span fields: names, dims, targets and the flags that await later work."""
    _validate_project(spec)
    if not spec.graph:
        raise SpecError("", "graph", "at least one [[graph]] is required")
    seen: set[str] = set()
    for i, graph in enumerate(spec.graph):
        where = f"graph[{i}]"
        _identifier(graph.name, f"{where}.name")
        _length(graph.name, f"{where}.name", NAME_LIMIT)
        if graph.name.startswith("_") or graph.name in RESERVED_GRAPH_NAMES:
            raise SpecError("", f"{where}.name", f"'{graph.name}' is reserved (no leading underscore, not 'torch')")
        if graph.name in seen:
            raise SpecError("", f"{where}.name", f"graph name '{graph.name}' is used twice")
        if spec.project.cpp and (
            graph.name in CPP_KEYWORDS or graph.name in CPP_TAKEN or graph.name == spec.project.name
        ):
            raise SpecError(
                "",
                f"{where}.name",
                f"'{graph.name}' is a C++ keyword or a member of the C++ package's class {spec.project.name}::Package; "
                "rename the graph, or set project.cpp = false to build no C++ package",
            )
        seen.add(graph.name)
        _validate_graph(graph, where)
    if not spec.target:
        spec.target.append(Target(device="cpu"))
    _validate_targets(spec.target)
    _validate_flags(spec)
    if not 1 <= spec.runtime.instances <= INSTANCES_LIMIT:
        raise SpecError(
            "", "runtime.instances", f"instances must be from 1 to {INSTANCES_LIMIT}, got {spec.runtime.instances}"
        )
    _validate_custom_ops(spec)
    _validate_matrix(spec)


def _validate_project(spec: ProjectSpec) -> None:
    project = spec.project
    _identifier(project.name, "project.name")
    _length(project.name, "project.name", NAME_LIMIT)
    if project.name in ("torch", "shimgen"):
        raise SpecError("", "project.name", f"'{project.name}' would shadow a package the generated one needs")
    if project.name in sys.stdlib_module_names:
        raise SpecError(
            "",
            "project.name",
            f"'{project.name}' is a module of Python's standard library: the package could not be imported",
        )
    if project.cpp and project.name in CPP_KEYWORDS:
        raise SpecError(
            "",
            "project.name",
            f"'{project.name}' is a C++ keyword or a namespace C++ programs use, and it would name the C++ package's "
            "namespace; rename the project, or set project.cpp = false to build no C++ package",
        )
    _length(project.version, "project.version", VERSION_LIMIT)
    try:
        version = Version(project.version)
    except InvalidVersion:
        raise SpecError(
            "", "project.version", f"'{project.version}' is not a PEP 440 version such as '1.0', '0.2.1' or '1.0rc1'"
        ) from None
    if version.local is not None:
        raise SpecError(
            "",
            "project.version",
            f"'{project.version}' has a local label (+{version.local}); shimgen labels each wheel "
            "with its torch and targets itself (+torch2.13.0.cpu.native)",
        )
    if not project.description.isprintable():
        bad = next(c for c in project.description if not c.isprintable())
        what = "a line break" if f"a{bad}b".splitlines() != [f"a{bad}b"] else f"the control character {bad!r}"
        raise SpecError(
            "",
            "project.description",
            f"must be a single line of printable text (it is the wheel's Summary); it holds {what}",
        )


def _validate_graph(graph: Graph, where: str) -> None:
    module, _, attr = graph.entry.partition(":")
    if not module or not attr or not all(p.isidentifier() for p in module.split(".") + attr.split(".")):
        raise SpecError("", f"{where}.entry", f"'{graph.entry}' is not 'package.module:callable'")
    if not graph.inputs:
        raise SpecError("", f"{where}.inputs", "a graph needs at least one input")
    names: set[str] = set()
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
        _validate_input(inp, graph, iw)
    used_dims = {size for inp in graph.inputs for size in inp.shape if isinstance(size, str)}
    defaulted = {name for name, dim in graph.dims.items() if dim.example is None}
    for name, dim in graph.dims.items():
        dw = f"{where}.dims.{name}"
        _identifier(name, dw)
        if name not in used_dims:
            raise SpecError("", dw, "not used by any input shape")
        _validate_dim(name, dim, dw)
    count = math.prod(len(dim.specialize) for dim in graph.dims.values() if dim.specialize)
    if count > VARIANTS_LIMIT:
        lists = " x ".join(f"{len(d.specialize)} ({name})" for name, d in graph.dims.items() if d.specialize)
        raise SpecError(
            "",
            f"{where}.dims",
            f"{lists} = {count} specialized variants; at most {VARIANTS_LIMIT} per graph, each a compiled "
            "copy of the model: list fewer sizes",
        )
    _check_example_bytes(graph, where, defaulted)
    for k, pattern in enumerate(graph.depends):
        if not pattern or pattern.startswith(("/", "~")):
            raise SpecError(
                "", f"{where}.depends[{k}]", f"'{pattern}' is not a glob pattern relative to the spec's directory"
            )
    for name in ("atol", "rtol"):
        if getattr(graph, name) < 0:
            raise SpecError("", f"{where}.{name}", f"tolerances must not be negative, got {getattr(graph, name)}")


def _validate_input(inp: Input, graph: Graph, iw: str) -> None:
    for k, size in enumerate(inp.shape):
        if isinstance(size, str):
            if size not in graph.dims:
                raise SpecError(
                    "",
                    f"{iw}.shape[{k}]",
                    f"'{size}' is not a dim of this graph (dims: {', '.join(graph.dims) or 'none'})",
                )
        elif size < 0:
            raise SpecError("", f"{iw}.shape[{k}]", f"size {size} is negative")
    if inp.memory_format == "channels_last" and len(inp.shape) != 4:
        raise SpecError("", f"{iw}.memory_format", "channels_last needs a 4-d shape")
    _validate_value_range(inp, iw)


def _validate_value_range(inp: Input, iw: str) -> None:
    """low/high as entry.make_inputs uses them: torch.randint for integers, float32 rand scaled for floats."""
    if inp.dtype == "bool":
        for name in ("low", "high"):
            if getattr(inp, name) is not None:
                raise SpecError(
                    "", f"{iw}.{name}", "bool inputs take random true/false values; low and high do not apply"
                )
        return
    integer = inp.dtype not in ("float64", "float32", "float16", "bfloat16")
    low = inp.low if inp.low is not None else (0 if integer else -1.0)
    high = inp.high if inp.high is not None else (10 if integer else 1.0)
    bottom, top = VALUE_RANGE["float32" if inp.dtype == "float64" else inp.dtype]  # values start as float32
    for name, value in (("low", low), ("high", high)):
        if integer and isinstance(value, float) and not value.is_integer():
            raise SpecError("", f"{iw}.{name}", f"{inp.dtype} inputs need a whole number, got {value}")
        # high is exclusive, and torch.randint takes it as an int64
        limit = min(top + 1, INT64_MAX) if integer and name == "high" else top
        if not bottom <= value <= limit:
            span = (
                f"[{bottom}, {top}]: low >= {bottom}, high (exclusive) <= {limit}"
                if integer
                else f"[{bottom:.7g}, {top:.7g}]"
            )
            raise SpecError("", f"{iw}.{name}", f"{name} {value} is outside {inp.dtype}'s values {span}")
    if low >= high:
        key = "low" if inp.low is not None else "high"
        raise SpecError(
            "",
            f"{iw}.{key}",
            f"low {low} must be below high {high}"
            + ("" if inp.low is not None and inp.high is not None else " (the other bound is the default)"),
        )
    if not integer and high - low > FLOAT32_MAX:
        raise SpecError(
            "",
            f"{iw}.high",
            f"high - low is beyond the largest float32 ({FLOAT32_MAX:.7g}), in which example values are drawn",
        )


def _validate_dim(name: str, dim: Dim, dw: str) -> None:
    """Range, multiple and example of one dim; fills in the default example."""
    step = dim.multiple_of
    if step < 1:
        raise SpecError("", f"{dw}.multiple_of", f"multiple_of must be at least 1, got {step}")
    if dim.min < 1:
        raise SpecError("", f"{dw}.min", f"min must be at least 1, got {dim.min}")
    if dim.max < dim.min:
        raise SpecError("", f"{dw}.max", f"max {dim.max} is below min {dim.min}")
    if dim.max == dim.min:
        raise SpecError(
            "",
            f"{dw}.max",
            f"max equals min ({dim.min}): a size that never changes is static; "
            f"write {dim.min} in the input shapes instead of '{name}'",
        )
    if dim.max > DIM_SIZE_LIMIT:
        raise SpecError(
            "",
            f"{dw}.max",
            f"max {dim.max} is beyond {DIM_SIZE_LIMIT} (2**63 - 2), the largest dim size torch.export supports (sys.maxsize - 1)",
        )
    _multiple(dim.min, step, f"{dw}.min", 1)
    _multiple(dim.max, step, f"{dw}.max", dim.min + 1)
    for k, size in enumerate(dim.specialize):
        if not dim.min <= size <= dim.max:
            raise SpecError("", f"{dw}.specialize[{k}]", f"size {size} is outside [{dim.min}, {dim.max}]")
        _multiple(size, step, f"{dw}.specialize[{k}]", dim.min, dim.max)
        if dim.specialize.index(size) != k:
            raise SpecError("", f"{dw}.specialize[{k}]", f"size {size} is listed twice")
    if dim.min == 1 and dim.max == 2 and 1 not in dim.specialize:
        # The dynamic code is compiled for sizes of 2 and up, which here leaves 2 alone: it would fail at 1.
        dim.specialize.append(1)
    if dim.example is None:
        dim.example = max(2, dim.min, (dim.min + dim.max) // 2 // step * step)
        return
    if not dim.min <= dim.example <= dim.max:
        raise SpecError("", f"{dw}.example", f"example {dim.example} is outside [{dim.min}, {dim.max}]")
    if dim.example < 2:
        raise SpecError(
            "", f"{dw}.example", f"example {dim.example} is below 2 (torch.export specializes sizes 0 and 1)"
        )
    _multiple(dim.example, step, f"{dw}.example", max(2, dim.min), dim.max)


def _multiple(value: int, step: int, where: str, lowest: int, highest: int = DIM_SIZE_LIMIT) -> None:
    """A SpecError unless `value` is a multiple of `step`, suggesting the nearest multiples in [lowest, highest]."""
    if value % step == 0:
        return
    below = value // step * step
    near = [str(v) for v in (below, below + step) if lowest <= v <= highest]
    key = where.rsplit(".", 1)[-1]
    use = f"; use {' or '.join(near)}" if near else ""
    raise SpecError("", where, f"{key} {value} is not a multiple of {step} (multiple_of){use}")


def input_bytes(graph: Graph, sizes: dict[str, int]) -> list[int]:
    """Bytes of each input with the dynamic dims at `sizes`."""
    return [
        math.prod(sizes[s] if isinstance(s, str) else s for s in inp.shape) * ITEM_BYTES[inp.dtype]
        for inp in graph.inputs
    ]


def _check_example_bytes(graph: Graph, where: str, defaulted: set[str]) -> None:
    """Tracing allocates random inputs at the example sizes: a range's default middle can be far too big."""
    sizes: dict[str, int] = {name: dim.example for name, dim in graph.dims.items()}  # type: ignore[misc]
    if sum(input_bytes(graph, sizes)) <= EXAMPLE_BYTES_LIMIT:
        return
    smallest = {name: -(-max(2, dim.min) // dim.multiple_of) * dim.multiple_of for name, dim in graph.dims.items()}
    if sum(input_bytes(graph, smallest)) > EXAMPLE_BYTES_LIMIT:
        each = input_bytes(graph, smallest)
        j = each.index(max(each))
        even = ", even with every dim at its smallest example" if graph.dims else ""
        raise SpecError(
            "", f"{where}.inputs[{j}].shape", f"{_too_big(graph, j, smallest)}{even}; make the static sizes smaller"
        )
    name = max(graph.dims, key=lambda n: sizes[n] / smallest[n])
    each = input_bytes(graph, sizes)
    j = max((k for k, inp in enumerate(graph.inputs) if name in inp.shape), key=lambda k: each[k])
    default = f" (now the middle of [min, max], {sizes[name]})" if name in defaulted else ""
    raise SpecError(
        "",
        f"{where}.dims.{name}.example",
        f"{_too_big(graph, j, sizes)}; set dims.{name}.example{default} "
        "to a smaller size: the package still takes every size up to max",
    )


def _too_big(graph: Graph, j: int, sizes: dict[str, int]) -> str:
    inp = graph.inputs[j]
    shape = ", ".join(str(s) if isinstance(s, int) else f"{s}={sizes[s]}" for s in inp.shape)
    return (
        f"the example inputs take {_bytes_text(sum(input_bytes(graph, sizes)))} ({inp.name}: {inp.dtype}[{shape}]), "
        f"beyond the {_bytes_text(EXAMPLE_BYTES_LIMIT)} shimgen allocates to trace"
    )


def _bytes_text(n: int) -> str:
    """'4 GiB', '64.5 TiB'."""
    unit = 0
    while n >= 1024 * 2 ** (10 * unit) and unit < 6:
        unit += 1
    value = f"{n / 2 ** (10 * unit):.1f}".removesuffix(".0")
    return f"{value} {('bytes', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB', 'EiB')[unit]}"


def _validate_targets(targets: list[Target]) -> None:
    seen: set[str] = set()
    for i, target in enumerate(targets):
        where = f"target[{i}]"
        if target.device in seen:
            raise SpecError(
                "",
                f"{where}.device",
                f"a second '{target.device}' target: build one package per {target.device} variant",
            )
        seen.add(target.device)
        if not devices.device(target.device).gpu:
            if target.archs:
                raise SpecError("", f"{where}.archs", "archs applies to cuda targets only")
            target.isa = target.isa or "native"
            if target.threads is not None and target.threads < 1:
                raise SpecError("", f"{where}.threads", f"threads must be at least 1, got {target.threads}")
        else:
            for name in ("isa", "threads"):
                if getattr(target, name) is not None:
                    raise SpecError("", f"{where}.{name}", f"{name} applies to cpu targets only")
            if not target.archs:
                raise SpecError("", f"{where}.archs", 'a cuda target needs archs, such as ["sm_90"]')
            for k, arch in enumerate(target.archs):
                if not (arch.startswith("sm_") and arch[3:].rstrip("a").isdigit()):
                    raise SpecError("", f"{where}.archs[{k}]", f"'{arch}' is not a CUDA arch such as 'sm_90'")
                if target.archs.index(arch) != k:
                    raise SpecError("", f"{where}.archs[{k}]", f"'{arch}' is listed twice")


def _validate_flags(spec: ProjectSpec) -> None:
    flags = spec.flags
    cuda = next((t for t in spec.target if devices.device(t.device).gpu), None)
    if flags.split < 1:
        raise SpecError("", "flags.split", f"split must be at least 1, got {flags.split}")
    for name in ("tma", "cuda_graphs"):
        if getattr(flags, name) and cuda is None:
            raise SpecError(
                "", f"flags.{name}", f'{name} applies to cuda targets only; add a [[target]] with device = "cuda"'
            )
    if flags.tma:
        without = [a for a in cuda.archs if arch_number(a) < 90]  # type: ignore[union-attr]
        if without:
            raise SpecError(
                "", "flags.tma", f"TMA needs Hopper or newer (sm_90+); the cuda target lists {', '.join(without)}"
            )


CXX_SUFFIXES = (".cpp", ".cc", ".cxx")


def _validate_custom_ops(spec: ProjectSpec) -> None:
    """Shapes of [[custom_op]] entries; that the files exist is checked where the build reads them."""
    cuda = any(devices.device(t.device).gpu for t in spec.target)
    modules: set[str] = set()
    for i, op in enumerate(spec.custom_op):
        where = f"custom_op[{i}]"
        if not op.sources and op.module is None:
            raise SpecError(
                "",
                where,
                "give `sources` (C++/CUDA files defining ops with TORCH_LIBRARY) or `module` (a Python module), or both",
            )
        for k, source in enumerate(op.sources):
            suffix = Path(source).suffix
            if suffix == ".cu" and not cuda:
                raise SpecError(
                    "",
                    f"{where}.sources[{k}]",
                    f"'{source}' is CUDA: .cu sources need a [[target]] with device = \"cuda\"",
                )
            if suffix not in (*CXX_SUFFIXES, ".cu"):
                raise SpecError(
                    "",
                    f"{where}.sources[{k}]",
                    f"'{source}' is not a C++ ({', '.join(CXX_SUFFIXES)}) or CUDA (.cu) source",
                )
        if op.module is not None:
            if not op.module or not all(p.isidentifier() for p in op.module.split(".")):
                raise SpecError(
                    "", f"{where}.module", f"'{op.module}' is not a Python module name such as 'my_ops' or 'pkg.ops'"
                )
            if op.module in modules:
                raise SpecError("", f"{where}.module", f"module '{op.module}' is listed twice")
            if op.module.split(".")[0] == spec.project.name:
                raise SpecError(
                    "",
                    f"{where}.module",
                    f"'{op.module}' is under the project's name: the built package '{spec.project.name}' would be "
                    "imported in its place; rename the project or the module",
                )
            modules.add(op.module)


def _validate_matrix(spec: ProjectSpec) -> None:
    from shimgen.toolchain import supported_torch

    supported = supported_torch()
    for k, version in enumerate(spec.matrix.torch):
        where = f"matrix.torch[{k}]"
        if not re.fullmatch(r"\d+\.\d+\.\d+", version):
            raise SpecError("", where, f"'{version}' is not a torch release such as '2.13.0'")
        if version not in supported:
            raise SpecError("", where, f"torch {version} is outside the range this shimgen supports ({supported})")
    for k, version in enumerate(spec.matrix.python):
        if not re.fullmatch(r"3\.\d+", version):
            raise SpecError("", f"matrix.python[{k}]", f"'{version}' is not a Python version such as '3.11'")
    for k, version in enumerate(spec.matrix.cuda):
        if not re.fullmatch(r"\d+\.\d+", version):
            raise SpecError("", f"matrix.cuda[{k}]", f"'{version}' is not a CUDA version such as '13.0'")
    if spec.matrix.cuda and not any(devices.device(t.device).gpu for t in spec.target):
        raise SpecError("", "matrix.cuda", "applies to a cuda target; the spec has none")
    for name, values in (("torch", spec.matrix.torch), ("python", spec.matrix.python), ("cuda", spec.matrix.cuda)):
        twice = next((v for i, v in enumerate(values) if values.index(v) != i), None)
        if twice is not None:
            raise SpecError("", f"matrix.{name}", f"'{twice}' is listed twice")


def arch_number(arch: str) -> int:
    """90 for 'sm_90' and 'sm_90a'."""
    return int(arch[3:].rstrip("a"))


def _identifier(name: str, where: str) -> None:
    if not name.isidentifier() or keyword.iskeyword(name) or not name.isascii():
        raise SpecError("", where, f"'{name}' is not a valid Python identifier")


def _length(text: str, where: str, limit: int) -> None:
    if len(text) > limit:
        raise SpecError("", where, f"{len(text)} characters long; at most {limit} (it goes into file names)")


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
    return (
        f"{kind.get(type(value), type(value).__name__)} ({value!r})"
        if not isinstance(value, (list, dict))
        else kind[type(value)]
    )
