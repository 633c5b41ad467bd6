"""Correctness under change: edits to a model's source, a spec's flags and a dynamic range each show
in the rebuilt package (nothing stale); a build killed mid-compile and then rerun gives a correct
package; kernels split over several files compute bit-identical results; a compiler cache is used."""

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


def test_split_kernels_are_bit_identical(zoo_spec: Path, workdir: Path, tmp_path: Path) -> None:
    split4 = build_json(zoo_spec, workdir)
    one_file = zoo_spec.with_name("zoo_split1.toml")
    one_file.write_text(with_flags(edited(zoo_spec.read_text(), 'name = "zoo"', 'name = "zoo_split1"'), split="1"))
    split1 = build_json(one_file, workdir)

    def kernels(summary: dict[str, Any]) -> list[Path]:
        return sorted(Path(summary["package_dir"]).parent.glob("codegen/convnet_cpu/kernels_*.cpp"))

    assert len(kernels(split1)) == 1 and len(kernels(split4)) > 1
    spec = load_spec(zoo_spec)
    for graph in spec.graph:
        sizes = {name: dim.example for name, dim in graph.dims.items()}
        inputs = make_inputs(graph, sizes, seed=3)
        args = [t for i, t in zip(graph.inputs, inputs, strict=True) if not i.keyword]
        kwargs = {i.name: t for i, t in zip(graph.inputs, inputs, strict=True) if i.keyword}
        a = call_in_subprocess(split4, graph.name, tmp_path, *args, **kwargs)
        b = call_in_subprocess(split1, graph.name, tmp_path, *args, **kwargs)
        flat_a, flat_b = torch.utils._pytree.tree_leaves(a), torch.utils._pytree.tree_leaves(b)
        assert flat_a and len(flat_a) == len(flat_b), (graph.name, a, b)
        assert all(torch.equal(p, q) for p, q in zip(flat_a, flat_b, strict=True)), graph.name


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
