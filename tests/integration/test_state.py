"""Graphs that mutate state (buffers updated in place, the pattern of a static KV cache or BatchNorm statistics): the
package keeps the state, calls see each other's updates as in eager, two graphs over one module share one copy, calls
from several threads take turns, and state() / reset_state() / load_weights() behave as documented."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import FAST_FLAGS, build_json, import_package, shimgen, with_flags
from cpp_program import pkg_config_program, read_tensors, run_graph

pytestmark = pytest.mark.slow

SPEC = """
[project]
name = "counter"

[[graph]]
name = "step"
entry = "models.stateful:Counter"
inputs = [{ name = "x", shape = ["batch", 8] }]
dims = { batch = { min = 1, max = 4 } }

[[graph]]
name = "peek"
entry = "models.stateful:Counter"
inputs = [{ name = "x", shape = [1, 8] }]

[[graph]]
name = "other"
entry = "models.stateful:Counter"
kwargs = { width = 8 }
inputs = [{ name = "x", shape = [1, 8] }]
"""


@pytest.fixture(scope="module")
def built_counter(workdir: Path) -> dict[str, Any]:
    spec = workdir / "projects" / "counter.toml"
    spec.write_text(with_flags(SPEC, **FAST_FLAGS))
    return build_json(spec, workdir)


def eager_counter() -> Any:
    from shimgen.trace import entry

    # In the project's scope: an earlier in-process build with custom ops keeps its own project's `models` package.
    with entry.project_scope(Path(__file__).resolve().parents[2] / "projects"):
        from models.stateful import Counter

        torch.manual_seed(0)  # the spec's seed: the graphs' weights
        return Counter().eval()


def test_calls_see_every_earlier_update_across_graphs(built_counter: dict[str, Any]) -> None:
    counter = import_package(built_counter)
    counter.reset_state()
    model = eager_counter()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for k in range(6):
            x = torch.randn(1 + k % 4, 8, generator=gen)
            graph = counter.peek if k % 3 == 2 else counter.step
            x = x[:1] if graph is counter.peek else x
            torch.testing.assert_close(graph(x), model(x), rtol=1e-5, atol=1e-5)
    state = counter.state()
    # `other` builds the module with other arguments: a state of its own, which none of these calls touched.
    assert set(state) == {"count", "total", "other.count", "other.total"} and state["count"].item() == 6.0
    assert state["other.count"].item() == 0.0
    counter.other(torch.ones(1, 8))
    assert counter.state()["other.count"].item() == 1.0 and counter.state()["count"].item() == 6.0
    torch.testing.assert_close(state["total"], model.total)
    state["count"].fill_(100)  # a copy: the package's state is not changed through it
    assert counter.state()["count"].item() == 6.0


def test_reset_and_load_weights(built_counter: dict[str, Any]) -> None:
    counter = import_package(built_counter)
    counter.step(torch.ones(2, 8))
    counter.reset_state()
    assert counter.state()["count"].item() == 0.0 and torch.equal(counter.state()["total"], torch.zeros(8))
    counter.step(torch.ones(2, 8))
    # New weights (here the build's own file) leave the state as it was.
    counter.load_weights(Path(built_counter["package_dir"]) / "counter" / "step_cpu.safetensors")
    assert counter.state()["count"].item() == 1.0 and torch.equal(counter.state()["total"], torch.full((8,), 2.0))


def test_calls_from_threads_take_turns(built_counter: dict[str, Any]) -> None:
    counter = import_package(built_counter)
    counter.reset_state()
    x = torch.ones(1, 8)
    seen: list[float] = []
    lock = threading.Lock()

    def work(graph: Any) -> None:
        for _ in range(50):
            out = graph(x)
            with lock:
                seen.append(out[0, 0].item())

    threads = [threading.Thread(target=work, args=(g,)) for g in (counter.step, counter.step, counter.peek)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert counter.state()["count"].item() == 150.0
    # Each call saw its own count (1..150): out = linear(x) * count + total, with total = count * 8 ones summed over x.
    assert len(set(seen)) == 150


def test_docstring_and_check(built_counter: dict[str, Any], workdir: Path) -> None:
    counter = import_package(built_counter)
    assert "State: each call updates count, total in place" in counter.step.__doc__
    assert "State: each call updates" in counter.peek.__doc__
    verified = built_counter["verified"]
    assert verified["cases"] and verified["beforehand"] == len(verified["cases"]), "the programs ran beside the compile"
    result = shimgen("check", workdir / "projects" / "counter.toml", "--out", workdir)
    assert result.returncode == 0, result.stderr


def test_cpp_package_keeps_the_state_across_calls_and_graphs(built_counter: dict[str, Any], tmp_path: Path) -> None:
    """From C++: three calls of step, then peek over the same module, see every update, as in eager."""
    program = pkg_config_program(Path(built_counter["cpp_prefix"]), "counter", tmp_path / "run_graph")
    x = torch.randn(1, 8, generator=torch.Generator().manual_seed(2))
    done = run_graph(program, "step", [x], tmp_path, "--repeat", "3", "--then", "peek")
    assert done.returncode == 0, done.stderr
    model = eager_counter()
    with torch.no_grad():
        for _ in range(3):
            model(x)
        want = model(x)
    torch.testing.assert_close(read_tensors(tmp_path / "out.bin"), [want], rtol=1e-5, atol=1e-5)


def test_cpp_package_reads_and_resets_the_state(built_counter: dict[str, Any], tmp_path: Path) -> None:
    """From C++: Package::state() gives the buffers as eager's after its calls; after reset_state() a call sees the
    initial state again, as a fresh model's first call."""
    program = pkg_config_program(Path(built_counter["cpp_prefix"]), "counter", tmp_path / "run_graph")
    x = torch.randn(1, 8, generator=torch.Generator().manual_seed(3))
    done = run_graph(program, "step", [x], tmp_path, "--repeat", "2", "--state", str(tmp_path / "state.bin"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["count", "other.count", "other.total", "total"]
    model = eager_counter()
    with torch.no_grad():
        for _ in range(2):
            model(x)
    # step's and peek's module, and graph other's (a module of its own, not called), named after it
    state = read_tensors(tmp_path / "state.bin")
    untouched = eager_counter()
    want = [model.count, untouched.count, untouched.total, model.total]
    torch.testing.assert_close(state, want, rtol=1e-5, atol=1e-5)

    done = run_graph(program, "step", [x], tmp_path, "--repeat", "3", "--reset", "1", "--then", "peek")
    assert done.returncode == 0, done.stderr
    with torch.no_grad():
        want = eager_counter()(x)
    torch.testing.assert_close(read_tensors(tmp_path / "out.bin"), [want], rtol=1e-5, atol=1e-5)
