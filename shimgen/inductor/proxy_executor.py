"""The table of ops Inductor leaves to run time (custom ops, aten ops without a C shim), for the runtime's proxy
executor (shimgen/runtime/shimgen_extern_ops.h).

AOTInductor's generated code calls such an op as `proxy_executor->call_function(node, ints, tensors)`: the op's
int and tensor arguments flattened, its output tensors appended last, and everything else left in `<hash>.wrapper.json`.
AOTInductor's own executor parses that JSON at load time; shimgen reads it at build time instead and writes, per node,
where each argument comes from: constants as literals of the table, nothing parsed at run time.
"""

from __future__ import annotations

import builtins
import math
from dataclasses import dataclass
from typing import Any

from markupsafe import Markup

from shimgen.errors import UserError
from shimgen.project.escape import cpp


@dataclass(frozen=True)
class ExternNode:
    """One op call: its ExternArg and ExternResult initializers (C++), in the schema's order, and the arrays of
    literal lists they point to."""

    name: str  # 'ns::op'
    overload: str
    schema: str
    args: tuple[Markup, ...]
    results: tuple[Markup, ...]
    arrays: tuple[Markup, ...]
    num_ints: int
    num_tensors: int


def extern_nodes(wrapper_json: dict[str, Any]) -> list[ExternNode]:
    """The nodes of Inductor's `<hash>.wrapper.json`, in the order the generated code numbers them."""
    return [_node(entry["node"], f"node{k}") for k, entry in enumerate(wrapper_json.get("nodes", []))]


def ops_called(wrapper_json: dict[str, Any]) -> list[str]:
    return sorted({entry["node"]["target"] for entry in wrapper_json.get("nodes", [])})


def _node(node: dict[str, Any], prefix: str) -> ExternNode:
    import torch

    target = node["target"]
    name, _, overload = target.partition(".")
    try:
        schema = torch._C._get_schema(name, overload)
    except RuntimeError:
        raise UserError(f"the graph calls {target}, which is not registered in this process") from None
    flat = _Flat(target, prefix)
    slots = {a.name: k for k, a in enumerate(schema.arguments)}
    args: dict[int, Markup] = {}
    for item in node["inputs"]:
        slot = slots.get(item["name"])
        if slot is None:
            raise UserError(f"{target}: Inductor passes an argument '{item['name']}' its schema does not have")
        args[slot] = flat.argument(item["arg"], item["name"])
    for slot, argument in enumerate(schema.arguments):
        if slot not in args:
            if not argument.has_default_value():
                raise UserError(f"{target}: Inductor passes no value for '{argument.name}', which has no default")
            args[slot] = flat.default(argument.default_value, argument.real_type, argument.name)
    if len(node["outputs"]) != len(schema.returns):
        raise UserError(
            f"{target}: Inductor describes {len(node['outputs'])} outputs, the schema {len(schema.returns)}"
        )
    results = [flat.output(r.real_type, out) for r, out in zip(schema.returns, node["outputs"], strict=True)]
    return ExternNode(
        name,
        overload,
        str(schema),
        tuple(args[slot] for slot in range(len(schema.arguments))),
        tuple(results),
        tuple(flat.arrays),
        flat.ints,
        flat.tensors,
    )


def _initializer(struct: str, kind: str, **fields: object) -> Markup:
    """A designated initializer of shimgen::ExternArg or shimgen::ExternResult."""
    return Markup(
        "{" + ", ".join([f".kind = shimgen::{struct}::{kind}", *(f".{k} = {v}" for k, v in fields.items())]) + "}"
    )


def _arg(kind: str, **fields: object) -> Markup:
    return _initializer("ExternArg", kind, **fields)


def _result(kind: str, **fields: object) -> Markup:
    return _initializer("ExternResult", kind, **fields)


