"""The one layer that runs Meson and ninja, for generated projects, the toolchain probe and the per-user prebuilt
library alike, and reads what Meson says it built and installs.

Every build directory is configured exactly as meson-python configures one (same arguments, same native file), so
that `pip wheel` of a generated project reuses it and finds nothing left to compile. Every failure reads the same
way: the step, the failing translation unit and the compiler's first error; the whole log stays on disk under the
build directory.

Every step runs with SOURCE_DATE_EPOCH set (the user's, else a constant), so that no date of the build reaches its
outputs: the compiler's __DATE__ and __TIME__.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shimgen.build.process import Completed, run
from shimgen.errors import BuildError, UserError
from shimgen.files import write_if_changed
from shimgen.results import CompileResult
from shimgen.toolchain import Toolchain

NATIVE_FILE = "meson-python-native-file.ini"
NINJA_STATUS = "[shimgen %f/%t] "
_STATUS = re.compile(r"^\[shimgen (\d+)/(\d+)\] (.*)$")
ZIP_EPOCH = 315532800  # 1980-01-01 00:00 UTC, the earliest time a zip member can hold


class BuildFailure(BuildError):
    """A Meson, ninja or meson-python run that failed; `completed` holds the whole run."""

    def __init__(self, what: str, step: str, completed: Completed, detail: str, unit: str = "") -> None:
        self.step = step
        self.completed = completed
        self.detail = detail
        self.unit = unit
        log = f"\n(full log: {completed.log})" if completed.log else ""
        super().__init__(f"{what}: {step} failed{f' in {unit}' if unit else ''}:\n{detail}{log}")


def setup_args(source: Path, build: Path) -> list[str]:
    """The arguments meson-python passes to `meson setup` (mesonpy.Project._configure)."""
    return [
        str(source),
        str(build),
        "-Dbuildtype=release",
        "-Db_ndebug=if-release",
        "-Db_vscrt=md",
        f"--native-file={build / NATIVE_FILE}",
    ]


def build(
    source: Path,
    build_dir: Path,
    tc: Toolchain,
    what: str,
    launcher: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> CompileResult:
    """Configure `build_dir` for `source` once, then bring it up to date with ninja."""
    build_dir.mkdir(parents=True, exist_ok=True)
    # The content meson-python writes, so its reconfigure at the wheel step changes nothing.
    write_if_changed(build_dir / NATIVE_FILE, f"\n[binaries]\npython = '{tc.python}'\n")
    if not (build_dir / "meson-private" / "coredata.dat").is_file():
        setup = run(
            [tc.meson, "setup", *setup_args(source, build_dir)], env=_env(tc, launcher), log=_log(build_dir, "setup")
        )
        if not setup.ok:
            raise BuildFailure(what, "meson setup", setup, setup.tail(25))
    return _ninja(build_dir, tc, what, progress or (lambda message: None), launcher)


def _ninja(
    build_dir: Path, tc: Toolchain, what: str, progress: Callable[[str], None], launcher: str | None
) -> CompileResult:
    started = time.time()
    done = total = 0

    def on_line(line: str) -> None:
        nonlocal done, total
        match = _STATUS.match(line)
        if match:
            done, total = int(match[1]), int(match[2])
            progress(f"compile {done} of {total}: {unit_name(match[3])}")

    ninja = run(
        [tc.ninja, "-C", str(build_dir)],
        env={**_env(tc, launcher), "NINJA_STATUS": NINJA_STATUS},
        log=_log(build_dir, "compile"),
        on_line=on_line,
    )
    if not ninja.ok:
        unit, detail = first_error(ninja.output, build_dir)
        raise BuildFailure(what, "compile", ninja, detail, unit)
    return CompileResult(
        key="",
        extensions=built_files(build_dir),
        units_done=done,
        units_total=total,
        unit_seconds=_unit_seconds(build_dir, started),
    )


def install_plan(build_dir: Path) -> dict[str, dict[str, dict[str, Any]]]:
    """Meson's install plan for `build_dir`: {category: {file: {"destination": "{py_platlib}/...", "tag": ...}}}."""
    return json.loads((build_dir / "meson-info" / "intro-install_plan.json").read_text())


def install_tagged(build_dir: Path, tag: str, destdir: Path, tc: Toolchain) -> Path:
    """`meson install` of what `build_dir` built with install tag `tag`, into `destdir`; returns where the prefix's
    contents landed there."""
    installed = run(
        [
            tc.meson,
            "install",
            "-C",
            str(build_dir),
            "--no-rebuild",
            "--tags",
            tag,
            "--destdir",
            str(destdir),
            "--quiet",
        ],
        env=_env(tc),
        log=_log(build_dir, f"install-{tag}"),
    )
    if not installed.ok:
        raise BuildFailure(f"the {tag} package", "meson install", installed, installed.tail(20))
    options = json.loads((build_dir / "meson-info" / "intro-buildoptions.json").read_text())
    prefix = next(o["value"] for o in options if o["name"] == "prefix")
    return destdir / Path(prefix).relative_to("/")


