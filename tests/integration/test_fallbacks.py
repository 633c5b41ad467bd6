"""A graph that a build cannot use as first generated is generated again without what failed, and the lockfile keeps
that, so that later builds generate it so at once.

Vectorized C++ kernels that the compiler refuses: Inductor's vectorized codegen has had such bugs (torch 2.11 with g++
on bloom and torchvision's swin_t: results/model_sweep.md), but none that torch 2.13 shows on a small graph, so the
refusal is injected: the build runs in this process with codegen wrapped so that every kernels file holding vectorized
code ends in an #error.

oneDNN's fusions that compute otherwise: torch 2.13 does so for torchvision's RAFT (results/model_sweep.md), a build
of minutes, so the wrong result is injected: codegen with oneDNN, in this process, is wrapped to scale its weights.
The codegen without oneDNN runs in a new interpreter, unwrapped. Meson, g++, the check, the retry and the package are
real. Freezing that computes otherwise is injected the same way.

Inductor failing on a graph with its GEMM templates as candidates: torch 2.13 does so for transformers' LeViT, whose
cold codegen takes a minute, so the failure is injected: Inductor's compile raises when asked for the C++ template."""

from __future__ import annotations

import functools
import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import FAST_FLAGS, import_package, spec_of_its_own, with_flags
from test_build import eager_and_inputs

from shimgen.errors import MismatchError
from shimgen.inductor import codegen
from shimgen.pipeline import build
from shimgen.results import CodegenResult

SPEC = """
[project]
name = "scalar_heads"

[[graph]]
name = "heads"
entry = "models.mlp:Heads"
kwargs = { width = 32, classes = 10 }
inputs = [
  { name = "x", shape = ["batch", 32] },
  { name = "scale", shape = [32], keyword = true },
]
dims = { batch = { min = 1, max = 16, example = 4 } }
"""
REFUSED = "vectorized kernels refused by this test"


