"""`shimgen report`'s data: read from the session's mlp build (built_mlp), never building again."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from shimgen.commands import matrix, report
from shimgen.errors import UserError
from shimgen.spec import load_spec

COLLECT = (
    "import json, sys; from pathlib import Path; from shimgen.commands import report; "
    "r = report.collect(Path(sys.argv[1]), Path(sys.argv[2]), None); assert 'torch' not in sys.modules; print(json.dumps(r))"
)


def test_report_lists_what_the_build_made(built_mlp: dict[str, Any], workdir: Path) -> None:
    spec = workdir / "projects" / "mlp.toml"
    data = report.collect(spec, workdir, None)
    unit = data["units"]["forward_cpu"]
    codegen = workdir / "build" / "mlp" / "codegen" / "forward_cpu"

    inductor = [k for k in unit["kernels"] if k["kind"].startswith("Inductor C++")]
    assert inductor, unit["kernels"]
    for k in inductor:
        source = Path(k["source"])
        assert source.parent == codegen and source.name.startswith("kernels_")
        assert k["name"] in source.read_text().splitlines()[k["line"] - 1] and k["calls"] >= 1
    assert sum(k["calls"] for k in unit["kernels"]) >= 8  # 8 Linear layers: Inductor's GEMM template or oneDNN's
    assert all(Path(k["source"]).is_file() for k in unit["kernels"])

    # At 4 rows the Linear layers took their kernel untimed (kernel_choice.untimed_kernel): nothing in the lockfile.
    # test_shared_cache's lockfile test reports choices that were timed.
    assert unit["untimed_gemms"] == built_mlp["untimed_gemms"]["forward_cpu"] and unit["kernel_choices"] == []

    steps = {s["name"]: s for s in unit["translation_units"]}
    for source in [*codegen.glob("kernels_*.cpp"), codegen / "model.cpp"]:
        assert steps[f"src_forward_cpu_{source.name}"]["step"] == "compile"
    assert all(isinstance(s["seconds"], float) and s["seconds"] >= 0 for s in steps.values())

    extension, weights, wheel = unit["sizes"]["extension"], unit["sizes"]["weights"], data["wheel"]
    assert Path(extension["path"]).parent == Path(built_mlp["package_dir"]) / "mlp"
    assert steps[Path(extension["path"]).name]["step"] == "link"
    assert (
        weights["path"] == str(codegen / "weights.safetensors") and wheel["path"] == built_mlp["wheel"]
    )  # flags.weights = "file"
    for sized in (extension, weights, wheel):
        assert sized["bytes"] == Path(sized["path"]).stat().st_size > 0

    # The JSON form is the same data, and collecting it imports no torch.
    run = subprocess.run([sys.executable, "-c", COLLECT, str(spec), str(workdir)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == data
    shown = report.text(data)
    assert all(k["name"] in shown for k in unit["kernels"]) and "src_forward_cpu_model.cpp" in shown
    assert "    template 4x32 @ 32x32 x8" in shown.splitlines()


def test_report_of_a_spec_never_built(workdir: Path, tmp_path: Path) -> None:
    spec = workdir / "projects" / "mlp.toml"
    root = tmp_path.resolve() / "build" / "mlp"
    message = f"nothing built for mlp under {root}; run shimgen build first"
    with pytest.raises(UserError, match=f"^{re.escape(message)}$"):
        report.collect(spec, tmp_path, None)

    # Built with --only alone: the error says so; that build's report says what it lacks.
    identifier = matrix.identifiers(load_spec(spec))[0].identifier
    with pytest.raises(UserError, match=re.escape(f"under {root / identifier};")):
        report.collect(spec, tmp_path, identifier)
    (root / identifier).mkdir(parents=True)
    (root / identifier / "state.json").write_text("{}")
    with pytest.raises(UserError, match=re.escape(f"built with --only: {identifier}")):
        report.collect(spec, tmp_path, None)
    unit = report.collect(spec, tmp_path, identifier)["units"]["forward_cpu"]
    assert not unit["generated"] and unit["kernels"] == [] and unit["sizes"] == {"extension": None, "weights": None}
