"""Package stage: meson-python turns the compiled build directory into a wheel; the wheel unpacked
is the importable package directory. Both are replaced only after the unpacked package imports in
a fresh interpreter, so a build that reports success always leaves a package that imports.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path

from .errors import BuildError
from .files import replace_dir
from .toolchain import Toolchain

_BUILD_WHEEL = "import sys, mesonpy; print(mesonpy.build_wheel(sys.argv[1], {'build-dir': sys.argv[2]}))"
_IMPORT = "import sys; sys.path.insert(0, sys.argv[1]); import importlib; importlib.import_module(sys.argv[2])"


def build_and_unpack(source: Path, build: Path, dist: Path, site: Path, name: str, tc: Toolchain, launcher: str | None) -> Path:
    """The wheel in `dist` and its contents in `site` (a directory that can go on sys.path)."""
    dist.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".shimgen-wheel-", dir=dist) as tmp:
        wheel = _build_wheel(source, build, Path(tmp), tc, launcher)
        staging = site.with_name(site.name + ".new")
        _unpack(wheel, staging)
        _check_imports(staging, name, tc)
        final = dist / wheel.name
        wheel.replace(final)
        replace_dir(staging, site)
    return final


def _build_wheel(source: Path, build: Path, out: Path, tc: Toolchain, launcher: str | None) -> Path:
    """meson-python, without build isolation, reusing the compile stage's build directory."""
    result = subprocess.run([tc.python, "-c", _BUILD_WHEEL, str(out), str(build)], cwd=source, env=tc.env(launcher),
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise BuildError("meson-python could not build the wheel:\n" + "\n".join((result.stdout + result.stderr).strip().splitlines()[-20:]))
    return out / result.stdout.strip().splitlines()[-1]


def _unpack(wheel: Path, staging: Path) -> None:
    shutil.rmtree(staging, ignore_errors=True)
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(staging)
    for member in staging.rglob("*.so"):
        member.chmod(0o755)


def _check_imports(staging: Path, name: str, tc: Toolchain) -> None:
    result = subprocess.run([tc.python, "-c", _IMPORT, str(staging), name], capture_output=True, text=True)
    if result.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        crash = f" (it crashed with signal {-result.returncode})" if result.returncode < 0 else ""
        last = (result.stderr.strip().splitlines() or [""])[-1]
        raise BuildError(f"the built package '{name}' does not import{crash}; the previous package is left in place: {last}")
