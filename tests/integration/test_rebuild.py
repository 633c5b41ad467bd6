"""Correctness under change: edits to a model's source, a spec's flags and a dynamic range each show
in the rebuilt package (nothing stale); a build killed mid-compile and then rerun gives a correct
package; kernels split over several files compute bit-identical results to one file's; a compiler cache is used."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import COMMAND, FAST_FLAGS, build_json, call_in_subprocess, edited, shimgen, with_flags

from shimgen.spec import load_spec
from shimgen.trace.entry import load_model, make_inputs

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def zoo_spec(workdir: Path) -> Path:
    return workdir / "projects" / "zoo.toml"


def eager(spec: Path, index: int, inputs: list[torch.Tensor]) -> Any:
    graph = load_spec(spec).graph[index]
    model = load_model(graph, f"graph[{index}]", spec.parent)
    with torch.no_grad():
        return model(*inputs)


def convnet_inputs(spec: Path, batch: int = 3) -> list[torch.Tensor]:
    return make_inputs(load_spec(spec).graph[0], {"batch": batch}, seed=11)


def test_model_source_edit_rebuilds_only_its_graph(zoo_spec: Path, workdir: Path, tmp_path: Path) -> None:
    base = build_json(zoo_spec, workdir)
    base_wheel = Path(base["wheel"]).read_bytes()
    (x,) = convnet_inputs(zoo_spec)
    torch.testing.assert_close(
        call_in_subprocess(base, "convnet", tmp_path, x), eager(zoo_spec, 0, [x]), rtol=1e-4, atol=1e-5
    )

    source = workdir / "projects" / "models" / "convnet.py"
    original = source.read_text()
    changed = edited(original, ".mean(dim=(2, 3))", ".amax(dim=(2, 3))")
    try:
        source.write_text(changed)
        after = build_json(zoo_spec, workdir)
        assert "trace:convnet_cpu" not in after["skipped"] and "codegen:convnet_cpu" not in after["skipped"]
        assert {"trace:heads_cpu", "codegen:heads_cpu", "trace:distance_cpu", "codegen:distance_cpu"} <= set(
            after["skipped"]
        )
        want = eager(zoo_spec, 0, [x])
        torch.testing.assert_close(call_in_subprocess(after, "convnet", tmp_path, x), want, rtol=1e-4, atol=1e-5)
    finally:
        source.write_text(original)
    restored = build_json(zoo_spec, workdir)
    # The edit undone: the code from before it, kept in the build's history, and the same wheel as before, byte for byte.
    assert "codegen:convnet_cpu (earlier build)" in restored["skipped"]
    assert Path(restored["wheel"]).read_bytes() == base_wheel
    torch.testing.assert_close(
        call_in_subprocess(restored, "convnet", tmp_path, x), eager(zoo_spec, 0, [x]), rtol=1e-4, atol=1e-5
    )


def test_flag_edits_recompile_without_retracing(zoo_spec: Path, workdir: Path, tmp_path: Path) -> None:
    build_json(zoo_spec, workdir)
    original = zoo_spec.read_text()
    graphs = ("convnet", "heads", "distance")
    (x,) = convnet_inputs(zoo_spec)
    try:
        # An opt level: the same generated sources, compiled again with the new flag.
        zoo_spec.write_text(with_flags(original, kernel_opt='"O2"'))
        after = build_json(zoo_spec, workdir)
        assert {f"{stage}:{g}_cpu" for stage in ("trace", "codegen") for g in graphs} <= set(after["skipped"])
        compile_commands = (workdir / "build" / "zoo" / "meson" / "compile_commands.json").read_text()
        assert "-O2" in compile_commands and after["compiled_units"]["done"] > 0
        torch.testing.assert_close(
            call_in_subprocess(after, "convnet", tmp_path, x), eager(zoo_spec, 0, [x]), rtol=1e-4, atol=1e-5
        )

        # A codegen flag: the saved traces are reloaded and generated again, one kernel file per graph.
        zoo_spec.write_text(with_flags(original, kernel_opt='"O2"', split="1"))
        after = build_json(zoo_spec, workdir)
        assert {f"trace:{g}_cpu" for g in graphs} <= set(after["skipped"])
        assert not {f"codegen:{g}_cpu" for g in graphs} & set(after["skipped"])
        assert len(list((workdir / "build" / "zoo" / "project" / "src" / "convnet_cpu").glob("kernels_*.cpp"))) == 1
        torch.testing.assert_close(
            call_in_subprocess(after, "convnet", tmp_path, x), eager(zoo_spec, 0, [x]), rtol=1e-4, atol=1e-5
        )
    finally:
        zoo_spec.write_text(original)


def test_dynamic_range_edit_reaches_the_package(zoo_spec: Path, workdir: Path, tmp_path: Path) -> None:
    original = zoo_spec.read_text()
    narrowed = edited(
        original,
        "dims = { batch = { min = 1, max = 32, example = 4 } }",
        "dims = { batch = { min = 1, max = 8, example = 4 } }",
    )
    assert narrowed != original
    try:
        zoo_spec.write_text(narrowed)
        after = build_json(zoo_spec, workdir)
        assert "trace:convnet_cpu" not in after["skipped"]
        (x12,) = convnet_inputs(zoo_spec, batch=12)
        assert (
            call_in_subprocess(after, "convnet", tmp_path, x12)
            == "ValueError: convnet(): input 'x' dim 0 ('batch') must be in [1, 8], got 12"
        )
        (x8,) = convnet_inputs(zoo_spec, batch=8)
        torch.testing.assert_close(
            call_in_subprocess(after, "convnet", tmp_path, x8), eager(zoo_spec, 0, [x8]), rtol=1e-4, atol=1e-5
        )
    finally:
        zoo_spec.write_text(original)
    assert "convnet" in build_json(zoo_spec, workdir)["graphs"]


# A graph of many distinct kernels (about 55 KiB of them): enough source for two kernel files by default.
CHAIN_MODEL = """
import torch
import torch.nn.functional as F

