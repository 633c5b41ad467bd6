"""A C++ program of a shimgen package (examples/cpp/run_graph.cpp) for the tests: its tensor files, and the program
built with pkg-config and one compiler command."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
from conftest import REPO

sys.path.insert(0, str(REPO / "examples" / "cpp"))
from tensor_file import read_tensors, write_tensors  # noqa: E402, F401 (the tests take them from here)

from shimgen import toolchain


def tool(name: str) -> str:
    """A build tool of this environment: the venv's (scripts/setup.sh installs cmake, ninja) or the system's."""
    found = shutil.which(name, path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    assert found, f"{name} is not installed: scripts/setup.sh installs it"
    return found


def run_graph(program: Path, graph: str, inputs: list[torch.Tensor], tmp: Path, *args: str, **env: str) -> Any:
    write_tensors(tmp / "in.bin", inputs)
    return subprocess.run(
        [str(program), graph, str(tmp / "in.bin"), str(tmp / "out.bin"), *args],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=300,
    )


def write_safetensors(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    """A safetensors file of `tensors` (a state dict), as the safetensors package writes one."""
    names = {torch.float32: "F32", torch.int64: "I64"}
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        data = t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        header[name] = {"dtype": names[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def pkg_config_program(prefix: Path, name: str, program: Path) -> Path:
    """examples/cpp/run_graph.cpp compiled and linked by one compiler command with `pkg-config --cflags --libs`."""
    env = {**os.environ, "PKG_CONFIG_PATH": str(prefix / "lib" / "pkgconfig")}
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", name], capture_output=True, text=True, env=env)
    assert flags.returncode == 0, flags.stderr
    compiled = subprocess.run(
        f"{toolchain.detect().cxx} -O1 -DPACKAGE={name} '-DPACKAGE_HEADER=<{name}/{name}.h>' "
        f"{REPO / 'examples/cpp/run_graph.cpp'} -o {program} {flags.stdout.strip()} -pthread",
        shell=True,
        capture_output=True,
        text=True,
    )
    assert compiled.returncode == 0, compiled.stderr
    return program


def cmake_built_program(prefix: Path, name: str, method: str, build: Path) -> Path:
    """examples/cpp configured and built by CMake + ninja (find_package(<name> CONFIG REQUIRED) in `prefix`), calling
    graph `method` through its own method."""
    configure = subprocess.run(
        [
            tool("cmake"),
            "-S",
            str(REPO / "examples" / "cpp"),
            "-B",
            str(build),
            "-G",
            "Ninja",
            f"-DCMAKE_MAKE_PROGRAM={tool('ninja')}",
            "-DCMAKE_BUILD_TYPE=Release",
            f"-DPACKAGE={name}",
            f"-DGRAPH_METHOD={method}",
            f"-DCMAKE_PREFIX_PATH={prefix}",
        ],
        capture_output=True,
        text=True,
    )
    assert configure.returncode == 0, configure.stdout + configure.stderr
    compiled = subprocess.run([tool("cmake"), "--build", str(build)], capture_output=True, text=True)
    assert compiled.returncode == 0, compiled.stdout + compiled.stderr
    return build / "run_graph"
