"""Weights as their own artifact (flags.weights): a safetensors file mapped at import, load_weights() swapping weights
in a running package (checked, double-buffered), and a checkpoint change that rebuilds only the weights."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import build_json
from cpp_program import pkg_config_program, read_tensors, run_graph, write_safetensors

pytestmark = pytest.mark.slow

MODEL = """
import os

import torch


def mlp(checkpoint="weights.pt"):
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 64),
    torch.nn.LayerNorm(64), torch.nn.BatchNorm1d(64))
    model.load_state_dict(torch.load(os.path.join(os.path.dirname(__file__), checkpoint), weights_only=True))
    return model.eval()
"""


def layers() -> torch.nn.Sequential:
    """The model of MODEL, without its checkpoint."""
    return torch.nn.Sequential(
        torch.nn.Linear(64, 64),
        torch.nn.GELU(),
        torch.nn.Linear(64, 64),
        torch.nn.LayerNorm(64),
        torch.nn.BatchNorm1d(64),
    )


def weights(seed: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    model = layers()
    with torch.no_grad():
        model[3].weight.uniform_(0.5, 1.5)  # not the defaults: a forgotten buffer or parameter shows
        model[3].bias.uniform_(-0.5, 0.5)
        model[4].running_mean.uniform_(-0.5, 0.5)  # buffers the model reads; num_batches_tracked it does not
        model[4].running_var.uniform_(0.5, 1.5)
    return model.state_dict()


def project(root: Path, name: str, flags: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "wmodel.py").write_text(MODEL)
    torch.save(weights(0), root / "weights.pt")
    spec = root / f"{name}.toml"
    spec.write_text(
        textwrap.dedent(f'''
        [project]
        name = "{name}"

        [[graph]]
        name = "forward"
        entry = "wmodel:mlp"
        inputs = [{{ name = "x", shape = ["batch", 64] }}]
        dims = {{ batch = {{ min = 1, max = 32, example = 4 }} }}

        [[target]]
        device = "cpu"

        [flags]
        {flags}
    ''')
    )
    return spec


RUN = """
import json, sys, torch
sys.path.insert(0, sys.argv[1])
package = __import__(sys.argv[2])
layers = [torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 64), torch.nn.LayerNorm(64),
torch.nn.BatchNorm1d(64)]
model = torch.nn.Sequential(*layers).eval()
x = torch.randn(5, 64, generator=torch.Generator().manual_seed(3))

def eager(path):
    model.load_state_dict(torch.load(path, weights_only=True))
    with torch.no_grad():
        return model(x)

def error(weights):
    try:
        package.load_weights(weights)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None

