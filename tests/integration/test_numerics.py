"""Models in float16 and bfloat16 build and check with the default tolerances: compiled kernels round otherwise than
eager (tolerance.py), by more than the float32 defaults allow."""

from __future__ import annotations

from pathlib import Path

import pytest

from shimgen.commands.cli import main

LOW_PRECISION_MLP = """import torch
from torch import nn


def mlp(dtype: str) -> nn.Module:
    layers = [m for _ in range(4) for m in (nn.Linear(64, 64), nn.GELU(), nn.LayerNorm(64))]
    return nn.Sequential(*layers).to(getattr(torch, dtype)).eval()
"""


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_low_precision_model_builds_and_checks_with_the_defaults(
    dtype: str, tmp_path: Path, workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (workdir / "projects" / "low_precision.py").write_text(LOW_PRECISION_MLP)
    spec = workdir / "projects" / f"mlp_{dtype}.toml"
    spec.write_text(
        f'[project]\nname = "mlp_{dtype}"\n\n[[graph]]\nname = "forward"\nentry = "low_precision:mlp"\n'
        f'kwargs = {{ dtype = "{dtype}" }}\ninputs = [{{ name = "x", shape = ["batch", 64], dtype = "{dtype}" }}]\n'
        "dims = { batch = { min = 2, max = 16, example = 8 } }\n"
    )
    assert main(["check", str(spec), "--out", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert "check: all 4 outputs match eager (forward: atol=0.0001 rtol=0.0001; " in err, err
    assert f"{dtype} outputs: atol at least" in err
