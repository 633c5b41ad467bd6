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


def greedy(prefill, decode, prompt: torch.Tensor, tokens: int) -> tuple[list[int], float]:  # type: ignore[no-untyped-def]
    """The tokens, and seconds per decode step."""
    device = prompt.device
    length = prompt.shape[1]
    logits = prefill(prompt, cache_position=torch.arange(length, device=device))
    token = int(logits[0, -1].argmax())
    out = [token]
    start = time.perf_counter()
    for position in range(length, length + tokens - 1):
        logits = decode(torch.tensor([[token]], device=device), cache_position=torch.tensor([position], device=device))
        token = int(logits[0, -1].argmax())
        out.append(token)
    return out, (time.perf_counter() - start) / max(1, tokens - 1)


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
        eager, eager_step = greedy(model, model, prompt, args.tokens)
    package.reset_state()
    compiled, compiled_step = greedy(package.prefill, package.decode, prompt, args.tokens)
    print(f"eager:   {eager}  ({eager_step * 1e3:.2f} ms per decode step)")
    print(f"shimgen: {compiled}  ({compiled_step * 1e3:.2f} ms per decode step)")
    print("tokens equal" if eager == compiled else "TOKENS DIFFER")
    return 0 if eager == compiled else 1


if __name__ == "__main__":
    sys.exit(main())
