"""The C++ package every build makes (shimgen/package/cpp.py): found by a real CMake project (examples/cpp, built with
CMake and ninja) and by a plain compiler command through pkg-config, a program linking only lib<name>.so and libtorch
runs each graph as eager does, from several threads, and bad use is a clear exception."""

from __future__ import annotations

import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest
import torch
from cpp_program import cmake_built_program, pkg_config_program, read_tensors, run_graph, write_safetensors
from test_build import eager_and_inputs

from shimgen import toolchain

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cmake_program(built_multi: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """examples/cpp built by CMake + ninja against the multi package, calling graph heads through its own method."""
    return cmake_built_program(Path(built_multi["cpp_prefix"]), "multi", "heads", tmp_path_factory.mktemp("cmake"))


def test_package_layout(built_multi: dict[str, Any]) -> None:
    prefix = Path(built_multi["cpp_prefix"])
    for path in (
        "include/multi/multi.h",
        "lib/libmulti.so",
        "lib/multi/heads_cpu.so",
        "lib/multi/distance_cpu.so",
        "lib/cmake/multi/multiConfig.cmake",
        "lib/cmake/multi/multiConfigVersion.cmake",
        "lib/pkgconfig/multi.pc",
    ):
        assert (prefix / path).is_file(), path
    # No Python at run time: neither the library nor the graphs' libraries need libpython or torch's Python half.
    for library in [prefix / "lib/libmulti.so", *(prefix / "lib/multi").glob("*.so")]:
        needed = subprocess.run(["readelf", "-d", str(library)], capture_output=True, text=True).stdout
        assert "libpython" not in needed and "libtorch_python" not in needed, (library, needed)
    # The archive holds the same tree under one directory.
    archive = Path(built_multi["cpp_archive"])
    assert archive.name == f"multi-0.1.0-{built_multi['target']}-cpp.tar.gz" and archive.parent.name == "dist"
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
    top = archive.name.removesuffix(".tar.gz")
    assert {f"{top}/{p.relative_to(prefix).as_posix()}" for p in prefix.rglob("*")} | {top} == names


def test_cmake_program_runs_each_graph_as_eager(
    cmake_program: Path, built_multi: dict[str, Any], workdir: Path, tmp_path: Path
) -> None:
    spec = workdir / "projects" / "multi.toml"
    _, model, (x, scale) = eager_and_inputs(spec, 0, {"batch": 3})
    done = run_graph(cmake_program, "heads", [x, scale], tmp_path, "--threads", "4")
    assert done.returncode == 0, done.stderr
    with torch.no_grad():
        want = model(x, scale=scale)
    # The Python package's pytree leaves, in order: logits, then stats' two tensors.
    got = read_tensors(tmp_path / "out.bin")
    torch.testing.assert_close(got, [want["logits"], *want["stats"]], rtol=1e-4, atol=1e-5)

    _, fn, (a, b) = eager_and_inputs(spec, 1, {"n": 7, "m": 2})
    done = run_graph(cmake_program, "distance", [a, b], tmp_path)
    assert done.returncode == 0, done.stderr
    torch.testing.assert_close(read_tensors(tmp_path / "out.bin"), [fn(a, b)], rtol=1e-5, atol=1e-5)


def test_pkg_config_and_a_plain_compiler_command(built_multi: dict[str, Any], tmp_path: Path, workdir: Path) -> None:
    program = pkg_config_program(Path(built_multi["cpp_prefix"]), "multi", tmp_path / "run_graph")
    _, fn, (a, b) = eager_and_inputs(workdir / "projects" / "multi.toml", 1, {"n": 32, "m": 8})
    done = run_graph(program, "distance", [a, b], tmp_path)
    assert done.returncode == 0, done.stderr
    torch.testing.assert_close(read_tensors(tmp_path / "out.bin"), [fn(a, b)], rtol=1e-5, atol=1e-5)


def test_bad_inputs_are_invalid_argument_with_python_messages(
    cmake_program: Path, built_multi: dict[str, Any], tmp_path: Path
) -> None:
    x, scale = torch.randn(3, 32), torch.randn(32)
    cases = [
        ([x], "takes 2 inputs"),
        ([x.double(), scale], "float32"),
        ([torch.randn(3, 31), scale], "x"),
        ([torch.randn(17, 32), scale], "batch"),
    ]
    for inputs, message in cases:
        done = run_graph(cmake_program, "heads", inputs, tmp_path)
        assert done.returncode == 2, (inputs, done.stderr)
        assert done.stderr.startswith("invalid_argument: ") and message in done.stderr, done.stderr
    done = run_graph(cmake_program, "nosuch", [x, scale], tmp_path)
    assert done.returncode == 2 and "no graph 'nosuch'" in done.stderr and "heads, distance" in done.stderr, done.stderr


def test_missing_weights_and_another_torch_are_clear_errors(
    cmake_program: Path, built_multi: dict[str, Any], tmp_path: Path
) -> None:
    prefix = tmp_path / "prefix"
    shutil.copytree(built_multi["cpp_prefix"], prefix)
    (prefix / "lib" / "multi" / "heads_cpu.safetensors").unlink()
    inputs = [torch.randn(3, 32), torch.randn(32)]
    done = run_graph(cmake_program, "heads", inputs, tmp_path, "--prefix", str(prefix))
    assert done.returncode == 3 and "heads_cpu.safetensors" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and "terminate" not in done.stderr

    # A torch of another version first on the library path: the same libraries, under a torch that says 2.99.0.
    fake = tmp_path / "torch"
    (fake / "lib").mkdir(parents=True)
    for library in Path(toolchain.detect().torch_lib).iterdir():
        (fake / "lib" / library.name).symlink_to(library)
    (fake / "version.py").write_text("__version__ = '2.99.0+cpu'\n")
    done = run_graph(cmake_program, "heads", inputs, tmp_path, LD_LIBRARY_PATH=str(fake / "lib"))
    assert done.returncode == 3, done.stderr
    assert f"built for torch {toolchain.detect().torch_version}" in done.stderr and "2.99.0" in done.stderr


def test_load_weights_from_cpp_takes_weights_files_and_refuses_a_state_dict_under_freezing(
    cmake_program: Path, built_multi: dict[str, Any], workdir: Path, tmp_path: Path
) -> None:
    """multi is built with freezing (the default): its weights file loads back; a state dict is refused as in Python
    (test_weights.py loads one into an unfrozen build from C++)."""
    _, model, (x, scale) = eager_and_inputs(workdir / "projects" / "multi.toml", 0, {"batch": 2})
    built = Path(built_multi["cpp_prefix"]) / "lib" / "multi" / "heads_cpu.safetensors"
    done = run_graph(cmake_program, "heads", [x, scale], tmp_path, "--weights", str(built))
    assert done.returncode == 0, done.stderr
    with torch.no_grad():
        want = model(x, scale=scale)
    torch.testing.assert_close(
        read_tensors(tmp_path / "out.bin"), [want["logits"], *want["stats"]], rtol=1e-4, atol=1e-5
    )

    write_safetensors(tmp_path / "state.safetensors", model.state_dict())
    done = run_graph(cmake_program, "heads", [x, scale], tmp_path, "--weights", str(tmp_path / "state.safetensors"))
    assert done.returncode == 3 and "flags.freezing = true" in done.stderr, done.stderr
    (tmp_path / "bad.safetensors").write_bytes(b"not a weights file")
    done = run_graph(cmake_program, "heads", [x, scale], tmp_path, "--weights", str(tmp_path / "bad.safetensors"))
    assert done.returncode == 3 and "bad.safetensors" in done.stderr, done.stderr
