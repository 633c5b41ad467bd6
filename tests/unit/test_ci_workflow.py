"""`shimgen ci`: the workflow is valid against GitHub's workflow schema (SchemaStore's, in tests/data: see its README),
has one job per build identifier with the right runner and torch index, embeds awkward paths as the text they are, and
its
CPU jobs' commands, run here, build a wheel."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from conftest import FAST_FLAGS, REPO, edited, shimgen, with_flags

from shimgen.commands import ci_workflow, matrix
from shimgen.errors import UserError
from shimgen.project import escape
from shimgen.spec import load_spec
from shimgen.toolchain import supported_torch

SCHEMA = json.loads((Path(__file__).parents[1] / "data" / "github-workflow.schema.json").read_text())
RUNNING_PYTHON, RUNNING_TORCH, _ = matrix.running()
# The matrix of the tests' specs: the brief's versions, plus this environment's so that one CPU job can run here.
TORCHES = [v for v in dict.fromkeys([RUNNING_TORCH, "2.13.0", "2.14.1"]) if v in supported_torch()]
PYTHONS = list(dict.fromkeys([RUNNING_PYTHON, "3.11"]))
GPU_TARGETS = '\n[[target]]\ndevice = "cpu"\n\n[[target]]\ndevice = "cuda"\narchs = ["sm_90"]\n'
EXPRESSION = re.compile(r"\$\{\{\s*matrix\.([A-Za-z_][\w-]*)\s*\}\}")


def matrix_table(cuda: bool) -> str:
    table = f"\n[matrix]\ntorch = {json.dumps(TORCHES)}\npython = {json.dumps(PYTHONS)}\n"
    return table + ('cuda = ["13.0"]\n' if cuda else "")


def write_spec(directory: Path, name: str, extra: str) -> Path:
    """projects/mlp.toml renamed, built fast (conftest.FAST_FLAGS), with `extra` (targets, [matrix]) appended."""
    directory.mkdir(parents=True, exist_ok=True)
    spec = directory / f"{name}.toml"
    text = edited(
        with_flags((REPO / "projects" / "mlp.toml").read_text(), **FAST_FLAGS), 'name = "mlp"', f'name = "{name}"'
    )
    spec.write_text(text + extra, encoding="utf-8")
    return spec


def parse(text: str) -> dict[str, Any]:
    return yaml.safe_load(text)


def job(workflow: dict[str, Any]) -> dict[str, Any]:
    (only,) = workflow["jobs"].values()
    return only


def validate(workflow: dict[str, Any]) -> None:
    jsonschema.validators.validator_for(SCHEMA)(SCHEMA).validate(workflow)


@pytest.fixture
def gpu_spec(tmp_path: Path) -> Path:
    return write_spec(tmp_path / "projects", "gpu_ci", GPU_TARGETS + matrix_table(cuda=True))


def test_cpu_and_cuda_matrix_is_a_valid_workflow_with_a_job_per_identifier(gpu_spec: Path, tmp_path: Path) -> None:
    labels = ci_workflow.runner_labels("self-hosted, linux,gpu")
    workflow = parse(ci_workflow.workflow(gpu_spec, tmp_path, labels, "shimgen==0.1.0"))
    validate(workflow)
    build = job(workflow)
    include = build["strategy"]["matrix"]["include"]
    ids = matrix.identifiers(load_spec(gpu_spec))
    assert [e["identifier"] for e in include] == [b.identifier for b in ids]
    assert {b.target.device for b in ids} == {"cpu", "cuda"}
    for entry, b in zip(include, ids, strict=True):
        assert (entry["python"], entry["torch"], entry["cuda"], entry["device"]) == (
            b.python,
            b.torch,
            b.cuda or "",
            b.target.device,
        )
        if b.cuda:
            assert entry["runner"] == ["self-hosted", "linux", "gpu"]
            assert entry["torch_index"] == f"{ci_workflow.TORCH_INDEX}/cu{b.cuda.replace('.', '')}"
        else:
            assert entry["runner"] == ci_workflow.CPU_RUNNER
            assert entry["torch_index"] == f"{ci_workflow.TORCH_INDEX}/cpu"
    assert build["runs-on"] == "${{ matrix.runner }}"
    assert build["env"]["SPEC"] == gpu_spec.relative_to(tmp_path).as_posix()
    assert build["env"]["SHIMGEN_REQUIREMENT"] == "shimgen==0.1.0"


def test_steps_install_torch_first_then_shimgen_then_build_check_and_upload(gpu_spec: Path, tmp_path: Path) -> None:
    steps = job(parse(ci_workflow.workflow(gpu_spec, tmp_path, ["gpu"], "shimgen==0.1.0")))["steps"]
    uses = [s["uses"].split("@")[0] for s in steps if "uses" in s]
    assert uses == ["actions/checkout", "actions/setup-python", "actions/upload-artifact"]
    runs = [s["run"] for s in steps if "run" in s]
    assert [r.split()[:4] for r in runs] == [["python", "-m", "pip", "install"]] * 2 + [
        ["shimgen", "build", '"$SPEC"', "--only"],
        ["shimgen", "check", '"$SPEC"', "--only"],
    ]
    assert "torch==" in runs[0] and "--index-url" in runs[0]
    assert steps[-1]["with"] == {"name": "${{ matrix.identifier }}", "path": "dist/*.whl", "if-no-files-found": "error"}


def test_resnet_spec_is_a_valid_workflow() -> None:
    spec = REPO / "projects" / "resnet.toml"
    workflow = parse(ci_workflow.workflow(spec, REPO, [], ci_workflow.default_requirement()))
    validate(workflow)
    build = job(workflow)
    assert [e["identifier"] for e in build["strategy"]["matrix"]["include"]] == [
        b.identifier for b in matrix.identifiers(load_spec(spec))
    ]
    assert build["env"]["SPEC"] == "projects/resnet.toml"


def test_a_cuda_job_needs_a_runner_label(gpu_spec: Path, tmp_path: Path) -> None:
    with pytest.raises(UserError, match="--cuda-runner"):
        ci_workflow.workflow(gpu_spec, tmp_path, ci_workflow.runner_labels(" , "), "shimgen")


def test_spec_outside_root_is_refused(gpu_spec: Path, tmp_path: Path) -> None:
    with pytest.raises(UserError, match="not under it"):
        ci_workflow.workflow(gpu_spec, tmp_path / "elsewhere", ["gpu"], "shimgen")


def test_awkward_paths_and_requirements_read_back_as_written(tmp_path: Path) -> None:
    spec = write_spec(tmp_path / "dir 'with' \"quotes\" ü: #x", "odd_ci", "")
    requirement = 'shimgen @ git+https://example.com/a"b#egg=shimgen'
    workflow = parse(ci_workflow.workflow(spec, tmp_path, [], requirement))
    validate(workflow)
    assert job(workflow)["env"]["SPEC"] == spec.relative_to(tmp_path).as_posix()
    assert job(workflow)["env"]["SHIMGEN_REQUIREMENT"] == requirement
    with pytest.raises(UserError, match="expression"):
        ci_workflow.workflow(spec, tmp_path, [], "shimgen==${{ secrets.TOKEN }}")


@pytest.mark.parametrize(
    "text",
    [
        "",
        "plain",
        "3.10",
        "on",
        "null",
        "- [a]: {b} #c &d *e !f |g >h %i @j `k",
        "q\"uo'te\\",
        "tab\there\nnew line\r\x00\x7f\x85\u2028\u2029\ufeff",
        "ünïcødé ✓ 🙂",
    ],
)
def test_yaml_filter_reads_back_as_the_text(text: str) -> None:
    assert yaml.safe_load(f"v: {escape.yaml(text)}") == {"v": text}
    assert yaml.safe_load(f"v: {escape.yaml([text, text])}") == {"v": [text, text]}
    assert json.loads(escape.yaml(text)) == text  # one JSON string, which YAML 1.2 reads as the same


def test_ci_template_refuses_unescaped_strings() -> None:
    with pytest.raises(TypeError, match="without an escaping filter"):
        ci_workflow._env().from_string("v: {{ v }}").render(v="x")


def test_default_root_is_the_git_top_directory(tmp_path: Path) -> None:
    (tmp_path / "repo" / ".git").mkdir(parents=True)
    spec = write_spec(tmp_path / "repo" / "a" / "b", "rooted", "")
    assert ci_workflow.default_root(spec) == tmp_path / "repo"
    assert (
        ci_workflow.default_output(tmp_path / "repo", spec)
        == tmp_path / "repo" / ".github" / "workflows" / "shimgen-rooted.yml"
    )


def test_cli_writes_and_prints_the_workflow(gpu_spec: Path, tmp_path: Path) -> None:
    if "invalid choice" in shimgen("ci", "--help").stderr:
        pytest.skip("cli not wired")
    expected = ci_workflow.workflow(gpu_spec, tmp_path, ["self-hosted", "gpu"], ci_workflow.default_requirement())
    printed = shimgen("ci", gpu_spec, "--root", tmp_path, "--cuda-runner", "self-hosted,gpu", "--print")
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout == expected
    written = shimgen("ci", gpu_spec, "--root", tmp_path, "--cuda-runner", "self-hosted,gpu")
    assert written.returncode == 0, written.stderr
    output = ci_workflow.default_output(tmp_path, gpu_spec)
    assert written.stdout.strip() == str(output)
    assert output.read_text() == expected
    refused = shimgen("ci", gpu_spec, "--root", tmp_path, "--cuda-runner", "", "--print")
    assert refused.returncode == 2 and "--cuda-runner" in refused.stderr


def commands(step: dict[str, Any], entry: dict[str, Any]) -> str:
    """A step's `run:` with its `${{ matrix.* }}` expressions replaced by the job's values (other expressions are a bug here)."""
    text = EXPRESSION.sub(lambda m: str(entry[m.group(1)]), step["run"])
    assert "${{" not in text, text
    return text


def job_env(build: dict[str, Any], entry: dict[str, Any]) -> dict[str, str]:
    return {k: commands({"run": str(v)}, entry) for k, v in build.get("env", {}).items()}


@pytest.mark.slow
@pytest.mark.parametrize("python", PYTHONS)
@pytest.mark.parametrize("torch", TORCHES)
def test_cpu_jobs_commands_build_locally(python: str, torch: str, tmp_path: Path) -> None:
    """The CPU job for `python` and `torch`, run here: its `run:` steps in order with its env, in bash, in a copy of
    projects/ as
    the repository. Skipped: the `uses:` steps (checkout, setup-python, upload; the upload's path glob is checked
    instead) and
    the "Install ..." steps, which install torch and shimgen into a runner: this venv has both. A job for another Python
    or
    torch than this environment's is skipped."""
    root = tmp_path / "repo"
    shutil.copytree(REPO / "projects", root / "projects", ignore=shutil.ignore_patterns("__pycache__"))
    spec = write_spec(root / "projects", "ci_mlp", matrix_table(cuda=False))
    build = job(parse(ci_workflow.workflow(spec, root, [], ci_workflow.default_requirement())))
    entry = next(
        e
        for e in build["strategy"]["matrix"]["include"]
        if (e["python"], e["torch"], e["device"]) == (python, torch, "cpu")
    )
    if (python, torch) != (RUNNING_PYTHON, RUNNING_TORCH):
        pytest.skip(
            f"{entry['identifier']} runs with Python {python} and torch {torch}; this environment has {RUNNING_PYTHON} and "
            f"{RUNNING_TORCH}"
        )
    env = {
        **os.environ,
        **job_env(build, entry),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    ran = []
    for step in build["steps"]:
        if "run" not in step or step.get("name", "").startswith("Install "):
            continue
        script = commands(step, entry)
        done = subprocess.run(
            ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, f"{script}\n{done.stderr[-4000:]}"
        ran.append(step["name"])
    assert ran == ["Build", "Check against eager"]
    upload = build["steps"][-1]
    wheels = sorted(root.glob(upload["with"]["path"]))
    assert [w.name.split("-")[0] for w in wheels] == ["ci_mlp"], wheels
