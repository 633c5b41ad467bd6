"""Codegen details that CPU machines can check for CUDA builds too."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from shimgen.inductor.codegen import _private_inductor_cache, inductor_configs
from shimgen.spec.model import Flags, Target


def test_private_inductor_cache_takes_aoti_output_and_is_restored(tmp_path: Path) -> None:
    """CUDA codegen relies on this: AOTInductor's per-graph output directory lands in the private cache
    (where no same-named kernel of another build can be reused), and the user's settings come back."""
    program = torch.export.export(torch.nn.Linear(8, 8).eval(), (torch.randn(2, 8),))
    before = {name: os.environ.get(name) for name in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
    with _private_inductor_cache(tmp_path):
        torch._inductor.aoti_compile_and_package(
            program, package_path=str(tmp_path / "m.pt2"), inductor_configs={"aot_inductor.package_cpp_only": True}
        )
    assert list((tmp_path / "inductor").rglob("*.wrapper.cpp"))
    assert {name: os.environ.get(name) for name in before} == before


def test_inductor_configs_are_real_settings_and_follow_the_flags() -> None:
    cuda = Target(device="cuda", archs=["sm_90"])
    default = inductor_configs(cuda, Flags())
    assert default["max_autotune_gemm"] and default["max_autotune_conv_backends"] == "ATEN"
    assert "max_autotune_gemm" not in inductor_configs(cuda, Flags(gemm_autotune=False))
    assert inductor_configs(Target(device="cpu", isa="native"), Flags())["max_autotune_gemm_backends"] == "CPP,ATEN"
    assert "max_autotune_gemm" not in inductor_configs(Target(device="cpu", isa="native"), Flags(gemm_autotune=False))
    for target, flags in (
        (cuda, Flags()),
        (cuda, Flags(tma=True)),
        (cuda, Flags(max_autotune=True)),
        (Target(device="cpu", isa="native"), Flags()),
    ):
        with torch._inductor.config.patch(inductor_configs(target, flags, "g++")):  # a misspelt name raises
            pass
