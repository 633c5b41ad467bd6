"""The toolchain proved: a tiny probe extension built with the same Meson setup as a real project
and imported in a fresh interpreter, so that a compiler whose output crashes when loaded (as GCC
builds against another libstdc++ do, inside AOTInductor's std::regex) is caught and the next
candidate compiler tried. Verdicts are cached per toolchain key, under a lock.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from shimgen import toolchain
from shimgen.build.meson import BuildFailure, build
from shimgen.build.process import start
from shimgen.errors import UserError
from shimgen.files import LockHeld, exclusive, shimgen_fingerprint, stage_key, write_if_changed
from shimgen.project import render
from shimgen.toolchain import Toolchain


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """What the probe found for one candidate compiler."""

    cxx: str
    identity: str
    ok: bool
    reason: str = ""
    linker: str = ""  # Toolchain.linker

    @property
    def named(self) -> str:
        """The compiler, with the linker it was told to use: 'c++ with ld.gold (c++ (Debian 12.2.0-14) 12.2.0)'."""
        return f"{self.cxx}{f' with ld.{self.linker}' if self.linker else ''} ({self.identity})"


def candidates(cxx: str) -> list[Toolchain]:
    """The toolchains to prove for compiler `cxx`, in order: with the fastest linker installed, then (where that is
    not the compiler's default) with the compiler's default."""
    tc = toolchain.detect(cxx)
    return [tc, replace(tc, linker="")] if tc.linker else [tc]


def prove_compiler(
    cxx: str, refresh: bool = False, waiting: Callable[[LockHeld], None] | None = None
) -> tuple[Toolchain, list[Verdict]]:
    """The toolchain of compiler `cxx` that the probe passes (its last verdict's), or the last one tried, and the
    verdicts of those proved."""
    verdicts = []
    for tc in candidates(cxx):
        verdicts.append(prove(tc, toolchain.cache_dir(), refresh, waiting))
        if verdicts[-1].ok:
            break
    return tc, verdicts


def select(waiting: Callable[[LockHeld], None] | None = None) -> tuple[Toolchain, list[Verdict]]:
    """The first candidate compiler whose probe builds and loads; UserError naming each failure if none."""
    verdicts = []
    for cxx in toolchain.candidate_compilers():
        tc, proved = prove_compiler(cxx, waiting=waiting)
        verdicts += proved
        if proved[-1].ok:
            return tc, verdicts
    lines = "\n".join(f"  {v.named}: {v.reason}" for v in verdicts)
    raise UserError(
        f"the toolchain probe (a torch extension built and loaded like a generated package's) failed with every C++ compiler here:\n"
        f"{lines}\nFix: install a compiler that matches this Python's libstdc++ (the system g++), or set CXX to one; "
        "`shimgen doctor --refresh` proves them again."
    )


def selected_before() -> Toolchain | None:
    """What `select` returns, known from cached verdicts alone; None where it would have to prove a compiler."""
    for cxx in toolchain.candidate_compilers():
        for tc in candidates(cxx):
            stamp = toolchain.cache_dir() / probe_key(tc) / "verdict.json"
            if not stamp.is_file():
                return None
            if Verdict(**json.loads(stamp.read_text())).ok:
                return tc
    return None


def prove(
    tc: Toolchain, cache: Path, refresh: bool = False, waiting: Callable[[LockHeld], None] | None = None
) -> Verdict:
    """Build and load the probe extension once per toolchain key. A verdict is cached only when
    it would come out the same again: never from a probe that was killed or raced another."""
    key = probe_key(tc)
    probe_dir = cache / key
    stamp = probe_dir / "verdict.json"
    with exclusive(cache / f"{key}.lock", waiting):
        if stamp.is_file() and not refresh:
            return Verdict(**json.loads(stamp.read_text()))
        shutil.rmtree(probe_dir, ignore_errors=True)
        source, build_dir = probe_dir / "src", probe_dir / "build"
        render.render_probe(tc, source)
        verdict, lasting = _build_and_load(tc, source, build_dir)
        if lasting:
            write_if_changed(stamp, json.dumps(asdict(verdict)))
    return verdict


def probe_key(tc: Toolchain) -> str:
    """The toolchain's key and shimgen's fingerprint: a new shimgen proves its toolchain again."""
    return stage_key(tc.key, shimgen_fingerprint())[:16]


def _build_and_load(tc: Toolchain, source: Path, build_dir: Path) -> tuple[Verdict, bool]:
    """The verdict, and whether it lasts (the same toolchain would get it again)."""
    # The interpreter that loads the probe imports torch while the probe compiles.
    loader = start([tc.python, str(source / "check_probe.py"), str(build_dir)], env=tc.env())
    try:
        build(source, build_dir, tc, "the toolchain probe")
    except BuildFailure as failure:
        loader.finish("")
        lasting = (
            not failure.completed.interrupted and "already using this build directory" not in failure.completed.output
        )
        return Verdict(
            cxx=tc.cxx,
            identity=tc.cxx_identity,
            linker=tc.linker,
            ok=False,
            reason=f"{failure.step} failed: {_one_line(failure.detail)}",
        ), lasting
    except BaseException:
        loader.finish("")
        raise
    loaded = loader.finish("load\n")
    if loaded.ok:
        return Verdict(
            cxx=tc.cxx,
            identity=tc.cxx_identity,
            linker=tc.linker,
            ok=True,
            reason="builds and loads the probe",
        ), True
    if loaded.signal:
        return Verdict(
            cxx=tc.cxx,
            identity=tc.cxx_identity,
            linker=tc.linker,
            ok=False,
            reason=f"extensions it builds crash when loaded (signal {loaded.signal})",
        ), not loaded.interrupted
    return Verdict(
        cxx=tc.cxx,
        identity=tc.cxx_identity,
        linker=tc.linker,
        ok=False,
        reason=f"the probe extension does not load: {loaded.tail(1)}",
    ), True


def _one_line(detail: str) -> str:
    return " | ".join(line.strip() for line in detail.strip().splitlines()[:3])
