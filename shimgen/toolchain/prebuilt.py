"""Prebuilt stage: what every project with the same toolchain and flags shares, built once with
Meson into the per-user cache: the precompiled headers (Meson's PCH support) and the AOTInductor
runtime interface, whose source Inductor emits identically for every graph of a target; and, beside them, shimgen's
runtime library for the target's device (runtime_lib.py)."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path

from shimgen.build.meson import build
from shimgen.errors import BuildError
from shimgen.files import LockHeld, exclusive, shimgen_fingerprint
from shimgen.inductor import codegen
from shimgen.project import render
from shimgen.results import Prebuilt, Unit, target_compile_args
from shimgen.spec import Flags, Target
from shimgen.toolchain import Toolchain, cache_dir, runtime_lib


def ensure(
    tc: Toolchain, target: Target, units: list[Unit], flags: Flags, waiting: Callable[[LockHeld], None] | None = None
) -> Prebuilt:
    """The prebuilt pieces for `target`, whose `units` share one runtime interface."""
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
    root = cache_dir().parent / "prebuilt" / key
    with exclusive(root.with_name(f"{key}.lock"), waiting):
        if not (root / "done").is_file():
            _build(tc, target.device, compile_args, flags, interface, root)
    built = root / "build"
    runtime = runtime_lib.ensure(tc, target.device, waiting)  # shared by every flag set
    return Prebuilt(
        key=key,
        interface_lib=built / "libaoti_interface.a",
        wrapper_pch=_pch(built, "wrapper") if flags.pch else None,
        kernel_pch=_pch(built, "kernel") if flags.pch else None,
        runtime_libs=tuple(runtime.link_order),
    )


def _build(tc: Toolchain, device: str, compile_args: list[str], flags: Flags, interface: bytes, root: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)  # what an interrupted build left
    staging = root.with_name(root.name + ".new")
    shutil.rmtree(staging, ignore_errors=True)
    source = staging / "src"
    render.render_prebuilt(tc, device, compile_args, flags, interface, source)
    build(source, staging / "build", tc, "the shared runtime interface and precompiled headers")
    (staging / "done").write_text("")
    staging.replace(root)


def _pch(build_dir: Path, flavor: str) -> Path:
    gch = next(build_dir.glob(f"*{flavor}_pch*.p/{flavor}_pch.h.gch"), None)
    if gch is None:
        raise BuildError(
            f"precompiled header {flavor}_pch.h.gch missing under {build_dir}; remove {build_dir.parent} and rebuild"
        )
    return gch.with_suffix("")
