"""Toolchain: finds Python, torch, the C++ compilers, Meson and ninja, without importing torch (a
no-op rebuild must stay fast). Whether they work together is `shimgen.toolchain.probe`'s to prove.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import sys
import sysconfig

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib
from dataclasses import asdict, dataclass
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from shimgen.build.process import run
from shimgen.errors import UserError


@dataclass(frozen=True, kw_only=True)
class Toolchain:
    python: str
    python_version: str
    torch_version: str
    torch_includes: tuple[str, ...]
    torch_lib: str
    cxx: str
    cxx_identity: str
    linker: str  # what Meson links with (its CXX_LD: mold, lld or gold), or "" for the compiler's default
    meson: str
    ninja: str
    has_last_error: bool

    @property
    def extension_includes(self) -> tuple[str, ...]:
        """The include directories torch.utils.cpp_extension gives a C++ extension: torch's, its C++ API's (where
        torch/extension.h finds torch/all.h) and Python's."""
        return (self.torch_includes[0], f"{self.torch_includes[0]}/torch/csrc/api/include", *self.torch_includes[1:])

    @property
    def key(self) -> str:
        """Hash of everything that makes compiled output differ between toolchains."""
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]

    def env(self, launcher: str | None = None) -> dict[str, str]:
        """Environment for Meson and meson-python: the compiler (behind `launcher`, ccache or sccache),
        and the Meson and ninja this toolchain found, handed over explicitly since meson-python and
        Meson otherwise look them up on PATH, where an un-activated venv's are not."""
        cxx = f"{launcher} {self.cxx}" if launcher else self.cxx
        env = {**os.environ, "CXX": cxx, "MESON": self.meson, "NINJA": self.ninja}
        if self.linker:
            env["CXX_LD"] = self.linker
        else:
            env.pop("CXX_LD", None)
        if launcher and Path(launcher).name == "ccache":
            # Without these ccache compiles every translation unit that force-includes a precompiled header itself,
            # uncached: nearly all of a generated project's.
            sloppiness = {s for s in env.get("CCACHE_SLOPPINESS", "").split(",") if s}
            env["CCACHE_SLOPPINESS"] = ",".join(
                sorted(sloppiness | {"pch_defines", "time_macros", "include_file_mtime", "include_file_ctime"})
            )
        return env


def supported_torch() -> SpecifierSet:
    """The torch versions this shimgen supports: its `torch` extra in pyproject.toml (installed, or of the source tree)."""
    source = Path(__file__).parents[2] / "pyproject.toml"
    if source.is_file():
        requirements = tomllib.loads(source.read_text())["project"]["optional-dependencies"]["torch"]
    else:
        requirements = importlib.metadata.requires("shimgen") or []
    for requirement in map(Requirement, requirements):
        if requirement.name == "torch":
            return requirement.specifier
    raise UserError("shimgen's own metadata states no supported torch range; reinstall shimgen")


def check_torch_supported(version: str) -> None:
    supported = supported_torch()
    if version not in supported:
        raise UserError(
            f"torch {version} is installed; this shimgen supports torch{supported} (pyproject.toml): install one of those "
            "or a shimgen release for this torch"
        )


def compiler_cache() -> str | None:
    """sccache or ccache when one is on PATH."""
    return shutil.which("sccache") or shutil.which("ccache")


def detect(cxx: str | None = None, linker: str | None = None) -> Toolchain:
    """The toolchain around `cxx` (default: the first candidate compiler) and `linker` (default: `fast_linker()`),
    unproved."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise UserError("torch is not installed in this Python; install torch first (pip install torch==<version>)")
    torch_dir = Path(spec.submodule_search_locations[0])
    torch_version = importlib.metadata.version("torch").split("+")[0]
    check_torch_supported(torch_version)
    include = torch_dir / "include"
    variable_header = include / "torch/csrc/autograd/python_variable.h"
    interface_header = include / "torch/csrc/inductor/aoti_runtime/interface.h"
    if not variable_header.is_file() or not interface_header.is_file():
        raise UserError(f"torch {torch_version} at {torch_dir} ships no C++ headers; a full torch wheel is needed")
    cxx = cxx or candidate_compilers()[0]
    return Toolchain(
        python=sys.executable,
        python_version=f"{sys.version_info.major}.{sys.version_info.minor}",
        torch_version=torch_version,
        torch_includes=(str(include), sysconfig.get_paths()["include"]),
        torch_lib=str(torch_dir / "lib"),
        cxx=cxx,
        cxx_identity=_compiler_identity(cxx),
        linker=fast_linker() if linker is None else linker,
        meson=_find_meson(),
        ninja=_find_ninja(),
        has_last_error="AOTInductorGetLastError" in interface_header.read_text(),
    )


# Meson's names for the linkers a compiler can be told to use (-fuse-ld), fastest first. Linking a package's extension
# modules took 0.5-0.6 s each with the system's default ld.bfd and 0.15 s with gold (benchmarks/results/linker.md).
FAST_LINKERS = ("mold", "lld", "gold")


def fast_linker() -> str:
    """$CXX_LD where the user set it (Meson's variable), else the fastest of FAST_LINKERS installed (as ld.<name> on
    PATH), or "" for the compiler's default. The probe proves the compiler with it, and without it where that fails."""
    return os.environ.get("CXX_LD") or next((name for name in FAST_LINKERS if shutil.which(f"ld.{name}")), "")


def candidate_compilers() -> list[str]:
    """$CXX first when set, then the usual C++ compilers on PATH, each file once."""
    names = ["c++", "g++", "/usr/bin/g++", "clang++"]
    if os.environ.get("CXX"):
        if shutil.which(os.environ["CXX"]) is None:
            raise UserError(f"CXX={os.environ['CXX']} is not an executable compiler")
        names.insert(0, os.environ["CXX"])
    found: dict[str, str] = {}
    for name in names:
        path = shutil.which(name)
        if path:
            found.setdefault(os.path.realpath(path), path)
    if not found:
        raise UserError("no C++ compiler found (tried c++, g++, /usr/bin/g++, clang++); install g++ or set CXX")
    return list(found.values())


def cache_dir() -> Path:
    """Per-user cache of proved toolchains: $SHIMGEN_CACHE_DIR, else $XDG_CACHE_HOME/shimgen/toolchain."""
    if os.environ.get("SHIMGEN_CACHE_DIR"):
        return Path(os.environ["SHIMGEN_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "shimgen" / "toolchain"


def _compiler_identity(cxx: str) -> str:
    version = run([cxx, "--version"])
    if not version.ok:
        raise UserError(f"C++ compiler {cxx} does not run: {version.tail(1)}")
    return version.output.splitlines()[0].strip() if version.output.strip() else cxx


def _find_meson() -> str:
    """The meson installed with this Python (its scripts directory), else the one on PATH."""
    path = _beside_python("meson") or shutil.which("meson")
    if path is None:
        raise UserError(f"Meson is not installed for {sys.executable}: {sys.executable} -m pip install meson")
    return path


def _find_ninja() -> str:
    """The ninja installed with this Python (the ninja package), else the one on PATH."""
    path = _beside_python("ninja")
    if path is None and importlib.util.find_spec("ninja") is not None:
        import ninja

        path = str(Path(ninja.BIN_DIR) / "ninja")
    path = path or shutil.which("ninja")
    if path is None:
        raise UserError(f"ninja is not installed for {sys.executable}: {sys.executable} -m pip install ninja")
    return path


def _beside_python(name: str) -> str | None:
    path = Path(sysconfig.get_path("scripts")) / name
    return str(path) if path.is_file() and os.access(path, os.X_OK) else None
