"""Refit: the constants Inductor computed from the weights at build time (freezing's folded batch norms, weights
transposed, cast or packed for their kernels), computed again from new weights by the operations the build ran.

Shipped unchanged in every package built by shimgen; the build records each model's program
(shimgen/inductor/refit.py) and checks that it gives back the build's constants bit for bit. A program is JSON:

    {"inputs": {"<value>": ["<weight name>", "<dtype>", [<size>, ...]]}, "copied": [<value>, ...],
     "steps": [{"op": "aten::add.Tensor", "args": [...], "kwargs": {...}, "out": [<value> | null, ...], "threads": 8}],
     "outputs": {"<constant>": <value>}, "packed_bytes": {"<constant>": <bytes>},
     "packed_layouts": {"<constant>": "<hex>"}, "checks": [{"v": <value>, "dtype": "float32", "values": [...]}],
     "missing": {"<constant>": "<why it has no program>"}, "fixed": {"<weight>": "<digest>"}}

An argument is a JSON scalar, a list, {"v": <value>} (an earlier value), or a literal: {"dtype": "float32"},
{"device": "cpu"}, {"memory_format": "channels_last"}, {"layout": "strided"}, {"float": "inf"},
{"tensor": [...], "dtype": "float32", "shape": [...]}. `copied`: inputs a step writes into (copied first, so the
caller's tensors stay as they are). `checks`: values the code was compiled with (Inductor inlines tiny constants):
new weights must give the same ones. `packed_bytes`: the size of oneDNN's buffer, for the constants prepacked for
oneDNN. `packed_layouts`: oneDNN's description of those buffers (packed_layout()) as the build's replay made them;
`threads`: a oneDNN step's thread count at build time, which oneDNN's choice of layout follows. `fixed`: the weights whose
values the build read (digest()): new weights must keep them.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
from collections.abc import Iterator, Mapping
from typing import Any

import torch


class RefitError(ValueError):
    """New weights that the compiled code cannot take by recomputing its constants."""


def op(name: str) -> Any:
    """The operator overload named like 'aten::add.Tensor'."""
    namespace, rest = name.split("::")
    packet, _, overload = rest.partition(".")
    return getattr(getattr(getattr(torch.ops, namespace), packet), overload or "default")


def decode(arg: Any, values: dict[int, torch.Tensor], device: torch.device) -> Any:
    if isinstance(arg, list):
        return [decode(a, values, device) for a in arg]
    if not isinstance(arg, dict):
        return arg
    if "v" in arg:
        return values[arg["v"]]
    if "tensor" in arg:
        return torch.tensor(arg["tensor"], dtype=getattr(torch, arg["dtype"]), device=device).reshape(arg["shape"])
    if "dtype" in arg:
        return getattr(torch, arg["dtype"])
    if "device" in arg:
        recorded = torch.device(arg["device"])
        return device if recorded.type == device.type else recorded
    if "memory_format" in arg:
        return getattr(torch, arg["memory_format"])
    if "layout" in arg:
        return getattr(torch, arg["layout"])
    if "float" in arg:
        return float(arg["float"])
    raise RefitError(f"unknown argument {arg!r} in a refit program")


def digest(tensor: torch.Tensor) -> str:
    """The sha256 of a tensor's elements in row-major order."""
    data = tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
    return (
        f"{str(tensor.dtype).removeprefix('torch.')}{list(tensor.shape)}:{hashlib.sha256(data.tobytes()).hexdigest()}"
    )


def check_fixed(program: Mapping[str, Any], weights: Mapping[str, Any]) -> None:
    """RefitError where `weights` change a weight whose value the build read (it may be compiled into the code)."""
    for name, expected in program.get("fixed", {}).items():
        value = weights.get(name)
        if isinstance(value, torch.Tensor) and digest(value) != expected:
            raise RefitError(
                f"weight '{name}' cannot change without a rebuild: the build read its value while compiling the model "
                "(Inductor may have written it into the kernels, as it does for a tensor of one repeated value)"
            )


def run(
    program: Mapping[str, Any], weights: Mapping[str, torch.Tensor], device: torch.device
) -> dict[str, torch.Tensor]:
    """The program's constants computed from `weights` (by the names its inputs give) on `device`."""
    check_fixed(program, weights)
    copied = set(program.get("copied", ()))
    values: dict[int, torch.Tensor] = {}
    for value, (name, _, _) in program["inputs"].items():
        tensor = weights[name].detach()
        values[int(value)] = tensor.to(device, copy=int(value) in copied)
    with torch.no_grad():
        for step in program["steps"]:
            with _threads(step.get("threads")):
                result = op(step["op"])(*decode(step["args"], values, device), **decode_kwargs(step, values, device))
            outs = result if isinstance(result, (tuple, list)) else [result]
            for value, tensor in zip(step["out"], outs, strict=True):
                if value is not None:
                    values[value] = tensor
    for check in program.get("checks", ()):
        got = values[check["v"]]
        expected = torch.tensor(check["values"], dtype=getattr(torch, check["dtype"]))
        if got.cpu().reshape(expected.shape).ne(expected).any():
            raise RefitError(
                f"the new weights change a value the code was compiled with ({check['values']}): Inductor wrote it into "
                "the kernels as a literal, so it cannot change without a rebuild"
            )
    outputs = {name: values[value] for name, value in program["outputs"].items()}
    for name, layout in program.get("packed_layouts", {}).items():
        if packed_layout(outputs[name]) != layout:
            raise RefitError(
                f"oneDNN packed constant '{name}' in another layout here than at build time, which the compiled code "
                "takes (oneDNN's choice follows the machine and its threads): rebuild the package on this machine"
            )
    return outputs


def packed_layout(tensor: torch.Tensor) -> str:
    """oneDNN's description of a prepacked tensor's buffer: its layout and blocking."""
    return bytes(op("mkldnn::_get_mkldnn_serialized_md")(tensor).tolist()).hex()


@contextlib.contextmanager
def _threads(count: int | None) -> Iterator[None]:
    """torch's threads set to `count` meanwhile (None: left as they are)."""
    before = torch.get_num_threads()
    if count is None or count == before:
        yield
        return
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def decode_kwargs(step: Mapping[str, Any], values: dict[int, torch.Tensor], device: torch.device) -> dict[str, Any]:
    return {k: decode(v, values, device) for k, v in step.get("kwargs", {}).items()}


def constant_bytes(tensor: torch.Tensor, typed: bool, nbytes: int, packed_bytes: int = 0) -> torch.Tensor:
    """The bytes the compiled model takes for a constant, as its weights file holds them: a typed constant's elements;
    otherwise its whole storage (a strided tensor) or oneDNN's buffer of `packed_bytes` (a prepacked one, as the build
    measured it), zero-padded to `nbytes`."""
    if typed:
        return tensor.contiguous().reshape(-1).view(torch.uint8)
    if tensor.is_mkldnn:
        buffer = (ctypes.c_ubyte * packed_bytes).from_address(torch.ops.mkldnn.data_ptr(tensor))
        raw = torch.frombuffer(bytearray(buffer), dtype=torch.uint8)
    else:
        raw = torch.empty(0, dtype=torch.uint8, device=tensor.device).set_(tensor.untyped_storage())
    if raw.numel() > nbytes:
        raise RefitError(f"a recomputed constant holds {raw.numel()} bytes, the compiled model's {nbytes}")
    if raw.numel() == nbytes:
        return raw
    padded = torch.zeros(nbytes, dtype=torch.uint8, device=raw.device)
    padded[: raw.numel()] = raw
    return padded
