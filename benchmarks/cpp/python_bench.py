"""Contender "shimgen Python" of benchmarks/cpp_call.py, the reference: the Python package of the same shimgen build,
in a fresh interpreter: import torch, import the package, first call (its CLOCK_MONOTONIC time printed as
first_result_ns; load_ns and loaded_ns around the package's import), then per-call timing as the C++ programs time it
(benchmarks/cpp/bench_common.h), and the first result written.

    python python_bench.py <package_dir> <name> <graph> <inputs.bin> <outputs.bin> [--threads N] [--warmup S]
        [--batch S] [--batches N] [--device D]
"""

import statistics
import sys
import time
from pathlib import Path

import torch
import torch.utils._pytree as pytree

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "cpp"))
from tensor_file import read_tensors, write_tensors  # noqa: E402


def flat(output):
    return (
        [output]
        if isinstance(output, torch.Tensor)
        else [t for t in pytree.tree_leaves(output) if isinstance(t, torch.Tensor)]
    )


def ready(outputs):
    if outputs and outputs[0].is_cuda:
        torch.cuda.synchronize()


def main():
    package_dir, name, graph, inputs_path, outputs_path = sys.argv[1:6]
    opts = {"--threads": "1", "--warmup": "0.5", "--batch": "0.2", "--batches": "7", "--device": "cpu"}
    rest = sys.argv[6:]
    for i in range(0, len(rest) - 1, 2):
        opts[rest[i]] = rest[i + 1]
    torch.set_num_threads(int(opts["--threads"]))
    torch.set_grad_enabled(False)
    inputs = [t.to(opts["--device"]) for t in read_tensors(inputs_path)]
    sys.path.insert(0, package_dir)
    load_ns = time.monotonic_ns()
    package = __import__(name)
    fn = getattr(package, graph)
    loaded_ns = time.monotonic_ns()
    first = flat(fn(*inputs))
    ready(first)
    print("first_result_ns", time.monotonic_ns())
    print("load_ns", load_ns)
    print("loaded_ns", loaded_ns, flush=True)

    start, warm = time.perf_counter(), 0
    while warm < 3 or time.perf_counter() - start < float(opts["--warmup"]):
        ready(flat(fn(*inputs)))
        warm += 1
    calls = max(1, min(1000000, int(float(opts["--batch"]) / ((time.perf_counter() - start) / warm))))
    samples = []
    for _ in range(int(opts["--batches"])):
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            out = fn(*inputs)
        ready(flat(out))
        samples.append((time.perf_counter_ns() - t0) / calls)
    print("calls_per_batch", calls)
    print("batch_ns", " ".join(f"{s:.1f}" for s in samples))
    print(f"per_call_ns {statistics.median(samples):.1f}")
    write_tensors(outputs_path, first)


if __name__ == "__main__":
    main()
