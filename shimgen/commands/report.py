"""`shimgen report`: what a build made, per graph and target (unit): its kernels and the library calls of its model,
the lockfile's kernel choices with their timings, each translation unit's compile seconds, and the sizes of what
ships. Everything is read from the build's files, state.json and the lockfile: torch is never imported.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shimgen.build.meson import unit_name as tu_name
from shimgen.cache.state import State
from shimgen.commands import matrix
from shimgen.errors import UserError
from shimgen.inductor import generated, kernel_choice, lockfile
from shimgen.pipeline import Layout
from shimgen.results import CodegenResult, PackageResult, unit_name
from shimgen.spec import Graph, Target, load_spec

_LINKED = (".so", ".pyd", ".dylib", ".dll", ".a", ".lib")


@dataclass(frozen=True)
class _Build:
    """What every unit's part of the report reads."""

    name: str
    layout: Layout
    state: State
    packaged: PackageResult | None
    locked: lockfile.Locked
    torch: str | None
    steps: list[dict[str, Any]]  # translation units, each with its unit (or None)


def collect(spec_path: Path, out: Path, only: str | None) -> dict[str, Any]:
    """The report of the spec's last build under `out` (the one for build identifier `only`) as JSON-able data."""
    spec = load_spec(spec_path)
    layout = Layout.of(spec_path, out.resolve(), spec.project.name)
    if only is not None:
        picked = matrix.select(spec, only)
        spec = dataclasses.replace(spec, target=[picked.target])
        layout = dataclasses.replace(layout, root=layout.root / picked.identifier)
    if not layout.state_file.is_file():
        raise UserError(_never_built(spec.project.name, layout, only))
    state = State(layout.state_file)
    packaged = state.get(PackageResult, "package") or _unrecorded_package(layout, spec.project.name)
    build = _Build(
        spec.project.name,
        layout,
        state,
        packaged,
        lockfile.read(layout.lock_path),
        _torch_version(),
        _translation_units(layout),
    )
    units = {unit_name(g, t): _unit(build, g, t) for t in spec.target for g in spec.graph}
    return {
        "name": build.name,
        "build_dir": str(layout.root),
        "torch": build.torch,
        "lockfile": str(layout.lock_path) if layout.lock_path.is_file() else None,
        "units": units,
        "translation_units": [_without_unit(s) for s in build.steps if s["unit"] not in units],
        "wheel": _sized(packaged.wheel) if packaged else None,
    }


def _never_built(name: str, layout: Layout, only: str | None) -> str:
    message = f"nothing built for {name} under {layout.root}; run shimgen build first"
    ids = sorted(p.parent.name for p in layout.root.glob("*/state.json")) if only is None else []
    return message + (f" (it was built with --only: {', '.join(ids)}; pass that to --only)" if ids else "")


def _unrecorded_package(layout: Layout, name: str) -> PackageResult | None:
    """The package a build left in place, when a later one that failed dropped its record: site/ and the wheel its
    dist-info names."""
    info = next(layout.site.glob(f"{name}-*.dist-info"), None)
    if info is None or not (info / "WHEEL").is_file():
        return None
    tag = next(
        (
            line.split(":", 1)[1].strip()
            for line in (info / "WHEEL").read_text().splitlines()
            if line.startswith("Tag:")
        ),
        None,
    )
    return (
        PackageResult(key="", wheel=layout.dist / f"{info.name.removesuffix('.dist-info')}-{tag}.whl", site=layout.site)
        if tag
        else None
    )


def _torch_version() -> str | None:
    try:
        return importlib.metadata.version("torch").split("+")[0]
    except importlib.metadata.PackageNotFoundError:
        return None


def _unit(build: _Build, graph: Graph, target: Target) -> dict[str, Any]:
    unit = unit_name(graph, target)
    code = build.state.get(CodegenResult, f"unit:codegen:{unit}")
    section = lockfile.section(unit, build.torch) if build.torch else None
    return {
        "graph": graph.name,
        "device": target.device,
        "generated": code is not None,
        "kernels": generated.kernels(code) if code else [],
        "lock_section": section,
        "kernel_choices": _choices(build.locked.units.get(section, ()) if section else (), code),
        "untimed_gemms": [{"sizes": list(s), "kernel": k, "count": n} for (s, k), n in code.untimed_gemms]
        if code
        else [],
        "translation_units": [_without_unit(s) for s in build.steps if s["unit"] == unit],
        "sizes": {
            "extension": _sized(_extension(unit, build)),
            "weights": _sized(code.weights_file or code.weights)
            if code
            else None,  # the weights file, or the object linked in
        },
    }


def _choices(sets: tuple[lockfile.Measured, ...], code: CodegenResult | None) -> list[Any]:
    """The choices of the lockfile's set that holds every timing this build used; else of its first set."""
    used = lockfile.used_by(sets, code.autotune_timings) if code else None
    return (used or (sets[0] if sets else lockfile.Measured({}))).choices


def _translation_units(layout: Layout) -> list[dict[str, Any]]:
    """Every output in the Meson build dir's .ninja_log that is still there, its seconds at its last build and its unit."""
    log = layout.meson / ".ninja_log"
    seconds: dict[str, float] = {}
    for line in log.read_text().splitlines() if log.is_file() else []:
        parts = line.split("\t")
        if len(parts) >= 4 and parts[0].isdigit() and parts[1].isdigit():
            seconds[parts[3]] = (int(parts[1]) - int(parts[0])) / 1000  # later entries are later builds
    owners = _owners(layout)
    return [
        {
            "name": tu_name(output),
            "output": output,
            "step": _step(output),
            "seconds": s,
            "unit": owners.get(output) or owners.get(output.split("/")[0]),
        }
        for output, s in seconds.items()
        if (layout.meson / output).is_file()
    ]


