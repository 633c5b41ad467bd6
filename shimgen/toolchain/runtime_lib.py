"""shimgen's runtime library (shimgen/runtime): built once per toolchain and device with Meson into the per-user cache,
beside the prebuilt pieces, and linked into every graph's extension of that device. Its key holds the toolchain, the
device and shimgen's fingerprint."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from shimgen.build.meson import build
from shimgen.files import LockHeld, shimgen_fingerprint, stage_key
from shimgen.project import render
from shimgen.toolchain import Toolchain, entries


@dataclass(frozen=True, kw_only=True)
class RuntimeLibrary:
    key: str
    core: Path  # libshimgen_core.a: the runtime over at::Tensor, no Python
    python: Path  # libshimgen_python.a: the CPython face over the core
    extern_ops: Path  # libshimgen_extern_ops.a: the proxy executor of the graphs that call ops through the dispatcher

    @property
    def link_order(self) -> list[Path]:
        """The extension's link order: the CPython face, then the core it calls."""
        return [self.python, self.core]


def key(tc: Toolchain, device: str) -> str:
    return stage_key(tc.key, device, shimgen_fingerprint())[:16]


def location(tc: Toolchain, device: str) -> Path:
    """Where the runtime library for `device` is built in the per-user cache."""
    return entries.location("runtime", key(tc, device))


def ensure(
    tc: Toolchain,
    device: str,
    held: ExitStack | None,
    waiting: Callable[[LockHeld], None] | None = None,
    launcher: str | None = None,
) -> RuntimeLibrary:
    """The runtime library for `device`, built (behind the compiler cache `launcher`) where the per-user cache lacks
    it, and held there until `held` closes (None: only made)."""

    def make(staging: Path) -> None:
        render.render_runtime(tc, device, staging / "src")
        build(staging / "src", staging / "build", tc, f"shimgen's runtime library for {device}", launcher)

    lib_key = key(tc, device)
    root = location(tc, device)
    entries.ensure(root, make, held, waiting)
    built = root / "build"
    return RuntimeLibrary(
        key=lib_key,
        core=built / "libshimgen_core.a",
        python=built / "libshimgen_python.a",
        extern_ops=built / "libshimgen_extern_ops.a",
    )
