"""A first build on a fresh machine: projects/resnet.toml built with an empty per-user cache (no proved toolchain,
prebuilt headers or runtime library) and fresh Inductor and Triton caches, by each given shimgen source tree in turn
(for example a checkout of an older commit, with its pyproject.toml, against this one), alternating, each round in
a fresh process; wall seconds and each build's stage table. With --then-kernel-opt, the same project is built again
into the same caches with only flags.kernel_opt changed (a user's flag edit, or a second project of other flags).

    python benchmarks/first_build.py --device cpu --rounds 2 /tmp/old-shimgen .
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from build_time import on_device
from common import REPO


def first_build(root: Path, device: str, then_kernel_opt: str | None = None) -> str:
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        shutil.copytree(REPO / "projects", tmp / "projects", ignore=shutil.ignore_patterns("__pycache__"))
        spec = tmp / "projects" / "resnet.toml"
        on_device(spec, device)
        others = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != REPO]
        env = {
            **os.environ,
            "SHIMGEN_CACHE_DIR": str(tmp / "cache" / "toolchain"),
            "TORCHINDUCTOR_CACHE_DIR": str(tmp / "inductor"),
            "TRITON_CACHE_DIR": str(tmp / "triton"),
            "PYTHONPATH": os.pathsep.join([str(root), *others]),
        }
        # From the temporary directory: `python -m` puts the working directory first on sys.path.
        build = [sys.executable, "-m", "shimgen", "build", str(spec), "--out", str(tmp / "out")]
        ok, report = _timed(build, env, tmp, f"{root}")
        if then_kernel_opt and ok:
            text = spec.read_text()
            spec.write_text(re.sub(r'(?m)^kernel_opt = ".*"$', f'kernel_opt = "{then_kernel_opt}"', text))
            assert spec.read_text() != text, "the spec sets no kernel_opt to change"
            report += _timed(build, env, tmp, f"  then kernel_opt = {then_kernel_opt}")[1]
        subprocess.run(["pkill", "-f", "shimgen[.]commands[.]server"])  # each build's server, idle from now on
        return report


def _timed(build: list[str], env: dict[str, str], cwd: Path, what: str) -> tuple[bool, str]:
    """Whether the build succeeded, and its wall time and stage table (or its error) under `what`."""
    start = time.perf_counter()
    done = subprocess.run(build, env=env, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        return False, f"{what}: failed (exit {done.returncode}) after {wall:.1f}s\n{done.stderr[-3000:]}"
    table = done.stderr[done.stderr.find("  stage ") :].split("  models")[0]
    return True, f"{what}: {wall:.1f}s\n{table}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--then-kernel-opt", choices=["O0", "O1", "O2", "O3", "Os"], help="then build it again so")
    parser.add_argument("roots", nargs="+", type=Path, help="shimgen source trees (each holding shimgen/)")
    args = parser.parse_args()
    for r in range(args.rounds):
        for root in args.roots:
            print(f"round {r + 1}, {first_build(root.resolve(), args.device, args.then_kernel_opt)}", flush=True)


if __name__ == "__main__":
    main()
