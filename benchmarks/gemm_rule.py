"""Where timing GEMM candidates pays on a CPU: the measurement behind kernel_choice.CPU_LIBRARY_ROWS.

    python benchmarks/gemm_rule.py [--out benchmarks/results]

Builds one project of Linear + ReLU graphs, rows (M) 1 to 256 by K x N of BERT-base-like layers, with
`max_autotune = true` (every GEMM's candidates timed: the rule off) and reads each selection's timings from the build
summary: Inductor's C++ GEMM template against the library kernel (oneDNN), one thread, as shimgen times them. Then
the same project with the default flags, timed: the build time the rule saves, and which GEMMs it left untimed.
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from pathlib import Path

from common import REPO, Report, shimgen_build

ROWS = (1, 4, 16, 32, 64, 128, 256)
SHAPES = ((384, 384), (384, 1536), (768, 768))
MODEL = """
from torch import nn


def linear(k: int, n: int) -> nn.Module:
    return nn.Sequential(nn.Linear(k, n), nn.ReLU())
"""


def spec_text(flags: str) -> str:
    graphs = [
        f'[[graph]]\nname = "m{m}_k{k}_n{n}"\nentry = "gemm_model:linear"\nkwargs = {{ k = {k}, n = {n} }}\n'
        f'inputs = [{{ name = "x", shape = [{m}, {k}], dtype = "float32" }}]\n'
        for k, n in SHAPES
        for m in ROWS
    ]
    return (
        '[project]\nname = "gemm_rule"\nversion = "0.1.0"\n\n'
        + "\n".join(graphs)
        + f'\n[[target]]\ndevice = "cpu"\nisa = "native"\n\n[flags]\n{flags}\n'
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    args = parser.parse_args()
    import torch

    report = Report()
    report(
        f"# gemm_rule.py, {time.strftime('%Y-%m-%d %H:%M')}, {platform.machine()}, {os.cpu_count()} cores, "
        f"torch {torch.__version__}"
    )
    with tempfile.TemporaryDirectory(prefix="shimgen-gemm-rule-") as tmp:
        root = Path(tmp)
        (root / "gemm_model.py").write_text(MODEL)
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(root / "inductor"), "SHIMGEN_SERVER": "off"}
        spec = root / "timed.toml"
        spec.write_text(spec_text("max_autotune = true"))
        timed_wall, timed = shimgen_build(spec, root / "timed", env, "--retune", "--no-verify")
        spec = root / "ruled.toml"
        spec.write_text(spec_text(""))
        ruled_wall, ruled = shimgen_build(spec, root / "ruled", env, "--retune", "--no-verify")
    report("\n| rows (M) | K x N | C++ GEMM template us | library us | template / library | the rule gives |")
    report("| --- | --- | --- | --- | --- | --- |")
    from shimgen.inductor.kernel_choice import CPU_LIBRARY_ROWS

    for k, n in SHAPES:
        for m in ROWS:
            choices = timed["kernel_choices"].get(f"m{m}_k{k}_n{n}_cpu", [])
            if not choices:
                report(f"| {m} | {k} x {n} | - | - | - | (no selection: {timed['kernel_choices'].keys()}) |")
                continue
            us = choices[0]["us"]
            template = next(v for name, v in us.items() if "template" in name)
            library = next(v for name, v in us.items() if "template" not in name)
            rule = "library, untimed" if m >= CPU_LIBRARY_ROWS else "timed"
            report(f"| {m} | {k} x {n} | {template:g} | {library:g} | {template / library:.2f} | {rule} |")
    untimed = sum(len(v) for v in ruled.get("untimed_gemms", {}).values())
    report(
        f"\nbuild of the {len(ROWS) * len(SHAPES)} graphs, candidates timed (--retune): every GEMM "
        f"{timed_wall:.1f}s (codegen {timed['stages']['codegen']:.1f}s), by the rule ({untimed} untimed) "
        f"{ruled_wall:.1f}s (codegen {ruled['stages']['codegen']:.1f}s)"
    )
    report.save(args.out / "gemm_rule.md")


if __name__ == "__main__":
    main()
