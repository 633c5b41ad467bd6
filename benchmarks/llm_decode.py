"""LLM decoding, batch 1: prefill latency over a prompt and greedy decode tokens per second, for a LLaMA-shaped
LlamaForCausalLM (random init) behind transformers' static-cache export recipe, side by side:

- eager: the wrapped model itself;
- torch.compile(mode="reduce-overhead") of it (CUDA graphs on a GPU);
- AOTInductor (default configs, each program compiled and loaded through its package loader) on the very programs
  shimgen traced, their caches given as one set of user-managed constants to both;
- shimgen: the package built from a spec with a `prefill` and a `decode` graph (defaults; `cuda_graphs` on a GPU).

Every contender first generates greedily from the same prompt and must give eager's tokens. Then each is timed in
turn, the rounds alternating: prefill (the prompt, from position 0) and a greedy decode of `--tokens` tokens after it,
each step feeding back the argmax (a host read per token, as generation does).

    python benchmarks/llm_decode.py --config small|smollm2 [--device cpu|cuda] [--prompt 128] [--tokens 64] [--threads
    2]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import REPO, Report, shimgen_build

# models.llm.llama's keyword arguments, and what they make.
CONFIGS = {
    "small": ({}, "projects/llm.toml's small LLaMA (hidden 64, 2 layers, vocab 128)"),
    "smollm2": (
        {"hidden": 576, "layers": 30, "heads": 9, "kv_heads": 3, "intermediate": 1536, "vocab": 49152},
        "SmolLM2-135M's shape (hidden 576, 30 layers, 9 heads, 3 KV heads, vocab 49152; 135M parameters), random init",
    ),
}
Step = Callable[[Any, Any], Any]  # (input_ids, cache_position) -> logits


def spec_text(config: dict[str, Any], vocab: int, prompt: int, max_cache: int, device: str, arch: str) -> str:
    target = (
        f'\n[[target]]\ndevice = "cuda"\narchs = ["{arch}"]\n\n[flags]\ncuda_graphs = true\n'
        if device == "cuda"
        else ""
    )
    kwargs = "kwargs = { " + ", ".join(f"{k} = {v!r}" for k, v in {**config, "max_cache": max_cache}.items()) + " }\n"
    entry = "llama"
    return (
        f'[project]\nname = "llm_bench"\n\n'
        f'[[graph]]\nname = "prefill"\nentry = "models.llm:{entry}"\n{kwargs}'
        f'inputs = [\n  {{ name = "input_ids", shape = [1, "seq"], dtype = "int64", high = {vocab} }},\n'
        f'  {{ name = "cache_position", shape = ["seq"], dtype = "int64", values = "arange", keyword = true }},\n]\n'
        f"dims = {{ seq = {{ min = 2, max = {prompt} }} }}\natol = 1e-3\nrtol = 1e-3\n\n"
        f'[[graph]]\nname = "decode"\nentry = "models.llm:{entry}"\n{kwargs}'
        f'inputs = [\n  {{ name = "input_ids", shape = [1, 1], dtype = "int64", high = {vocab} }},\n'
        f'  {{ name = "cache_position", shape = [1], dtype = "int64", high = {max_cache}, keyword = true }},\n]\n'
        f"atol = 1e-3\nrtol = 1e-3\n{target}"
    )


def generate(prefill: Step, decode: Step, prompt: Any, tokens: int) -> tuple[list[int], float, float]:
    """Greedy tokens, prefill seconds, decode seconds (the steps after prefill)."""
    import torch

    device = prompt.device
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    logits = prefill(prompt, torch.arange(prompt.shape[1], device=device))
    token = int(logits[0, -1].argmax())
    prefilled = time.perf_counter()
    out = [token]
    for position in range(prompt.shape[1], prompt.shape[1] + tokens - 1):
        logits = decode(torch.tensor([[token]], device=device), torch.tensor([position], device=device))
        token = int(logits[0, -1].argmax())
        out.append(token)
    sync()
    return out, prefilled - start, time.perf_counter() - prefilled


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", choices=sorted(CONFIGS), default="small")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2, help="CPU threads (torch.set_num_threads)")
    parser.add_argument("--dtype", default="float32", help="the weights' and the KV cache's dtype")
    parser.add_argument("--skip", nargs="*", default=[], help="contenders to leave out")
    parser.add_argument("--results", type=Path, help="markdown file to write")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    report = Report()
    config, label = CONFIGS[args.config]
    if args.dtype != "float32":
        config, label = {**config, "dtype": args.dtype}, f"{label}, in {args.dtype}"
    max_cache = args.prompt + args.tokens
    device = torch.device(args.device)
    gpu = torch.cuda.get_device_name() if device.type == "cuda" else None
    arch = "sm_{}{}".format(*torch.cuda.get_device_capability()) if gpu else ""
    report(f"# LLM decoding: {label}\n")
    report(
        f"{gpu or f'CPU, {args.threads} threads'}, torch {torch.__version__}; batch 1, prompt {args.prompt}, {args.tokens} tokens "
        f"greedy, KV cache of {max_cache}; medians of {args.rounds} rounds, contenders alternating.\n"
    )

    with tempfile.TemporaryDirectory(prefix="shimgen-llm-") as tmp:
        root = Path(tmp)
        shutil.copytree(REPO / "projects" / "models", root / "models")
        sys.path.insert(0, str(root))
        from models import llm as llm_models

        torch.manual_seed(0)  # the spec's seed: shimgen builds the model so, with the same weights
        model = llm_models.llama(**config, max_cache=max_cache)
        vocab = model.model.config.vocab_size
        spec = root / "llm_bench.toml"
        spec.write_text(spec_text(config, vocab, args.prompt, max_cache, args.device, arch))
        seconds, summary = shimgen_build(spec, root)
        report(
            f"shimgen build (cold for this spec, defaults{', cuda_graphs' if gpu else ''}): {seconds:.0f} s; "
            f"stages {', '.join(f'{k} {v:.0f}s' for k, v in summary['stages'].items() if v >= 1)}\n"
        )
        sys.path.insert(0, summary["package_dir"])
        import llm_bench

        model = model.to(device).eval()

        def reset_eager() -> None:
            for name, t in model.named_buffers():
                if "cache" in name or "cumulative_length" in name:
                    t.zero_()

        steps: dict[str, tuple[Step, Step, Callable[[], None]]] = {}
        eager_step: Step = lambda ids, pos: model(ids, cache_position=pos)  # noqa: E731
        steps["eager"] = (eager_step, eager_step, reset_eager)
        if "reduce-overhead" not in args.skip:
            compiled = torch.compile(model, mode="reduce-overhead")
            compiled_step: Step = lambda ids, pos: compiled(ids, cache_position=pos)  # noqa: E731
            steps["torch.compile reduce-overhead"] = (compiled_step, compiled_step, reset_eager)
        if "aoti" not in args.skip:
            start = time.perf_counter()
            steps["AOTInductor"] = _aoti(root, args.device, summary)
            report(f"AOTInductor compile of both programs: {time.perf_counter() - start:.0f} s\n")
        steps["shimgen"] = (
            lambda ids, pos: llm_bench.prefill(ids, cache_position=pos),
            lambda ids, pos: llm_bench.decode(ids, cache_position=pos),
            llm_bench.reset_state,
        )

        prompt = torch.randint(0, vocab, (1, args.prompt), generator=torch.Generator().manual_seed(0)).to(device)
        tokens: dict[str, list[int]] = {}
        samples: dict[str, list[tuple[float, float]]] = {name: [] for name in steps}
        with torch.no_grad():
            for name, (prefill, decode, reset) in steps.items():
                reset()
                tokens[name] = generate(prefill, decode, prompt, args.tokens)[
                    0
                ]  # also the warm-up (compiles, captures)
            for _ in range(args.rounds):
                for name, (prefill, decode, reset) in steps.items():
                    reset()
                    _, prefill_s, decode_s = generate(prefill, decode, prompt, args.tokens)
                    samples[name].append((prefill_s, decode_s))
        report(
            "| contender | greedy tokens equal eager | prefill (ms) | decode tokens/s | shimgen's decode tokens/s over it |"
        )
        report("| --- | --- | --- | --- | --- |")
        rate = {name: (args.tokens - 1) / statistics.median(d for _, d in s) for name, s in samples.items()}
        for name, s in samples.items():
            same = "yes" if tokens[name] == tokens["eager"] else f"NO: {tokens[name][:8]}..."
            report(
                f"| {name} | {same} | {statistics.median(p for p, _ in s) * 1e3:.2f} | {rate[name]:.1f} | "
                f"{rate['shimgen'] / rate[name]:.2f}x |"
            )
        report(f"\neager's tokens: {tokens['eager'][:16]}...")
        if args.results:
            report.save(args.results)
        return 0 if all(t == tokens["eager"] for t in tokens.values()) else 1


def _aoti(root: Path, device: str, summary: dict[str, Any]) -> tuple[Step, Step, Callable[[], None]]:
    """AOTInductor's packages of shimgen's traced programs (the same programs shimgen compiles), with one set of state
    tensors (the caches) given to both as user-managed constants."""
    import torch

    from shimgen.toolchain import probe

    # The compiler shimgen's probe proved: a GPU image's default g++ builds AOTInductor libraries that crash at load.
    configs = {"cpp.cxx": (None, probe.select(lambda message: None)[0].cxx)}
    runners = {}
    for graph in ("prefill", "decode"):
        program = torch.export.load(str(root / "build" / "llm_bench" / "trace" / f"{graph}_{device}.pt2"))
        path = torch._inductor.aoti_compile_and_package(
            program, package_path=str(root / f"aoti_{graph}.pt2"), inductor_configs=configs
        )
        runners[graph] = (torch._inductor.aoti_load_package(path), program)
    prefill_program = runners["prefill"][1]
    held = {**prefill_program.state_dict, **prefill_program.constants}
    state = {n: t.detach().clone().to(device) for n, t in held.items() if "cache" in n or "cumulative_length" in n}
    for runner, _ in runners.values():
        fqns = set(runner.get_constant_fqns())
        runner.load_constants({n: t for n, t in state.items() if n in fqns}, check_full_update=False, user_managed=True)

    def reset() -> None:
        for t in state.values():
            t.zero_()

    prefill_loader, decode_loader = runners["prefill"][0].loader, runners["decode"][0].loader
    return (
        lambda ids, pos: prefill_loader.run([ids, pos])[0],
        lambda ids, pos: decode_loader.run([ids, pos])[0],
        reset,
    )


if __name__ == "__main__":
    sys.exit(main())
