"""LLM decoding as users export it: transformers' static-cache recipe over a small LlamaForCausalLM, a `prefill` graph
over a prompt of any length and a `decode` graph of one token sharing the package's one KV cache. Greedy generation
through the package gives eager's tokens (scripts/llm_generate.py, what a user runs)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import FAST_FLAGS, REPO, build_json, import_package, with_flags

pytest.importorskip(
    "transformers", reason="the LLM is built from a transformers config (scripts/setup.sh installs transformers)"
)
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def built_llm(workdir: Path) -> dict[str, Any]:
    spec = workdir / "projects" / "llm.toml"
    spec.write_text(with_flags(spec.read_text(), **FAST_FLAGS))
    return build_json(spec, workdir)


def test_greedy_tokens_equal_eager(built_llm: dict[str, Any], workdir: Path) -> None:
    run = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "llm_generate.py"),
            "--spec",
            str(workdir / "projects" / "llm.toml"),
            "--out",
            str(workdir),
            "--tokens",
            "12",
        ],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0 and "tokens equal" in run.stdout, run.stdout + run.stderr


def test_cache_is_state_shared_by_both_graphs(built_llm: dict[str, Any]) -> None:
    llm = import_package(built_llm)
    llm.reset_state()
    caches = {name for name in llm.state() if "cache" in name}
    assert caches and all(not llm.state()[name].any() for name in caches)
    llm.prefill(torch.tensor([[5, 7, 9]]), cache_position=torch.arange(3))
    filled = {name: t.clone() for name, t in llm.state().items()}
    assert any(filled[name].any() for name in caches)
    llm.decode(torch.tensor([[11]]), cache_position=torch.tensor([3]))
    after = llm.state()
    key = next(name for name in caches if "key_cache" in name)
    # decode wrote position 3 and left prefill's positions 0-2 as they were: it reads and writes the same cache.
    assert torch.equal(after[key][..., :3, :], filled[key][..., :3, :]) and after[key][..., 3, :].any()
    # A one-token prompt: torch.export cannot keep seq=1 in prefill's dynamic range; it runs a variant compiled for it.
    automatic = [m for m in built_llm["models"] if m["variant"] == {"seq": 1}]
    assert automatic and "seq=1" in automatic[0]["automatic"], built_llm["models"]
    assert llm._prefill_cpu._variant_prefill(torch.tensor([[5]]), cache_position=torch.tensor([0])) == "seq=1"
