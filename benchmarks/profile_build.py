"""Where a build's time goes: one project built cold (fresh Inductor and Triton caches) and then after a code edit, in
this process (no build server; the spec's variants dropped, so that its one unit is traced and generated here too),
each written as the functions the build spent the most wall time in.

The build's thread is sampled every few milliseconds (its stack, as `sys._current_frames` gives it) rather than traced
with cProfile: Inductor turns profilers of its own on and off, which silently ends an outer cProfile's view.

    python benchmarks/profile_build.py --device cuda --out benchmarks/results
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from build_time import EDIT_KINDS, EDITS, on_device  # noqa: E402


class StackSampler:
    """Seconds of wall time per function (inclusive: on the stack) and per function at the top of the stack (own) of
    one thread, sampled every `interval` seconds."""

    def __init__(self, thread: int, interval: float = 0.005) -> None:
        self.thread, self.interval = thread, interval
        self.inclusive: collections.Counter[str] = collections.Counter()  # seconds
        self.own: collections.Counter[str] = collections.Counter()
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> StackSampler:
        self._sampler.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._sampler.join()

    def _run(self) -> None:
        last = time.perf_counter()
        while not self._stop.wait(self.interval):
            # The time since the last sample goes to this stack: a sample comes late while the build holds the GIL.
            now = time.perf_counter()
            elapsed, last = now - last, now
            frame = sys._current_frames().get(self.thread)
            seen = set()
            top = True
            while frame is not None:
                code = frame.f_code
                name = f"{_short(code.co_filename)}:{code.co_firstlineno}({code.co_name})"
                if top:
                    self.own[name] += elapsed  # type: ignore[assignment]
                    top = False
                if name not in seen:
                    seen.add(name)
                    self.inclusive[name] += elapsed  # type: ignore[assignment]
                frame = frame.f_back

    @staticmethod
    def table(counter: collections.Counter[str], lines: int) -> str:
        return "\n".join(f"{seconds:8.2f}s  {name}" for name, seconds in counter.most_common(lines))


def _short(filename: str) -> str:
    """A file name without its install prefix: torch/..., shimgen/..., or the standard library's."""
    for marker, kept in (("site-packages/", ""), ("/shimgen/", "shimgen/"), ("/lib/python3", "")):
        _, found, rest = filename.partition(marker)
        if found:
            return kept + rest
    return filename


def profiled_build(spec: Path, out: Path, name: str, lines: int) -> str:
    from shimgen.build import process
    from shimgen.inductor import internals
    from shimgen.pipeline import build

    if internals.fork_is_safe():  # the package check's interpreter, as the command line forks it
        process.fork_spare_interpreter()
    start = time.perf_counter()
    with StackSampler(threading.get_ident()) as sampler:
        summary = build(spec, out).summary()
    wall = time.perf_counter() - start
    return (
        f"\n## {name}: {wall:.1f}s; stages (s) {summary['stages']}\n\n"
        f"Inclusive (on the stack):\n```\n{sampler.table(sampler.inclusive, lines)}\n```\n"
        f"Own (top of the stack):\n```\n{sampler.table(sampler.own, lines // 2)}\n```\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--model", default="resnet", choices=sorted(EDITS))
    parser.add_argument("--lines", type=int, default=70)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="shimgen-profile-"))
    projects = tmp / "projects"
    shutil.copytree(REPO / "projects", projects, ignore=shutil.ignore_patterns("__pycache__"))
    # The per-user cache (toolchain probe, prebuilt headers) warmed by a tiny build first, with caches of its own.
    warm = projects / "warm.toml"
    warm.write_text((projects / "mlp.toml").read_text() + '\n[[target]]\ndevice = "cpu"\nisa = "native"\n')
    on_device(warm, args.device)
    os.environ.update(
        SHIMGEN_SERVER="off",
        TORCHINDUCTOR_CACHE_DIR=str(tmp / "warm-inductor"),
        TRITON_CACHE_DIR=str(tmp / "warm-triton"),
    )
    from shimgen.pipeline import build

    build(warm, tmp / "warm")
    os.environ.update(TORCHINDUCTOR_CACHE_DIR=str(tmp / "inductor"), TRITON_CACHE_DIR=str(tmp / "triton"))
    spec = projects / f"{args.model}.toml"
    spec.write_text(re.sub(r", specialize = \[[^]]*\]", "", spec.read_text()))
    on_device(spec, args.device)
    report = f"# profile_build.py --device {args.device} --model {args.model}\n"
    report += profiled_build(spec, tmp / "out", "cold", args.lines)
    model_file, line, assign = EDITS[args.model]
    source = projects / model_file
    source.write_text(
        source.read_text().replace(line, f"{assign}\n    {EDIT_KINDS['code'][args.model]}\n    return model")
    )
    report += profiled_build(spec, tmp / "out", "code edit", args.lines)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"profile_build_{args.model}_{args.device}.md").write_text(report)
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
