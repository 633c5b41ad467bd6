"""Where a command's processor time goes, by kind of process: runs it (for example `bash .ci/run`) and samples /proc
every quarter second, adding each process's new user + system time to its kind. The total is the machine's busy time
over the run (/proc/stat; the build servers are detached, outside the command's tree), so what the samples missed
(processes shorter than a sample, the last quarter second of each, anything else running) shows as a row of its own.

    python benchmarks/ci_processes.py --out /tmp/ci_processes.md -- bash .ci/run
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def kind(cmdline: list[str], cwd: str, comm: str) -> str:
    """What a process is, from its command line, working directory and name."""
    text = " ".join(cmdline)
    per_user = "/.cache/shimgen/" in cwd or "/shimgen-cache" in cwd
    if comm in ("cc1plus", "cc1", "as"):
        return (
            "compiler: per-user pieces (runtime library, prebuilt headers, probe)" if per_user else "compiler: projects"
        )
    if comm in ("ld", "ld.gold", "ld.lld", "ld.mold", "collect2"):
        return "linker"
    if comm in ("ccache", "c++", "g++", "gcc"):
        return "compiler drivers and ccache"
    if "shimgen.commands.server" in text:
        return "build servers (trace, codegen, packaging)"
    if "xdist" in text or "pytest" in text or "execnet" in text:
        return "pytest workers (eager references, tests' own code)"
    if " -m pip" in text or "/pip " in text or text.endswith("/pip"):
        return "pip"
    if "meson" in text or comm == "ninja":
        return "meson and ninja"
    if "python" in comm or "python" in (cmdline[0] if cmdline else ""):
        return "other interpreters (spawned build workers, package checks, tests' subprocesses)"
    if comm in ("mypy", "ruff"):
        return "lint"
    return f"other ({comm})"


def _busy_seconds() -> float:
    """The machine's processor time spent busy since boot (all cores): /proc/stat's first line less idle and iowait."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(values[:8]) - values[3] - values[4]) / TICK


def _read(pid: str) -> tuple[int, str, list[str], str] | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        cpu = int(fields[11]) + int(fields[12])  # utime, stime
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except (OSError, ValueError):
        return None
    return cpu, comm, [c for c in cmdline if c], cwd


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="append the table (markdown) to this file")
    parser.add_argument("--interval", type=float, default=0.25)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    started, busy_before = time.monotonic(), _busy_seconds()
    proc = subprocess.Popen(command)
    me = os.getpid()
    seen: dict[str, tuple[int, str]] = {}  # pid -> (cpu ticks counted so far, kind)
    by_kind: Counter[str] = Counter()
    while proc.poll() is None:
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or int(pid) == me:
                continue
            read = _read(pid)
            if read is None:
                continue
            cpu, comm, cmdline, cwd = read
            counted, what = seen.get(pid, (0, ""))
            if not what or counted > cpu:  # a new process (or a reused pid)
                counted, what = 0, kind(cmdline, cwd, comm)
                if pid not in seen and cpu > 0 and time.monotonic() - started < args.interval * 2:
                    counted = cpu  # running before the command started: not its time
            by_kind[what] += cpu - counted
            seen[pid] = (cpu, what)
        time.sleep(args.interval)
    wall = time.monotonic() - started
    total = _busy_seconds() - busy_before
    sampled = {k: v / TICK for k, v in by_kind.items()}
    cores = os.cpu_count() or 1
    lines = [
        f"`{' '.join(command)}`: exit {proc.returncode}, {wall / 60:.1f} min wall, {total:.0f} s of processor time "
        f"({total / (wall * cores):.0%} of {cores} cores)",
        "",
        "| processor s | share | what |",
        "| --- | --- | --- |",
    ]
    rows = sorted(sampled.items(), key=lambda kv: -kv[1])
    rows.append(
        ("not sampled (short processes, last samples, anything else running)", max(total - sum(sampled.values()), 0.0))
    )
    lines += [f"| {s:.0f} | {s / total:.1%} | {what} |" for what, s in rows if s >= 0.5]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with args.out.open("a") as f:
            f.write("\n" + text)
    sys.exit(proc.returncode)


if __name__ == "__main__":
    main()
