"""Runtime of generated packages: random bad calls never crash and always raise a clear error,
several threads share a callable, resident memory stays flat, calls reuse their buffers, import is fast."""

from __future__ import annotations

import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import build_json, import_package, rss_growth_over_10000_calls, spec_of_its_own
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shimgen.spec import Graph, load_spec
from shimgen.trace.entry import load_model, make_inputs

pytestmark = pytest.mark.slow

DTYPES = [torch.float32, torch.float64, torch.float16, torch.int64, torch.int32, torch.bool, torch.uint8]


@pytest.fixture(scope="module")
def packages(built_mlp: dict[str, Any], built_multi: dict[str, Any], workdir: Path) -> list[tuple[Any, Graph, Any]]:
    """(callable, graph spec, eager model) for every graph of mlp and multi."""
    out = []
    for summary, spec_name in ((built_mlp, "mlp.toml"), (built_multi, "multi.toml")):
        spec_path = workdir / "projects" / spec_name
        package = import_package(summary)
        for i, graph in enumerate(load_spec(spec_path).graph):
            out.append((getattr(package, graph.name), graph, load_model(graph, f"graph[{i}]", spec_path.parent)))
    return out


def expected_error(graph: Graph, args: list[Any], kwargs: dict[str, Any]) -> type[Exception] | None:
    """An independent oracle: which exception the binding must raise for this call, if any."""
    positional = [i for i in graph.inputs if not i.keyword]
    if len(args) > len(positional):
        return TypeError
    bound = dict(zip((i.name for i in positional), args, strict=False))  # trailing inputs may come by keyword
    for key, value in kwargs.items():
        if key not in {i.name for i in graph.inputs} or key in bound:
            return TypeError
        bound[key] = value
    if len(bound) != len(graph.inputs):
        return TypeError
    dims: dict[str, int] = {}
    for spec in graph.inputs:
        t = bound[spec.name]
        if not isinstance(t, torch.Tensor) or t.layout != torch.strided:
            return TypeError
        if t.dtype != getattr(torch, spec.dtype):
            return TypeError
        if t.device.type != "cpu" or t.dim() != len(spec.shape):
            return ValueError
        for size, want in zip(t.shape, spec.shape, strict=True):
            if isinstance(want, int) and size != want:
                return ValueError
            if isinstance(want, str):
                dim = graph.dims[want]
                if not dim.min <= size <= dim.max or dims.setdefault(want, size) != size:
                    return ValueError
        if not t.is_contiguous():
            return ValueError
    return None


def tensor_like(graph: Graph, draw: Any) -> Any:
    """A value for one input slot: usually a tensor close to valid, sometimes something else."""
    kind = draw(st.sampled_from(["valid", "valid", "dtype", "rank", "size", "noncontig", "empty", "meta", "other"]))
    spec = draw(st.sampled_from(graph.inputs))
    sizes = {n: draw(st.integers(d.min, d.max)) for n, d in graph.dims.items()}
    shape = [sizes[s] if isinstance(s, str) else s for s in spec.shape]
    if kind == "other":
        return draw(st.sampled_from([None, 3, 2.5, "x", [1.0, 2.0], (torch.ones(2),), torch.ones(2).numpy()]))
    if kind == "size":
        shape[draw(st.integers(0, len(shape) - 1))] = draw(st.sampled_from([0, 1, 65, 100, 1000]))
    if kind == "rank":
        shape = shape + [1] if draw(st.booleans()) else shape[:-1]
    if kind == "empty":
        shape = [0 for _ in shape]
    dtype = draw(st.sampled_from(DTYPES)) if kind == "dtype" else getattr(torch, spec.dtype)
    device = "meta" if kind == "meta" else "cpu"
    t = torch.zeros(shape, dtype=dtype, device=device)
    if kind == "noncontig" and t.dim() >= 2 and t.shape[-1] > 1:
        t = torch.zeros(shape[:-1] + [shape[-1] * 2], dtype=dtype)[..., ::2]
    return t