def _owners(layout: Layout) -> dict[str, str]:
    """Meson's outputs (a target's file, and its `<file>.p` object directory), relative to the build directory, by the
    unit whose sources (project/src/<unit>/) they are built from, from Meson's own target list."""
    info = layout.meson / "meson-info" / "intro-targets.json"
    src = layout.project / "src"
    owners: dict[str, str] = {}
    for target in json.loads(info.read_text()) if info.is_file() else []:
        sources = [Path(s) for group in target.get("target_sources", []) for s in group.get("sources", [])]
        units = {s.relative_to(src).parts[0] for s in sources if s.is_relative_to(src) and s != src}
        if len(units) == 1:
            for file in target.get("filename", []):
                output = os.path.relpath(file, layout.meson)
                owners[output] = owners[f"{output}.p"] = next(iter(units))
    return owners


def _step(output: str) -> str:
    if output.endswith((".o", ".obj")):
        return "compile"
    return "link" if output.endswith(_LINKED) else "generate"


def _extension(unit: str, build: _Build) -> Path | None:
    """The unit's extension module in the unpacked wheel; the one in the Meson build directory when not packaged."""
    for where in ([build.packaged.site / build.name] if build.packaged else []) + [build.layout.meson]:
        found = sorted(p for p in where.glob(f"_{unit}.*") if p.suffix in (".so", ".pyd"))
        if found:
            return found[0]
    return None


def _without_unit(step: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in step.items() if k != "unit"}


def _sized(path: Path | None) -> dict[str, Any] | None:
    return {"path": str(path), "bytes": path.stat().st_size} if path is not None and path.is_file() else None


def text(report: dict[str, Any]) -> str:
    """The report as readable text."""
    lines = [f"{report['name']}: {report['build_dir']} (torch {report['torch'] or 'not installed'})"]
    root = Path(report["build_dir"])
    for unit, data in report["units"].items():
        lines += ["", f"{unit} (graph {data['graph']}, {data['device']})"]
        if not data["generated"]:
            lines.append(
                "  not generated: state.json records no codegen for it (the last build failed before it, or is still running)"
            )
        lines += _kernel_lines(data["kernels"], root) + _choice_lines(data, report["lockfile"])
        lines += _tu_lines(data["translation_units"])
        lines += ["  sizes:"] + _table(
            [[k, _shown(v, root), _bytes(v)] for k, v in data["sizes"].items()], "    ", right=2
        )
    if report["translation_units"]:
        lines += ["", "shared"] + _tu_lines(report["translation_units"])
    lines += ["", f"wheel: {_shown(report['wheel'], root)} {_bytes(report['wheel'])}".rstrip()]
    return "\n".join(lines)


def _kernel_lines(kernels: list[dict[str, Any]], root: Path) -> list[str]:
    rows = [
        [
            k["name"],
            k["kind"],
            _relative(k["source"], root) + (f":{k['line']}" if k["line"] else ""),
            f"x{k['calls']}" if k["calls"] is not None else "",
        ]
        for k in kernels
    ]
    return [f"  kernels ({len(kernels)}):"] + (_table(rows, "    ") if rows else ["    none found"])


def _choice_lines(data: dict[str, Any], lock: str | None) -> list[str]:
    untimed = [f"    {g['kernel']} {kernel_choice.listed([(g['sizes'], g['count'])])}" for g in data["untimed_gemms"]]
    lines = [f"  GEMMs taken untimed ({kernel_choice.RULE}):", *untimed] if untimed else []
    if not data["kernel_choices"]:
        return [*lines, f"  kernel choices: none in {'the lockfile' if lock else 'a lockfile (there is none)'}"]
    lines.append(f"  kernel choices (lockfile section '{data['lock_section']}', us per call):")
    for c in data["kernel_choices"]:
        count = f" x{c['count']}" if c.get("count", 1) > 1 else ""
        others = "; ".join(f"{name} {us:g}" for name, us in c["us"].items() if name != c["picked"])
        lines.append(
            f"    {c['op']}({', '.join(c['sizes'])}){count}: {c['picked']} {c['us'].get(c['picked'], float('nan')):g}"
            + (f"; {others}" if others else "")
        )
    return lines


def _tu_lines(steps: list[dict[str, Any]]) -> list[str]:
    rows = [[s["name"], s["step"], f"{s['seconds']:.1f}s"] for s in sorted(steps, key=lambda s: -s["seconds"])]
    return ["  translation units:"] + (
        _table(rows, "    ", right=2) if rows else ["    none in the Meson build's .ninja_log"]
    )


def _table(rows: list[list[str]], indent: str, right: int | None = None) -> list[str]:
    """Rows in aligned columns; column `right` aligned to the right."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [
        indent
        + "  ".join(
            cell.rjust(w) if i == right else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in rows
    ]


def _relative(path: str, root: Path) -> str:
    return os.path.relpath(path, root) if Path(path).is_relative_to(root) else path


def _shown(sized: dict[str, Any] | None, root: Path) -> str:
    return _relative(sized["path"], root) if sized else "missing"


def _bytes(sized: dict[str, Any] | None) -> str:
    if sized is None:
        return ""
    n = sized["bytes"]
    return f"{n / 1e6:.1f} MB" if n >= 1e6 else f"{n / 1e3:.1f} kB" if n >= 1e3 else f"{n} B"
