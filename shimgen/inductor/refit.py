"""Refit programs: how each constant Inductor computes from the weights at build time is computed again from new ones.

While Inductor compiles a graph, a dispatch mode records every operation on real tensors that descends from the
program's weights: freezing's constant folding (batch norms merged into convolutions; weights cast, transposed or
prepacked for oneDNN) and the weights the C++ GEMM template blocks for its kernels. Each constant the model keeps is
then a chain of those operations over named weights: a program (shimgen/runtime/_shimgen_refit.py describes its
JSON) that the package's load_weights() runs on new weights. The build runs each program on the build's own weights
and keeps it only where it gives back the constant bit for bit; a constant with no program (made in a way the mode
does not see, or after Python read a weight's value) is listed with the reason, and load_weights() names it.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

from shimgen.inductor import weights as weights_file

# Operations that hand a tensor's value to Python, which may then decide what the build does; the others that return
# no tensor read only its metadata (aten::is_pinned).
VALUE_READS = frozenset(("aten::_local_scalar_dense", "aten::equal", "aten::is_nonzero", "aten::allclose"))
LITERAL_ELEMENTS = 64  # a tensor made by Inductor, not from the weights, rides in the program up to this size


class _Unrecordable(Exception):
    pass


@dataclass
class Recording:
    """The operations seen so far, and the constants Inductor's graph took."""

    by_storage: dict[tuple[Any, ...], str]  # the program's weights by where their elements are
    steps: list[dict[str, Any]] = field(default_factory=list)
    inputs: dict[int, str] = field(default_factory=dict)
    copied: set[int] = field(default_factory=set)
    constants: dict[str, Any] = field(default_factory=dict)  # Inductor's constant name → the tensor it holds
    inlined: list[Any] = field(default_factory=list)  # tensors Inductor wrote into the code as literals
    read_back: str = ""  # the first operation that handed a weight's value to Python
    read_weights: set[str] = field(default_factory=set)  # the weights whose values were handed to Python
    read_unknown: bool = False  # a value was handed to Python from a tensor of unrecorded descent
    sources: dict[int, frozenset[str]] = field(default_factory=dict)  # value → the weights it is computed from
    count: int = 0
    values: Any = None  # tensor → value number (-1: derived from the weights in a way not recorded)

    def __post_init__(self) -> None:
        from torch.utils.weak import WeakTensorKeyDictionary

        self.values = WeakTensorKeyDictionary()

    def value_of(self, tensor: Any) -> int | None:
        """The tensor's value number; None where it does not come from the weights."""
        known = self.values.get(tensor)
        if known is not None:
            return known
        key = _storage_key(tensor)
        name = None if key is None else self.by_storage.get(key)
        if name is None:
            return None
        number = self._new(tensor)
        self.inputs[number] = name
        self.sources[number] = frozenset((name,))
        return number

    def _new(self, tensor: Any) -> int:
        self.count += 1
        self.values[tensor] = self.count
        return self.count

    def note(self, func: Any, args: Any, kwargs: Any, out: Any) -> None:
        import torch
        from torch.utils import _pytree as pytree

        given = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if not given or any(not _real(t) for t in given):
            return
        numbers = [self.value_of(t) for t in given]
        if all(n is None for n in numbers):
            return
        results = pytree.tree_leaves(out)
        if any(not isinstance(r, torch.Tensor) for r in results):
            if func.name() in VALUE_READS:
                self.read_back = self.read_back or func.name()
                self.read_unknown |= -1 in numbers
                self.read_weights.update(*(self.sources.get(n, ()) for n in numbers if n is not None))
            return
        written = [
            t
            for index, argument in enumerate(func._schema.arguments)
            if argument.alias_info is not None and argument.alias_info.is_write
            for t in pytree.tree_leaves(args[index] if index < len(args) else kwargs.get(argument.name))
            if isinstance(t, torch.Tensor)
        ]
        try:
            # A tensor written into that is not a recorded value would be encoded as it is after the write.
            if -1 in numbers or any(self.values.get(t) is None for t in written):
                raise _Unrecordable
            step = {"op": func.name(), "args": self._encode(list(args)), "kwargs": self._encode(dict(kwargs))}
            if "mkldnn" in func.name():
                # oneDNN picks a packed layout by the threads it would run (on a 16-core AMX Xeon, 16 gave another
                # than 1 to 8), and the compiled code takes the layout chosen here.
                step["threads"] = torch.get_num_threads()
        except _Unrecordable:
            self.unrecorded(out)
            return
        self.copied |= {self.values[t] for t in written if self.values[t] in self.inputs}
        step["out"] = [self.values.get(r) or self._new(r) for r in results]
        descent = frozenset().union(*(self.sources.get(n, ()) for n in numbers if n is not None))
        self.sources.update({n: self.sources.get(n, frozenset()) | descent for n in step["out"]})
        self.steps.append(step)

    def unrecorded(self, out: Any) -> None:
        """Mark `out` as computed from the weights in a way not recorded."""
        import torch
        from torch.utils import _pytree as pytree

        for r in pytree.tree_leaves(out):
            if isinstance(r, torch.Tensor) and _real(r):
                self.values[r] = -1

    def _encode(self, arg: Any) -> Any:
        import torch

        if isinstance(arg, (list, tuple)):
            return [self._encode(a) for a in arg]
        if isinstance(arg, dict):
            return {k: self._encode(v) for k, v in arg.items()}
        if isinstance(arg, torch.Tensor):
            number = self.value_of(arg)
            if number is not None:
                return {"v": number}
            if arg.layout != torch.strided or arg.numel() > LITERAL_ELEMENTS or arg.is_complex():
                raise _Unrecordable
            return {
                "tensor": arg.detach().cpu().reshape(-1).tolist(),
                "dtype": _name(arg.dtype),
                "shape": list(arg.shape),
            }
        if isinstance(arg, torch.dtype):
            return {"dtype": _name(arg)}
        if isinstance(arg, torch.device):
            return {"device": str(arg)}
        if isinstance(arg, torch.memory_format):
            return {"memory_format": _name(arg)}
        if isinstance(arg, torch.layout):
            return {"layout": _name(arg)}
        if isinstance(arg, float) and not math.isfinite(arg):
            return {"float": str(arg)}
        if arg is None or isinstance(arg, (bool, int, float, str)):
            return arg
        raise _Unrecordable

    def program(self, wanted: list[weights_file.Constant], original: dict[str, Any]) -> dict[str, Any]:
        """The program of the `wanted` constants (those not plain weights), checked against the build's own weights
        (`original`, by the program's names)."""
        import torch

        outputs: dict[str, int] = {}
        missing: dict[str, str] = {}
        for c in wanted:
            tensor = self.constants.get(c.name)
            number = None if tensor is None else self.value_of(tensor)
            if self.read_back:
                missing[c.name] = f"the build read a weight's value ({self.read_back}) while computing it"
            elif number is None or number == -1:
                missing[c.name] = "computed in a way the build did not record"
            else:
                outputs[c.name] = number
        for t in self.inlined:  # a weight written into the code as it is: its value is fixed
            number = self.value_of(t)
            self.read_unknown |= number == -1
            if number in self.inputs:
                self.read_weights.add(self.inputs[number])
        checks = [
            {"v": self.values[t], "dtype": _name(t.dtype), "values": t.reshape(-1).tolist()}
            for t in self.inlined
            if self.values.get(t, -1) not in (-1, *self.inputs)
        ]
        program = self._sliced(outputs, checks, original)
        program["missing"] = missing
        from shimgen.runtime import _shimgen_refit as replay  # the package's own module: it imports torch

        # Values Python read may have been compiled into the code (a uniform weight folded into a literal).
        read = set(original) if self.read_unknown else self.read_weights
        program["fixed"] = {
            name.removeprefix(weights_file.WEIGHT_PREFIX): replay.digest(original[name])
            for name in sorted(read)
            if isinstance(original.get(name), torch.Tensor)
        }
        program["packed_bytes"] = {
            name: torch.ops.mkldnn._nbytes(self.constants[name]) for name in outputs if self.constants[name].is_mkldnn
        }
        self._verify(program, wanted, original)
        return program

    def _sliced(
        self, outputs: dict[str, int], checks: list[dict[str, Any]], original: dict[str, Any]
    ) -> dict[str, Any]:
        """The steps the outputs and checks need, values renumbered from 0 in order of appearance."""
        needed = set(outputs.values()) | {c["v"] for c in checks}
        steps = []
        for step in reversed(self.steps):
            if needed & set(step["out"]):
                steps.append(step)
                needed |= set(_numbers(step["args"])) | set(_numbers(step["kwargs"]))
        steps.reverse()
        renumber = {n: i for i, n in enumerate(n for n in self.inputs if n in needed)}
        for step in steps:
            for n in step["out"]:
                renumber.setdefault(n, len(renumber))
        kept = [n for step in steps for n in step["out"]]

        def remap(arg: Any) -> Any:
            if isinstance(arg, list):
                return [remap(a) for a in arg]
            if isinstance(arg, dict):
                return {"v": renumber[arg["v"]]} if "v" in arg else {k: remap(v) for k, v in arg.items()}
            return arg

        return {
            "inputs": {
                str(renumber[n]): [
                    name.removeprefix(weights_file.WEIGHT_PREFIX),
                    _name(original[name].dtype),
                    list(original[name].shape),
                ]
                for n, name in self.inputs.items()
                if n in renumber
            },
            "copied": sorted(renumber[n] for n in self.copied if n in renumber),
            "steps": [
                {
                    "op": s["op"],
                    "args": remap(s["args"]),
                    "kwargs": remap(s["kwargs"]),
                    "out": [renumber[n] if n in needed or n in kept else None for n in s["out"]],
                    **({"threads": s["threads"]} if "threads" in s else {}),
                }
                for s in steps
            ],
            "outputs": {name: renumber[n] for name, n in outputs.items()},
            "checks": [{**c, "v": renumber[c["v"]]} for c in checks],
        }

    def _verify(self, program: dict[str, Any], wanted: list[weights_file.Constant], original: dict[str, Any]) -> None:
        """Drop the outputs whose program does not give back the build's constant bit for bit."""
        import torch

        from shimgen.runtime import _shimgen_refit as replay  # the package's own module: it imports torch

        if not program["outputs"]:
            return
        by_name = {name.removeprefix(weights_file.WEIGHT_PREFIX): t for name, t in original.items()}
        device = next(iter(self.constants.values())).device
        try:
            again = replay.run(program, by_name, device)
        except Exception as exc:  # any operator may refuse what it ran at build time in another context
            for name in list(program["outputs"]):
                program["missing"][name] = f"its program failed on the build's weights: {type(exc).__name__}: {exc}"
            program["outputs"] = {}
            return
        for c in wanted:
            if c.name not in program["outputs"]:
                continue
            packed = program["packed_bytes"].get(c.name, 0)
            built = replay.constant_bytes(self.constants[c.name], c.typed, c.nbytes, packed)
            got = replay.constant_bytes(again[c.name], c.typed, c.nbytes, packed)
            if built.shape != got.shape or not torch.equal(built.cpu(), got.cpu()):
                del program["outputs"][c.name]
                program["missing"][c.name] = "its program does not give back the build's value"
            elif again[c.name].is_mkldnn:
                # The replay's description, not Inductor's constant's: they differed with equal bytes for three of
                # ResNet-18's convolutions on an AMX Xeon.
                program.setdefault("packed_layouts", {})[c.name] = replay.packed_layout(again[c.name])


