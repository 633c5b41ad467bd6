"""Package stage: meson-python turns the compiled build directory into a wheel; the wheel unpacked
is the importable package directory. Both are replaced only after the unpacked package imports in
a fresh interpreter, so a build that reports success always leaves a package that imports.
"""

from __future__ import annotations

import shutil
import tempfile
import zipfile
from pathlib import Path

from .errors import BuildError
from .files import replace_dir
from .meson import build_wheel
from .process import run
from .results import PackageResult
from .toolchain import Toolchain

_IMPORT = "import sys; sys.path[:0] = [sys.argv[1], *sys.argv[3:]]; import importlib; importlib.import_module(sys.argv[2])"


def build_and_unpack(source: Path, build_dir: Path, dist: Path, site: Path, name: str, tc: Toolchain, launcher: str | None,
                     key: str, module_dirs: tuple[Path, ...] = ()) -> PackageResult:
    """The wheel in `dist` and its contents in `site` (a directory that can go on sys.path); `module_dirs` hold the
    Python modules the package imports besides torch (the spec's directory, for its custom ops' modules)."""
    dist.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".shimgen-wheel-", dir=dist) as tmp:
        wheel = build_wheel(source, build_dir, Path(tmp), tc, launcher)
        staging = site.with_name(site.name + ".new")
        _unpack(wheel, staging)
        _check_imports(staging, name, tc, module_dirs)
        final = dist / wheel.name
        wheel.replace(final)
        replace_dir(staging, site)
    return PackageResult(key, final, site)


def _unpack(wheel: Path, staging: Path) -> None:
    shutil.rmtree(staging, ignore_errors=True)
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(staging)
    for member in staging.rglob("*.so"):
        member.chmod(0o755)


def _check_imports(staging: Path, name: str, tc: Toolchain, module_dirs: tuple[Path, ...]) -> None:
    imported = run([tc.python, "-c", _IMPORT, str(staging), name, *map(str, module_dirs)])
    if not imported.ok:
        shutil.rmtree(staging, ignore_errors=True)
        crash = f" (it crashed with signal {imported.signal})" if imported.signal else ""
        raise BuildError(f"the built package '{name}' does not import{crash}; the previous package is left in place: {imported.tail(1)}")
