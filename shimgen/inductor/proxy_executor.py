"""The C++ that runs the ops Inductor leaves to run time (custom ops, aten ops without a C shim).

AOTInductor's generated code calls such an op as `proxy_executor->call_function(node, ints, tensors)`: the op's
int and tensor arguments flattened, its output tensors appended last, and everything else left in `<hash>.wrapper.json`.
AOTInductor's own executor parses that JSON at load time; shimgen reads it at build time instead and writes, per
node, the dispatcher call with every argument in its place: constants as literals, nothing parsed at run time.
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
    """One op call: the op, the stack slot of each argument (a C++ expression), and where each output goes."""

    name: str  # 'ns::op'
    overload: str
    schema: str
    arity: int
    args: tuple[tuple[int, Markup], ...]  # (stack slot, IValue expression)
    outputs: tuple[Markup, ...]  # statements storing the results, after the call
    num_ints: int
    num_tensors: int


def extern_nodes(wrapper_json: dict[str, Any]) -> list[ExternNode]:
    """The nodes of Inductor's `<hash>.wrapper.json`, in the order the generated code numbers them."""
    return [_node(entry["node"]) for entry in wrapper_json.get("nodes", [])]


def ops_called(wrapper_json: dict[str, Any]) -> list[str]:
    return sorted({entry["node"]["target"] for entry in wrapper_json.get("nodes", [])})


def _node(node: dict[str, Any]) -> ExternNode:
    import torch

    target = node["target"]
    name, _, overload = target.partition(".")
    try:
        schema = torch._C._get_schema(name, overload)
    except RuntimeError:
        raise UserError(f"the graph calls {target}, which is not registered in this process") from None
    flat = _Flat(target)
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
            args[slot] = _literal(argument.default_value, argument.real_type, target, argument.name)
    if len(node["outputs"]) != len(schema.returns):
        raise UserError(
            f"{target}: Inductor describes {len(node['outputs'])} outputs, the schema {len(schema.returns)}"
        )
    outputs = [
        flat.output(k, r.real_type, out) for k, (r, out) in enumerate(zip(schema.returns, node["outputs"], strict=True))
    ]
    return ExternNode(
        name,
        overload,
        str(schema),
        len(schema.arguments),
        tuple(sorted(args.items())),
        tuple(o for o in outputs if o),
        flat.ints,
        flat.tensors,
    )


