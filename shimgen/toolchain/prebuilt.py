"""What every project with the same toolchain and flags shares, built once with Meson into the
per-user cache: the precompiled headers (Meson's PCH support) and the AOTInductor runtime
interface, whose source Inductor emits identically for every graph."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import BuildError
from . import Toolchain, cache_dir


@dataclass
class Prebuilt:
    interface_lib: Path
    wrapper_pch: Path | None  # force-include this path; GCC uses the .gch beside it
    kernel_pch: Path | None


def ensure_prebuilt(tc: Toolchain, device: str, inductor_args: list[str], wrapper_opt: str, kernel_opt: str, pch: bool,
                    interface: bytes) -> Prebuilt:
    from ..build import meson_setup_args
    from ..render import TEMPLATES, render_prebuilt

    templates = sorted((TEMPLATES / "prebuilt").iterdir())
    key = hashlib.sha256(json.dumps([tc.key, device, inductor_args, wrapper_opt, kernel_opt, pch, [p.read_text() for p in templates]]).encode()
                         + interface).hexdigest()[:16]
    root = cache_dir().parent / "prebuilt" / key
    if not (root / "done").is_file():
        root.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f"{key}.", dir=root.parent))
        source, build = staging / "src", staging / "build"
        render_prebuilt(tc, device, inductor_args, wrapper_opt, kernel_opt, pch, interface, source)
        build.mkdir()
        (build / "meson-python-native-file.ini").write_text(f"\n[binaries]\npython = '{tc.python}'\n")
        for cmd in ([*tc.meson, "setup", *meson_setup_args(source, build)], [tc.ninja, "-C", str(build)]):
            result = subprocess.run(cmd, env=tc.env(), capture_output=True, text=True)
            if result.returncode != 0:
                shutil.rmtree(staging, ignore_errors=True)
                raise BuildError("building the shared runtime interface and precompiled headers failed:\n"
                                 + "\n".join((result.stdout + result.stderr).strip().splitlines()[-15:]))
        (staging / "done").write_text("")
        try:
            os.replace(staging, root)  # atomic; a concurrent build that got there first wins
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)
    build = root / "build"
    return Prebuilt(build / "libaoti_interface.a", _pch(build, "wrapper") if pch else None, _pch(build, "kernel") if pch else None)


def _pch(build: Path, flavor: str) -> Path:
    gch = next(build.glob(f"*{flavor}_pch*.p/{flavor}_pch.h.gch"), None)
    if gch is None:
        raise BuildError(f"precompiled header {flavor}_pch.h.gch missing under {build}; remove {build.parent} and rebuild")
    return gch.with_suffix("")
