"""Prebuilt stage: what every project with the same toolchain and flags shares, built once with
Meson into the per-user cache: the precompiled headers (Meson's PCH support) and the AOTInductor
runtime interface, whose source Inductor emits identically for every graph of a target; and, beside them, shimgen's
runtime library for the target's device (runtime_lib.py)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

from shimgen.build.meson import build
from shimgen.errors import BuildError
from shimgen.files import LockHeld, shimgen_fingerprint
from shimgen.inductor import codegen
from shimgen.project import render
from shimgen.results import Prebuilt, Unit, target_compile_args
from shimgen.spec import Flags, Target
from shimgen.toolchain import Toolchain, entries, runtime_lib


def ensure(
    tc: Toolchain,
    target: Target,
    units: list[Unit],
    flags: Flags,
    held: ExitStack,
    waiting: Callable[[LockHeld], None] | None = None,
) -> Prebuilt:
    """The prebuilt pieces for `target`, whose `units` share one runtime interface, held (kept in the per-user cache)
    until `held` closes."""
    interface = codegen.shared_interface(
        {name: code.interface.read_text() for u in units for name, code in u.generated}
    ).encode()
    compile_args = target_compile_args(units)
    key = hashlib.sha256(
        json.dumps(
            [tc.key, target.device, compile_args, flags.wrapper_opt, flags.kernel_opt, flags.pch, shimgen_fingerprint()]
        ).encode()
        + interface
    ).hexdigest()[:16]
    runtime = runtime_lib.ensure(tc, target.device, held, waiting)  # shared by every flag set
    root = entries.location("prebuilt", key)

    def make(staging: Path) -> None:
        render.render_prebuilt(tc, target.device, compile_args, flags, interface, staging / "src")
        build(staging / "src", staging / "build", tc, "the shared runtime interface and precompiled headers")

    entries.ensure(root, make, held, waiting)
    built = root / "build"
    return Prebuilt(
        key=key,
        interface_lib=built / "libaoti_interface.a",
        wrapper_pch=_pch(built, "wrapper") if flags.pch else None,
        kernel_pch=_pch(built, "kernel") if flags.pch else None,
        runtime_pch=_pch(built, "runtime") if flags.pch else None,
        runtime_libs=tuple(runtime.link_order),
    )


def _pch(build_dir: Path, flavor: str) -> Path:
    gch = next(build_dir.glob(f"*.p/{flavor}_pch.h.gch"), None)
    if gch is None:
        raise BuildError(
            f"precompiled header {flavor}_pch.h.gch missing under {build_dir}; remove {build_dir.parent} and rebuild"
        )
    return gch.with_suffix("")
