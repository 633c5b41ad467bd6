"""Weights embedded in the extension against weights in a file beside it: import, first call and memory, side by side.

    python benchmarks/weights_load.py [--spec projects/resnet.toml] [--out benchmarks/results]

Builds the spec twice (flags.weights = "embedded" and "file", everything else as the spec has it), then for each
package starts fresh interpreters that import it and call it once, and reads /proc/self/smaps_rollup: with
"embedded" AOTInductor copies the weights into anonymous memory at import (private to the process); with "file"
they stay pages of the mapped file, which the page cache shares between processes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import REPO, Report, shimgen_build

PROBE = """
import json, sys, time
start = time.perf_counter()
import torch
torch_done = time.perf_counter()
sys.path.insert(0, sys.argv[1])
package = __import__(sys.argv[2])
imported = time.perf_counter()
x = torch.randn(1, 3, 224, 224)
package.forward(x)
called = time.perf_counter()
memory = {}
with open("/proc/self/smaps_rollup") as f:
    for line in f:
        key, _, value = line.partition(":")
        if key in ("Rss", "Pss", "Anonymous", "Private_Clean", "Private_Dirty", "Shared_Clean"):
            memory[key] = int(value.split()[0]) / 1024
print(json.dumps({"import": imported - torch_done, "first_call": called - imported, **memory}))
"""


def variant(spec: Path, weights: str) -> Path:
    text = spec.read_text().replace(f'name = "{spec.stem}"', f'name = "{spec.stem}_{weights}"', 1)
    text = (
        text.replace("[flags]", f'[flags]\nweights = "{weights}"', 1)
        if "[flags]" in text
        else text + f'\n[flags]\nweights = "{weights}"\n'
    )
    path = spec.parent / f"_{spec.stem}_{weights}.toml"
    path.write_text(text)
    return path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spec", type=Path, default=REPO / "projects" / "resnet.toml")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    report = Report()
    rows = {}
    with tempfile.TemporaryDirectory(prefix="shimgen-weights-") as tmp:
        for weights in ("embedded", "file"):
            spec = variant(args.spec, weights)
            try:
                _, summary = shimgen_build(spec, Path(tmp) / weights)
            finally:
                spec.unlink()
                spec.with_name(spec.name + ".lock").unlink(missing_ok=True)
            runs = [
                json.loads(
                    subprocess.run(
                        [sys.executable, "-c", PROBE, summary["package_dir"], summary["name"]],
                        check=True,
                        capture_output=True,
                        text=True,
                    ).stdout
                )
                for _ in range(args.runs)
            ]
            rows[weights] = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
            rows[weights]["build"] = summary["elapsed"]
            rows[weights]["wheel_mb"] = Path(summary["wheel"]).stat().st_size / 1e6
    e, f = rows["embedded"], rows["file"]
    report(
        f"# weights embedded or in a file: {args.spec.name}, {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores\n"
    )
    report(f"Median of {args.runs} fresh interpreters each; memory (MiB) after import and one call.\n")
    report("| figure | embedded | file | file / embedded |\n| --- | --- | --- | --- |")
    for name, key in [
        ("build (s)", "build"),
        ("wheel (MB)", "wheel_mb"),
        ("import (s)", "import"),
        ("first call (s)", "first_call"),
        ("Rss", "Rss"),
        ("Pss", "Pss"),
        ("Anonymous (private heap)", "Anonymous"),
        ("Private_Dirty", "Private_Dirty"),
        ("Private_Clean", "Private_Clean"),
        ("Shared_Clean", "Shared_Clean"),
    ]:
        report(
            f"| {name} | {e[key]:.3f} | {f[key]:.3f} | {f[key] / e[key]:.2f} |"
            if e[key]
            else f"| {name} | {e[key]:.3f} | {f[key]:.3f} | - |"
        )
    report.save(args.out / f"weights_load_{args.spec.stem}.md")


if __name__ == "__main__":
    main()
