"""What every project with the same toolchain and flags shares, built once with Meson into the
per-user cache: the precompiled headers (Meson's PCH support) and the AOTInductor runtime
interface, whose source Inductor emits identically for every graph."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..errors import BuildError
from ..files import exclusive
from . import Toolchain, cache_dir


@dataclass
class Prebuilt:
    interface_lib: Path
    wrapper_pch: Path | None  # force-include this path; GCC uses the .gch beside it
    kernel_pch: Path | None


def ensure_prebuilt(tc: Toolchain, device: str, inductor_args: list[str], wrapper_opt: str, kernel_opt: str, pch: bool,
                    interface: bytes, waiting: Callable[[str], None] | None = None) -> Prebuilt:
    from ..render import TEMPLATES

    templates = sorted((TEMPLATES / "prebuilt").iterdir())
    key = hashlib.sha256(json.dumps([tc.key, device, inductor_args, wrapper_opt, kernel_opt, pch, [p.read_text() for p in templates]]).encode()
                         + interface).hexdigest()[:16]
    root = cache_dir().parent / "prebuilt" / key
    with exclusive(root.with_name(f"{key}.lock"), waiting):
        if not (root / "done").is_file():
            _build_prebuilt(tc, device, inductor_args, wrapper_opt, kernel_opt, pch, interface, root)
    build = root / "build"
    return Prebuilt(build / "libaoti_interface.a", _pch(build, "wrapper") if pch else None, _pch(build, "kernel") if pch else None)


def _build_prebuilt(tc: Toolchain, device: str, inductor_args: list[str], wrapper_opt: str, kernel_opt: str, pch: bool,
                    interface: bytes, root: Path) -> None:
    from ..build import meson_setup_args
    from ..render import render_prebuilt

    shutil.rmtree(root, ignore_errors=True)  # what an interrupted build left
    staging = root.with_name(root.name + ".new")
    shutil.rmtree(staging, ignore_errors=True)
    source, build = staging / "src", staging / "build"
    render_prebuilt(tc, device, inductor_args, wrapper_opt, kernel_opt, pch, interface, source)
    build.mkdir()
    (build / "meson-python-native-file.ini").write_text(f"\n[binaries]\npython = '{tc.python}'\n")
    for cmd in ([tc.meson, "setup", *meson_setup_args(source, build)], [tc.ninja, "-C", str(build)]):
        result = subprocess.run(cmd, env=tc.env(), capture_output=True, text=True)
        if result.returncode != 0:
            shutil.rmtree(staging, ignore_errors=True)
            raise BuildError("building the shared runtime interface and precompiled headers failed:\n"
                             + "\n".join((result.stdout + result.stderr).strip().splitlines()[-15:]))
    (staging / "done").write_text("")
    staging.replace(root)


def _pch(build: Path, flavor: str) -> Path:
    gch = next(build.glob(f"*{flavor}_pch*.p/{flavor}_pch.h.gch"), None)
    if gch is None:
        raise BuildError(f"precompiled header {flavor}_pch.h.gch missing under {build}; remove {build.parent} and rebuild")
    return gch.with_suffix("")