@st.composite
def calls(draw: Any, graph: Graph) -> tuple[list[Any], dict[str, Any]]:
    names = [i.name for i in graph.inputs] + ["y", "input", "X"]
    args = [tensor_like(graph, draw) for _ in range(draw(st.integers(0, len(graph.inputs) + 1)))]
    kwargs = {draw(st.sampled_from(names)): tensor_like(graph, draw) for _ in range(draw(st.integers(0, 2)))}
    return args, kwargs


@pytest.mark.parametrize("index", [0, 1, 2], ids=["mlp.forward", "multi.heads", "multi.distance"])
def test_random_bad_calls_raise_clear_errors(packages: list[tuple[Any, Graph, Any]], index: int) -> None:
    fn, graph, model = packages[index]
    seen = {"errors": 0, "valid": 0}

    @settings(max_examples=2000, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(calls(graph))
    def run(call: tuple[list[Any], dict[str, Any]]) -> None:
        args, kwargs = call
        want = expected_error(graph, args, kwargs)
        if want is None:
            seen["valid"] += 1
            fn(*args, **kwargs)
            return
        with pytest.raises(want) as exc:
            fn(*args, **kwargs)
        assert str(exc.value).startswith(f"{graph.name}(")
        seen["errors"] += 1

    run()
    assert seen["errors"] >= 1500
    # A good call afterwards still gives the right answer.
    inputs = make_inputs(graph, {n: d.max for n, d in graph.dims.items()}, seed=5)
    args = [t for i, t in zip(graph.inputs, inputs, strict=True) if not i.keyword]
    kwargs = {i.name: t for i, t in zip(graph.inputs, inputs, strict=True) if i.keyword}
    with torch.no_grad():
        torch.testing.assert_close(fn(*args, **kwargs), model(*args, **kwargs), rtol=1e-4, atol=1e-5)


def test_threads_share_a_callable(packages: list[tuple[Any, Graph, Any]]) -> None:
    """Eight threads call one callable at once (more threads than model instances); every call's
    result is checked, and an exception in any thread fails the test through its future."""
    fn, graph, model = packages[0]
    inputs = [make_inputs(graph, {"batch": 1 + k % 64}, seed=k)[0] for k in range(16)]
    with torch.no_grad():
        expected = [model(x) for x in inputs]
    threads, calls_each = 8, 100
    start = threading.Barrier(threads)

    def worker(k: int) -> int:
        start.wait(timeout=60)  # all threads call at once, not one after another as the pool starts them
        for step in range(calls_each):
            j = (k + step) % len(inputs)
            torch.testing.assert_close(
                fn(inputs[j]),
                expected[j],
                rtol=1e-5,
                atol=1e-5,
                msg=lambda m, k=k, step=step: f"thread {k} call {step}: {m}",
            )
        return calls_each

    with ThreadPoolExecutor(max_workers=threads) as pool:
        futures = [pool.submit(worker, k) for k in range(threads)]
        done = [future.result(timeout=600) for future in futures]
    assert done == [calls_each] * threads


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_results_match_eager_at_any_thread_count(
    packages: list[tuple[Any, Graph, Any]], built_mlp: dict[str, Any], built_multi: dict[str, Any], threads: int
) -> None:
    """Kernels size their OpenMP teams by torch.set_num_threads; at one thread each region runs its serial copy."""
    kernels = [
        p
        for built in (built_mlp, built_multi)
        for p in (Path(built["package_dir"]).parent / "project" / "src").rglob("kernels_*.cpp")
    ]
    assert any("omp_get_max_threads() == 1" in p.read_text() for p in kernels), (
        "no OpenMP region with a serial copy to exercise"
    )
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for fn, graph, model in packages:
            inputs = make_inputs(graph, {n: d.max for n, d in graph.dims.items()}, seed=threads)
            args = [t for i, t in zip(graph.inputs, inputs, strict=True) if not i.keyword]
            kwargs = {i.name: t for i, t in zip(graph.inputs, inputs, strict=True) if i.keyword}
            with torch.no_grad():
                torch.testing.assert_close(fn(*args, **kwargs), model(*args, **kwargs), rtol=1e-4, atol=1e-5)
    finally:
        torch.set_num_threads(before)


class PlainSubclass(torch.Tensor):
    """A Python subclass without __torch_dispatch__: its data is the tensor's own."""


def unusual_tensors() -> dict[str, tuple[Any, type[Exception] | None]]:
    """Tensors torch can make that the binding must either run or reject with the input's error."""
    from torch.testing._internal.two_tensor import TwoTensor

    x = torch.randn(4, 32)
    parts = [torch.randn(2, 32), torch.randn(3, 32)]
    return {
        "nested": (torch.nested.nested_tensor(parts), TypeError),
        "jagged": (torch.nested.nested_tensor(parts, layout=torch.jagged), TypeError),
        "sparse_coo": (x.to_sparse(), TypeError),
        "sparse_csr": (x.to_sparse_csr(), TypeError),
        "mkldnn": (x.to_mkldnn(), TypeError),
        "meta": (torch.empty(4, 32, device="meta"), ValueError),
        "wrapper_subclass": (TwoTensor(x, x.clone()), TypeError),
        "parameter": (torch.nn.Parameter(x), None),
        "plain_subclass": (x.as_subclass(PlainSubclass), None),
        "requires_grad": (x.clone().requires_grad_(), None),
    }


@pytest.mark.parametrize("kind", list(unusual_tensors()))
def test_unusual_tensors_run_or_raise_the_inputs_error(packages: list[tuple[Any, Graph, Any]], kind: str) -> None:
    """Nested, sparse, meta and wrapper-subclass tensors, whose sizes or data C++ cannot read as a
    dense tensor's, raise a Python error naming the input (never a C++ exception through CPython)."""
    fn, graph, model = packages[0]
    validate = getattr(fn.__self__, f"_validate_{graph.name}")  # the extension module's argument checks alone
    tensor, error = unusual_tensors()[kind]
    if error is None:
        validate(tensor)
        with torch.no_grad():
            torch.testing.assert_close(fn(tensor), model(tensor.detach().as_subclass(torch.Tensor)))
        return
    for call in (fn, validate):
        with pytest.raises(error) as exc:
            call(tensor)
        assert str(exc.value).startswith(f"{graph.name}(): input 'x'"), str(exc.value)


def test_memory_stays_flat_over_10000_calls(built_mlp: dict[str, Any]) -> None:
    grown = rss_growth_over_10000_calls(built_mlp, 8, 32)
    assert grown <= 1 << 20, f"resident memory grew by {grown} bytes"


LARGE_OUTPUT = """
[project]
name = "large"

[[graph]]
name = "distance"
entry = "models.geometry:pairwise_distance"
inputs = [{ name = "a", shape = ["n", 8] }, { name = "b", shape = ["m", 8] }]
dims = { n = { min = 2, max = 4096 }, m = { min = 2, max = 4096 } }

[flags]
gemm_autotune = false
kernel_opt = "O1"
"""

FAULTS_SCRIPT = """
import resource, sys, torch
sys.path.insert(0, sys.argv[1])
distance = __import__(sys.argv[2]).distance
a, b = torch.randn(4096, 8), torch.randn(4096, 8)
for _ in range(3):
    d = distance(a, b)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    d = distance(a, b)
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) // 10)
"""


def test_calls_reuse_their_large_buffers(workdir: Path, tmp_path: Path) -> None:
    """A call's 64 MiB output, freed by the caller, serves a later call (runtime.keep_buffers): calls after the first
    fault in almost no fresh pages. Without the pool glibc maps every block over 32 MiB anew, 16,384 pages a call."""
    spec = spec_of_its_own(workdir, tmp_path / "spec" / "large.toml", LARGE_OUTPUT)
    summary = build_json(spec, tmp_path)
    run = subprocess.run(
        [sys.executable, "-c", FAULTS_SCRIPT, summary["package_dir"], summary["name"]], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    assert int(run.stdout) < 1000, f"{run.stdout.strip()} page faults per call"


def test_no_compiler_at_import_or_call(built_mlp: dict[str, Any], tmp_path: Path) -> None:
    """With no compiler reachable at all, import and calls still work."""
    script = f"import sys, torch; sys.path.insert(0, {built_mlp['package_dir']!r}); import mlp; print(mlp.forward(torch.ones(3, 32)).shape)"
    run = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env={"PATH": str(tmp_path), "CXX": "/nonexistent", "CC": "/nonexistent"},
    )
    assert run.stdout.strip() == "torch.Size([3, 32])", run.stderr
