"""shimgen's runtime library (shimgen/runtime): built once per toolchain and device with Meson into the per-user cache,
beside the prebuilt pieces, and linked into every graph's extension of that device. Its key holds the toolchain, the
device and the library's own sources, so that a change elsewhere in shimgen does not rebuild it."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from shimgen.build.meson import build
from shimgen.files import exclusive
from shimgen.project import render
from shimgen.toolchain import Toolchain, cache_dir


@dataclass(frozen=True)
class RuntimeLibrary:
    key: str
    core: Path    # libshimgen_core.a: the runtime over at::Tensor, no Python
    python: Path  # libshimgen_python.a: the CPython face over the core

    @property
    def link_args_paths(self) -> list[Path]:
        """The extension's link order: the CPython face, then the core it calls."""
        return [self.python, self.core]


def key(tc: Toolchain, device: str) -> str:
    digest = hashlib.sha256(json.dumps([tc.key, device]).encode())
    for name, content in render.runtime_sources(tests=False):
        digest.update(f"{name}\0".encode() + content)
    return digest.hexdigest()[:16]


def ensure(tc: Toolchain, device: str, waiting: Callable[[str], None] | None = None) -> RuntimeLibrary:
    """The runtime library for `device`, built where the per-user cache lacks it."""
    lib_key = key(tc, device)
    root = cache_dir().parent / "runtime" / lib_key
    with exclusive(root.with_name(f"{lib_key}.lock"), waiting):
        if not (root / "done").is_file():
            shutil.rmtree(root, ignore_errors=True)  # what an interrupted build left
            staging = root.with_name(root.name + ".new")
            shutil.rmtree(staging, ignore_errors=True)
            render.render_runtime(tc, device, staging / "src")
            build(staging / "src", staging / "build", tc, f"shimgen's runtime library for {device}")
            (staging / "done").write_text("")
            staging.replace(root)
    built = root / "build"
    return RuntimeLibrary(lib_key, built / "libshimgen_core.a", built / "libshimgen_python.a")