ACTIVATIONS = (F.gelu, F.silu, torch.tanh, torch.sigmoid, F.softplus, F.elu, F.mish, F.hardswish, F.selu, F.leaky_relu)


class Chain(torch.nn.Module):
    def __init__(self, width=32):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in ACTIVATIONS)

    def forward(self, x):
        for k, (layer, activation) in enumerate(zip(self.layers, ACTIVATIONS)):
            x = activation(layer(x))
            x = torch.softmax(x, dim=-1) * (k + 1) if k % 2 else F.layer_norm(x, x.shape[-1:])
        return x
"""
CHAIN_SPEC = """
[project]
name = "chain"

[[graph]]
name = "forward"
entry = "chain:Chain"
inputs = [{ name = "x", shape = ["batch", 32] }]
dims = { batch = { min = 1, max = 16, example = 5 } }
"""


def test_split_kernels_are_bit_identical(tmp_path: Path) -> None:
    (tmp_path / "chain.py").write_text(CHAIN_MODEL)
    spec = tmp_path / "chain.toml"
    spec.write_text(with_flags(CHAIN_SPEC, **FAST_FLAGS))
    split = build_json(spec, tmp_path / "out")
    one_file = tmp_path / "chain_split1.toml"
    one_file.write_text(with_flags(edited(spec.read_text(), 'name = "chain"', 'name = "chain_split1"'), split="1"))
    split1 = build_json(one_file, tmp_path / "out")

    def kernels(summary: dict[str, Any]) -> list[Path]:
        return sorted(Path(summary["package_dir"]).parent.glob("codegen/forward_cpu/kernels_*.cpp"))

    assert len(kernels(split1)) == 1 and len(kernels(split)) > 1
    x = torch.randn(5, 32)
    a = call_in_subprocess(split, "forward", tmp_path, x)
    b = call_in_subprocess(split1, "forward", tmp_path, x)
    assert torch.equal(a, b)


def test_killed_mid_compile_then_rebuilt(workdir: Path, tmp_path: Path) -> None:
    spec = workdir / "projects" / "mlp_killed.toml"
    spec.write_text(
        edited(
            with_flags((workdir / "projects" / "mlp.toml").read_text(), **FAST_FLAGS),
            'name = "mlp"',
            'name = "mlp_killed"',
        )
    )
    proc = subprocess.Popen(
        [*COMMAND, "build", str(spec), "--out", str(workdir)], stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    assert proc.stderr is not None
    for line in proc.stderr:
        if line.startswith("[compile] compile 1 of"):
            os.killpg(proc.pid, signal.SIGKILL)  # shimgen, ninja and the compilers, mid-build
            break
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the build finished before it could be killed"
    assert not list((workdir / "dist").glob("mlp_killed-*.whl"))
    summary = build_json(spec, workdir)
    x = make_inputs(load_spec(spec).graph[0], {"batch": 5}, seed=1)[0]
    torch.testing.assert_close(
        call_in_subprocess(summary, "forward", tmp_path, x), eager(spec, 0, [x]), rtol=1e-5, atol=1e-5
    )


def test_compiler_cache_is_used_when_on_path(workdir: Path, tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "ccache.log"
    (bin_dir / "ccache").write_text(f'#!/bin/sh\necho "$@" >> {log}\nexec "$@"\n')
    (bin_dir / "ccache").chmod(0o755)
    spec = workdir / "projects" / "mlp_cached.toml"
    spec.write_text(
        edited(
            with_flags((workdir / "projects" / "mlp.toml").read_text(), **FAST_FLAGS),
            'name = "mlp"',
            'name = "mlp_cached"',
        )
    )
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    result = shimgen("build", spec, "--out", workdir, "--json", env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout and '"compiler_cache": "' + str(bin_dir / "ccache") + '"' in result.stdout
    assert "model.cpp" in log.read_text()
    result = shimgen("build", spec, "--out", workdir, "--json", "--no-cache", env=env)
    assert result.returncode == 0 and '"compiler_cache": null' in result.stdout
