"""The weights file of flags.weights = "file": a graph's constants as safetensors, shipped beside its extension.

Inductor, told to keep the weights out of the library (package_constants_on_disk_format = "binary_blob"),
leaves them as one blob: its non-folded constants in order, each `data_size` bytes (64-byte padded). The
model's generated class describes each constant (`constants_info_` in its constructor). shimgen rewrites
the blob as a safetensors file: one entry per constant, named by the weight it holds where it has one
(`fc.bias`) and else by Inductor's name (`_frozen_param3`), typed where the constant is a plain
contiguous tensor and raw bytes otherwise (oneDNN's prepacked layouts). Entries whose size is a multiple
of 64 bytes come first and start 64-byte aligned; the others follow, largest element first, each
aligned to its element. The header's metadata maps entries to the model's constants. A graph with specialized
variants has one file for all its models: a variant's constant whose bytes the file already holds maps to that entry.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shimgen.files import write_if_changed
from shimgen.inductor import compat

ALIGN = 64
WEIGHT_PREFIX = "model."  # of the program's weight names: trace makes the model its adapter's submodule `model`
FORMAT = "shimgen-weights-1"
_INFO = re.compile(r"^\s*constants_info_\[(\d+)\]\.(\w+) = (.*);$", re.M)
# safetensors' dtype names by torch's.
SAFETENSORS_DTYPES = {
    "float64": "F64",
    "float32": "F32",
    "float16": "F16",
    "bfloat16": "BF16",
    "int64": "I64",
    "int32": "I32",
    "int16": "I16",
    "int8": "I8",
    "uint8": "U8",
    "bool": "BOOL",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2",
}
ITEMSIZE = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
}


@dataclass(frozen=True)
class Constant:
    """One constant of Inductor's model class, as its constructor describes it."""

    name: str
    fqn: str  # the weight's name in the model's state dict, or `name` where Inductor made it (freezing)
    dtype: str  # torch's name: float32
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    data_size: int  # bytes in the blob, padded
    layout: str  # strided, or _mkldnn for oneDNN's prepacked weights
    from_folded: bool  # computed at load by runtime constant folding: not in the blob
    kind: str  # Parameter, Buffer or TensorConstant (torch::aot_inductor::ConstantType)
    plain: bool = False  # one of the program's weights, as it is (not computed from weights by Inductor)

    @property
    def weight(self) -> str:
        """The name a state dict gives it."""
        return self.fqn or self.name

    @property
    def typed(self) -> bool:
        """A contiguous tensor of its own storage: stored with its dtype and shape."""
        if self.layout != "strided" or self.offset or self.dtype not in SAFETENSORS_DTYPES:
            return False
        contiguous, expected = 1, []
        for size in reversed(self.shape):
            expected.append(contiguous)
            contiguous *= max(size, 1)
        return tuple(reversed(expected)) == self.stride or math.prod(self.shape) <= 1

    @property
    def nbytes(self) -> int:
        """Bytes of the entry: the tensor's for a typed one, the blob's padded slice otherwise."""
        return math.prod(self.shape) * ITEMSIZE[SAFETENSORS_DTYPES[self.dtype]] if self.typed else self.data_size


def parse_constants(model_cpp: str) -> list[Constant]:
    """The constants the generated model class declares, in its order."""
    fields: dict[int, dict[str, str]] = {}
    for index, name, value in _INFO.findall(model_cpp):
        fields.setdefault(int(index), {})[name] = value.strip()
    constants = []
    for index in sorted(fields):
        f = fields[index]
        constants.append(
            Constant(
                name=json.loads(f["name"]),
                fqn=json.loads(f.get("original_fqn", '""')),
                dtype=f["dtype"].removeprefix("cached_torch_dtype_"),
                shape=_ints(f["shape"]),
                stride=_ints(f["stride"]),
                offset=int(f.get("offset", "0")),
                data_size=int(f["data_size"]),
                layout=re.sub(r".*cached_torch_layout_(\w+)\)?", r"\1", f.get("layout", "strided")),
                from_folded=f.get("from_folded") == "true",
                kind=re.sub(r".*ConstantType::(\w+)\)?", r"\1", f.get("type", "Unknown")),
            )
        )
    return constants


