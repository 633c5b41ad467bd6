"""What a trace depends on: every project file the model reads while it is built and traced, and
the files a spec's `depends` globs name. A build leaves the calling process as it found it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import build_json, call_in_subprocess

from shimgen.pipeline import build

MODEL = '''
from pathlib import Path

import torch


class Scaled(torch.nn.Module):
    """Its weights come from a file beside it, read when the model is built."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.load(Path(__file__).parent / "weights.pt"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale
'''

SPEC = """
[project]
name = "scaled"

[[graph]]
name = "forward"
entry = "scaled_model:Scaled"
inputs = [{ name = "x", shape = [4] }]
depends = ["tables/*.txt"]
"""


REFIT = """
import sys, torch
sys.path.insert(0, sys.argv[1])
package = __import__(sys.argv[2])
try:
    package.load_weights({"scale": torch.full((4,), 3.0)})
except Exception as exc:
    print(f"{type(exc).__name__}: {exc}")
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    (root / "tables").mkdir(parents=True)
    (root / "scaled_model.py").write_text(MODEL)
    (root / "scaled.toml").write_text(SPEC)
    torch.save(torch.full((4,), 2.0), root / "weights.pt")
    return root


def test_in_process_build_leaves_sys_path_and_modules_alone(project: Path, tmp_path: Path) -> None:
    path_before, modules_before = list(sys.path), set(sys.modules)
    build(project / "scaled.toml", tmp_path / "out")
    # Libraries may append to sys.path when first imported (setuptools does); shimgen puts the spec's directory first.
    assert sys.path[: len(path_before)] == path_before and str(project) not in sys.path
    assert "scaled_model" not in sys.modules
    assert not [name for name in set(sys.modules) - modules_before if "scaled" in name]


def test_weights_file_and_declared_files_retrace(project: Path, tmp_path: Path) -> None:
    spec, out, x = project / "scaled.toml", tmp_path / "out", torch.arange(4.0)
    first = build_json(spec, out)
    torch.testing.assert_close(call_in_subprocess(first, "forward", tmp_path, x), x * 2)
    # Inductor writes the uniform scale into the kernel: a new value needs the rebuild below, not load_weights().
    refused = subprocess.run(
        [sys.executable, "-c", REFIT, first["package_dir"], first["name"]], capture_output=True, text=True, check=True
    )
    assert refused.stdout.strip() == (
        "WeightsError: graph forward: weight 'scale' cannot change without a rebuild: the build read its value while "
        "compiling the model (Inductor may have written it into the kernels, as it does for a tensor of one repeated "
        "value)"
    )

    assert "trace:forward_cpu" in build_json(spec, out)["skipped"]

    torch.save(torch.full((4,), 3.0), project / "weights.pt")  # read through torch.load: found without `depends`
    changed = build_json(spec, out)
    assert "trace:forward_cpu" not in changed["skipped"] and "trace" in changed["stages"]
    torch.testing.assert_close(call_in_subprocess(changed, "forward", tmp_path, x), x * 3)

    (project / "tables" / "vocab.txt").write_text("a new file the model never opens, matched by `depends`")
    assert "trace:forward_cpu" not in build_json(spec, out)["skipped"]
    (project / "notes.txt").write_text("matched by nothing")
    assert "trace:forward_cpu" in build_json(spec, out)["skipped"]
