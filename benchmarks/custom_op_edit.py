"""A custom op's edit-rebuild loop: projects/custom_ops.toml built with shimgen's defaults (the torch header its C++
source includes first, precompiled in the per-user cache once the source is edited) and with `pch = false`, then its
op body edited and both rebuilt, in alternation, without the compiler cache.

    python benchmarks/custom_op_edit.py [--rounds 3] [--work DIR]

The builds run on a per-user cache whose prebuilt pieces are new (its toolchain verdicts and runtime libraries are the
user's). The default's first edit starts making the precompiled header aside; the benchmark waits for it before the
timed edits (an edit of a user who reads the compiler's output first would find it made). Saves
benchmarks/results/custom_op_edit.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from common import REPO, Report, shimgen_build

from shimgen import toolchain

HEADER_WAIT_S = 900  # the header compiles in about a minute of one core
WAYS = {"precompiled torch header (default)": "", "pch = false": "pch = false\n"}


def work_copy(root: Path, flags: str) -> Path:
    for directory in ("projects", "kernels"):
        shutil.copytree(REPO / directory, root / directory, ignore=shutil.ignore_patterns("__pycache__", "*.lock"))
    spec = root / "projects" / "custom_ops.toml"
    text = spec.read_text()
    spec.write_text(
        text.replace("[flags]\n", "[flags]\n" + flags) if "[flags]" in text else text + "\n[flags]\n" + flags
    )
    return spec


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--work", type=Path)
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="shimgen-op-edit-"))
    user = toolchain.cache_dir().parent
    cache = work / "cache"
    cache.mkdir(parents=True)
    for part in ("toolchain", "runtime"):
        (user / part).mkdir(parents=True, exist_ok=True)
        (cache / part).symlink_to(user / part)
    env = {**os.environ, "SHIMGEN_CACHE_DIR": str(cache / "toolchain")}
    specs = {way: work_copy(work / f"way{k}", flags) for k, (way, flags) in enumerate(WAYS.items())}

    report = Report()
    report(f"# custom_op_edit.py, {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}\n")
    report("`ops` stage and whole `shimgen build` in seconds, `--no-cache` (no compiler cache).\n")
    default, plain = WAYS
    first = {way: shimgen_build(spec, spec.parents[1] / "out", env, "--no-cache") for way, spec in specs.items()}

    def edit(spec: Path, r: int) -> tuple[float, float]:
        source = spec.parents[1] / "kernels" / "shimgen_ops.cpp"
        source.write_text(source.read_text() + f"\nstatic const int shimgen_benchmark_edit_{r} = {r};\n")
        wall, summary = shimgen_build(spec, spec.parents[1] / "out", env, "--no-cache")
        return summary["stages"]["ops"], wall

    first_edit = {}
    for way, spec in specs.items():
        first_edit[way] = edit(spec, 0)
        if way == default:
            started = time.monotonic()
    prebuilt = cache / "prebuilt"
    while not any(
        "." not in gch.parents[2].name and (gch.parents[2] / "done").is_file()
        for gch in prebuilt.glob("*/include/ATen/ATen.h.gch")
    ):
        if list(prebuilt.glob("*.failed")) or time.monotonic() - started > HEADER_WAIT_S:
            sys.exit(f"the precompiled ATen/ATen.h was not made (in {prebuilt}): the benchmark cannot go on")
        time.sleep(1)
    made_in = time.monotonic() - started
    edits: dict[str, list[tuple[float, float]]] = {way: [] for way in specs}
    for r in range(1, args.rounds + 1):
        for way, spec in specs.items():
            edits[way].append(edit(spec, r))
    report("| build | " + " | ".join(WAYS) + " | ratio |")
    report("| --- | --- | --- | --- |")

    def row(name: str, a: float, b: float) -> None:
        report(f"| {name} | {a:.1f} | {b:.1f} | {a / b:.2f} |")

    row("first build, `ops` stage", first[default][1]["stages"]["ops"], first[plain][1]["stages"]["ops"])
    row("first build, whole", first[default][0], first[plain][0])
    row("first edit, `ops` stage (the default starts making the header)", first_edit[default][0], first_edit[plain][0])
    row("first edit, whole build", first_edit[default][1], first_edit[plain][1])
    for k, name in enumerate(("`ops` stage", "whole build")):
        row(
            f"op body edited, {name} (median of {args.rounds})",
            statistics.median(s[k] for s in edits[default]),
            statistics.median(s[k] for s in edits[plain]),
        )
    report(
        f"\nThe header was made {made_in:.0f} s after the default's first edit ended (the other's first edit ran meanwhile).\n"
    )
    report(f"rounds: {edits}")
    report.save(REPO / "benchmarks" / "results" / "custom_op_edit.md")


if __name__ == "__main__":
    main()