def mark_plain(constants: list[Constant], program_weights: dict[str, Any]) -> list[Constant]:
    """The constants, each marked where it is one of `program_weights` (by name) with its dtype and shape, as a
    contiguous tensor: a weight Inductor computed nothing from."""

    def plain(c: Constant) -> bool:
        value = program_weights.get(c.fqn)
        return (
            c.typed
            and value is not None
            and str(value.dtype).removeprefix("torch.") == c.dtype
            and tuple(value.shape) == c.shape
        )

    return [dataclasses.replace(c, plain=plain(c)) for c in constants]


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(v.rstrip("L")) for v in text.strip("{}").split(",") if v.strip())


def write_from_blob(constants: list[Constant], blob: bytes, out: Path) -> None:
    """The safetensors file of the constants Inductor serialized into `blob`."""
    stored = [c for c in constants if not c.from_folded]
    if sum(c.data_size for c in stored) != len(blob):
        raise compat.changed(
            f"Inductor's weights blob changed (it holds {len(blob)} bytes, its model's constants "
            f"{sum(c.data_size for c in stored)})"
        )
    data, start = {}, 0
    for c in stored:
        data[c.name] = blob[start : start + c.nbytes]
        start += c.data_size
    _write(stored, data, out)


def write_from_tensors(constants: list[Constant], values: dict[str, Any], out: Path) -> bool:
    """The safetensors file of the constants taken from `values` (weights by name, as the exported program holds them);
    False, and nothing written, where a constant is not among them as a plain tensor of its dtype and shape (Inductor
    made or changed it)."""

    stored = [c for c in constants if not c.from_folded]
    if not all(c.plain for c in stored) or not all(c.fqn in values for c in stored):
        return False
    data = {}
    for c in stored:
        value = values[c.fqn]
        if str(value.dtype).removeprefix("torch.") != c.dtype or tuple(value.shape) != c.shape:
            return False
        data[c.name] = tensor_bytes(value)
    _write(stored, data, out)
    return True


def write_refitted(
    constants: list[Constant], values: dict[str, Any], program: dict[str, Any], device: str, out: Path
) -> bool:
    """The weights file of the constants made from new `values` (weights by the program's names): the plain ones as
    they are, the others by their refit program (refit.py) on `device`, in the bytes the compiled code takes; False,
    and nothing written, where a constant has no program or the new weights change a literal of the code."""
    import torch

    from shimgen.runtime import _shimgen_refit as replay  # the package's own module: it imports torch

    stored = [c for c in constants if not c.from_folded]
    derived = [c for c in stored if not c.plain]
    if program.get("missing") or any(c.name not in program.get("outputs", {}) for c in derived):
        return False
    if not all(c.fqn in values for c in stored if c.plain):
        return False
    try:
        again = replay.run(program, {n.removeprefix(WEIGHT_PREFIX): t for n, t in values.items()}, torch.device(device))
    except replay.RefitError:
        return False
    data = {}
    for c in stored:
        if c.plain:
            value = values[c.fqn]
            if str(value.dtype).removeprefix("torch.") != c.dtype or tuple(value.shape) != c.shape:
                return False
            data[c.name] = tensor_bytes(value)
        else:
            packed = program.get("packed_bytes", {}).get(c.name, 0)
            data[c.name] = tensor_bytes(replay.constant_bytes(again[c.name], c.typed, c.nbytes, packed))
    _write(stored, data, out)
    return True


