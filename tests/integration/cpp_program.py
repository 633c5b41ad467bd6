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

from shimgen import toolchain

# c10::ScalarType's numbers of the dtypes these tests pass.
SCALAR_TYPES = {torch.uint8: 0, torch.int32: 3, torch.int64: 4, torch.float16: 5, torch.float32: 6, torch.float64: 7}
DTYPES = {code: dtype for dtype, code in SCALAR_TYPES.items()}


def write_tensors(path: Path, tensors: list[torch.Tensor]) -> None:
    parts = [struct.pack("<q", len(tensors))]
    for t in tensors:
        parts.append(struct.pack(f"<{2 + t.dim()}q", SCALAR_TYPES[t.dtype], t.dim(), *t.shape))
        parts.append(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    path.write_bytes(b"".join(parts))


def read_tensors(path: Path) -> list[torch.Tensor]:
    data, offset = path.read_bytes(), 8
    tensors = []
    for _ in range(struct.unpack_from("<q", data)[0]):
        code, rank = struct.unpack_from("<2q", data, offset)
        shape = struct.unpack_from(f"<{rank}q", data, offset + 16)
        offset += 16 + 8 * rank
        t = torch.empty(shape, dtype=DTYPES[code])
        nbytes = t.numel() * t.element_size()
        t.view(-1).view(torch.uint8)[:] = torch.frombuffer(bytearray(data[offset : offset + nbytes]), dtype=torch.uint8)
        offset += nbytes
        tensors.append(t)
    return tensors


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
