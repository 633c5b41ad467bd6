"""The CUDA half of the toolchain: nvcc (which embeds each Triton kernel as cubins plus PTX), the
archs it can target, and whether the installed torch was built with CUDA. Found without importing
torch, like the C++ half."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from shimgen.build.process import run
from shimgen.errors import SpecError, UserError
from shimgen.spec import Target


@dataclass(frozen=True, kw_only=True)
class CudaToolchain:
    nvcc: str
    version: str  # "13.0"
    codes: tuple[str, ...]  # what `nvcc --list-gpu-code` names: sm_75, sm_80, ...

    @property
    def home(self) -> Path:
        return Path(self.nvcc).resolve().parent.parent

    @property
    def include_dirs(self) -> list[str]:
        return [str(self.home / "include")]

    @property
    def lib_dirs(self) -> list[str]:
        """Where libcuda's link stub lives: the driver itself is found at run time."""
        candidates = [
            self.home / "lib64",
            self.home / "lib64/stubs",
            self.home / "targets/x86_64-linux/lib",
            self.home / "targets/x86_64-linux/lib/stubs",
        ]
        return [str(p) for p in candidates if p.is_dir()]


def find_nvcc() -> str:
    """$NVCC, then $CUDA_HOME/bin/nvcc, then nvcc on PATH, then /usr/local/cuda/bin/nvcc."""
    if "NVCC" in os.environ:
        nvcc = os.environ["NVCC"]
        if not (shutil.which(nvcc) or (os.path.isfile(nvcc) and os.access(nvcc, os.X_OK))):
            raise UserError(f"NVCC={nvcc} is not an executable; point it at nvcc or unset it")
        return shutil.which(nvcc) or nvcc
    candidates = [os.path.join(os.environ["CUDA_HOME"], "bin", "nvcc")] if "CUDA_HOME" in os.environ else []
    candidates += [shutil.which("nvcc") or "", "/usr/local/cuda/bin/nvcc"]
    for nvcc in candidates:
        if nvcc and os.path.isfile(nvcc) and os.access(nvcc, os.X_OK):
            return nvcc
    raise UserError("a cuda target needs nvcc, and none was found: install the CUDA toolkit, or set CUDA_HOME or NVCC")


def detect_cuda() -> CudaToolchain:
    nvcc = find_nvcc()
    version_text, codes = run([nvcc, "--version"]), run([nvcc, "--list-gpu-code"])
    for failed in (r for r in (version_text, codes) if not r.ok):
        raise UserError(f"{nvcc} does not run: {failed.tail(1)}")
    version = re.search(r"release (\d+\.\d+)", version_text.output)
    return CudaToolchain(
        nvcc=nvcc, version=version.group(1) if version else "unknown", codes=tuple(codes.output.split())
    )


def torch_cuda_version() -> str:
    """The CUDA version the installed torch was built with; an error for a CPU-only torch."""
    spec = importlib.util.find_spec("torch")
    torch_dir = Path(spec.submodule_search_locations[0])  # type: ignore[union-attr, index]
    found = re.search(r"^cuda\s*(?::[^=]*)?=\s*'([\d.]+)'", (torch_dir / "version.py").read_text(), re.M)
    if not found or not (torch_dir / "lib" / "libtorch_cuda.so").is_file():
        raise UserError(
            f"the installed torch at {torch_dir} has no CUDA support; cuda targets need a CUDA build of torch"
        )
    return found.group(1)


def check_archs(cuda: CudaToolchain, target: Target, where: str) -> None:
    """Every arch of the target must be one nvcc can compile for."""
    plain = {code.rstrip("a") for code in cuda.codes}
    for k, arch in enumerate(target.archs):
        if arch.rstrip("a") not in plain:
            raise SpecError(
                "",
                f"{where}.archs[{k}]",
                f"nvcc {cuda.version} ({cuda.nvcc}) cannot target {arch}; it can target {', '.join(cuda.codes)}",
            )
