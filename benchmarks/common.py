"""What every benchmark script shares: a report printed as it goes and saved as markdown, and the
real `shimgen build` run in a subprocess."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


class Report:
    """Call with a line to print it now and keep it for `save`."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, text: str) -> None:
        print(text, flush=True)
        self.lines.append(text)

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(self.lines) + "\n")


def run(cmd: list[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> tuple[float, str]:
    """(wall seconds, stdout); exits with the command's stderr if it fails."""
    start = time.perf_counter()
    result = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"{shlex.join(cmd)} failed:\n{result.stderr[-3000:]}")
    return time.perf_counter() - start, result.stdout


def shimgen_build(spec: Path, out: Path, env: dict[str, str] | None = None, *extra: str) -> tuple[float, dict[str, Any]]:
    """(wall seconds, the --json summary) of `shimgen build`, from the source tree."""
    seconds, stdout = run([sys.executable, "-m", "shimgen", "build", str(spec), "--out", str(out), "--json", *extra], env, cwd=REPO)
    return seconds, json.loads(stdout)


def import_built(summary: dict[str, Any]) -> Any:
    """The built package, imported from its site directory."""
    sys.path.insert(0, summary["package_dir"])
    return __import__(summary["name"])