@pytest.fixture
def refusing_compiler(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Codegen as it is, except that vectorized kernels do not compile; the list records each codegen's
    scalar_kernels argument."""
    calls: list[str] = []

    def refuse(result: CodegenResult, kwargs: dict[str, Any]) -> None:
        calls.append(kwargs.get("scalar_kernels", ""))
        for path in result.kernels:
            if "at::vec::" in path.read_text():
                path.write_text(path.read_text() + f'\n#error "{REFUSED}"\n')

    _after_codegen(monkeypatch, refuse)
    return calls


def _after_codegen(monkeypatch: pytest.MonkeyPatch, after: Callable[[CodegenResult, dict[str, Any]], None]) -> None:
    """codegen.generate in this process followed by `after(result, its keyword arguments)`."""
    real = codegen.generate

    def generate(*args: Any, **kwargs: Any) -> CodegenResult:
        result = real(*args, **kwargs)
        after(result, kwargs)
        return result

    monkeypatch.setattr(codegen, "generate", generate)


def _locked(spec: Path, fallback: str) -> list[Any]:
    """The lockfile's `fallback` field of each unit."""
    lock = json.loads(spec.with_name(spec.name + ".lock").read_text())
    return [unit.get(fallback) for unit in lock["units"].values()]


def _equals_eager(built: Any, spec: Path) -> None:
    """The built package's heads at batch 7 as eager's."""
    package = import_package(built.summary())
    _, eager, (x, scale) = eager_and_inputs(spec, 0, {"batch": 7})
    with torch.no_grad():
        torch.testing.assert_close(package.heads(x, scale=scale), eager(x, scale=scale), rtol=1e-5, atol=1e-5)


def test_refused_vectorized_kernels_are_generated_again_scalar(
    workdir: Path, tmp_path: Path, refusing_compiler: list[str]
) -> None:
    spec = spec_of_its_own(workdir, tmp_path / "spec" / "scalar_heads.toml", with_flags(SPEC, **FAST_FLAGS))
    out = tmp_path / "out"
    built = build(spec, out)
    assert refusing_compiler == ["", f'#error "{REFUSED}"'], "one vectorized codegen, refused; then one scalar"
    assert built.scalar_kernels == {"heads_cpu": f'#error "{REFUSED}"'}
    kernels = sorted((out / "build" / "scalar_heads" / "project" / "src" / "heads_cpu").glob("kernels_*.cpp"))
    assert kernels and not any("at::vec::" in k.read_text() for k in kernels)
    assert _locked(spec, "scalar_kernels") == [f'#error "{REFUSED}"']
    _equals_eager(built, spec)

    # Up to date: nothing generated again. A fresh output directory reads the lockfile: scalar kernels at once.
    assert "codegen:heads_cpu" in build(spec, out).skipped and len(refusing_compiler) == 2
    fresh = build(spec, tmp_path / "fresh")
    assert refusing_compiler[2:] == [f'#error "{REFUSED}"'] and fresh.scalar_kernels == built.scalar_kernels


@pytest.fixture
def onednn_miscompiling(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Codegen as it is, except that a graph generated with oneDNN (in this process) computes otherwise: its weights
    file scaled. The list records each such codegen's model source."""
    models: list[str] = []

    def miscompile(result: CodegenResult, kwargs: dict[str, Any]) -> None:
        assert not kwargs.get("onednn_off"), "a codegen without oneDNN runs in a new interpreter"
        models.append(result.model.read_text())
        _scale_weights(result)

    _after_codegen(monkeypatch, miscompile)
    return models


def _scale_weights(result: CodegenResult) -> None:
    """The generated code made to compute otherwise: its weights file's values times 1.5."""
    assert result.weights_file is not None
    data = result.weights_file.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    scaled = torch.frombuffer(bytearray(data[8 + length :]), dtype=torch.float32) * 1.5
    result.weights_file.write_bytes(data[: 8 + length] + scaled.numpy().tobytes())


def test_a_graph_that_computes_otherwise_with_onednn_is_generated_again_without(
    workdir: Path, tmp_path: Path, onednn_miscompiling: list[str]
) -> None:
    spec = spec_of_its_own(workdir, tmp_path / "spec" / "onednn_heads.toml", with_flags(SPEC, **FAST_FLAGS))
    out = tmp_path / "out"
    built = build(spec, out)
    assert len(onednn_miscompiling) == 1 and "mkldnn" in onednn_miscompiling[0], "generated once with oneDNN"
    why = built.onednn_off["heads_cpu"]
    assert why.startswith(
        "with oneDNN's fusions its package computed otherwise (graph[0] (heads, cpu) at example (batch=4): output 0 "
        "differs from the traced program (max abs error"
    ), why
    model = out / "build" / "scalar_heads" / "project" / "src" / "heads_cpu" / "model.cpp"
    assert "mkldnn" not in model.read_text()
    assert _locked(spec, "onednn_off") == [why]
    _equals_eager(built, spec)

    # A fresh output directory reads the lockfile: no codegen with oneDNN.
    fresh = build(spec, tmp_path / "fresh")
    assert len(onednn_miscompiling) == 1 and fresh.onednn_off == built.onednn_off


def test_a_graph_that_computes_otherwise_with_freezing_is_generated_again_without(
    workdir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without oneDNN in the running (flags.onednn off), a frozen graph that computes otherwise (its weights file
    scaled, as in the oneDNN case) is generated again at once without freezing, in this process. Where it still
    computes otherwise without freezing, the build fails, naming what it was generated without."""
    frozen: list[bool] = []
    miscompiled_unfrozen = False
    real = codegen.generate

    def generate(*args: Any, **kwargs: Any) -> CodegenResult:
        result = real(*args, **kwargs)
        flags = args[2]
        frozen.append(flags.freezing)
        if flags.freezing or miscompiled_unfrozen:
            _scale_weights(result)
        return result

    monkeypatch.setattr(codegen, "generate", generate)
    spec = spec_of_its_own(
        workdir, tmp_path / "spec" / "frozen_heads.toml", with_flags(SPEC, **FAST_FLAGS, onednn="false")
    )
    built = build(spec, tmp_path / "out")
    assert frozen == [True, False], "generated once with freezing, then without"
    why = built.freezing_off["heads_cpu"]
    assert why.startswith(
        "with freezing its package computed otherwise (graph[0] (heads, cpu) at example (batch=4): output 0 differs "
        "from the traced program (max abs error"
    ), why
    assert _locked(spec, "freezing_off") == [why] and not built.onednn_off
    _equals_eager(built, spec)

    # A fresh output directory reads the lockfile: no codegen with freezing. Its code computing otherwise too, no
    # fallback is left.
    miscompiled_unfrozen = True
    with pytest.raises(MismatchError) as failed:
        build(spec, tmp_path / "fresh")
    assert frozen[2:] == [False]
    assert str(failed.value).startswith(
        "the built package 'scalar_heads' does not compute what its traced program does; no package is written: "
        "graph[0] (heads, cpu) at example (batch=4): output 0 differs"
    ), failed.value
    assert str(failed.value).endswith("(generated without freezing)"), failed.value


def test_a_graph_inductor_fails_on_with_gemm_templates_is_generated_again_without(
    workdir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = spec_of_its_own(
        workdir, tmp_path / "spec" / "template_heads.toml", with_flags(SPEC, kernel_opt='"O1"', gemm_autotune="true")
    )
    asked: list[dict[str, Any]] = []
    real = torch._inductor.aoti_compile_and_package

    @functools.wraps(real)  # shimgen checks its signature
    def compile_and_package(*args: Any, inductor_configs: dict[str, Any], **kwargs: Any) -> Any:
        asked.append(inductor_configs)
        if "CPP" in inductor_configs.get("max_autotune_gemm_backends", ""):
            raise AssertionError("wrong ndim (injected by this test)")
        return real(*args, inductor_configs=inductor_configs, **kwargs)

    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", compile_and_package)
    out = tmp_path / "out"
    built = build(spec, out)
    assert [c.get("max_autotune_gemm_backends") for c in asked] == ["CPP,ATEN", None], "with templates, then without"
    why = built.gemm_templates_off["heads_cpu"]
    assert (
        why
        == "Inductor failed on the graph with them as candidates (AssertionError: wrong ndim (injected by this test))"
    )
    assert _locked(spec, "gemm_templates_off") == [why]
    _equals_eager(built, spec)

    # Up to date under the key the next build computes; a fresh output directory reads the lockfile: no templates.
    assert "codegen:heads_cpu" in build(spec, out).skipped and len(asked) == 2
    fresh = build(spec, tmp_path / "fresh")
    assert [c.get("max_autotune_gemm_backends") for c in asked[2:]] == [None] and fresh.gemm_templates_off == {
        "heads_cpu": why
    }
