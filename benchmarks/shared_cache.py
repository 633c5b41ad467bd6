"""Cold builds against builds from a shared cache, and byte-identical wheels, for one spec (default ResNet-18):

    python benchmarks/shared_cache.py [--spec projects/resnet.toml] [--out benchmarks/results]

Three builds, each as a new machine would run it: an empty HOME (no per-user shimgen, Inductor or ccache caches),
a fresh copy of the spec's directory and a fresh output directory.
  1. cold, filling a shared cache on a Redis server started here (redis-server, localhost);
  2. cold again, without the shared cache: a second independent build, for the byte-identity check;
  3. a "second machine" pointed at the same cache.
Figures: wall seconds end to end (interpreter start included), the ratio 3/1, and the sha256 of the three wheels.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from common import REPO, Report, shimgen_build


def _redis(directory: Path) -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [
            "redis-server",
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(directory),
        ],
        stdout=subprocess.DEVNULL,
    )
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return server, f"redis://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.1)
    raise SystemExit("redis-server did not start")


def _machine(root: Path, spec: Path, name: str, cache: str | None) -> tuple[float, dict]:
    """A build as on a new machine: its own HOME, checkout and output directory."""
    home, checkout = root / name / "home", root / name / "checkout"
    home.mkdir(parents=True)
    shutil.copytree(spec.parent, checkout / spec.parent.name, ignore=shutil.ignore_patterns("__pycache__", "*.lock"))
    lock = spec.with_name(spec.name + ".lock")
    if lock.is_file():  # the committed lockfile comes with the checkout
        shutil.copy(lock, checkout / spec.parent.name / lock.name)
    env = {**os.environ, "HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache")}
    env.pop("SHIMGEN_CACHE_DIR", None)
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    extra = ("--cache", cache) if cache else ()
    return shimgen_build(checkout / spec.parent.name / spec.name, root / name / "out", env, *extra)


def _sha256(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", type=Path, default=REPO / "projects" / "resnet.toml")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    args = parser.parse_args()
    spec = args.spec.resolve()
    report = Report()
    report(f"# Shared cache and reproducible wheels: {spec.relative_to(REPO)}\n")
    report(
        f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores. Each build: empty HOME, fresh checkout "
        "copy, fresh output directory; wall seconds include interpreter start.\n"
    )
    with tempfile.TemporaryDirectory(prefix="shimgen-shared-bench-") as tmp:
        root = Path(tmp)
        server, url = _redis(root)
        try:
            cold, first = _machine(root, spec, "first", url)
            again, second = _machine(root, spec, "second-no-cache", None)
            shared, third = _machine(root, spec, "third-shared", url)
        finally:
            server.terminate()
        report("| build | seconds | stages | wheel sha256 |")
        report("|---|---|---|---|")
        for label, seconds, summary in (
            ("1. cold, filling the cache", cold, first),
            ("2. cold, no shared cache", again, second),
            ("3. second machine, shared cache", shared, third),
        ):
            stages = ", ".join(f"{k} {v:.1f}" for k, v in summary["stages"].items())
            report(f"| {label} | {seconds:.1f} | {stages} | `{_sha256(summary['wheel'])[:16]}` |")
        report(f"\nShared-cache build / cold build: **{shared / cold:.2f}x** (goal <= 0.3).")
        report(f"Found in the shared cache by build 3: {', '.join(third['shared_cache']['found']) or 'nothing'}.")
        identical = len({_sha256(s["wheel"]) for s in (first, second, third)}) == 1
        report(
            f"Wheels of the three builds byte-identical: **{'yes' if identical else 'NO'}** ({Path(first['wheel']).name})."
        )
    report.save(args.out / f"shared_cache_{spec.stem}.md")


if __name__ == "__main__":
    main()
