"""shimgen's runtime library (shimgen/runtime) builds with warnings as errors, and its C++ unit tests pass: configured,
built and run with Meson (`meson test`) against the installed torch, with the compiler the toolchain probe proves, linked
with the runtime library as the per-user cache builds it for every project. The C++ package's tests load a stand-in for
a compiled model that the same project builds (SHIMGEN_FAKE_MODEL)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from shimgen import toolchain
from shimgen.build.meson import build
from shimgen.project import render
from shimgen.toolchain import Toolchain, probe, runtime_lib


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Toolchain, runtime_lib.RuntimeLibrary]:
    tc, _ = probe.select()
    library = runtime_lib.ensure(tc, "cpu", None, launcher=toolchain.compiler_cache())
    root = tmp_path_factory.mktemp("runtime_cpp")
    render.render_runtime(tc, "cpu", root / "src", tests_against=library.core)
    build(root / "src", root / "build", tc, "the runtime's unit tests")
    return root / "build", tc, library


def test_runtime_unit_tests_pass(built: tuple[Path, Toolchain, runtime_lib.RuntimeLibrary]) -> None:
    build_dir, tc, _ = built
    result = subprocess.run(
        [tc.meson, "test", "-C", str(build_dir), "--print-errorlogs"], capture_output=True, text=True, env=tc.env()
    )
    assert result.returncode == 0, result.stdout + result.stderr
    log = (build_dir / "meson-logs" / "testlog.txt").read_text()
    for name in (
        "checks",
        "dims_bind_across_inputs",
        "dispatch",
        "output_tree",
        "output_tree_failure",
        "cpp_face_errors",
        "json",
        "safetensors",
        "safetensors_errors",
        "weights_file",
        "weights_by_name",
        "torch_version",
        "pick_unit",
        "package_paths",
        "package",
        "package_errors",
        "external_package",
    ):
        assert f"ok {name}" in log, log


def test_runtime_library_is_built(built: tuple[Path, Toolchain, runtime_lib.RuntimeLibrary]) -> None:
    _, _, library = built
    assert library.core.is_file() and library.python.is_file()
