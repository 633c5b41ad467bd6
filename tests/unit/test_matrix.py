"""`shimgen matrix`: one build identifier per CI job; `--only` builds one of them and refuses an environment that
cannot; the supported torch range is enforced."""

from __future__ import annotations

import json
import re
import sys
import zipfile
from pathlib import Path

import torch
from conftest import edited, shimgen

RUNNING = f"cp{sys.version_info.major}{sys.version_info.minor}-torch{torch.__version__.split('+')[0]}"

SPEC = """
[project]
name = "mx"
[[graph]]
name = "f"
entry = "models.mlp:mlp"
inputs = [{ name = "x", shape = [2, 32] }]
[[target]]
device = "cpu"
[[target]]
device = "cuda"
archs = ["sm_80", "sm_90"]
[matrix]
torch = ["2.13.0", "2.14.1"]
python = ["3.11", "3.12"]
cuda = ["13.0"]
"""


def test_identifiers_are_target_x_torch_x_python_x_cuda(tmp_path: Path) -> None:
    spec = tmp_path / "mx.toml"
    spec.write_text(SPEC)
    listed = shimgen("matrix", spec)
    assert listed.returncode == 0, listed.stderr
    ids = listed.stdout.split()
    jobs = json.loads(shimgen("matrix", spec, "--json").stdout)
    assert [job["identifier"] for job in jobs] == ids
    assert len(ids) == len(set(ids)) == 2 * 2 * 2  # two targets, two torch, two Python, one CUDA
    for job in jobs:
        expected = f"cp{job['python'].replace('.', '')}-torch{job['torch']}-" + (
            "cpu-native" if job["device"] == "cpu" else f"cu{job['cuda'].replace('.', '')}-sm_80-sm_90"
        )
        assert job["identifier"] == expected
    assert {(j["python"], j["torch"]) for j in jobs} == {(p, t) for p in ("3.11", "3.12") for t in ("2.13.0", "2.14.1")}


def test_defaults_are_the_running_python_and_torch(workdir: Path) -> None:
    listed = shimgen("matrix", workdir / "projects" / "resnet.toml")
    assert listed.stdout.split() == [f"{RUNNING}-cpu-native"]


def test_only_refuses_an_identifier_this_environment_cannot_build(tmp_path: Path) -> None:
    spec = tmp_path / "mx.toml"
    spec.write_text(
        edited(
            SPEC,
            'torch = ["2.13.0", "2.14.1"]',
            'torch = ["2.13.0", "2.14.1", "' + torch.__version__.split("+")[0] + '"]',
        )
        if torch.__version__.split("+")[0] not in ("2.13.0", "2.14.1")
        else SPEC
    )
    other = "2.14.1" if torch.__version__.startswith("2.13") else "2.13.0"
    wanted = f"cp{sys.version_info.major}{sys.version_info.minor}-torch{other}-cpu-native"
    refused = shimgen("build", spec, "--only", wanted, "--out", tmp_path)
    assert refused.returncode == 2
    assert (
        f"--only {wanted} builds with torch {other}; this environment has torch {torch.__version__.split('+')[0]}"
        in refused.stderr
    )
    unknown = shimgen("build", spec, "--only", "cp27-nothing", "--out", tmp_path)
    assert unknown.returncode == 2
    assert "no build identifier of the spec matches" in unknown.stderr and wanted in unknown.stderr
    assert not (tmp_path / "build").exists()


def test_torch_outside_the_supported_range_is_refused(tmp_path: Path) -> None:
    spec = tmp_path / "mx.toml"
    spec.write_text(edited(SPEC, '"2.14.1"]', '"2.10.0"]'))
    refused = shimgen("matrix", spec)
    assert refused.returncode == 2
    assert re.search(
        r"matrix\.torch\[1\]: torch 2\.10\.0 is outside the range this shimgen supports \(.*>=2\.11.*\)", refused.stderr
    )


def test_a_version_with_a_local_label_is_refused(tmp_path: Path) -> None:
    spec = tmp_path / "mx.toml"
    spec.write_text(edited(SPEC, 'name = "mx"', 'name = "mx"\nversion = "1.0+mine"'))
    refused = shimgen("matrix", spec)
    assert refused.returncode == 2 and "project.version: '1.0+mine' has a local label" in refused.stderr


def test_merge_refuses_wheels_that_are_not_one_package_s_targets(built_mlp: dict, tmp_path: Path) -> None:
    """The joining itself needs a cpu and a cuda wheel (test_cuda.py); here: what merge refuses, with the reason."""
    wheel = Path(built_mlp["wheel"])
    alone = shimgen("merge", wheel, "--out", tmp_path)
    assert alone.returncode == 2 and "name two or more wheels" in alone.stderr
    twice = shimgen("merge", wheel, wheel, "--out", tmp_path)
    assert twice.returncode == 2 and "two wheels hold a cpu target" in twice.stderr
    foreign = tmp_path / "other-1.0-py3-none-any.whl"
    with zipfile.ZipFile(foreign, "w") as zf:
        zf.writestr("other/__init__.py", "")
    refused = shimgen("merge", wheel, foreign, "--out", tmp_path)
    assert refused.returncode == 2 and "other-1.0-py3-none-any.whl was not built by this shimgen" in refused.stderr
    assert not list(tmp_path.glob("mlp-*.whl"))