def _write(stored: list[Constant], data: dict[str, bytes], out: Path) -> None:
    # By the weight's name, unless several constants come from one weight (Inductor's packed copies of it).
    uses = collections.Counter(c.weight for c in stored)
    entry = {c.name: c.weight if uses[c.weight] == 1 else c.name for c in stored}
    entries = [
        _Entry(
            entry[c.name],
            SAFETENSORS_DTYPES[c.dtype] if c.typed else "U8",
            list(c.shape) if c.typed else [c.nbytes],
            data[c.name],
        )
        for c in stored
    ]
    metadata = {
        "format": FORMAT,
        "constants": json.dumps({entry[c.name]: c.name for c in stored}, sort_keys=True),
        "raw": json.dumps(
            {
                entry[c.name]: {"dtype": c.dtype, "shape": list(c.shape), "layout": c.layout}
                for c in stored
                if not c.typed
            },
            sort_keys=True,
        ),
    }
    write_if_changed(out, _encode(entries, metadata))


@dataclass(frozen=True)
class _Entry:
    name: str
    dtype: str  # safetensors'
    shape: list[int]
    data: bytes


def _encode(entries: list[_Entry], metadata: dict[str, str]) -> bytes:
    """A safetensors file: the data starts 64-byte aligned, entries of a size that is a multiple of 64 first, then the
    others
    largest element first, with no holes."""
    aligned = [e for e in entries if len(e.data) % ALIGN == 0]
    rest = sorted((e for e in entries if len(e.data) % ALIGN), key=lambda e: -ITEMSIZE[e.dtype])
    header: dict[str, Any] = {}
    offset = 0
    for e in aligned + rest:
        header[e.name] = {"dtype": e.dtype, "shape": e.shape, "data_offsets": [offset, offset + len(e.data)]}
        offset += len(e.data)
    header["__metadata__"] = metadata
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % ALIGN)  # the data starts 64-byte aligned
    return b"".join([struct.pack("<Q", len(text)), text, *(e.data for e in aligned + rest)])


def _decode(data: bytes) -> tuple[list[_Entry], dict[str, str]]:
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length])
    start = 8 + length
    entries = [
        _Entry(name, e["dtype"], e["shape"], data[start + e["data_offsets"][0] : start + e["data_offsets"][1]])
        for name, e in header.items()
        if name != "__metadata__"
    ]
    return sorted(entries, key=lambda e: header[e.name]["data_offsets"][0]), header.get("__metadata__", {})


def unit_file(dynamic: Path, variants: list[tuple[str, Path]], layout: str) -> bytes:
    """One weights file for a graph's dynamic code and its specialized variants, from the file of each: the dynamic
    code's entries as they are, then each tensor of a variant the file does not hold yet (`<variant>/<entry>`). The
    metadata maps each variant's constants to entries (`variants`) and names the compiled code the constants are laid
    out for (`layout`: load_weights() refuses a file of other code)."""
    entries, metadata = _decode(dynamic.read_bytes())
    held = {_content(e): e.name for e in entries}
    raw = json.loads(metadata.get("raw", "{}"))
    to_entry: dict[str, dict[str, str]] = {}
    for variant, path in variants:
        own, own_metadata = _decode(path.read_bytes())
        own_raw = json.loads(own_metadata.get("raw", "{}"))
        constant_of = json.loads(own_metadata["constants"])
        to_entry[variant] = {}
        for e in own:
            if _content(e) not in held:
                held[_content(e)] = f"{variant}/{e.name}"
                entries.append(dataclasses.replace(e, name=held[_content(e)]))
                if e.name in own_raw:
                    raw[held[_content(e)]] = own_raw[e.name]
            to_entry[variant][constant_of[e.name]] = held[_content(e)]
    metadata = {**metadata, "raw": json.dumps(raw, sort_keys=True), "layout": layout}
    if variants:
        metadata["variants"] = json.dumps(to_entry, sort_keys=True)
    return _encode(entries, metadata)


