"""Prebuilt stage: what every project with the same toolchain and flags shares, built once with
Meson into the per-user cache: the precompiled headers (Meson's PCH support) and the AOTInductor
runtime interface, whose source Inductor emits identically for every graph of a target; and, beside them, shimgen's
runtime library for the target's device (runtime_lib.py). The kernels' precompiled header is an entry of its own,
keyed by kernel_opt and not by the wrapper's flags: the wrapper's pieces (about three quarters of the compiling) are not made again for a
project that differs only in kernel_opt. Custom ops' sources that are being edited get a precompiled header of the torch
header each includes first (`ops_headers`), used by GCC without being named in the sources."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

from shimgen.build.meson import build
from shimgen.build.process import start_python
from shimgen.errors import BuildError
from shimgen.files import LockHeld, shimgen_fingerprint
from shimgen.inductor import codegen
from shimgen.project import render
from shimgen.results import Prebuilt, Unit, kernel_compile_args, target_compile_args, wrapper_compile_args
from shimgen.spec import Flags, Target
from shimgen.toolchain import Toolchain, entries, probe, runtime_lib
from shimgen.toolchain.warmup import NICENESS


def ensure(
    tc: Toolchain,
    target: Target,
    units: list[Unit],
    flags: Flags,
    held: ExitStack,
    waiting: Callable[[LockHeld], None] | None = None,
    launcher: str | None = None,
) -> Prebuilt:
    """The prebuilt pieces for `target`, whose `units` share one runtime interface, held (kept in the per-user cache)
    until `held` closes. They compile behind the compiler cache `launcher`, as projects do: ccache keeps precompiled
    headers too, and an entry made again (for a new shimgen, in another per-user cache) compiles the same sources."""
    interface = codegen.shared_interface(
        {name: code.interface.read_text() for u in units for name, code in u.generated}
    ).encode()
    compile_args = target_compile_args(units)
    key, kernel_key = entry_keys(tc.key, target.device, compile_args, flags, interface)
    runtime = runtime_lib.ensure(tc, target.device, held, waiting, launcher)  # shared by every flag set
    root = entries.location("prebuilt", key)

    def make(staging: Path) -> None:
        render.render_prebuilt(tc, target.device, wrapper_compile_args(compile_args), flags, interface, staging / "src")
        build(staging / "src", staging / "build", tc, "the shared runtime interface and precompiled headers", launcher)

    with ThreadPoolExecutor(1) as pool:  # the kernels' header compiles beside the rest, as in one ninja run
        kernel_pch = (
            pool.submit(
                _kernel_pch, tc, compile_args, flags, kernel_key, held.enter_context(ExitStack()), waiting, launcher
            )
            if flags.pch
            else None
        )
        entries.ensure(root, make, held, waiting)
    built = root / "build"
    return Prebuilt(
        key=key,
        interface_lib=built / "libaoti_interface.a",
        wrapper_pch=_pch(built, "wrapper") if flags.pch else None,
        kernel_pch=kernel_pch.result() if kernel_pch else None,
        runtime_pch=_pch(built, "runtime") if flags.pch else None,
        runtime_libs=tuple(runtime.link_order),
        extern_ops_lib=runtime.extern_ops,
    )


def entry_keys(tc_key: str, device: str, compile_args: list[str], flags: Flags, interface: bytes) -> tuple[str, str]:
    """The keys of the wrapper's pieces and of the kernels' precompiled header: each holds what its files depend on."""

    def common(args: list[str]) -> bytes:
        return json.dumps([tc_key, device, args, flags.pch, shimgen_fingerprint()]).encode()

    wrapper = hashlib.sha256(
        common(wrapper_compile_args(compile_args)) + json.dumps(["wrapper", flags.wrapper_opt]).encode() + interface
    )
    kernel = hashlib.sha256(
        common(kernel_compile_args(compile_args)) + json.dumps(["kernel", flags.kernel_opt]).encode()
    )
    return wrapper.hexdigest()[:16], kernel.hexdigest()[:16]


def _kernel_pch(
    tc: Toolchain,
    compile_args: list[str],
    flags: Flags,
    key: str,
    held: ExitStack,
    waiting: Callable[[LockHeld], None] | None,
    launcher: str | None,
) -> Path:
    """The kernels' precompiled header, held until `held` closes: an entry of its own, keyed by kernel_opt and not by
    the wrapper's flags or the interface, so that projects that differ only in kernel_opt share the rest."""
    root = entries.location("prebuilt", key)

    def make(staging: Path) -> None:
        render.render_kernel_pch(tc, kernel_compile_args(compile_args), flags.kernel_opt, staging / "src")
        build(staging / "src", staging / "build", tc, "the kernels' precompiled header", launcher)

    entries.ensure(root, make, held, waiting)
    return _pch(root / "build", "kernel")


