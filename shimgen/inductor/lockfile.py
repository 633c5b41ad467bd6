"""`<spec>.lock`: every kernel choice Inductor makes by timing (`gemm_autotune`, `max_autotune`), kept beside the
spec so that the next build, on any machine, replays it instead of measuring again (a C++ GEMM template's key leaves
out the core count its source was made for: kernel_choice.locked_keys): the same spec, toolchain and
torch then give the same kernels (and the same wheel). Meant to be committed; `shimgen build --retune` measures again.

Per unit (graph, device, torch) it holds Inductor's own timing records (op -> input layouts -> float32 matmul
precision -> candidate key -> ms), in the shape of Inductor's autotuning cache, and beside them the
choices as a reader wants them (op, sizes, winner, microseconds per candidate). A unit whose vectorized C++ kernels the
compiler refused also holds why (`scalar_kernels`): later builds generate its kernels without vectorization at once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shimgen.errors import UserError
from shimgen.files import exclusive, write_if_changed
from shimgen.results import KernelChoice, to_json

FORMAT = 1
HEADER = (
    "Kernel choices shimgen measured at build time, replayed by later builds on any machine. Commit this file; "
    "`shimgen build --retune` measures again and rewrites it."
)

Timings = dict[str, Any]  # op -> inputs key -> precision -> choice hash -> milliseconds


def path_for(spec_path: Path) -> Path:
    return spec_path.with_name(spec_path.name + ".lock")


def section(unit: str, torch_version: str) -> str:
    return f"{unit} torch{torch_version}"


@dataclass(frozen=True)
class Locked:
    """A lockfile as read, by section."""

    timings: dict[str, Timings] = field(default_factory=dict)
    scalar_kernels: dict[str, str] = field(default_factory=dict)  # why the vectorized kernels did not compile


def read(path: Path) -> Locked:
    """The lockfile's records; empty without a lockfile."""
    if not path.is_file():
        return Locked()
    try:
        data = json.loads(path.read_text())
        units = data["units"]
        if data.get("format") != FORMAT or not isinstance(units, dict):
            raise ValueError(f"format {data.get('format')!r}")
        return Locked(
            timings={name: unit.get("timings", {}) for name, unit in units.items()},
            scalar_kernels={
                name: str(unit["scalar_kernels"]) for name, unit in units.items() if "scalar_kernels" in unit
            },
        )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UserError(
            f"{path}: not a shimgen lockfile this version reads ({exc}); delete it or build with --retune"
        ) from None


def update(path: Path, sections: dict[str, tuple[Timings, tuple[KernelChoice, ...], str]], keep: set[str]) -> bool:
    """Write `sections` (timings, choices, why the kernels are scalar or "") into the lockfile, keeping the other
    sections named in `keep` (units of other torch versions); True when the file changed. Builds of one spec in several
    output directories at once take turns."""
    with exclusive(path.with_name(f".{path.name}.writing")):
        try:
            units = json.loads(path.read_text())["units"] if path.is_file() else {}
        except (ValueError, KeyError, TypeError):
            units = {}
        units = {name: unit for name, unit in units.items() if name in keep}
        for name, (timings, choices, scalar) in sections.items():
            unit: dict[str, Any] = {"choices": to_json(choices), "timings": timings} if timings else {}
            if scalar:
                unit["scalar_kernels"] = scalar
            if unit:
                units[name] = unit
            else:
                units.pop(name, None)
        if not units and not path.is_file():
            return False
        text = json.dumps({"comment": HEADER, "format": FORMAT, "units": units}, indent=1, sort_keys=True) + "\n"
        return write_if_changed(path, text)
