"""The per-user pieces a first build needs, started ahead of need: on a machine whose per-user cache lacks the proved
toolchain or shimgen's runtime library for a target's device (a fresh machine, a new torch, a new shimgen), a build
starts a low-priority process that proves the compiler and builds those libraries while the build traces and generates
code. Its stages take the same locks, so they find the pieces done or wait for them; what the warm-up could not build,
they build themselves and report. The warm-up ends with the build that started it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

from shimgen.build.process import start_python
from shimgen.toolchain import probe, runtime_lib

NICENESS = 10  # the trace and codegen it runs beside come first


@dataclass(frozen=True)
class Warmup:
    process: subprocess.Popen[bytes]

    def stop(self) -> None:
        """End the warm-up and what it runs (Meson, ninja, compilers) where it is still running. A probe killed this
        way is not remembered, and a runtime library left half-built is built again by the next build that needs it."""
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        self.process.wait()


def needed(devices: Sequence[str]) -> bool:
    """Whether the per-user cache lacks the verdicts that pick a compiler, or that compiler's runtime library for one
    of `devices`."""
    tc = probe.selected_before()
    return tc is None or any(not (runtime_lib.location(tc, device) / "done").is_file() for device in devices)


def start(devices: Sequence[str], launcher: str | None) -> Warmup | None:
    """The warm-up for `devices`, started where the compiler is not proved yet or their runtime libraries are missing;
    they compile behind the compiler cache `launcher`."""
    if not needed(devices):
        return None
    argv = [json.dumps({"devices": sorted(set(devices)), "launcher": launcher})]
    return Warmup(start_python("shimgen.toolchain.warmup:main", argv, NICENESS))


def main(argv: list[str]) -> int:
    tc, _ = probe.select()
    job = json.loads(argv[0])
    for device in job["devices"]:
        runtime_lib.ensure(tc, device, held=None, launcher=job["launcher"])
    return 0
