"""oneDNN's packed weights against the threads a call runs (issue 29): a CPU spec built with its [[target]] threads at 1
and at this machine's default (what a build packs for when the spec says nothing), each package called at 1 thread and
at the default, each call in a process of its own, the processes taking turns.

oneDNN picks a convolution's or linear layer's packed weight layout by the threads it will run, and repacks a weight
packed for other threads at every call. Before the [[target]] threads setting, codegen packed at its worker's threads
(1 while CPU GEMMs were timed): the "1" package below is what every build shipped then.

    python benchmarks/packed_threads.py [--spec projects/resnet.toml] [--graph forward] [--sizes batch=1] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from common import REPO, Report, shimgen_build

CALL = textwrap.dedent("""
    import importlib, json, sys, time, torch
    site, spec, graph, threads, sizes = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), json.loads(sys.argv[5])
    sys.path.insert(0, site)
    sys.path.insert(0, str(__import__("pathlib").Path(spec).parent))
    from shimgen.spec import load_spec
    loaded = load_spec(__import__("pathlib").Path(spec))
    g = next(g for g in loaded.graph if g.name == graph)
    torch.set_num_threads(threads)
    package = importlib.import_module(loaded.project.name)
    shape = [sizes.get(s, g.dims[s].example) if isinstance(s, str) else s for s in g.inputs[0].shape]
    x = torch.randn(*shape)
    fn = getattr(package, graph)
    for _ in range(5):
        fn(x)
    blocks = []
    for _ in range(7):
        start, calls = time.perf_counter(), 0
        while time.perf_counter() - start < 0.5:
            fn(x)
            calls += 1
        blocks.append((time.perf_counter() - start) / calls)
    print(sorted(blocks)[3] * 1e3)
""")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spec", type=Path, default=REPO / "projects" / "resnet.toml")
    parser.add_argument("--graph", default="forward")
    parser.add_argument("--sizes", default="batch=1", help="dim=size,... of the graph's first input")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, help="directory for packed_threads.md")
    args = parser.parse_args()
    import torch

    sizes = {k: int(v) for k, v in (item.split("=") for item in args.sizes.split(",") if item)}
    default = torch.get_num_threads()
    report = Report()
    report(
        f"# packed_threads.py, {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
        f"python {platform.python_version()}\n"
    )
    report(
        f"{args.spec.name}, graph {args.graph} at {sizes}: ms per call (median of 7 blocks of 0.5 s; the median of "
        f"{args.rounds} rounds, each call in a process of its own). Rows: the threads the build packed oneDNN's weights "
        f"for ([[target]] threads); columns: the threads of the call. This machine's default: {default}.\n"
    )
    work = Path(tempfile.mkdtemp(prefix="shimgen-packed-"))
    sites: dict[int, str] = {}
    packings = sorted({1, default})
    for packed in packings:
        projects = work / f"projects-{packed}"
        shutil.copytree(args.spec.parent, projects, ignore=shutil.ignore_patterns("__pycache__"))
        spec = projects / args.spec.name
        text = spec.read_text()
        assert 'device = "cpu"' in text, "the spec needs a cpu [[target]]"
        spec.write_text(text.replace('device = "cpu"', f'device = "cpu"\nthreads = {packed}', 1))
        wall, summary = shimgen_build(spec, work / f"out-{packed}")
        sites[packed] = summary["package_dir"]
        print(f"built, packed for {packed} threads: {wall:.1f} s", flush=True)
    times: dict[tuple[int, int], list[float]] = {}
    for _ in range(args.rounds):
        for packed in packings:
            for threads in packings:
                done = subprocess.run(
                    [
                        sys.executable,
                        "-c",
                        CALL,
                        sites[packed],
                        str(work / f"projects-{packed}" / args.spec.name),
                        args.graph,
                        str(threads),
                        json.dumps(sizes),
                    ],
                    capture_output=True,
                    text=True,
                    check=True,
                    env={**os.environ, "PYTHONPATH": str(REPO)},
                )
                times.setdefault((packed, threads), []).append(float(done.stdout.split()[-1]))
    report("| packed for \\ called at | " + " | ".join(f"{t} threads" for t in packings) + " |")
    report("| --- |" + " --- |" * len(packings))
    for packed in packings:
        cells = [f"{statistics.median(times[packed, t]):.2f}" for t in packings]
        report(f"| {packed} threads | " + " | ".join(cells) + " |")
    shutil.rmtree(work, ignore_errors=True)
    if args.out:
        report.save(args.out / "packed_threads.md")


if __name__ == "__main__":
    main()