def external_file(files: list[tuple[str, bytes]]) -> bytes:
    """The weights file of a package built with flags.weights = "external", from its units' files (`unit_file`, by
    unit) or, for `shimgen merge`, from the external files of its targets' packages (unit ""): each tensor once
    (`<unit>/<entry>` where first seen). Metadata `units` holds, by unit, what a unit's own file has at its top level,
    its entry names those of this file, and its dynamic model's `constants` by constant (constant -> entry, as
    `variants` has them: constants of equal bytes share one entry)."""
    entries: list[_Entry] = []
    held: dict[tuple[str, tuple[int, ...], bytes], str] = {}
    units_metadata: dict[str, dict[str, Any]] = {}
    for source, data in files:
        own, metadata = _decode(data)
        by_name = {e.name: e for e in own}
        if source:  # a unit's own file: constants by entry
            units = {
                source: {
                    "constants": {c: entry for entry, c in json.loads(metadata["constants"]).items()},
                    "variants": json.loads(metadata.get("variants", "{}")),
                    "raw": json.loads(metadata.get("raw", "{}")),
                    "layout": metadata.get("layout", ""),
                }
            }
        else:
            units = json.loads(metadata["units"])
        for unit, mine in units.items():
            prefix = f"{unit}/" if source else ""  # a merged file's entries have theirs

            def place(entry: str, prefix: str = prefix, by_name: dict[str, _Entry] = by_name) -> str:
                e = by_name[entry]
                if _content(e) not in held:
                    held[_content(e)] = prefix + entry
                    entries.append(dataclasses.replace(e, name=held[_content(e)]))
                return held[_content(e)]

            units_metadata[unit] = {
                "constants": {c: place(entry) for c, entry in mine["constants"].items()},
                "variants": {
                    variant: {c: place(entry) for c, entry in to_entry.items()}
                    for variant, to_entry in mine["variants"].items()
                },
                "raw": {place(entry): info for entry, info in mine["raw"].items()},
                "layout": mine["layout"],
            }
    return _encode(entries, {"format": FORMAT, "units": json.dumps(units_metadata, sort_keys=True)})


def _content(e: _Entry) -> tuple[str, tuple[int, ...], bytes]:
    # The bytes themselves: Python hashes them about ten times faster than sha256 (a ResNet-18's two files took 0.7 s),
    # once per object, and compares them only where the hashes match.
    return (e.dtype, tuple(e.shape), bytes(e.data))


def variant_bytes(path: Path, variant: str) -> int:
    """Bytes of the tensors a weights file holds for `variant` alone (those the dynamic code and earlier variants lack)."""
    with path.open("rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    return sum(
        e["data_offsets"][1] - e["data_offsets"][0] for name, e in header.items() if name.startswith(f"{variant}/")
    )


def tensor_bytes(tensor: Any) -> bytes:
    """A tensor's elements as bytes, in row-major order."""
    import torch

    return tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def package_view(constants: list[Constant], state: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """What the package's load_weights checks, per constant the extension takes, in its order; weights by the names
    the model's own state dict gives them; `state`: the weights the model mutates (by the program's names)."""
    return [
        {
            "name": c.name,
            "fqn": c.weight.removeprefix(WEIGHT_PREFIX),
            "kind": c.kind,
            "dtype": c.dtype,
            "shape": list(c.shape),
            "layout": c.layout,
            "typed": c.typed,
            "plain": c.plain,
            "nbytes": c.nbytes,
            "state": c.fqn in state,
        }
        for c in constants
        if not c.from_folded
    ]


def unused_weights(constants: list[Constant], program_weights: dict[str, Any]) -> list[str]:
    """The program's weights its compiled model does not take (a batch norm's num_batches_tracked; with freezing, those
    folded into other constants), by the names the model's own state dict gives them."""
    taken = {c.fqn for c in constants}
    return sorted(name.removeprefix(WEIGHT_PREFIX) for name in program_weights if name not in taken)


def write_constants(constants: list[Constant], out: Path) -> None:
    out.write_text(json.dumps([c.__dict__ for c in constants], indent=1) + "\n")


def read_constants(path: Path) -> list[Constant]:
    return [
        Constant(**{**c, "shape": tuple(c["shape"]), "stride": tuple(c["stride"])})
        for c in json.loads(path.read_text())
    ]