class _Flat:
    """Where each int and tensor argument sits in the flattened arrays, counted as the generated code passes them."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.ints = 0
        self.tensors = 0

    def tensor(self) -> Markup:
        self.tensors += 1
        return Markup(f"*tensor_handle_to_tensor_pointer(tensors[{self.tensors - 1}])")

    def int(self) -> Markup:
        self.ints += 1
        return Markup(f"ints[{self.ints - 1}]")

    def argument(self, arg: dict[str, Any], name: str) -> Markup:
        """The IValue of one argument as Inductor serialized it: its kind says where the value is."""
        ((kind, value),) = arg.items()
        if kind == "as_none":
            return Markup("c10::IValue()")
        if kind == "as_tensor":
            return Markup(f"c10::IValue({self.tensor()})")
        if kind in ("as_int", "as_sym_int"):
            return Markup(f"c10::IValue({self.int()})")
        if kind in ("as_ints", "as_sym_ints"):
            first = self.ints
            self.ints += len(value)
            return Markup(f"c10::IValue(std::vector<int64_t>(ints + {first}, ints + {self.ints}))")
        if kind == "as_tensors":
            return Markup("c10::IValue(std::vector<at::Tensor>{" + ", ".join(self.tensor() for _ in value) + "})")
        if kind == "as_optional_tensors":
            items = [self.tensor() if next(iter(item)) == "as_tensor" else Markup("std::nullopt") for item in value]
            return Markup("c10::IValue(c10::List<std::optional<at::Tensor>>({" + ", ".join(items) + "}))")
        return _serialized_literal(kind, value, self.target, name)

    def output(self, index: builtins.int, schema_type: Any, out: dict[str, Any]) -> Markup:
        ((kind, value),) = out.items()
        type_kind = schema_type.kind()
        if kind == "as_none" or type_kind == "NoneType":
            return Markup("")
        if kind == "as_tensor":
            return Markup(f"{self.tensor()} = std::move(stack[{index}]).toTensor();")
        if kind == "as_optional_tensor":
            if next(iter(value)) == "as_none":
                return Markup("")
            return Markup(f"{self.tensor()} = std::move(stack[{index}]).toTensor();")
        if kind == "as_tensors":
            stores = " ".join(f"{self.tensor()} = list.get({k});" for k in range(len(value)))
            return Markup(
                f"{{ auto list = std::move(stack[{index}]).toTensorList(); TORCH_CHECK(list.size() == {len(value)}, "
                f'{cpp(self.target)}, " returned ", list.size(), " tensors, traced with {len(value)}"); {stores} }}'
            )
        if kind == "as_int" and type_kind == "IntType":
            return Markup(
                f'TORCH_CHECK(stack[{index}].toInt() == {self.int()}, "an int result differs from its traced value");'
            )
        raise UserError(f"shimgen cannot call {self.target} yet: it returns {schema_type}")


def _serialized_literal(kind: str, value: Any, target: str, name: str) -> Markup:
    """A constant Inductor serialized into the JSON, as an IValue expression."""
    from torch._export.serde.serialize import (
        _SERIALIZE_TO_TORCH_DTYPE,
        _SERIALIZE_TO_TORCH_LAYOUT,
        _SERIALIZE_TO_TORCH_MEMORY_FORMAT,
    )

    if kind == "as_float":
        return Markup(f"c10::IValue({_double(value)})")
    if kind == "as_bool":
        return Markup(f"c10::IValue({'true' if value else 'false'})")
    if kind == "as_string":
        return Markup(f"c10::IValue(std::string({cpp(value)}))")
    if kind == "as_floats":
        return Markup("c10::IValue(std::vector<double>{" + ", ".join(_double(v) for v in value) + "})")
    if kind == "as_bools":
        return Markup("c10::IValue(std::vector<bool>{" + ", ".join("true" if v else "false" for v in value) + "})")
    if kind == "as_strings":
        return Markup(
            "c10::IValue(std::vector<std::string>{" + ", ".join(f"std::string({cpp(v)})" for v in value) + "})"
        )
    if kind == "as_scalar_type":
        return _dtype(_SERIALIZE_TO_TORCH_DTYPE[value])
    if kind == "as_memory_format":
        return _memory_format(_SERIALIZE_TO_TORCH_MEMORY_FORMAT[value])
    if kind == "as_layout":
        return _layout(_SERIALIZE_TO_TORCH_LAYOUT[value])
    if kind == "as_device":
        # The device type alone: the model's GPU is current while it runs, whichever the build used.
        return Markup(f"c10::IValue(c10::Device({cpp(value['type'])}))")
    raise UserError(f"shimgen cannot call {target} yet: argument '{name}' is passed as {kind}")


def _literal(value: Any, schema_type: Any, target: str, name: str) -> Markup:
    """A schema default as an IValue expression."""
    import torch

    if value is None:
        return Markup("c10::IValue()")
    if isinstance(value, bool):
        return Markup(f"c10::IValue({'true' if value else 'false'})")
    if isinstance(value, int):
        return Markup(f"c10::IValue(int64_t{{{value}}})" if value != -(2**63) else "c10::IValue(INT64_MIN)")
    if isinstance(value, float):
        return Markup(f"c10::IValue({_double(value)})")
    if isinstance(value, str):
        return Markup(f"c10::IValue(std::string({cpp(value)}))")
    if isinstance(value, torch.dtype):
        return _dtype(value)
    if isinstance(value, torch.memory_format):
        return _memory_format(value)
    if isinstance(value, torch.layout):
        return _layout(value)
    if isinstance(value, (list, tuple)) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return Markup("c10::IValue(std::vector<int64_t>{" + ", ".join(f"int64_t{{{v}}}" for v in value) + "})")
    if isinstance(value, (list, tuple)) and all(isinstance(v, float) for v in value):
        return Markup("c10::IValue(std::vector<double>{" + ", ".join(_double(v) for v in value) + "})")
    raise UserError(f"shimgen cannot call {target} yet: the default of '{name}' ({schema_type}) is {value!r}")


def _double(value: float) -> str:
    if math.isnan(value):
        return "std::numeric_limits<double>::quiet_NaN()"
    if math.isinf(value):
        return ("-" if value < 0 else "") + "std::numeric_limits<double>::infinity()"
    return repr(float(value))


def _dtype(dtype: Any) -> Markup:
    return Markup(f"c10::IValue(c10::ScalarType::{_SCALAR_TYPE[str(dtype)]})")


def _memory_format(memory_format: Any) -> Markup:
    names = {
        "torch.contiguous_format": "Contiguous",
        "torch.channels_last": "ChannelsLast",
        "torch.channels_last_3d": "ChannelsLast3d",
        "torch.preserve_format": "Preserve",
    }
    return Markup(f"c10::IValue(c10::MemoryFormat::{names[str(memory_format)]})")


def _layout(layout: Any) -> Markup:
    names = {"torch.strided": "Strided", "torch.sparse_coo": "Sparse", "torch._mkldnn": "Mkldnn"}
    return Markup(f"c10::IValue(c10::Layout::{names[str(layout)]})")


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
