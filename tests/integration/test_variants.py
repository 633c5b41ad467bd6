"""Shape-specialized variants (dims.<name>.specialize): static code for the sizes a spec names inside the dynamic
package,
picked by the binding per call, sharing the weights file, and rebuilt one variant at a time."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import build_json, shimgen, spec_of_its_own
from cpp_program import pkg_config_program, run_graph

pytestmark = pytest.mark.slow

MODEL = """
import torch


def mlp(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 16),
    torch.nn.LayerNorm(16)).eval()
"""

# Each call's model (its variant's label, "" for the dynamic one) and its largest difference from eager, for batch sizes
# from argv; then the same after load_weights of the model made with seed 1.
RUN = """
import json, sys, torch
sys.path.insert(0, sys.argv[1])
sys.path.insert(0, sys.argv[2])
package = __import__(sys.argv[3])
from vmodel import mlp
from importlib import import_module
extension = import_module(sys.argv[3] + "._forward_cpu")
results = {"doc": package.forward.__doc__, "calls": {}, "after_load": {}, "outputs": {}}

def calls(model, into):
    for batch in json.loads(sys.argv[4]):
        x = torch.randn(batch, 64, generator=torch.Generator().manual_seed(batch))
        with torch.no_grad():
            got = package.forward(x)
            into[batch] = [extension._variant_forward(x), (got - model(x)).abs().max().item()]
        results["outputs"].setdefault(batch, got.tolist())

