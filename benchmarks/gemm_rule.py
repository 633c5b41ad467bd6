"""Where timing GEMM candidates pays: the measurement behind kernel_choice.untimed_kernel's rows.

    python benchmarks/gemm_rule.py [--device cuda] [--out benchmarks/results]

Builds one project of Linear + ReLU graphs, rows (M) by K x N of common layers (MiniLM's and BERT-base's, ResNet's
classifier, a 1B LLM's MLP on the CPU; large square ones on the GPU), with `max_autotune = true` (every GEMM's
candidates timed: the rule off) and reads each selection's timings from the build summary: Inductor's template (C++ on
the CPU, one thread, as shimgen times it; Triton on the GPU) against the library kernel (oneDNN; cuBLAS through ATen).
Then the same project with the default flags, timed: the build time the rule saves, and which GEMMs it left untimed.
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from pathlib import Path

from common import REPO, Report, shimgen_build

ROWS = {"cpu": (1, 2, 4, 8, 16, 64), "cuda": (1, 8, 64, 512, 4096)}
SHAPES = {"cpu": ((384, 384), (512, 1000), (768, 3072), (2048, 8192)), "cuda": ((512, 1000), (768, 3072), (4096, 4096))}
MODEL = """
from torch import nn


def linear(k: int, n: int) -> nn.Module:
    return nn.Sequential(nn.Linear(k, n), nn.ReLU())
"""


def spec_text(flags: str, device: str) -> str:
    graphs = [
        f'[[graph]]\nname = "m{m}_k{k}_n{n}"\nentry = "gemm_model:linear"\nkwargs = {{ k = {k}, n = {n} }}\n'
        f'inputs = [{{ name = "x", shape = [{m}, {k}], dtype = "float32" }}]\n'
        for k, n in SHAPES[device]
        for m in ROWS[device]
    ]
    target = 'device = "cpu"\nisa = "native"'
    if device != "cpu":
        import torch

        major, minor = torch.cuda.get_device_capability()
        target = f'device = "{device}"\narchs = ["sm_{major}{minor}"]'

    return (
        '[project]\nname = "gemm_rule"\nversion = "0.1.0"\n\n'
        + "\n".join(graphs)
        + f"\n[[target]]\n{target}\n\n[flags]\n{flags}\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=sorted(ROWS))
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    args = parser.parse_args()
    device = args.device
    import torch

    report = Report()
    report(
        f"# gemm_rule.py, {time.strftime('%Y-%m-%d %H:%M')}, {platform.machine()}, {os.cpu_count()} cores, "
        f"torch {torch.__version__}"
    )
    with tempfile.TemporaryDirectory(prefix="shimgen-gemm-rule-") as tmp:
        root = Path(tmp)
        (root / "gemm_model.py").write_text(MODEL)
        env = {
            **os.environ,
            "TORCHINDUCTOR_CACHE_DIR": str(root / "inductor"),
            "TRITON_CACHE_DIR": str(root / "triton"),
            "SHIMGEN_SERVER": "off",
        }
        spec = root / "timed.toml"
        spec.write_text(spec_text("max_autotune = true", device))
        timed_wall, timed = shimgen_build(spec, root / "timed", env, "--retune", "--no-verify")
        spec = root / "ruled.toml"
        spec.write_text(spec_text("", device))
        ruled_wall, ruled = shimgen_build(spec, root / "ruled", env, "--retune", "--no-verify")
    template_kind = "C++ GEMM template" if device == "cpu" else "best Triton template"
    report(f"\n| rows (M) | K x N | {template_kind} us | library us | template / library | the rule gives |")
    report("| --- | --- | --- | --- | --- | --- |")
    from shimgen.inductor import kernel_choice

    for k, n in SHAPES[device]:
        for m in ROWS[device]:
            choices = timed["kernel_choices"].get(f"m{m}_k{k}_n{n}_{device}", [])
            if not choices:
                report(f"| {m} | {k} x {n} | - | - | - | (no selection: {timed['kernel_choices'].keys()}) |")
                continue
            us = choices[0]["us"]
            template = min(v for name, v in us.items() if "template" in name)  # `us` has one per kind
            library = min(v for name, v in us.items() if "template" not in name)
            rule = kernel_choice.untimed_kernel(m, device != "cpu")
            rule = f"{rule}, untimed" if rule else "timed"
            report(f"| {m} | {k} x {n} | {template:g} | {library:g} | {template / library:.2f} | {rule} |")
    untimed = sum(len(v) for v in ruled.get("untimed_gemms", {}).values())
    report(
        f"\nbuild of the {len(ROWS[device]) * len(SHAPES[device])} graphs, candidates timed (--retune): every GEMM "
        f"{timed_wall:.1f}s (codegen {timed['stages']['codegen']:.1f}s), by the rule ({untimed} untimed) "
        f"{ruled_wall:.1f}s (codegen {ruled['stages']['codegen']:.1f}s)"
    )
    report.save(args.out / ("gemm_rule.md" if device == "cpu" else f"gemm_rule_{device}.md"))


if __name__ == "__main__":
    main()
