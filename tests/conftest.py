from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]


# The installed console script when there is one (CI installs shimgen), else the source tree.
SCRIPT = Path(sys.executable).with_name("shimgen")
COMMAND = [str(SCRIPT)] if SCRIPT.is_file() else [sys.executable, "-m", "shimgen"]


def shimgen(*args: str | Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the real CLI in a subprocess, as a user would."""
    return subprocess.run(
        [*COMMAND, *map(str, args)], cwd=REPO if COMMAND[0] == sys.executable else None,
        capture_output=True, text=True, env={**os.environ, **(env or {})},
    )


@pytest.fixture(scope="session")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of projects/ (specs and models) with room for build/ and dist/ beside it."""
    root = tmp_path_factory.mktemp("shimgen")
    shutil.copytree(REPO / "projects", root / "projects", ignore=shutil.ignore_patterns("__pycache__"))
    return root


def build_json(spec: Path, out: Path) -> dict[str, Any]:
    result = shimgen("build", spec, "--out", out, "--json")
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    return json.loads(result.stdout)


@pytest.fixture(scope="session")
def built_mlp(workdir: Path) -> dict[str, Any]:
    return build_json(workdir / "projects" / "mlp.toml", workdir)


@pytest.fixture(scope="session")
def built_multi(workdir: Path) -> dict[str, Any]:
    return build_json(workdir / "projects" / "multi.toml", workdir)