calls(mlp(0), results["calls"])
package.load_weights(mlp(1).state_dict())
calls(mlp(1), results["after_load"])
print(json.dumps(results))
"""


def project(root: Path, sizes: list[int]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "vmodel.py").write_text(MODEL)
    spec = root / "variants.toml"
    spec.write_text(
        textwrap.dedent(f"""
        [project]
        name = "variants"

        [[graph]]
        name = "forward"
        entry = "vmodel:mlp"
        inputs = [{{ name = "x", shape = ["batch", 64] }}]
        dims = {{ batch = {{ min = 1, max = 32, example = 4, specialize = {sizes} }} }}

        [flags]
        freezing = false
        gemm_autotune = false
        kernel_opt = "O1"
        split = 1
    """)
    )
    return spec


def run(summary: dict[str, Any], spec: Path, batches: list[int]) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", RUN, summary["package_dir"], str(spec.parent), summary["name"], json.dumps(batches)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def ran(summary: dict[str, Any], stage: str) -> set[str]:
    return {event["unit"] for event in summary["timeline"] if event["stage"] == stage}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    root = tmp_path_factory.mktemp("variants")
    spec = project(root, [1, 8])
    return spec, build_json(spec, root / "out")


def test_calls_at_a_specialized_size_run_its_variant_and_all_sizes_match_eager(
    built: tuple[Path, dict[str, Any]],
) -> None:
    spec, summary = built
    results = run(summary, spec, [1, 2, 8, 9, 32])
    assert {int(b): label for b, (label, _) in results["calls"].items()} == {
        1: "batch=1",
        2: "",
        8: "batch=8",
        9: "",
        32: "",
    }
    assert all(error < 1e-5 for _, error in results["calls"].values()), results["calls"]
    # load_weights reaches every model: the dynamic one and each variant
    assert all(error < 1e-5 for _, error in results["after_load"].values()), results["after_load"]
    assert "batch: 1..32, specialized for 1, 8" in results["doc"] and "batch=1; batch=8" in results["doc"]
    package = Path(summary["package_dir"]) / "variants"
    assert sorted(p.name for p in package.glob("_forward_cpu__*.so")) == [
        "_forward_cpu__batch1.so",
        "_forward_cpu__batch8.so",
    ]
    models = {json.dumps(m["variant"]): m for m in summary["models"]}
    assert set(models) == {"null", '{"batch": 1}', '{"batch": 8}'}
    assert all(
        m["trace"] > 0 and m["codegen"] > 0 and m["compile"] > 0 and m["library_bytes"] > 0 for m in models.values()
    )


def test_variants_share_the_weights_file(built: tuple[Path, dict[str, Any]]) -> None:
    _, summary = built
    data = (Path(summary["package_dir"]) / "variants" / "forward_cpu.safetensors").read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length])
    variants = json.loads(header["__metadata__"]["variants"])
    assert set(variants) == {"batch1", "batch8"}
    # Without freezing every constant is a weight as it is: the variants add no entry, and each maps its constants to
    # the
    # dynamic model's entries.
    entries = {name for name in header if name != "__metadata__"}
    assert entries == {
        "model.0.weight",
        "model.0.bias",
        "model.2.weight",
        "model.2.bias",
        "model.3.weight",
        "model.3.bias",
    }
    assert all(set(to_entry.values()) == entries for to_entry in variants.values())
    layers = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 16), torch.nn.LayerNorm(16))
    assert len(data) - 8 - length == sum(t.numel() * 4 for t in layers.state_dict().values())
    assert all(m["weights_bytes"] in (None, 0) for m in summary["models"])


def test_adding_or_removing_a_size_rebuilds_that_variant_alone(
    built: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    spec, summary = built
    before = run(summary, spec, [8])["outputs"]["8"]
    out = Path(summary["package_dir"]).parents[2]

    project(spec.parent, [1, 4, 8])
    added = build_json(spec, out)
    assert ran(added, "trace") == ran(added, "codegen") == {"forward_cpu__batch4"}
    compiled = {json.dumps(m["variant"]): m["compile"] for m in added["models"]}
    assert compiled['{"batch": 1}'] == compiled['{"batch": 8}'] == 0 and compiled['{"batch": 4}'] > 0
    assert run(added, spec, [4])["calls"]["4"][0] == "batch=4"

    project(spec.parent, [1, 4])
    removed = build_json(spec, out)
    assert ran(removed, "trace") == ran(removed, "codegen") == set()
    assert all(m["compile"] == 0 for m in removed["models"] if m["variant"])
    assert not (Path(removed["package_dir"]) / "variants" / "_forward_cpu__batch8.so").exists()
    results = run(removed, spec, [8])
    assert results["calls"]["8"][0] == ""
    assert torch.allclose(
        torch.tensor(results["outputs"]["8"]), torch.tensor(before), atol=1e-6
    )  # the variant and the dynamic code agree


def test_weights_derived_for_a_variant_are_stored_beside_the_shared_ones(workdir: Path, tmp_path: Path) -> None:
    """With freezing, a static convolution's weights are merged with its batch norm and packed for oneDNN at build
    time: the variant's own entries, next to the dynamic code's; `shimgen check` compares the variant with eager, and
    load_weights() computes both models' constants again from a new state dict."""
    spec = spec_of_its_own(
        workdir,
        tmp_path / "convs.toml",
        textwrap.dedent("""
        [project]
        name = "convs"

        [[graph]]
        name = "forward"
        entry = "models.convnet:ConvNet"
        inputs = [{ name = "x", shape = ["batch", 3, 32, 32] }]
        dims = { batch = { min = 1, max = 8, example = 4, specialize = [1] } }
        atol = 1e-3

        [flags]
        gemm_autotune = false
        kernel_opt = "O1"
    """),
    )
    result = shimgen("check", spec, "--out", tmp_path / "out", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert "variant batch=1" in {c["case"] for c in report["comparisons"]} and report["ok"]
    data = (tmp_path / "out" / "build" / "convs" / "site" / "convs" / "forward_cpu.safetensors").read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length])
    own = [name for name in header if name.startswith("batch1/")]
    to_entry = json.loads(header["__metadata__"]["variants"])["batch1"]
    assert own and set(own) <= set(to_entry.values())
    assert set(to_entry.values()) - set(own), "the variant shares none of the dynamic code's entries"
    # oneDNN packs a weight for the threads it will run; a call at another count repacks it at every call. Codegen
    # workers run fewer threads than a user's process (1 while GEMMs are timed): the packing runs at the default's.
    default = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
        capture_output=True,
        text=True,
        check=True,
    )
    for unit in ("forward_cpu", "forward_cpu__batch1"):
        program = json.loads((tmp_path / "out" / "build" / "convs" / "codegen" / unit / "refit.json").read_text())
        packed_at = {step["threads"] for step in program["steps"] if step["op"].startswith("mkldnn::")}
        assert packed_at == {int(default.stdout)}, unit
    other_threads = textwrap.dedent("""
        import sys, warnings, torch
        sys.path[:0] = [sys.argv[1]]
        import convs
        x = torch.randn(2, 3, 32, 32)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            convs.forward(x)
            torch.set_num_threads(int(sys.argv[2]))
            convs.forward(x)
            convs.forward(x)
        print(convs.forward.__doc__)
        print(*(str(w.message) for w in seen), sep="\\n")
    """)
    called = subprocess.run(
        [
            sys.executable,
            "-c",
            other_threads,
            str(tmp_path / "out" / "build" / "convs" / "site"),
            str(int(default.stdout) + 1),
        ],
        capture_output=True,
        text=True,
    )
    assert called.returncode == 0, called.stderr
    # Said in the docstring, and warned of once, at the first call at another count.
    assert f"oneDNN's weights are packed for {default.stdout.strip()} threads" in called.stdout
    warnings = [line for line in called.stdout.splitlines() if line.startswith("forward(): called at")]
    assert len(warnings) == 1 and f"packed for {default.stdout.strip()}:" in warnings[0], called.stdout
    # The C++ package says it once too, through c10's warning handler (stderr by default).
    program = pkg_config_program(tmp_path / "out" / "build" / "convs" / "cpp", "convs", tmp_path / "run_graph")
    x = torch.randn(2, 3, 32, 32)
    other = str(int(default.stdout) + 1)
    ran = run_graph(program, "forward", [x], tmp_path, "--repeat", "3", "--torch-threads", other)
    assert ran.returncode == 0, ran.stderr
    said = [line for line in ran.stderr.splitlines() if f"forward(): called at {other} threads" in line]
    assert len(said) == 1 and "(at::get_num_threads())" in said[0], ran.stderr
    refit = textwrap.dedent("""
        import json, sys, torch
        sys.path[:0] = [sys.argv[1], sys.argv[2]]
        import convs
        from models.convnet import ConvNet
        torch.manual_seed(5)
        model = ConvNet().eval()
        for bn in [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]:
            bn.weight.data.uniform_(0.5, 1.5); bn.bias.data.uniform_(-0.5, 0.5)
        convs.load_weights(model.state_dict())
        with torch.no_grad():
            print(json.dumps([(convs.forward(x) - model(x)).abs().max().item() for x in (torch.randn(1, 3, 32, 32), torch.randn(4, 3, 32, 32))]))
    """)
    done = subprocess.run(
        [sys.executable, "-c", refit, str(tmp_path / "out" / "build" / "convs" / "site"), str(workdir / "projects")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert max(json.loads(done.stdout)) < 1e-4
