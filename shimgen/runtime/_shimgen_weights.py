"""The weights of a shimgen package: its weights files mapped at import, load_weights(), and the state its graphs
mutate.

Shipped unchanged in every package built by shimgen. Each graph's extension takes its weights as one tensor of
bytes per constant of Inductor's model, in the model's order, for its dynamic model and then each specialized
variant (`_set_weights`); this module finds those bytes (in a weights file, a state dict or a checkpoint) and checks
names, dtypes and shapes before handing them over.

State: a buffer a graph updates in place (a counter, a static KV cache) is one tensor per device for the graphs that
build the same module (the same entry, arguments and seed), allocated at import from the weights file's initial values
and handed to each of those graphs and their variants, so one sees the updates of the others (prefill fills the cache
decode reads). The graphs that mutate state run one call at
a time across the package (their extensions share one lock); load_weights() leaves the state as it is.
"""

from __future__ import annotations

import importlib
import json
import os
import struct
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from . import _shimgen_refit as refit

MANIFEST = "_shimgen_build.json"
FORMAT = "shimgen-weights-1"  # the weights files shimgen writes (shimgen/inductor/weights.py)


class WeightsError(ValueError):
    """Weights that do not fit the compiled model."""


def read_safetensors(path: str) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The tensors of a safetensors file, mapped (copy on write: the file's pages are shared between processes), and
    its metadata."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    start = 8 + length
    data = torch.from_file(path, shared=False, size=size, dtype=torch.uint8)
    dtypes = {
        "F64": torch.float64,
        "F32": torch.float32,
        "F16": torch.float16,
        "BF16": torch.bfloat16,
        "I64": torch.int64,
        "I32": torch.int32,
        "I16": torch.int16,
        "I8": torch.int8,
        "U8": torch.uint8,
        "BOOL": torch.bool,
        "F8_E4M3": torch.float8_e4m3fn,
        "F8_E5M2": torch.float8_e5m2,
    }
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        dtype = dtypes.get(entry["dtype"])
        if dtype is None:
            raise WeightsError(f"{path}: tensor '{name}' has dtype {entry['dtype']}, which torch cannot read")
        raw = data[start + begin : start + end]
        tensors[name] = (
            raw.view(dtype).reshape(entry["shape"])
            if (start + begin) % dtype.itemsize == 0
            else raw.clone().view(dtype).reshape(entry["shape"])
        )
    return tensors, header.get("__metadata__", {})


def _as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.reshape(-1).view(torch.uint8)


class Unit:
    """One graph on one target: its extension, and the constants of each of its models (the dynamic one, then each
    specialized variant)."""

    def __init__(self, package: str, directory: str, unit: dict[str, Any], freezing: bool, external: bool) -> None:
        self.name, self.graph, self.device, self.freezing = unit["name"], unit["graph"], unit["device"], freezing
        self.module = importlib.import_module(f"{package}._{self.name}")
        self.models: list[tuple[str, list[dict[str, Any]]]] = [("", unit["constants"])]
        self.models += [(v["name"], v["constants"]) for v in unit.get("variants", ())]
        # Per model: how its constants computed from the weights at build time are computed again (None: it has none).
        self.programs: list[dict[str, Any] | None] = [unit.get("refit")]
        self.programs += [v.get("refit") for v in unit.get("variants", ())]
        self.unused = set(unit.get("unused_weights", ()))  # the model's weights the compiled graph does not read
        self.file = os.path.join(directory, unit["weights_file"]) if unit.get("weights_file") else None
        self.layout = unit.get("weights_layout", "")  # the compiled code the constants are laid out for
        self.loaded = not external  # the extension has weights: its own, or a file's (an "external" one's, once loaded)
        self.stateful = any(c.get("state") for c in self.constants)
        self.state_owner = unit.get("state_owner", "")

    def device_state(self) -> dict[str, torch.Tensor]:
        """The state tensors the dynamic model reads and writes where it runs (a GPU), by weight name; empty before its
        first call."""
        names = {c["name"]: c["fqn"] for c in self.models[0][1]}
        return {names[name]: t for name, t in self.module._state().items()}

    @property
    def constants(self) -> list[dict[str, Any]]:
        return [c for _, constants in self.models for c in constants]

    def from_file(self, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> list[list[torch.Tensor]] | str:
        """The bytes of each model's constants in a shimgen weights file (this build's, or another build's of the same
        compiled code): a unit's own file, its metadata at the top level, or an "external" package's file, by unit
        under "units". Where the file does not hold them all, why not."""
        if "units" in metadata:  # by constant: constant -> entry
            mine = json.loads(metadata["units"]).get(self.name)
            if mine is None:
                return "holds no weights of it"
        else:  # a unit's own file: entry -> constant
            mine = {key: json.loads(metadata.get(key, "{}")) for key in ("constants", "variants")}
            mine["constants"] = {c: e for e, c in mine["constants"].items()}
            mine["layout"] = metadata.get("layout", "")
        if mine.get("layout") and self.layout and mine["layout"] != self.layout:
            return "its weights are laid out for other compiled code (another build, spec or shimgen)"
        given: list[list[Any]] = []
        for variant, constants in self.models:
            to_entry = mine["variants"].get(variant) if variant else mine["constants"]
            if to_entry is None:
                return f"holds no weights of its variant {variant}"
            given.append([])
            for c in constants:
                entry = to_entry.get(c["name"])
                if entry not in tensors or _as_bytes(tensors[entry]).numel() != c["nbytes"]:
                    return f"holds no constant {c['name']} of the size its code takes"
                given[-1].append(_as_bytes(tensors[entry]))
        return given

    def plan(self, state: Mapping[str, Any]) -> list[list[torch.Tensor | None]]:
        """The bytes of each model's constants taken from `state` (None: keeps its value), checked; those Inductor
        computed from the weights at build time computed again by the model's refit program; one copy of each weight
        for all models."""
        copies: dict[str, torch.Tensor | None] = {}
        given: list[list[torch.Tensor | None]] = []
        for (_, constants), program in zip(self.models, self.programs, strict=True):
            try:
                refit.check_fixed(program or {}, state)
            except refit.RefitError as exc:
                raise WeightsError(f"graph {self.graph}: {exc}") from None
            derived = [c for c in constants if not c["plain"]]
            computed = self._recomputed(program, derived, state) if derived else {}
            given.append([])
            for c in constants:
                if not c["plain"]:
                    given[-1].append(computed[c["name"]])
                    continue
                if c["fqn"] not in copies:
                    copies[c["fqn"]] = self._copy(c, state.get(c["fqn"]))
                given[-1].append(copies[c["fqn"]])
        return given

    def _recomputed(
        self, program: dict[str, Any] | None, derived: list[dict[str, Any]], state: Mapping[str, Any]
    ) -> dict[str, torch.Tensor]:
        without = [c["fqn"] for c in derived if program is None or c["name"] not in program["outputs"]]
        if without:
            reasons = sorted(set((program or {}).get("missing", {}).values()))
            raise WeightsError(self._derived(list(dict.fromkeys(without)), reasons))
        assert program is not None
        inputs = {}
        for name, dtype, shape in program["inputs"].values():
            value = state.get(name)
            if value is None:
                raise WeightsError(
                    f"graph {self.graph}: weight '{name}' is missing (the build computed constants from it, and "
                    "computes them again from the new weights)"
                )
            if not isinstance(value, torch.Tensor):
                raise WeightsError(f"graph {self.graph}: weight '{name}' is a {type(value).__name__}, not a tensor")
            if str(value.dtype).removeprefix("torch.") != dtype or list(value.shape) != shape:
                raise WeightsError(
                    f"graph {self.graph}: weight '{name}' is {str(value.dtype).removeprefix('torch.')}"
                    f"{list(value.shape)}, the compiled model's is {dtype}{shape}"
                )
            inputs[name] = value
        device = torch.device("cpu" if self.device == "cpu" else "cuda")
        try:
            values = refit.run(program, inputs, device)
        except refit.RefitError as exc:
            raise WeightsError(f"graph {self.graph}: {exc}") from None
        packed = program.get("packed_bytes", {})
        return {
            c["name"]: refit.constant_bytes(values[c["name"]], c["typed"], c["nbytes"], packed.get(c["name"], 0))
            for c in derived
        }

    def _copy(self, c: dict[str, Any], value: Any) -> torch.Tensor | None:
        if c.get("state") and self.loaded:
            return None  # the package's state, whatever the state dict holds
        if value is None:
            if c["kind"] == "Parameter" or not self.loaded:  # buffers and constants left out keep their values
                raise WeightsError(
                    f"graph {self.graph}: weight '{c['fqn']}' is missing"
                    + ("" if self.loaded else " (the package has no weights yet to keep it from)")
                )
            return None
        if not isinstance(value, torch.Tensor):
            raise WeightsError(f"graph {self.graph}: weight '{c['fqn']}' is a {type(value).__name__}, not a tensor")
        if str(value.dtype).removeprefix("torch.") != c["dtype"] or tuple(value.shape) != tuple(c["shape"]):
            raise WeightsError(
                f"graph {self.graph}: weight '{c['fqn']}' is {str(value.dtype).removeprefix('torch.')}{list(value.shape)}, "
                f"the compiled model's is {c['dtype']}{list(c['shape'])}"
            )
        device = "cpu" if self.device == "cpu" or not value.is_cuda else value.device
        # A copy: the model must not see later in-place changes to the caller's tensors (an optimizer step).
        return _as_bytes(value.detach().to(device, copy=True, memory_format=torch.contiguous_format))

    def _derived(self, names: list[str], reasons: list[str]) -> str:
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        why = f" ({'; '.join(reasons)})" if reasons else ""
        file = f"{self.name}.safetensors"
        return (
            f"graph {self.graph}: Inductor computed constants from the weights at build time ({shown}) in a way this "
            f"package cannot repeat at load{why}. Rebuild with the new weights (shimgen recompiles nothing when only "
            f"weights change) and load that build's {file}"
            + (", or build with flags.freezing = false." if self.freezing else ".")
        )


class Weights:
    """The package's graphs and their weights; maps the weights files at import and allocates the state."""

    def __init__(self, package: str, init_file: str) -> None:
        directory = os.path.dirname(init_file)
        with open(os.path.join(directory, MANIFEST)) as f:
            manifest = json.load(f)
        external = bool(manifest.get("weights_env"))
        self.units = [Unit(package, directory, u, bool(manifest.get("freezing")), external) for u in manifest["units"]]
        # By (device, the module's graphs' state_owner), then weight name: the initial value (the file's bytes) and the
        # live
        # tensor those graphs read and write.
        self.initial: dict[tuple[str, str], dict[str, torch.Tensor]] = {}
        self.live: dict[tuple[str, str], dict[str, torch.Tensor]] = {}
        for unit in self.units:
            if unit.file:
                given = unit.from_file(*read_safetensors(unit.file))
                if isinstance(given, str):
                    raise ImportError(
                        f"{unit.file} does not hold the weights of graph {unit.graph}; reinstall the package"
                    )
                self._give(unit, given)
        groups = [group for group in (unit.module._state_group() for unit in self.units) if group is not None]
        for unit in self.units:
            if groups:
                unit.module._join_state_group(groups[0])
        # flags.weights = "external": the package ships none; they come from the file this variable names, if set.
        variable = manifest.get("weights_env")
        path = os.environ.get(variable) if variable else None
        if path:
            try:
                self.load(path)
            except (WeightsError, OSError, ValueError) as exc:
                raise ImportError(f"{variable}={path}: {exc}") from None

    def _give(self, unit: Unit, given: list[list[Any]]) -> None:
        unit.module._set_weights(self._with_state(unit, given))
        unit.loaded = True

    def _with_state(self, unit: Unit, given: list[list[Any]]) -> list[list[Any]]:
        """`given` with each state constant's bytes replaced by the package's live state (made from them the first time)."""
        owner = (unit.device, unit.state_owner)
        initial, live = self.initial.setdefault(owner, {}), self.live.setdefault(owner, {})
        for (_, constants), tensors in zip(unit.models, given, strict=True):
            for i, c in enumerate(constants):
                if not c.get("state"):
                    continue
                if c["fqn"] not in live:
                    if tensors[i] is None:
                        continue
                    dtype = getattr(torch, c["dtype"])
                    initial[c["fqn"]] = tensors[i].clone().view(dtype).reshape(c["shape"])
                    live[c["fqn"]] = initial[c["fqn"]].clone()
                tensors[i] = _as_bytes(live[c["fqn"]])
        return given

    def state(self, device: str | None = None, graph: str | None = None) -> dict[str, torch.Tensor]:
        """Copies of the state the graphs mutate (buffers updated in place), by weight name, as the last call left it,
        on
        `device` ('cpu' or 'cuda'; default: the first target's); of the module `graph` builds, or of every graph's.
        Where
        graphs of different modules hold state of the same name, each is named '<graph>.<weight>' after the first of
        those
        graphs."""
        units = [u for u in self.units if u.stateful]
        device = device or (units[0].device if units else "cpu")
        result: dict[str, torch.Tensor] = {}
        owners = list(dict.fromkeys(u.state_owner for u in units if u.device == device and graph in (None, u.graph)))

        def read() -> None:
            for owner in owners:
                first = next(u for u in units if u.device == device and u.state_owner == owner)
                held = {name: t.clone() for name, t in self.live.get((device, owner), {}).items()}
                for unit in units:
                    if unit.device == device and unit.state_owner == owner and device != "cpu":
                        held.update({name: t.clone() for name, t in unit.device_state().items()})
                result.update(
                    {
                        (name if owner == owners[0] or name not in result else f"{first.graph}.{name}"): t
                        for name, t in held.items()
                    }
                )

        self._locked(read)
        return result

    def reset_state(self) -> None:
        """Put the state back to its initial values (those the package was built with), on every device."""

        def reset() -> None:
            for owner, live in self.live.items():
                for name, t in live.items():
                    t.copy_(self.initial[owner][name])
            for unit in self.units:
                if unit.stateful and unit.device != "cpu":
                    for name, t in unit.device_state().items():
                        t.copy_(self.initial[unit.device, unit.state_owner][name])

        self._locked(reset)

    def _locked(self, fn: Any) -> None:
        stateful = [u for u in self.units if u.stateful]
        if stateful:
            stateful[0].module._with_state_lock(fn)

    def load(
        self, weights: Mapping[str, torch.Tensor] | str | os.PathLike[str], graphs: Iterable[str] | None = None
    ) -> None:
        """Replace the weights of the package's graphs (all, or those named) with `weights`: a state dict, a
        .safetensors file, or a checkpoint torch.load reads (weights only). Every parameter of each graph's model
        must be there with its dtype and shape; buffers left out keep their values. Calls running meanwhile
        finish on the old weights; later calls use the new ones."""
        units = self._select(graphs)
        if isinstance(weights, (str, os.PathLike)):
            path = os.fspath(weights)
            if path.endswith(".safetensors"):
                tensors, metadata = read_safetensors(path)
                if metadata.get("format") == FORMAT:
                    self._load_file(path, tensors, metadata, units)
                    return
                weights = tensors
            else:
                weights = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        if not isinstance(weights, Mapping):
            raise TypeError(
                f"load_weights() takes a state dict or the path of a weights file, not {type(weights).__name__}"
            )
        plans = [(unit, unit.plan(weights)) for unit in units]
        known = {c["fqn"] for unit in units for c in unit.constants} | {name for unit in units for name in unit.unused}
        unknown = sorted(set(weights) - known)
        if unknown:
            raise WeightsError(self._unknown(unknown))
        for unit, given in plans:
            self._give(unit, given)

    def _load_file(
        self, path: str, tensors: dict[str, torch.Tensor], metadata: dict[str, str], units: list[Unit]
    ) -> None:
        """A shimgen weights file: into every unit it holds all the constants of; where it leaves a unit without weights
        (an "external" package's first load), an error naming each unit and why."""
        read = [(unit, unit.from_file(tensors, metadata)) for unit in units]
        found = [(unit, given) for unit, given in read if not isinstance(given, str)]
        unfit = [(unit, why) for unit, why in read if isinstance(why, str)]
        if not found or any(not unit.loaded for unit, _ in unfit):
            reasons = "; ".join(f"{unit.name}: {why}" for unit, why in unfit)
            raise WeightsError(
                f"{path} does not hold the weights of this package's graphs as they were built ({reasons}): it comes "
                "from a build of another model, or with other flags or code"
            )
        for unit, given in found:
            self._give(unit, given)

    def _select(self, graphs: Iterable[str] | None) -> list[Unit]:
        if graphs is None:
            return self.units
        names = [graphs] if isinstance(graphs, str) else list(graphs)
        missing = sorted(set(names) - {u.graph for u in self.units})
        if missing:
            raise ValueError(
                f"no graph {', '.join(missing)} in this package (graphs: {', '.join(sorted({u.graph for u in self.units}))})"
            )
        return [u for u in self.units if u.graph in names]

    def _unknown(self, names: list[str]) -> str:
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        return f"{shown}: not weights of the compiled model"