def source_date_epoch() -> int:
    """$SOURCE_DATE_EPOCH (reproducible-builds.org) when set, else the earliest time a zip can hold: never the clock."""
    value = os.environ.get("SOURCE_DATE_EPOCH", "").strip()
    if not value:
        return ZIP_EPOCH
    if not value.isdigit():
        raise UserError(
            f"SOURCE_DATE_EPOCH={value!r} is not a number of seconds since 1970-01-01 UTC; "
            "set it to one (`git log -1 --format=%ct`, say) or unset it"
        )
    return int(value)


def _env(tc: Toolchain, launcher: str | None = None) -> dict[str, str]:
    return {**tc.env(launcher), "SOURCE_DATE_EPOCH": str(source_date_epoch())}


def built_files(build_dir: Path) -> tuple[Path, ...]:
    """What Meson builds for installation in `build_dir`, from its own install plan."""
    plan = build_dir / "meson-info" / "intro-installed.json"
    if not plan.is_file():
        return ()
    return tuple(sorted(Path(p) for p in json.loads(plan.read_text()) if (build_dir in Path(p).parents)))


def target_file(build_dir: Path, target: str) -> Path:
    """The file Meson built for `target` in `build_dir`, from its own target list."""
    targets = json.loads((build_dir / "meson-info" / "intro-targets.json").read_text())
    return Path(next(t["filename"][0] for t in targets if t["name"] == target))


def _log(build_dir: Path, step: str) -> Path:
    return build_dir / "meson-logs" / f"shimgen-{step}.log"


def _unit_seconds(build_dir: Path, since: float) -> dict[str, float]:
    """Seconds per output that this run rebuilt: .ninja_log's last entry for each output whose
    file is newer than the run's start (ninja may rewrite the log, so offsets cannot be trusted)."""
    log = build_dir / ".ninja_log"
    if not log.is_file():
        return {}
    entries: dict[str, float] = {}
    for line in log.read_text().splitlines():
        parts = line.split("\t")
        if len(parts) >= 4 and parts[0].isdigit() and parts[1].isdigit():
            entries[parts[3]] = (int(parts[1]) - int(parts[0])) / 1000
    seconds = {}
    for output, duration in entries.items():
        path = build_dir / output
        if path.is_file() and path.stat().st_mtime >= since:
            seconds[unit_name(output)] = duration
    return seconds


def unit_name(description: str) -> str:
    """'Compiling C++ object _forward.cpython-311-x86_64-linux-gnu.so.p/src_forward_wrapper.cpp.o' -> 'src_forward_wrapper.cpp'."""
    words = description.split()
    return words[-1].split("/")[-1].removesuffix(".o") if words else description


def error_message(detail: str) -> str:
    """The compiler's first error message in `detail` (first_error's), without the file and line it names."""
    first = next((line for line in detail.splitlines() if "error" in line), detail.strip().split("\n")[0])
    return first.split("error: ", 1)[-1].strip()[:300]


def first_error(log: str, build_dir: Path) -> tuple[str, str]:
    """(the failing translation unit or "", the compiler's first error) in a ninja log; its tail when no error is found."""
    lines = [line for line in log.splitlines() if not _STATUS.match(line)]
    failed = next((i for i, line in enumerate(lines) if line.startswith("FAILED:")), None)
    unit = ""
    if failed is not None:
        target = lines[failed][len("FAILED:") :].strip()
        sources = re.findall(r"(\S+\.(?:cpp|cc|cxx|c))\b", " ".join(lines[failed : failed + 2]))
        # A link names its library, not the last of its objects' sources.
        unit = sources[-1] if sources and target.endswith(".o") else target
    first = next(
        (
            i
            for i, line in enumerate(lines)
            if re.search(r"\berror\b|undefined reference|multiple definition", line) and not line.startswith("FAILED:")
        ),
        None,
    )
    where = os.path.relpath((build_dir / unit).resolve()) if unit else ""
    if first is None:
        return where, "\n".join(log.strip().splitlines()[-25:])
    end = next((i for i in range(first + 1, min(first + 6, len(lines))) if lines[i].startswith("FAILED:")), first + 6)
    return where, "\n".join(lines[first:end])
