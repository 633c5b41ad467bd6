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
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from shimgen.build.process import start_python
from shimgen.toolchain import Toolchain, cache_dir, probe, runtime_lib

NICENESS = 10  # the trace and codegen it runs beside come first


@dataclass(frozen=True)
class Warmup:
    process: subprocess.Popen[bytes]

    def quiet(self, report: Callable[[str], None]) -> Callable[[str], None]:
        """`report` for lock waits, silent about waits for this warm-up (the build's own work, not another build)."""
        own = f"shimgen process {self.process.pid} "
        return lambda message: None if own in message else report(message)

    def stop(self) -> None:
        """End the warm-up and what it runs (Meson, ninja, compilers) where it is still running. A probe killed this
        way is not remembered, and a runtime library left half-built is built again by the next build that needs it."""
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        self.process.wait()


def needed(tc: Toolchain, devices: Sequence[str]) -> bool:
    """Whether the per-user cache lacks the proved toolchain `tc` or the runtime library of one of `devices`."""
    if not (cache_dir() / probe.probe_key(tc) / "verdict.json").is_file():
        return True
    return any(not (runtime_lib.location(tc, device) / "done").is_file() for device in devices)


def start(tc: Toolchain, devices: Sequence[str]) -> Warmup | None:
    """The warm-up for `devices`, started where `tc` (found, not yet proved) or their runtime libraries are missing."""
    if not needed(tc, devices):
        return None
    return Warmup(start_python("shimgen.toolchain.warmup:main", [json.dumps(sorted(set(devices)))], NICENESS))


def main(argv: list[str]) -> int:
    tc, _ = probe.select()
    for device in json.loads(argv[0]):
        runtime_lib.ensure(tc, device)
    return 0
