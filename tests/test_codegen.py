"""Codegen details that CPU machines can check for CUDA builds too."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from shimgen.codegen import _private_inductor_cache


def test_private_inductor_cache_takes_aoti_output_and_is_restored(tmp_path: Path) -> None:
    """CUDA codegen relies on this: AOTInductor's per-graph output directory lands in the private cache
    (where no same-named kernel of another build can be reused), and the user's settings come back."""
    program = torch.export.export(torch.nn.Linear(8, 8).eval(), (torch.randn(2, 8),))
    before = {name: os.environ.get(name) for name in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
    with _private_inductor_cache(tmp_path):
        torch._inductor.aoti_compile_and_package(program, package_path=str(tmp_path / "m.pt2"),
                                                 inductor_configs={"aot_inductor.package_cpp_only": True})
    assert list((tmp_path / "inductor").rglob("*.wrapper.cpp"))
    assert {name: os.environ.get(name) for name in before} == before
