"""Package stage: meson-python turns the compiled build directory into a wheel; the wheel unpacked
is the importable package directory. Both are replaced atomically, and only after success.
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


def build_wheel(source: Path, build: Path, dist: Path, tc: Toolchain, launcher: str | None) -> Path:
    """meson-python, without build isolation, reusing the compile stage's build directory."""
    dist.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".shimgen-wheel-", dir=dist) as tmp:
        result = subprocess.run(
            [tc.python, "-c", _BUILD_WHEEL, tmp, str(build)], cwd=source, env=tc.env(launcher), capture_output=True, text=True
        )
        if result.returncode != 0:
            raise BuildError("meson-python could not build the wheel:\n" + "\n".join((result.stdout + result.stderr).strip().splitlines()[-20:]))
        name = result.stdout.strip().splitlines()[-1]
        wheel = dist / name
        (Path(tmp) / name).replace(wheel)
    return wheel


def unpack(wheel: Path, site: Path) -> None:
    """Replace `site` with the wheel's contents: a directory that can go on sys.path."""
    staging = site.with_name(site.name + ".new")
    shutil.rmtree(staging, ignore_errors=True)
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(staging)
    for member in staging.rglob("*.so"):
        member.chmod(0o755)
    replace_dir(staging, site)