def _numbers(arg: Any) -> Iterator[int]:
    if isinstance(arg, list):
        for a in arg:
            yield from _numbers(a)
    elif isinstance(arg, dict):
        if "v" in arg:
            yield arg["v"]
        else:
            for v in arg.values():
                yield from _numbers(v)


def _name(value: Any) -> str:
    return str(value).removeprefix("torch.")


def _real(tensor: Any) -> bool:
    import torch

    return (type(tensor) is torch.Tensor or type(tensor) is torch.nn.Parameter) and tensor.device.type != "meta"


def _storage_key(tensor: Any) -> tuple[Any, ...] | None:
    import torch

    if not _real(tensor) or tensor.layout != torch.strided:
        return None
    return (
        str(tensor.device),
        tensor.untyped_storage().data_ptr(),
        tensor.storage_offset(),
        tuple(tensor.shape),
        tuple(tensor.stride()),
        tensor.dtype,
    )


@contextmanager
def recorded(program_weights: dict[str, Any]) -> Iterator[Recording]:
    """Record, while Inductor compiles, how its constants come from `program_weights` (by the program's names)."""
    import torch
    from torch._inductor.constant_folding import ConstantFolder
    from torch._inductor.graph import GraphLowering
    from torch.utils._python_dispatch import TorchDispatchMode

    keys = {name: _storage_key(t) for name, t in program_weights.items() if isinstance(t, torch.Tensor)}
    recording = Recording({key: name for name, key in keys.items() if key is not None})

    class Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            try:
                recording.note(func, args, kwargs, out)
            except Exception:  # what cannot be recorded has no program; the build goes on
                recording.unrecorded(out)
            return out

    fold = ConstantFolder.run
    lower = GraphLowering.run
    allocate = GraphLowering.allocate_non_dup_const_name
    get_attr = GraphLowering.get_attr

    # Inductor runs both with every dispatch mode disabled.
    def fold_recorded(self: Any, *args: Any, **kwargs: Any) -> Any:
        with Mode():
            return fold(self, *args, **kwargs)

    def lower_recorded(self: Any, *args: Any) -> Any:
        with Mode():
            return lower(self, *args)

    def allocate_recorded(self: Any, name: str | None, data: Any) -> str:
        final = allocate(self, name, data)
        recording.constants[final] = data
        return final

    def get_attr_recorded(self: Any, target: Any, args: Any, kwargs: Any) -> Any:
        before = len(self.constants)
        result = get_attr(self, target, args, kwargs)
        value = functools.reduce(getattr, target.split("."), self.module) if isinstance(target, str) else None
        if (
            isinstance(value, torch.Tensor)
            and len(self.constants) == before
            and not any(v is value for v in self.constants.values())
        ):
            recording.inlined.append(value)
        return result

    with ExitStack() as stack:
        stack.enter_context(mock.patch.object(ConstantFolder, "run", fold_recorded))
        stack.enter_context(mock.patch.object(GraphLowering, "allocate_non_dup_const_name", allocate_recorded))
        stack.enter_context(mock.patch.object(GraphLowering, "get_attr", get_attr_recorded))
        stack.enter_context(mock.patch.object(GraphLowering, "run", lower_recorded))
        yield recording
