"""Compile stage: `meson setup` (once) and ninja over the generated project.

Meson is configured exactly as meson-python configures it, so the wheel step reuses this build
directory and finds nothing left to compile.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .errors import BuildError
from .files import write_if_changed
from .toolchain import Toolchain

NINJA_STATUS = "[shimgen %f/%t] "
_STATUS = re.compile(r"^\[shimgen (\d+)/(\d+)\] (.*)$")


@dataclass
class CompileResult:
    units_done: int = 0
    units_total: int = 0
    unit_seconds: dict[str, float] = field(default_factory=dict)


def meson_setup_args(source: Path, build: Path) -> list[str]:
    """The arguments meson-python passes to `meson setup` (mesonpy.Project._configure)."""
    native = build / "meson-python-native-file.ini"
    return [str(source), str(build), "-Dbuildtype=release", "-Db_ndebug=if-release", "-Db_vscrt=md", f"--native-file={native}"]


def compile_project(source: Path, build: Path, tc: Toolchain, launcher: str | None, progress: Callable[[str], None]) -> CompileResult:
    build.mkdir(parents=True, exist_ok=True)
    # Same content as meson-python writes, so its reconfigure changes nothing.
    write_if_changed(build / "meson-python-native-file.ini", f"\n[binaries]\npython = '{sys.executable}'\n")
    if not (build / "meson-private" / "coredata.dat").is_file():
        result = subprocess.run([tc.meson, "setup", *meson_setup_args(source, build)], env=tc.env(launcher), capture_output=True, text=True)
        if result.returncode != 0:
            raise BuildError("meson setup failed:\n" + _tail(result.stdout + result.stderr, 25))
    return _ninja(build, tc, progress)


def _ninja(build: Path, tc: Toolchain, progress: Callable[[str], None]) -> CompileResult:
    env = {**tc.env(), "NINJA_STATUS": NINJA_STATUS}
    started = time.time()
    proc = subprocess.Popen([tc.ninja, "-C", str(build)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    result = CompileResult()
    output: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        output.append(line)
        match = _STATUS.match(line.rstrip("\n"))
        if match:
            result.units_done, result.units_total = int(match[1]), int(match[2])
            progress(f"compile {match[1]} of {match[2]}: {_unit_name(match[3])}")
    if proc.wait() != 0:
        raise BuildError(_first_error("".join(output), build))
    result.unit_seconds = _unit_seconds(build, started)
    return result


def _unit_seconds(build: Path, since: float) -> dict[str, float]:
    """Seconds per output that this run rebuilt: .ninja_log's last entry for each output whose
    file is newer than the run's start (ninja may rewrite the log, so offsets cannot be trusted)."""
    log = build / ".ninja_log"
    if not log.is_file():
        return {}
    entries: dict[str, float] = {}
    for line in log.read_text().splitlines():
        parts = line.split("\t")
        if len(parts) >= 4 and parts[0].isdigit() and parts[1].isdigit():
            entries[parts[3]] = (int(parts[1]) - int(parts[0])) / 1000
    seconds = {}
    for output, duration in entries.items():
        path = build / output
        if path.is_file() and path.stat().st_mtime >= since:
            seconds[_unit_name(output)] = duration
    return seconds


def _unit_name(description: str) -> str:
    # "Compiling C++ object _forward.cpython-311-x86_64-linux-gnu.so.p/src_forward_wrapper.cpp.o"
    words = description.split()
    return words[-1].split("/")[-1].removesuffix(".o") if words else description


def _first_error(log: str, build: Path) -> str:
    lines = [line for line in log.splitlines() if not _STATUS.match(line)]
    failed = next((i for i, line in enumerate(lines) if line.startswith("FAILED:")), None)
    unit = ""
    if failed is not None:
        sources = re.findall(r"(\S+\.(?:cpp|cc|cxx|c))\b", " ".join(lines[failed : failed + 2]))
        unit = sources[-1] if sources else lines[failed][len("FAILED:") :].strip()
    first = next((i for i, line in enumerate(lines) if re.search(r"\berror\b", line) and not line.startswith("FAILED:")), None)
    if first is None:
        return "compile failed:\n" + _tail(log, 25)
    where = os.path.relpath((build / unit).resolve()) if unit else "a translation unit"
    return f"compile failed in {where}:\n" + "\n".join(lines[first : first + 6])


def _tail(text: str, n: int) -> str:
    return "\n".join(text.strip().splitlines()[-n:])