class _Flat:
    """Where each int and tensor argument sits in the flattened arrays, counted as the generated code passes them, and
    the literal lists the table needs."""

    def __init__(self, target: str, prefix: str) -> None:
        self.target = target
        self.prefix = prefix
        self.ints = 0
        self.tensors = 0
        self.arrays: list[Markup] = []

    def _take_tensors(self, n: builtins.int) -> builtins.int:
        """The index of the first of the next `n` tensors."""
        self.tensors += n
        return self.tensors - n

    def _take_ints(self, n: builtins.int) -> builtins.int:
        self.ints += n
        return self.ints - n

    def _array(self, c_type: str, items: list[str]) -> str:
        name = f"{self.prefix}_{len(self.arrays)}"
        self.arrays.append(Markup(f"const {c_type} {name}[] = {{{', '.join(items)}}};"))
        return name

    def argument(self, arg: dict[str, Any], name: str) -> Markup:
        """One argument as Inductor serialized it: its kind says where the value is."""
        ((kind, value),) = arg.items()
        if kind == "as_none":
            return _arg("kNone")
        if kind == "as_tensor":
            return _arg("kTensor", index=self._take_tensors(1))
        if kind in ("as_int", "as_sym_int"):
            return _arg("kInt", index=self._take_ints(1))
        if kind in ("as_ints", "as_sym_ints"):
            return _arg("kInts", index=self._take_ints(len(value)), count=len(value))
        if kind == "as_tensors":
            return _arg("kTensors", index=self._take_tensors(len(value)), count=len(value))
        if kind == "as_optional_tensors":
            present = [next(iter(item)) == "as_tensor" for item in value]
            flags = self._array("bool", ["true" if p else "false" for p in present]) if value else "nullptr"
            return _arg("kOptionalTensors", index=self._take_tensors(sum(present)), count=len(value), flags=flags)
        return self._serialized_literal(kind, value, name)

    def output(self, schema_type: Any, out: dict[str, Any]) -> Markup:
        ((kind, value),) = out.items()
        type_kind = schema_type.kind()
        if kind == "as_none" or type_kind == "NoneType":
            return _result("kSkip")
        if kind == "as_tensor":
            return _result("kTensor", index=self._take_tensors(1))
        if kind == "as_optional_tensor":
            if next(iter(value)) == "as_none":
                return _result("kSkip")
            return _result("kTensor", index=self._take_tensors(1))
        if kind == "as_tensors":
            return _result("kTensors", index=self._take_tensors(len(value)), count=len(value))
        if kind == "as_int" and type_kind == "IntType":
            return _result("kIntCheck", index=self._take_ints(1))
        raise UserError(f"shimgen cannot call {self.target} yet: it returns {schema_type}")

    def _list(self, kind: str, field: str, c_type: str, items: list[str]) -> Markup:
        return _arg(kind, count=len(items), **{field: self._array(c_type, items) if items else "nullptr"})

    def _serialized_literal(self, kind: str, value: Any, name: str) -> Markup:
        """A constant Inductor serialized into the JSON."""
        from torch._export.serde.serialize import (
            _SERIALIZE_TO_TORCH_DTYPE,
            _SERIALIZE_TO_TORCH_LAYOUT,
            _SERIALIZE_TO_TORCH_MEMORY_FORMAT,
        )

        if kind == "as_float":
            return _arg("kFloat", number=_double(value))
        if kind == "as_bool":
            return _arg("kBool", integer=int(bool(value)))
        if kind == "as_string":
            return _arg("kString", text=cpp(value))
        if kind == "as_floats":
            return self._list("kFloats", "numbers", "double", [_double(v) for v in value])
        if kind == "as_bools":
            return self._list("kBools", "flags", "bool", ["true" if v else "false" for v in value])
        if kind == "as_strings":
            return self._list("kStrings", "texts", "char* const", [cpp(v) for v in value])
        if kind == "as_scalar_type":
            return _dtype(_SERIALIZE_TO_TORCH_DTYPE[value])
        if kind == "as_memory_format":
            return _memory_format(_SERIALIZE_TO_TORCH_MEMORY_FORMAT[value])
        if kind == "as_layout":
            return _layout(_SERIALIZE_TO_TORCH_LAYOUT[value])
        if kind == "as_device":
            # The device type alone: the model's GPU is current while it runs, whichever the build used.
            return _arg("kDevice", text=cpp(value["type"]))
        raise UserError(f"shimgen cannot call {self.target} yet: argument '{name}' is passed as {kind}")

    def default(self, value: Any, schema_type: Any, name: str) -> Markup:
        """A schema default."""
        import torch

        if value is None:
            return _arg("kNone")
        if isinstance(value, bool):
            return _arg("kBool", integer=int(value))
        if isinstance(value, int):
            return _arg("kLiteralInt", integer=_int(value))
        if isinstance(value, float):
            return _arg("kFloat", number=_double(value))
        if isinstance(value, str):
            return _arg("kString", text=cpp(value))
        if isinstance(value, torch.dtype):
            return _dtype(value)
        if isinstance(value, torch.memory_format):
            return _memory_format(value)
        if isinstance(value, torch.layout):
            return _layout(value)
        if isinstance(value, (list, tuple)) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return self._list("kLiteralInts", "integers", "int64_t", [_int(v) for v in value])
        if isinstance(value, (list, tuple)) and all(isinstance(v, float) for v in value):
            return self._list("kFloats", "numbers", "double", [_double(v) for v in value])
        raise UserError(f"shimgen cannot call {self.target} yet: the default of '{name}' ({schema_type}) is {value!r}")


def _int(value: int) -> str:
    return "INT64_MIN" if value == -(2**63) else f"int64_t{{{value}}}"


def _double(value: float) -> str:
    if math.isnan(value):
        return "std::numeric_limits<double>::quiet_NaN()"
    if math.isinf(value):
        return ("-" if value < 0 else "") + "std::numeric_limits<double>::infinity()"
    return repr(float(value))


def _dtype(dtype: Any) -> Markup:
    return _arg("kScalarType", text=cpp(_SCALAR_TYPE[str(dtype)]))


def _memory_format(memory_format: Any) -> Markup:
    names = {
        "torch.contiguous_format": "Contiguous",
        "torch.channels_last": "ChannelsLast",
        "torch.channels_last_3d": "ChannelsLast3d",
        "torch.preserve_format": "Preserve",
    }
    return _arg("kMemoryFormat", text=cpp(names[str(memory_format)]))


def _layout(layout: Any) -> Markup:
    names = {"torch.strided": "Strided", "torch.sparse_coo": "Sparse", "torch._mkldnn": "Mkldnn"}
    return _arg("kLayout", text=cpp(names[str(layout)]))


_SCALAR_TYPE = {
    "torch.uint8": "Byte",
    "torch.int8": "Char",
    "torch.int16": "Short",
    "torch.int32": "Int",
    "torch.int64": "Long",
    "torch.float16": "Half",
    "torch.float32": "Float",
    "torch.float64": "Double",
    "torch.complex64": "ComplexFloat",
    "torch.complex128": "ComplexDouble",
    "torch.bool": "Bool",
    "torch.bfloat16": "BFloat16",
    "torch.uint16": "UInt16",
    "torch.uint32": "UInt32",
    "torch.uint64": "UInt64",
    "torch.float8_e4m3fn": "Float8_e4m3fn",
    "torch.float8_e5m2": "Float8_e5m2",
}