results = {}
exec(sys.argv[3])
print(json.dumps(results))
"""


def run(summary: dict[str, Any], code: str, cwd: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", RUN, summary["package_dir"], summary["name"], textwrap.dedent(code)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, **(env or {})},
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def unfrozen(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    root = tmp_path_factory.mktemp("unfrozen")
    spec = project(root, "unfrozen", "freezing = false")
    return spec, build_json(spec, root / "out")


def test_weights_file_is_safetensors_beside_the_extension_and_stored(unfrozen: tuple[Path, dict[str, Any]]) -> None:
    _, summary = unfrozen
    path = Path(summary["package_dir"]) / "unfrozen" / "forward_cpu.safetensors"
    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length])
    assert (8 + length) % 64 == 0
    assert header["__metadata__"]["format"] == "shimgen-weights-1"
    entries = {name: entry for name, entry in header.items() if name != "__metadata__"}
    assert entries["model.0.weight"]["dtype"] == "F32" and entries["model.0.weight"]["shape"] == [64, 64]
    assert entries["model.0.weight"]["data_offsets"][0] % 64 == 0
    ends = sorted(tuple(e["data_offsets"]) for e in entries.values())
    assert (
        all(a[1] == b[0] for a, b in zip(ends, ends[1:], strict=False)) and ends[-1][1] == len(data) - 8 - length
    )  # no holes
    stored = torch.frombuffer(bytearray(data[8 + length + ends[0][0] :]), dtype=torch.uint8)
    assert stored.numel() > 0
    with zipfile.ZipFile(summary["wheel"]) as wheel:
        info = wheel.getinfo("unfrozen/forward_cpu.safetensors")
        assert info.compress_type == zipfile.ZIP_STORED
        assert wheel.read(info) == data


def test_load_weights_swaps_in_new_weights_and_names_what_does_not_fit(
    unfrozen: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    spec, summary = unfrozen
    torch.save(weights(1), tmp_path / "new.pt")
    results = run(
        summary,
        f"""
        results["built"] = (package.forward(x) - eager({str(spec.parent / "weights.pt")!r})).abs().max().item()
        with open("/proc/self/maps") as f:
            results["mapped"] = "forward_cpu.safetensors" in f.read()
        new = torch.load({str(tmp_path / "new.pt")!r}, weights_only=True)
        package.load_weights(new)
        results["new"] = (package.forward(x) - eager({str(tmp_path / "new.pt")!r})).abs().max().item()
        new["0.weight"].zero_()  # load_weights copied: the model keeps what it was given
        results["copied"] = (package.forward(x) - eager({str(tmp_path / "new.pt")!r})).abs().max().item()
        package.load_weights({str(tmp_path / "new.pt")!r})
        results["from_path"] = (package.forward(x) - eager({str(tmp_path / "new.pt")!r})).abs().max().item()
        package.load_weights(package.__path__[0] + "/forward_cpu.safetensors")
        results["own_file"] = (package.forward(x) - eager({str(spec.parent / "weights.pt")!r})).abs().max().item()
        good = torch.load({str(tmp_path / "new.pt")!r}, weights_only=True)
        results["shape"] = error({{**good, "2.weight": torch.zeros(64, 63)}})
        results["dtype"] = error({{**good, "2.bias": torch.zeros(64, dtype=torch.float64)}})
        results["missing"] = error({{k: v for k, v in good.items() if k != "3.bias"}})
        results["unknown"] = error({{**good, "head.weight": torch.zeros(1)}})
        results["graph"] = error({str(tmp_path / "nope.pt")!r}) is not None
        results["after_errors"] = (package.forward(x) - eager({str(spec.parent / "weights.pt")!r})).abs().max().item()
    """,
        tmp_path,
    )
    assert results["built"] < 1e-5 and results["mapped"]
    assert (
        results["new"] < 1e-5
        and results["copied"] < 1e-5
        and results["from_path"] < 1e-5
        and results["own_file"] < 1e-5
    )
    assert (
        results["shape"]
        == "WeightsError: graph forward: weight '2.weight' is float32[64, 63], the compiled model's is float32[64, 64]"
    )
    assert (
        results["dtype"]
        == "WeightsError: graph forward: weight '2.bias' is float64[64], the compiled model's is float32[64]"
    )
    assert results["missing"] == "WeightsError: graph forward: weight '3.bias' is missing"
    assert results["unknown"] == "WeightsError: head.weight: not weights of the compiled model"
    assert results["graph"]
    assert results["after_errors"] < 1e-5  # a refused load leaves the weights as they were


def test_cpp_package_loads_a_state_dict_with_the_same_checks(
    unfrozen: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    """The C++ package of the same build takes a safetensors state dict (load_weights(path)), checked as in Python."""
    _, summary = unfrozen
    program = pkg_config_program(Path(summary["cpp_prefix"]), "unfrozen", tmp_path / "run_graph")
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(3))
    model = layers().eval()
    model.load_state_dict(weights(1))
    write_safetensors(tmp_path / "new.safetensors", weights(1))
    done = run_graph(program, "forward", [x], tmp_path, "--weights", str(tmp_path / "new.safetensors"))
    assert done.returncode == 0, done.stderr
    with torch.no_grad():
        torch.testing.assert_close(read_tensors(tmp_path / "out.bin"), [model(x)], rtol=1e-5, atol=1e-5)

    for edit, message in (
        (
            {"2.weight": torch.zeros(64, 63)},
            "weight '2.weight' is float32[64, 63], the compiled model's is float32[64, 64]",
        ),
        ({"3.bias": None}, "weight '3.bias' is missing"),
    ):
        state = {k: v for k, v in {**weights(1), **edit}.items() if v is not None}
        write_safetensors(tmp_path / "bad.safetensors", state)
        done = run_graph(program, "forward", [x], tmp_path, "--weights", str(tmp_path / "bad.safetensors"))
        assert done.returncode == 3 and message in done.stderr, done.stderr


def test_calls_in_flight_finish_on_the_weights_they_started_with(
    unfrozen: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    _, summary = unfrozen
    results = run(
        summary,
        """
        import threading
        a = {k: v.clone() for k, v in model.state_dict().items()}
        b = {k: v * 1.5 for k, v in a.items()}
        big = torch.randn(32, 64, generator=torch.Generator().manual_seed(5))
        package.load_weights(a); out_a = package.forward(big)
        package.load_weights(b); out_b = package.forward(big)
        bad, calls, stop = [], [0], threading.Event()

        def caller():
            while not stop.is_set():
                try:
                    out = package.forward(big)
                except Exception as exc:  # counted, not lost with the thread
                    bad.append(repr(exc))
                    return
                calls[0] += 1
                if not (torch.equal(out, out_a) or torch.equal(out, out_b)):
                    bad.append((out - out_a).abs().max().item())

        threads = [threading.Thread(target=caller) for _ in range(2)]
        for t in threads:
            t.start()
        for i in range(200):
            package.load_weights(a if i % 2 else b)
        stop.set()
        for t in threads:
            t.join()
        results.update(bad=len(bad), calls=calls[0], differ=not torch.equal(out_a, out_b))
    """,
        tmp_path,
    )
    assert results["differ"] and results["calls"] > 0
    assert results["bad"] == 0, f"{results['bad']} of {results['calls']} calls saw neither the old nor the new weights"


def test_a_new_checkpoint_rebuilds_only_the_weights(unfrozen: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    spec, first = unfrozen
    # The generated project's weights file: a build with nothing changed leaves it as it is, a new checkpoint writes it.
    project_file = Path(first["package_dir"]).parent / "project" / "src" / "forward_cpu" / "forward_cpu.safetensors"
    written = project_file.stat().st_mtime_ns
    same = build_json(spec, spec.parent / "out")
    assert project_file.stat().st_mtime_ns == written and "package" in same["skipped"]
    before = project_file.read_bytes()
    torch.save(weights(2), spec.parent / "weights.pt")
    try:
        again = build_json(spec, spec.parent / "out")
        assert project_file.read_bytes() != before
        assert "codegen:forward_cpu" in again["skipped"] and "weights" in again["stages"]
        assert again["compiled_units"]["done"] == 0
        results = run(
            again,
            f'results["err"] = (package.forward(x) - eager({str(spec.parent / "weights.pt")!r})).abs().max().item()',
            tmp_path,
        )
        assert results["err"] < 1e-5
    finally:
        torch.save(weights(0), spec.parent / "weights.pt")


def test_with_freezing_a_state_dict_refits_the_folded_constants_as_a_rebuild_computes_them(tmp_path: Path) -> None:
    """Freezing folds the batch norm and packs the linear weights at build time; load_weights(state dict) computes
    them again from the new weights: the outputs equal eager's, and bit for bit those of a build made with the new
    weights (the same code; its weights file loaded). The build after a new checkpoint does the same (no codegen, no
    compile), and its wheel is byte for byte that of a fresh build."""
    spec = project(tmp_path / "frozen", "frozen", "")
    built = build_json(spec, tmp_path / "out")
    snapshot = tmp_path / "first"
    subprocess.run(["cp", "-r", built["package_dir"], str(snapshot)], check=True)
    torch.save(weights(4), spec.parent / "weights.pt")
    rebuilt = build_json(spec, tmp_path / "out")
    assert "codegen:forward_cpu (weights refitted)" in rebuilt["skipped"] and "codegen" not in rebuilt["stages"]
    assert rebuilt["compiled_units"]["done"] == 0
    # The code passed the check at batch 1, 4 and 32 in the first build; with new weights it runs at the example.
    assert [c.rpartition(" at ")[2] for c in rebuilt["verified"]["cases"]] == ["example (batch=4)"], rebuilt["verified"]
    assert len(built["verified"]["cases"]) == len(rebuilt["verified"]["settled"]) + 1 == 3
    fresh = build_json(spec, tmp_path / "fresh")
    assert "codegen" in fresh["stages"] and len(fresh["verified"]["cases"]) == 3
    assert Path(fresh["wheel"]).read_bytes() == Path(rebuilt["wheel"]).read_bytes()
    new_file = Path(rebuilt["package_dir"]) / "frozen" / "forward_cpu.safetensors"
    new = str(spec.parent / "weights.pt")
    results = run(
        {**built, "package_dir": str(snapshot)},
        f"""
        state = torch.load({new!r}, weights_only=True)
        results["before"] = (package.forward(x) - eager({new!r})).abs().max().item()
        package.load_weights(state)
        refit = package.forward(x)
        results["refit"] = (refit - eager({new!r})).abs().max().item()
        package.load_weights({str(new_file)!r})
        results["same_as_rebuilt"] = torch.equal(refit, package.forward(x))
        results["no_weight"] = error({{k: v for k, v in state.items() if k != "0.weight"}})
        results["wrong_shape"] = error({{**state, "2.weight": torch.ones(3)}})
    """,
        tmp_path,
    )
    assert results["before"] > 1e-2 and results["refit"] < 1e-5
    assert results["same_as_rebuilt"]
    assert results["no_weight"] == (
        "WeightsError: graph forward: weight '0.weight' is missing (the build computed constants from it, and "
        "computes them again from the new weights)"
    )
    assert results["wrong_shape"] == (
        "WeightsError: graph forward: weight '2.weight' is float32[3], the compiled model's is float32[64, 64]"
    )


def test_embedded_weights_are_in_the_extension_and_load_weights_works_the_same(tmp_path: Path) -> None:
    spec = project(tmp_path / "embedded", "embedded", 'freezing = false\nweights = "embedded"')
    summary = build_json(spec, tmp_path / "out")
    assert not list(Path(summary["package_dir"]).rglob("*.safetensors"))
    torch.save(weights(1), tmp_path / "new.pt")
    results = run(
        summary,
        f"""
        results["built"] = (package.forward(x) - eager({str(spec.parent / "weights.pt")!r})).abs().max().item()
        package.load_weights({str(tmp_path / "new.pt")!r})
        results["new"] = (package.forward(x) - eager({str(tmp_path / "new.pt")!r})).abs().max().item()
        good = torch.load({str(tmp_path / "new.pt")!r}, weights_only=True)
        results["partial"] = error({{k: v for k, v in good.items() if k != "3.bias"}})
        results["buffer_kept"] = error({{k: v for k, v in good.items() if k != "4.running_mean"}})
    """,
        tmp_path,
    )
    assert results["built"] < 1e-5 and results["new"] < 1e-5
    assert results["partial"] == "WeightsError: graph forward: weight '3.bias' is missing"
    assert results["buffer_kept"] is None  # a buffer left out keeps the value compiled into the extension


def with_layout(source: Path, out: Path, layout: str) -> None:
    """A copy of an "external" weights file whose units say their weights are laid out for other compiled code."""
    data = source.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length])
    units = json.loads(header["__metadata__"]["units"])
    header["__metadata__"]["units"] = json.dumps({name: {**unit, "layout": layout} for name, unit in units.items()})
    text = json.dumps(header).encode()
    text += b" " * (-(8 + len(text)) % 64)
    out.write_bytes(struct.pack("<Q", len(text)) + text + data[8 + length :])


def test_external_weights_ship_apart_and_come_from_the_variable_or_load_weights(tmp_path: Path) -> None:
    """flags.weights = "external": neither the wheel nor the C++ package holds weights; the build writes them beside the
    wheel. The package imports without them (a call says how to give them), takes them from $EXTERNAL_WEIGHTS or
    load_weights(), and refuses a file laid out for other compiled code; a state dict is refit (freezing is on)."""
    spec = project(tmp_path / "external", "external", 'weights = "external"')
    summary = build_json(spec, tmp_path / "out")
    wheel, weights_file = Path(summary["wheel"]), Path(summary["weights_file"])
    assert weights_file.parent == wheel.parent and weights_file.name.startswith("external-0.1.0+torch")
    with zipfile.ZipFile(wheel) as zf:
        assert not [name for name in zf.namelist() if name.endswith(".safetensors")]
    with tarfile.open(summary["cpp_archive"]) as tar:
        assert not [name for name in tar.getnames() if name.endswith(".safetensors")]
    assert not list(Path(summary["package_dir"]).rglob("*.safetensors"))
    with_layout(weights_file, tmp_path / "other.safetensors", "another build's")
    built, new = str(spec.parent / "weights.pt"), str(tmp_path / "new.pt")
    torch.save(weights(1), new)
    results = run(
        summary,
        f"""
        try:
            package.forward(x)
        except RuntimeError as exc:
            results["call"] = str(exc)
        state = torch.load({new!r}, weights_only=True)
        results["partial"] = error({{k: v for k, v in state.items() if k != "4.running_mean"}})
        package.load_weights(state)
        results["refit"] = (package.forward(x) - eager({new!r})).abs().max().item()
        package.load_weights({str(weights_file)!r})
        results["file"] = (package.forward(x) - eager({built!r})).abs().max().item()
        results["other"] = error({str(tmp_path / "other.safetensors")!r})
    """,
        tmp_path,
    )
    assert results["call"] == (
        "forward(): no weights are loaded: package external was built with flags.weights = 'external' and ships none. "
        "Give it the weights file its build wrote beside the wheel: set EXTERNAL_WEIGHTS to its path before the package "
        "is imported (Python) or loaded (C++), or call external.load_weights(path) (Python), external::load(path) or "
        "load_weights(path) (C++)"
    )
    assert results["partial"] == (
        "WeightsError: graph forward: weight '4.running_mean' is missing (the package has no weights yet to keep it "
        "from)"
    )
    assert results["refit"] < 1e-5 and results["file"] < 1e-5
    assert results["other"] == (
        f"WeightsError: {tmp_path / 'other.safetensors'} does not hold the weights of this package's graphs as they "
        "were built (forward_cpu: its weights are laid out for other compiled code (another build, spec or shimgen)): "
        "it comes from a build of another model, or with other flags or code"
    )
    code = f'results["err"] = (package.forward(x) - eager({built!r})).abs().max().item()'
    assert run(summary, code, tmp_path, {"EXTERNAL_WEIGHTS": str(weights_file)})["err"] < 1e-5
    refused = subprocess.run(
        [sys.executable, "-c", RUN, summary["package_dir"], "external", code],
        capture_output=True,
        text=True,
        env={**os.environ, "EXTERNAL_WEIGHTS": str(tmp_path / "other.safetensors")},
    )
    assert refused.returncode == 1
    assert (
        refused.stderr.strip()
        .splitlines()[-1]
        .startswith(
            f"ImportError: EXTERNAL_WEIGHTS={tmp_path / 'other.safetensors'}: {tmp_path / 'other.safetensors'} does not "
            "hold the weights"
        )
    )
