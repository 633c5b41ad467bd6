"""Fresh pages per call (issue 29, item 2): minor page faults and system time of a built MiniLM package at batch 8 x
seq 128, as built (its buffers kept by the runtime, `[runtime] keep_buffers`), built with `keep_buffers = false`, and
that build under glibc with its trimming and mmap thresholds raised (every freed buffer kept by malloc, for the whole
process), each setting in its own process, alternating.

    shimgen build projects/minilm.toml --out /tmp/minilm
    shimgen build minilm_off.toml --out /tmp/minilm_off   # the same spec with [runtime] keep_buffers = false
    python benchmarks/page_faults.py /tmp/minilm/build/minilm/site /tmp/minilm_off/build/minilm/site [rounds]
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys

CALLS = """
import resource, sys, time, torch
sys.path.insert(0, sys.argv[1])
import minilm
ids = torch.randint(0, 30522, (8, 128)); mask = torch.ones(8, 128, dtype=torch.long); types = torch.zeros_like(mask)
for _ in range(5):
    minilm.forward(ids, attention_mask=mask, token_type_ids=types)
before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
for _ in range(50):
    minilm.forward(ids, attention_mask=mask, token_type_ids=types)
wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF)
print(wall / 50 * 1e3, (after.ru_minflt - before.ru_minflt) / 50, (after.ru_stime - before.ru_stime) / 50 * 1e3,
      (after.ru_utime - before.ru_utime) / 50 * 1e3)
"""
KEPT_BY_MALLOC = "glibc.malloc.mmap_threshold=268435456:glibc.malloc.trim_threshold=1073741824"


def main() -> None:
    kept, not_kept, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 6
    settings = {
        "buffers kept by the runtime (default)": (kept, ""),
        "keep_buffers = false, glibc default": (not_kept, ""),
        "keep_buffers = false, glibc keeping freed memory": (not_kept, KEPT_BY_MALLOC),
    }
    runs: dict[str, list[list[float]]] = {name: [] for name in settings}
    for _ in range(rounds):
        for name, (site, tunables) in settings.items():
            env = {**os.environ, "GLIBC_TUNABLES": tunables} if tunables else dict(os.environ)
            out = subprocess.run(
                [sys.executable, "-c", CALLS, site], env=env, capture_output=True, text=True, check=True
            )
            runs[name].append([float(v) for v in out.stdout.split()])
    print(f"MiniLM batch 8 x 128, {rounds} rounds of 50 calls, medians per call")
    print("| buffers | ms per call | minor faults | system ms | user ms |\n| --- | --- | --- | --- | --- |")
    for name, rows in runs.items():
        print(f"| {name} | " + " | ".join(f"{statistics.median(col):.1f}" for col in zip(*rows, strict=True)) + " |")


if __name__ == "__main__":
    main()
