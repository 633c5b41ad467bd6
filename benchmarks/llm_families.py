"""Greedy decoding through built LLM packages of many transformers families, token for token against eager: each
family a project of its own like projects/llm.toml (`prefill` and `decode` over one static KV cache, the package's
state), its model `models.llm:causal_lm` from a small config, built with `shimgen build`, then run by
scripts/llm_generate.py.

    python benchmarks/llm_families.py [--device cpu|cuda] [--dtype float32|bfloat16] [--only NAME ...] [--tokens N]
                                      [--out FILE]

The prompt is 8 tokens, so decoding 16 passes a sliding window of 12 (the `_sw` cases). Not here: DeepSeek-V3, whose
latent attention's keys do not fit transformers' static cache (5.23: eager fails with it too). The builds use ATen's GEMMs
and -O1 kernels (what is checked is what the package computes, not how fast).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import REPO, Report

MOE = "n_routed_experts = 4, num_experts_per_tok = 2, n_group = 1, topk_group = 1, moe_intermediate_size = 32"
# name: the model's kwargs (TOML), `arch` its transformers model type
FAMILIES = {
    "qwen2": 'arch = "qwen2"',
    "qwen3": 'arch = "qwen3"',
    "mistral": 'arch = "mistral"',
    "mistral_sw": 'arch = "mistral", sliding_window = 12',
    "ministral": 'arch = "ministral"',
    "gemma": 'arch = "gemma"',
    "gemma2": 'arch = "gemma2"',
    "gemma2_sw": 'arch = "gemma2", sliding_window = 12',
    "gemma3_text": 'arch = "gemma3_text"',
    "gemma3_sw": 'arch = "gemma3_text", sliding_window = 12',
    "cohere2": 'arch = "cohere2"',
    "phi3": 'arch = "phi3", pad_token_id = 0',
    "smollm3": 'arch = "smollm3", pad_token_id = 0',
    "olmo2": 'arch = "olmo2"',
    "granite": 'arch = "granite"',
    "stablelm": 'arch = "stablelm"',
    "glm": 'arch = "glm", pad_token_id = 0',
    "glm4": 'arch = "glm4", pad_token_id = 0',
    "exaone4": 'arch = "exaone4"',
    "llama4_text": 'arch = "llama4_text"',
    "hunyuan_v1_dense": 'arch = "hunyuan_v1_dense"',
    "seed_oss": 'arch = "seed_oss"',
    "ernie4_5": 'arch = "ernie4_5"',
    "arcee": 'arch = "arcee"',
    "apertus": 'arch = "apertus"',
    "mixtral": 'arch = "mixtral"',
    "qwen2_moe": 'arch = "qwen2_moe"',
    "qwen3_moe": 'arch = "qwen3_moe"',
    "phimoe": 'arch = "phimoe"',
    "olmoe": 'arch = "olmoe"',
    "granitemoe": 'arch = "granitemoe"',
    "gpt_oss": 'arch = "gpt_oss"',
    "gpt_oss_sw": 'arch = "gpt_oss", sliding_window = 12',
    "dots1": f'arch = "dots1", first_k_dense_replace = 1, n_shared_experts = 1, {MOE}',
}


def spec(name: str, kwargs: str) -> str:
    """projects/llm.toml with this family's model."""
    text = (REPO / "projects" / "llm.toml").read_text()
    text = text.replace('name = "llm"', f'name = "lm_{name}"', 1).replace(
        'entry = "models.llm:llama"', f'entry = "models.llm:causal_lm"\nkwargs = {{ {kwargs} }}'
    )
    return text + '\n[flags]\ngemm_autotune = false\nkernel_opt = "O1"\n'


def run_one(name: str, work: Path, device: str, dtype: str, tokens: int) -> tuple[str, float, str]:
    """(outcome, seconds, detail) of building the family and decoding through it."""
    import torch

    target = f'[[target]]\ndevice = "{device}"\n'
    if device == "cuda":
        target += 'archs = ["sm_{}{}"]\n'.format(*torch.cuda.get_device_capability())
    file = work / f"{name}.toml"
    kwargs = FAMILIES[name] + (f', dtype = "{dtype}"' if dtype != "float32" else "")
    file.write_text(spec(name, kwargs).replace("[flags]", f"{target}\n[flags]"))
    out = work / name
    start = time.perf_counter()
    shimgen = [sys.executable, "-m", "shimgen"]
    built = subprocess.run([*shimgen, "build", file, "--out", out], capture_output=True, text=True, cwd=REPO)
    if built.returncode != 0:
        said = [line for line in built.stderr.splitlines() if line.startswith("shimgen:")] or [built.stderr[-400:]]
        return "build failed", time.perf_counter() - start, " ".join(said[-1].split())
    generate = [sys.executable, REPO / "scripts" / "llm_generate.py", "--spec", file, "--out", out]
    ran = subprocess.run(
        [*generate, "--tokens", str(tokens), "--device", device],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    seconds = time.perf_counter() - start
    lines = ran.stdout.strip().splitlines()
    if ran.returncode != 0 and lines and lines[-1].startswith("TOKENS DIFFER"):
        return "tokens differ", seconds, lines[-1].removeprefix("TOKENS DIFFER ")
    if ran.returncode != 0 or not lines:
        return "run failed", seconds, " ".join((ran.stdout + ran.stderr).split())[-400:]
    eager, compiled = (line.split("(")[-1].removesuffix(" per decode step)") for line in lines[:2])
    return "tokens equal", seconds, f"per decode step: eager {eager}, shimgen {compiled}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", help="the weights' and the KV cache's dtype")
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    import torch
    import transformers

    names = [n for n in FAMILIES if not args.only or n in args.only]
    work = Path(tempfile.mkdtemp(prefix="shimgen-llm-"))
    shutil.copytree(REPO / "projects" / "models", work / "models", ignore=shutil.ignore_patterns("__pycache__"))
    report = Report(args.out)
    report(
        f"### llm_families.py --device {args.device} --dtype {args.dtype}, {time.strftime('%Y-%m-%d %H:%M')}, {platform.machine()}, "
        f"{os.cpu_count()} cores, torch {torch.__version__}, transformers {transformers.__version__}, "
        f"{len(names)} families, {args.tokens} tokens\n"
    )
    report("| family | model kwargs | outcome | seconds | detail |\n| --- | --- | --- | --- | --- |")
    for name in names:
        outcome, seconds, detail = run_one(name, work, args.device, args.dtype, args.tokens)
        report(f"| {name} | `{FAMILIES[name]}` | {outcome} | {seconds:.0f} | {detail.replace('|', '/')} |")
    equal = sum("| tokens equal |" in line for line in report.lines)
    report(f"\n{equal} of {len(names)} decode the same tokens as eager")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
