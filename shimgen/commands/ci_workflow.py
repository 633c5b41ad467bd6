"""`shimgen ci`: a GitHub Actions workflow for a spec's build matrix, one job per build identifier (`shimgen matrix`).

Each job installs its torch first, pinned, from PyTorch's index for its CPU or CUDA build, then shimgen, and runs
`shimgen build` and `shimgen check` with `--only` its identifier; the wheel is uploaded as an artifact named after it.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path
from typing import Any

import jinja2

from shimgen.commands import matrix
from shimgen.errors import UserError
from shimgen.project import escape
from shimgen.spec import load_spec

TEMPLATES = Path(__file__).parents[1] / "project" / "templates"
TEMPLATE = "ci/workflow.yml.j2"
CPU_RUNNER = "ubuntu-latest"
TORCH_INDEX = "https://download.pytorch.org/whl"


def workflow(spec_path: Path, root: Path, cuda_runner: list[str], shimgen_requirement: str) -> str:
    """The workflow's YAML text; `spec_path` is written relative to `root`, the repository's top directory."""
    spec = load_spec(spec_path)
    jobs = [_job(build, cuda_runner) for build in matrix.identifiers(spec)]
    context = {
        "name": f"shimgen {spec.project.name}",
        "spec": relative_spec(spec_path, root),
        "requirement": shimgen_requirement,
        "jobs": jobs,
    }
    _check_values(context)
    return _env().get_template(TEMPLATE).render(context)


def _job(build: matrix.BuildId, cuda_runner: list[str]) -> dict[str, Any]:
    """One `matrix.include` entry. `cuda` is '' for a CPU job: the schema of a matrix value has no null."""
    if build.cuda is None:
        return {
            "identifier": build.identifier,
            "python": build.python,
            "torch": build.torch,
            "cuda": "",
            "device": build.target.device,
            "torch_index": f"{TORCH_INDEX}/cpu",
            "runner": CPU_RUNNER,
        }
    if not cuda_runner:
        raise UserError(
            f"--cuda-runner: the spec's CUDA job {build.identifier} needs a runner with a GPU; name its label, "
            "or several separated by commas, such as self-hosted,linux,gpu"
        )
    return {
        "identifier": build.identifier,
        "python": build.python,
        "torch": build.torch,
        "cuda": build.cuda,
        "device": build.target.device,
        "torch_index": f"{TORCH_INDEX}/cu{build.cuda.replace('.', '')}",
        "runner": cuda_runner[0] if len(cuda_runner) == 1 else cuda_runner,
    }


def _check_values(value: object) -> None:
    """GitHub evaluates `${{` in any value, env included, and has no escape for it: refuse it rather than run an expression."""
    if isinstance(value, dict):
        for item in value.values():
            _check_values(item)
    elif isinstance(value, list):
        for item in value:
            _check_values(item)
    elif isinstance(value, str) and "${{" in value:
        raise UserError(f"{value!r} holds '${{{{', which GitHub would evaluate as an expression")


def _env() -> jinja2.Environment:
    """render.py's settings: every printed value must go through an escaping filter."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        finalize=escape.require_escaped,
    )
    env.filters.update(escape.FILTERS)
    return env


def relative_spec(spec_path: Path, root: Path) -> str:
    """The spec's path from the repository root, with forward slashes, as the workflow's jobs name it."""
    spec, top = spec_path.resolve(), root.resolve()
    if not spec.is_relative_to(top):
        raise UserError(
            f"--root {root}: the spec {spec_path} is not under it; the workflow runs from the repository's top directory"
        )
    text = spec.relative_to(top).as_posix()
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise UserError(f"{spec_path}: the path is not UTF-8 text; a workflow cannot name it") from None
    return text


def default_root(spec_path: Path) -> Path:
    """The git repository holding the spec (its top directory), else the current directory."""
    start = spec_path.resolve().parent
    return next((d for d in (start, *start.parents) if (d / ".git").exists()), Path.cwd())


def default_output(root: Path, spec_path: Path) -> Path:
    return root / ".github" / "workflows" / f"shimgen-{load_spec(spec_path).project.name}.yml"


def default_requirement() -> str:
    """This shimgen, pinned: the jobs build with the version that wrote the workflow."""
    try:
        version = importlib.metadata.version("shimgen")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree
        from shimgen import __version__ as version
    return f"shimgen=={version}"


def runner_labels(text: str) -> list[str]:
    """'self-hosted, linux,gpu' -> ['self-hosted', 'linux', 'gpu']; '' -> []."""
    return [label.strip() for label in text.split(",") if label.strip()]


def write(path: Path, text: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UserError(f"--output {path}: cannot write the workflow: {exc.strerror or exc}") from None
