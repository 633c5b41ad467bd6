"""The one way shimgen runs another program: its output captured (stdout and stderr interleaved, as
a terminal would show them), optionally streamed line by line and kept whole in a log file; the
caller judges the exit status."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

# A process ended by one of these was stopped from outside; its failure says nothing about its input.
INTERRUPTING_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGKILL, signal.SIGHUP}


@dataclass(frozen=True)
class Completed:
    command: tuple[str, ...]
    returncode: int
    output: str
    log: Path | None

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    @property
    def signal(self) -> int | None:
        """The signal that ended the process, if one did."""
        return -self.returncode if self.returncode < 0 else None

    @property
    def interrupted(self) -> bool:
        return self.signal in INTERRUPTING_SIGNALS

    def tail(self, lines: int) -> str:
        return "\n".join(self.output.strip().splitlines()[-lines:])


def run(
    command: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    log: Path | None = None,
    on_line: Callable[[str], None] | None = None,
) -> Completed:
    """Run `command` to completion. A program that cannot be started at all reads as exit status 127."""
    lines: list[str] = []
    try:
        with subprocess.Popen(
            list(command),
            env=env,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
        ) as proc:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.append(line)
                if on_line is not None:
                    on_line(line.rstrip("\n"))
            returncode = proc.wait()
    except OSError as exc:
        lines.append(f"{command[0]}: {exc.strerror or exc}\n")
        returncode = 127
    output = "".join(lines)
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(f"$ {' '.join(command)}\n{output}")
    return Completed(tuple(command), returncode, output, log)
