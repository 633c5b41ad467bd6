"""Precompiled headers, built once per toolchain and flag set with Meson's PCH support and kept in
the per-user cache, so that every graph of every project with the same flags reuses them."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from ..errors import BuildError
from . import Toolchain, cache_dir

FLAVORS = ("wrapper", "kernel")


def ensure_pch(tc: Toolchain, inductor_args: list[str], wrapper_opt: str, kernel_opt: str) -> dict[str, Path]:
    """Paths to force-include (`-include PATH`) per flavor; GCC finds PATH.gch beside each."""
    from ..build import meson_setup_args
    from ..render import TEMPLATES, render_pch

    sources = [(TEMPLATES / "pch" / f"{f}_pch.h").read_text() for f in FLAVORS]
    key = hashlib.sha256(json.dumps([tc.key, inductor_args, wrapper_opt, kernel_opt, sources,
                                     (TEMPLATES / "pch/meson.build.j2").read_text()]).encode()).hexdigest()[:16]
    root = cache_dir().parent / "pch" / key
    if not (root / "done").is_file():
        root.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f"{key}.", dir=root.parent))
        source, build = staging / "src", staging / "build"
        render_pch(tc, inductor_args, wrapper_opt, kernel_opt, source)
        build.mkdir()
        (build / "meson-python-native-file.ini").write_text(f"\n[binaries]\npython = '{tc.python}'\n")
        for cmd in ([*tc.meson, "setup", *meson_setup_args(source, build)], [tc.ninja, "-C", str(build)]):
            result = subprocess.run(cmd, env=tc.env(), capture_output=True, text=True)
            if result.returncode != 0:
                shutil.rmtree(staging, ignore_errors=True)
                raise BuildError("building the precompiled headers failed (set pch = false to skip them):\n"
                                 + "\n".join((result.stdout + result.stderr).strip().splitlines()[-15:]))
        (staging / "done").write_text("")
        try:
            os.replace(staging, root)  # atomic; a concurrent build that got there first wins
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)
    found = {}
    for flavor in FLAVORS:
        gch = next((root / "build").glob(f"*{flavor}_pch*.p/{flavor}_pch.h.gch"), None)
        if gch is None:
            raise BuildError(f"precompiled header {flavor}_pch.h.gch missing under {root}; remove that directory and rebuild")
        found[flavor] = gch.with_suffix("")
    return found
