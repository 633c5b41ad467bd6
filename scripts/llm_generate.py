"""Greedy generation through a built LLM package (projects/llm.toml: `prefill` and `decode` over one static KV cache)
and through the eager model it was built from, token for token:

    python scripts/llm_generate.py [--spec projects/llm.toml] [--out .] [--tokens 24] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from pathlib import Path

import torch

from shimgen.spec import load_spec
from shimgen.trace.entry import load_model, project_scope


def greedy(prefill, decode, prompt: torch.Tensor, tokens: int) -> tuple[list[int], float, list[str]]:  # type: ignore[no-untyped-def]
    """The tokens, seconds per decode step, and each step's two largest logits ("0.3633 (87), 0.3633 (118)")."""
    device = prompt.device
    length = prompt.shape[1]
    rows = [prefill(prompt, cache_position=torch.arange(length, device=device))[0, -1]]
    out = [int(rows[-1].argmax())]
    start = time.perf_counter()
    for position in range(length, length + tokens - 1):
        logits = decode(
            torch.tensor([[out[-1]]], device=device), cache_position=torch.tensor([position], device=device)
        )
        rows.append(logits[0, -1])
        out.append(int(rows[-1].argmax()))
    seconds = (time.perf_counter() - start) / max(1, tokens - 1)
    return out, seconds, [_two_largest(row) for row in rows]


def _two_largest(row: torch.Tensor) -> str:
    best = row.float().topk(2)
    return ", ".join(f"{v:.4g} ({i})" for v, i in zip(best.values.tolist(), best.indices.tolist(), strict=True))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spec", type=Path, default=Path("projects/llm.toml"))
    parser.add_argument("--out", type=Path, default=Path("."), help="where `shimgen build --out` put build/")
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    spec = load_spec(args.spec)
    sys.path.insert(0, str(args.out / "build" / spec.project.name / "site"))
    package = importlib.import_module(spec.project.name)
    graph = next(g for g in spec.graph if g.name == "prefill")
    vocab = next(i for i in graph.inputs if i.name == "input_ids").high
    prompt = torch.randint(0, int(vocab or 10), (1, 8), generator=torch.Generator().manual_seed(0)).to(args.device)
    with project_scope(args.spec.parent.resolve()):
        model = load_model(graph, "graph[0]", args.spec.parent.resolve()).to(args.device)
    with torch.no_grad():
        eager, eager_step, eager_top = greedy(model, model, prompt, args.tokens)
    package.reset_state()
    compiled, compiled_step, compiled_top = greedy(package.prefill, package.decode, prompt, args.tokens)
    print(f"eager:   {eager}  ({eager_step * 1e3:.2f} ms per decode step)")
    print(f"shimgen: {compiled}  ({compiled_step * 1e3:.2f} ms per decode step)")
    if eager == compiled:
        print("tokens equal")
        return 0
    # Where the two largest logits are (nearly) tied, rounding alone can pick the other token.
    k = next(k for k, (a, b) in enumerate(zip(eager, compiled, strict=True)) if a != b)
    print(
        f"TOKENS DIFFER from token {k}: the two largest logits there, eager {eager_top[k]}; shimgen {compiled_top[k]}"
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