def _pch(build_dir: Path, flavor: str) -> Path:
    gch = next(build_dir.glob(f"*.p/{flavor}_pch.h.gch"), None)
    if gch is None:
        raise BuildError(
            f"precompiled header {flavor}_pch.h.gch missing under {build_dir}; remove {build_dir.parent} and rebuild"
        )
    return gch.with_suffix("")


def ops_headers(
    tc: Toolchain,
    headers: list[str],
    held: ExitStack,
    waiting: Callable[[LockHeld], None] | None = None,
    launcher: str | None = None,
    make_missing: bool = False,
) -> tuple[Path, ...]:
    """Include directories holding `<header>.gch` for those of `headers` (torch headers, such as "ATen/ATen.h")
    already precompiled with the custom ops' flags, held until `held` closes. Searched before torch's headers, GCC
    takes the precompiled one for a source that includes the header first and where the flags and macros match (an
    op's source that compiled in 13.8 s here compiles in 5.6 s), and reads the header itself otherwise.

    With `make_missing` (the ops are being edited), the missing ones are made by a process of their own at lower
    priority, which outlives the build: a header costs about 50 s to make and up to 800 MB, which pays back only over
    several compiles of the ops, so a build neither waits for it nor makes it before an edit."""
    if make_missing:
        missing = [h for h in headers if _ops_header_wanted(tc, h)]
        if missing:
            start_python("shimgen.toolchain.prebuilt:make_ops_headers", [json.dumps([missing, launcher])], NICENESS)
    made = [h for h in headers if (_ops_header_entry(tc, h) / "done").is_file()]
    return tuple(d for h in made if (d := _ensure_ops_header(tc, h, launcher, held, waiting)) is not None)


def make_ops_headers(argv: list[str]) -> int:
    """The precompiled headers `ops_headers` makes aside (argv: the JSON of the headers and the compiler cache). One
    that does not compile on its own is marked, and not tried again by this shimgen."""
    headers, launcher = json.loads(argv[0])
    tc, _ = probe.select()
    for header in headers:
        if _ensure_ops_header(tc, header, launcher, None, None) is None:
            entries.beside(_ops_header_entry(tc, header), ".failed").write_text("")
    return 0


def _ops_header_wanted(tc: Toolchain, header: str) -> bool:
    """Whether `header` is neither made, nor being made, nor known not to compile on its own."""
    root = _ops_header_entry(tc, header)
    return not ((root / "done").is_file() or entries.beside(root, ".failed").is_file() or entries.being_made(root))


def _ensure_ops_header(
    tc: Toolchain,
    header: str,
    launcher: str | None,
    held: ExitStack | None,
    waiting: Callable[[LockHeld], None] | None,
) -> Path | None:
    """The include directory of `header`'s entry, made where missing; None where the header does not compile on its
    own (the ops' compile then reports what is wrong, in the user's source)."""
    root = _ops_header_entry(tc, header)
    try:
        entries.ensure(root, _make_ops_header(tc, header, launcher), held, waiting)
    except BuildError:
        return None
    return root / "include"


def _ops_header_entry(tc: Toolchain, header: str) -> Path:
    key = hashlib.sha256(json.dumps([tc.key, "ops", header, shimgen_fingerprint()]).encode()).hexdigest()[:16]
    return entries.location("prebuilt", key)


def _make_ops_header(tc: Toolchain, header: str, launcher: str | None) -> Callable[[Path], None]:
    def make(staging: Path) -> None:
        render.render_ops_pch(tc, header, staging / "src")
        build(staging / "src", staging / "build", tc, f"the custom ops' precompiled {header}", launcher)
        gch = staging / "include" / f"{header}.gch"
        gch.parent.mkdir(parents=True)
        _pch(staging / "build", "ops").with_suffix(".h.gch").replace(gch)

    return make
