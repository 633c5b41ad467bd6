"""What the CPU libraries a compiled graph calls reach on this machine (issue 29): the matmul kernels and the attention
kernels of a MiniLM-shaped BERT, at the call_overhead.py cases' thread count.

    python benchmarks/cpu_libraries.py [--threads 2] [--out benchmarks/results]

- GEMMs of MiniLM's layers at batch 8 x seq 128 (1024 rows): oneDNN's linear on weights packed for it (what shimgen's
  CPU packages call from 16 rows) against ATen's addmm (the BLAS torch was built with: MKL in the x86 wheels), in
  GFLOP/s.
- Attention at MiniLM's shape (12 heads of 32, seq 128, an additive padding mask) at batch 1 and 8: ATen's
  scaled_dot_product_attention (its CPU flash attention, what Inductor leaves in the graph), Inductor's C++
  flex-attention kernel (flex_attention through torch.compile), and bmm + softmax + bmm.

Each figure is the median of 5 blocks of about 0.3 s, the contenders' blocks taking turns.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import REPO, Report

GEMMS = ((1024, 384, 384), (1024, 384, 1536), (1024, 1536, 384), (2048, 2048, 2048))  # rows, K, N
HEADS, SEQ, HEAD_DIM = 12, 128, 32


def timed(contenders: dict[str, Callable[[], Any]], blocks: int = 5, seconds: float = 0.3) -> dict[str, float]:
    """Median seconds per call of each contender, blocks taking turns."""
    for f in contenders.values():
        for _ in range(3):
            f()
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(blocks):
        for name, f in contenders.items():
            start, calls = time.perf_counter(), 0
            while time.perf_counter() - start < seconds:
                f()
                calls += 1
            times[name].append((time.perf_counter() - start) / calls)
    return {name: statistics.median(t) for name, t in times.items()}


def gemms(report: Report) -> None:
    import torch

    report("\n## GEMMs, GFLOP/s (bias added)\n")
    report("| rows x K x N | oneDNN, packed weights | ATen addmm | addmm / oneDNN time |")
    report("| --- | --- | --- | --- |")
    for rows, k, n in GEMMS:
        x, w, b = torch.randn(rows, k), torch.randn(n, k), torch.randn(n)
        packed = torch.ops.mkldnn._reorder_linear_weight(w, rows)

        def onednn(x: Any = x, packed: Any = packed, b: Any = b) -> Any:
            return torch.ops.mkldnn._linear_pointwise(x, packed, b, "none", [], "")

        def aten(x: Any = x, w: Any = w, b: Any = b) -> Any:
            return torch.addmm(b, x, w.t())

        torch.testing.assert_close(onednn(), aten(), atol=1e-3, rtol=1e-3)
        t = timed({"oneDNN": onednn, "ATen": aten})
        flops = 2 * rows * k * n
        report(
            f"| {rows} x {k} x {n} | {flops / t['oneDNN'] / 1e9:.0f} | {flops / t['ATen'] / 1e9:.0f} | "
            f"{t['ATen'] / t['oneDNN']:.2f} |"
        )


def attention(report: Report) -> None:
    import torch
    from torch.nn.attention.flex_attention import flex_attention

    report(f"\n## Attention, {HEADS} heads x {HEAD_DIM}, seq {SEQ}, padding mask: ms per call\n")
    report("| batch | ATen SDPA (flash, CPU) | Inductor C++ flex attention | bmm + softmax + bmm | flex / SDPA |")
    report("| --- | --- | --- | --- | --- |")
    flex = torch.compile(flex_attention, fullgraph=True)
    for batch in (1, 8):
        q, k, v = (torch.randn(batch, HEADS, SEQ, HEAD_DIM) for _ in range(3))
        mask = torch.zeros(batch, 1, 1, SEQ)
        mask[:, :, :, SEQ - SEQ // 4 :] = torch.finfo(torch.float32).min  # the last quarter is padding

        def added(score: Any, b: Any, h: Any, q_index: Any, kv_index: Any, mask: Any = mask) -> Any:
            return score + mask[b, 0, 0, kv_index]

        def sdpa(q: Any = q, k: Any = k, v: Any = v, mask: Any = mask) -> Any:
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)

        def flexed(q: Any = q, k: Any = k, v: Any = v, added: Any = added) -> Any:
            return flex(q, k, v, score_mod=added)

        def matmuls(q: Any = q, k: Any = k, v: Any = v, mask: Any = mask, batch: int = batch) -> Any:
            rows = batch * HEADS
            scores = torch.baddbmm(
                mask.expand(batch, HEADS, SEQ, SEQ).reshape(rows, SEQ, SEQ),
                q.reshape(rows, SEQ, HEAD_DIM),
                k.reshape(rows, SEQ, HEAD_DIM).transpose(1, 2),
                alpha=HEAD_DIM**-0.5,
            )
            return torch.bmm(torch.softmax(scores, -1), v.reshape(rows, SEQ, HEAD_DIM)).view(
                batch, HEADS, SEQ, HEAD_DIM
            )

        torch.testing.assert_close(flexed(), sdpa(), atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(matmuls(), sdpa(), atol=1e-4, rtol=1e-4)
        t = timed({"sdpa": sdpa, "flex": flexed, "matmuls": matmuls})
        report(
            f"| {batch} | {t['sdpa'] * 1e3:.3f} | {t['flex'] * 1e3:.3f} | {t['matmuls'] * 1e3:.3f} | "
            f"{t['flex'] / t['sdpa']:.2f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    args = parser.parse_args()
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="shimgen-cpu-libraries-"))
    import torch

    torch.set_num_threads(args.threads)
    report = Report(args.out / "cpu_libraries.md")
    report(
        f"# cpu_libraries.py, {time.strftime('%Y-%m-%d %H:%M')}, {platform.machine()}, {os.cpu_count()} cores, "
        f"{args.threads} threads, torch {torch.__version__}, BLAS: {torch.backends.mkl.is_available() and 'MKL' or 'other'}"
    )
    gemms(report)
    attention(report)


if __name__ == "__main__":
    main()
