"""`<spec>.lock`: every kernel choice Inductor makes by timing (`gemm_autotune`, `max_autotune`), kept beside the
spec so that the next build, on any machine, replays it instead of measuring again (a C++ GEMM template's key leaves
out the core count its source was made for: kernel_choice.locked_keys): the same spec, toolchain and
torch then give the same kernels (and the same wheel). Meant to be committed; `shimgen build --retune` measures again.

Per unit (graph, device, torch) it holds one measured set per kind of machine that built it, each with Inductor's own
timing records (op -> input layouts -> float32 matmul precision -> candidate key -> ms, the shape of Inductor's
autotuning cache) and the choices as a reader wants them (op, sizes, winner, microseconds per candidate). Machines
whose candidates differ (a native-ISA C++ GEMM template's source follows the vector width) each keep their own set, so
one committed lockfile replays on all of them and none rewrites it. A unit that a build had to generate otherwise than
its flags say also holds why (`Fallbacks`): later builds generate it that way at once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shimgen.errors import UserError
from shimgen.files import exclusive, write_if_changed

FORMAT = 2  # format 1 held one measured set per unit; it is still read
HEADER = (
    "Kernel choices shimgen measured at build time, one set per kind of machine, replayed by later builds. Commit "
    "this file; `shimgen build --retune` measures again."
)

Timings = dict[str, Any]  # op -> inputs key -> precision -> choice hash -> milliseconds
Selection = tuple[str, str, str]  # one kernel selection: op, inputs key, precision


def path_for(spec_path: Path) -> Path:
    return spec_path.with_name(spec_path.name + ".lock")


def section(unit: str, torch_version: str) -> str:
    return f"{unit} torch{torch_version}"


@dataclass(frozen=True)
class Measured:
    """What one kind of machine measured for a unit: the timing records and the choices they gave (as JSON)."""

    timings: Timings
    choices: list[Any] = field(default_factory=list)


@dataclass(frozen=True)
class Fallbacks:
    """Why a build generated a unit otherwise than its flags say ("": it did not)."""

    scalar_kernels: str = ""  # its CPU kernels without vectorization: the compiler refused the vectorized ones
    onednn_off: str = ""  # without oneDNN: its package computed otherwise with oneDNN's fusions
    gemm_templates_off: str = ""  # without GEMM templates as candidates: Inductor failed on the graph with them
    freezing_off: str = ""  # without freezing: its package computed otherwise with the weights folded into the code

    def fields(self) -> dict[str, str]:
        return {name: why for name, why in vars(self).items() if why}


@dataclass(frozen=True)
class Locked:
    """A lockfile as read, by section."""

    units: dict[str, tuple[Measured, ...]] = field(default_factory=dict)
    fallbacks: dict[str, Fallbacks] = field(default_factory=dict)

    def timings(self, section: str) -> list[Timings]:
        """The section's timing sets, the order replay tries them in."""
        return [measured.timings for measured in self.units.get(section, ())]


def read(path: Path) -> Locked:
    """The lockfile's records; empty without a lockfile."""
    if not path.is_file():
        return Locked()
    try:
        data = json.loads(path.read_text())
        units = data["units"]
        if data.get("format") not in (1, FORMAT) or not isinstance(units, dict):
            raise ValueError(f"format {data.get('format')!r}")
        return Locked(
            units={name: _measured(unit) for name, unit in units.items()},
            fallbacks={name: found for name, unit in units.items() if (found := _fallbacks(unit)) != Fallbacks()},
        )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UserError(
            f"{path}: not a shimgen lockfile this version reads ({exc}); delete it or build with --retune"
        ) from None


def _fallbacks(unit: dict[str, Any]) -> Fallbacks:
    return Fallbacks(**{name: str(unit[name]) for name in vars(Fallbacks()) if name in unit})


def _measured(unit: dict[str, Any]) -> tuple[Measured, ...]:
    sets = unit["machines"] if "machines" in unit else [unit] if unit.get("timings") else []
    found = tuple(Measured(timings=dict(s["timings"]), choices=list(s.get("choices", []))) for s in sets)
    for measured in found:
        for _, record in _records(measured.timings):
            if not all(isinstance(ms, (int, float)) for ms in record.values()):
                raise ValueError("a timing is not a number")
    return found


def merged(sets: tuple[Measured, ...], used: Measured) -> tuple[Measured, ...]:
    """A unit's sets after a build that used `used`. A build that only replayed leaves them as they were. Otherwise its
    set replaces those that could answer every selection it made that they hold (its own kind of machine's, older),
    and sits beside those that could not (machines whose candidates differ); in a fixed order, whichever machine
    wrote last."""
    if not used.timings:
        return ()
    if all(any(_answers(s, where, record, exactly=True) for s in sets) for where, record in _records(used.timings)):
        return sets
    others = [
        s
        for s in sets
        if not all(_answers(s, where, record) for where, record in _records(used.timings) if _holds(s, where))
    ]
    return tuple(sorted([*others, used], key=_candidates))


def used_by(sets: tuple[Measured, ...], timings: Timings) -> Measured | None:
    """The set that holds every timing a build used (`timings`), if one does."""
    return next((s for s in sets if all(_answers(s, w, r, exactly=True) for w, r in _records(timings))), None)


def _records(timings: Timings) -> list[tuple[Selection, dict[str, float]]]:
    return [
        ((op, inputs, precision), record)
        for op, by_inputs in timings.items()
        for inputs, by_precision in by_inputs.items()
        for precision, record in by_precision.items()
    ]


def _holds(measured: Measured, where: Selection) -> bool:
    op, inputs, precision = where
    return precision in measured.timings.get(op, {}).get(inputs, {})


def _answers(measured: Measured, where: Selection, record: dict[str, float], exactly: bool = False) -> bool:
    """Whether `measured` has timings for all of `record`'s candidates (`exactly`: the same timings)."""
    op, inputs, precision = where
    held = measured.timings.get(op, {}).get(inputs, {}).get(precision, {})
    return all(key in held and (not exactly or held[key] == ms) for key, ms in record.items())


def _candidates(measured: Measured) -> str:
    return json.dumps(sorted((list(where), sorted(record)) for where, record in _records(measured.timings)))


def update(path: Path, sections: dict[str, tuple[Measured, Fallbacks]], keep: set[str]) -> bool:
    """Merge `sections` (the set a build used, and what it fell back on) into the lockfile, keeping the other
    sections named in `keep` (units of other torch versions); True when the file changed. Builds of one spec in several
    output directories at once take turns."""
    with exclusive(path.with_name(f".{path.name}.writing")):
        try:
            found = read(path) if path.is_file() else Locked()
        except UserError:
            found = Locked()
        written = {name: (found.units.get(name, ()), found.fallbacks.get(name, Fallbacks())) for name in keep}
        for name, (used, fallbacks) in sections.items():
            written[name] = (merged(found.units.get(name, ()), used), fallbacks)
        units: dict[str, Any] = {}
        for name, (sets, fallbacks) in written.items():
            unit: dict[str, Any] = {"machines": [{"choices": s.choices, "timings": s.timings} for s in sets]}
            unit.update(fallbacks.fields())
            if sets or fallbacks.fields():
                units[name] = unit
        if not units and not path.is_file():
            return False
        text = json.dumps({"comment": HEADER, "format": FORMAT, "units": units}, indent=1, sort_keys=True) + "\n"
        return write_if_changed(path, text)
