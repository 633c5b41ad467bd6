"""Bad specs: one line naming file and key path, exit code 2, no traceback."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from shimgen.cli import main
from shimgen.toolchain.cuda import CudaToolchain, detect_cuda

GOOD_GRAPH = """
[[graph]]
name = "forward"
entry = "models.mlp:mlp"
inputs = [{ name = "x", shape = ["batch", 32] }]
dims = { batch = { min = 1, max = 8 } }
"""
PROJECT = '[project]\nname = "demo"\n'
DTYPES = "float32, float64, float16, bfloat16, int64, int32, int16, int8, uint8, bool"

CASES = [
    ("toml syntax", "[project\nname = 1", "not valid TOML: Expected ']' at the end of a table declaration (at line 1, column 9)"),
    ("unknown key", PROJECT + GOOD_GRAPH.replace("name = \"forward\"", "nmae = \"forward\""), "graph[0].nmae: unknown key (did you mean 'name'?)"),
    ("unknown table", PROJECT + GOOD_GRAPH + "[flag]\nsplit = 1\n", "flag: unknown key (did you mean 'flags'?)"),
    ("wrong type", '[project]\nname = "demo"\nversion = 1\n' + GOOD_GRAPH, "project.version: expected a string, got an integer (1)"),
    ("bad dtype", PROJECT + GOOD_GRAPH.replace('shape = ["batch", 32] }', 'shape = ["batch", 32], dtype = "float33" }'),
     f"graph[0].inputs[0].dtype: 'float33' is not a dtype (expected one of: {DTYPES})"),
    ("missing key", PROJECT + GOOD_GRAPH.replace('entry = "models.mlp:mlp"\n', ""), "graph[0].entry: missing required key"),
    ("name not identifier", '[project]\nname = "my-model"\n' + GOOD_GRAPH, "project.name: 'my-model' is not a valid Python identifier"),
    ("name escapes out dir", '[project]\nname = "../../etc"\n' + GOOD_GRAPH, "project.name: '../../etc' is not a valid Python identifier"),
    ("graph name escapes", PROJECT + GOOD_GRAPH.replace('name = "forward"', 'name = "a/b"'), "graph[0].name: 'a/b' is not a valid Python identifier"),
    ("reserved graph name", PROJECT + GOOD_GRAPH.replace('name = "forward"', 'name = "_hidden"'), "graph[0].name: '_hidden' is reserved (no leading underscore, not 'torch')"),
    ("duplicate graph", PROJECT + GOOD_GRAPH + GOOD_GRAPH, "graph[1].name: graph name 'forward' is used twice"),
    ("unknown dim", PROJECT + GOOD_GRAPH.replace('["batch", 32]', '["btach", 32]'), "graph[0].inputs[0].shape[0]: 'btach' is not a dim of this graph (dims: batch)"),
    ("dim range", PROJECT + GOOD_GRAPH.replace("min = 1, max = 8", "min = 9, max = 8"), "graph[0].dims.batch.max: max 8 is below min 9"),
    ("entry syntax", PROJECT + GOOD_GRAPH.replace("models.mlp:mlp", "models/mlp.py"), "graph[0].entry: 'models/mlp.py' is not 'package.module:callable'"),
    ("tma on cpu", PROJECT + GOOD_GRAPH + "[flags]\ntma = true\n", 'flags.tma: tma applies to cuda targets only; add a [[target]] with device = "cuda"'),
    ("tma before hopper", PROJECT + GOOD_GRAPH + '[[target]]\ndevice = "cuda"\narchs = ["sm_80", "sm_90"]\n[flags]\ntma = true\n',
     "flags.tma: TMA needs Hopper or newer (sm_90+); the cuda target lists sm_80"),
    ("cuda graphs dynamic", PROJECT + GOOD_GRAPH + '[[target]]\ndevice = "cuda"\narchs = ["sm_90"]\n[flags]\ncuda_graphs = true\n',
     "flags.cuda_graphs: CUDA graphs replay one static shape; graph[0] 'forward' has dynamic dims (batch)"),
    ("arch twice", PROJECT + GOOD_GRAPH + '[[target]]\ndevice = "cuda"\narchs = ["sm_90", "sm_90"]\n', "target[0].archs[1]: 'sm_90' is listed twice"),
    ("bad arch", PROJECT + GOOD_GRAPH + '[[target]]\ndevice = "cuda"\narchs = ["hopper"]\n', "target[0].archs[0]: 'hopper' is not a CUDA arch such as 'sm_90'"),
    ("isa on cuda", PROJECT + GOOD_GRAPH + '[[target]]\ndevice = "cuda"\nisa = "avx2"\narchs = ["sm_90"]\n', "target[0].isa: isa applies to cpu targets only"),
    ("bad isa", PROJECT + GOOD_GRAPH + '[[target]]\ndevice = "cpu"\nisa = "sse9"\n', "target[0].isa: 'sse9' is not a valid isa (expected one of: native, avx2, avx512, default)"),
    ("custom op", PROJECT + GOOD_GRAPH + '[[custom_op]]\nname = "mylib::gelu"\n', "custom_op: custom ops are not yet supported (they come with the custom-ops work)"),
    ("no module", PROJECT + GOOD_GRAPH.replace("models.mlp:mlp", "nowhere.model:build"), "graph[0].entry: cannot import 'nowhere.model': ModuleNotFoundError: No module named 'nowhere'"),
    ("no attribute", PROJECT + GOOD_GRAPH.replace("models.mlp:mlp", "models.mlp:nope"), "graph[0].entry: module 'models.mlp' has no attribute 'nope'"),
    ("module raises", PROJECT + GOOD_GRAPH.replace("models.mlp:mlp", "broken:model"), "graph[0].entry: cannot import 'broken': RuntimeError: cannot build at import (at broken.py:2)"),
    ("inputs rejected", PROJECT + GOOD_GRAPH.replace('["batch", 32]', '["batch", 31]'),
     "graph[0].inputs: the model rejected the example inputs (x=(4, 31)): RuntimeError: mat1 and mat2 shapes cannot be multiplied (4x31 and 32x32)"),
]


@pytest.mark.parametrize("text,message", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_spec(tmp_path: Path, workdir: Path, capsys: pytest.CaptureFixture[str], text: str, message: str) -> None:
    spec = workdir / "projects" / "bad.toml"
    (workdir / "projects" / "broken.py").write_text('def model(x):\n    raise RuntimeError("cannot build at import")\nmodel(None)\n')
    spec.write_text(text)
    assert main(["build", str(spec), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"shimgen: {spec}: {message}"
    assert not any("Traceback" in line for line in err)
    assert not (tmp_path / "dist").exists()


def test_missing_spec_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["build", str(tmp_path / "nope.toml")]) == 2
    assert capsys.readouterr().err.strip() == f"shimgen: {tmp_path / 'nope.toml'}: cannot read spec: No such file or directory"


def test_cli_usage_error_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["bulid"])
    assert exc.value.code == 2
    assert "invalid choice: 'bulid'" in capsys.readouterr().err


CUDA_SPEC = PROJECT + GOOD_GRAPH + '[[target]]\ndevice = "cpu"\n[[target]]\ndevice = "cuda"\narchs = ["ARCH"]\n'


def _build_error(workdir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str) -> str:
    spec = workdir / "projects" / "bad.toml"
    spec.write_text(text)
    assert main(["build", str(spec), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert not any("Traceback" in line for line in err)
    assert not (tmp_path / "dist").exists()
    return err[-1].removeprefix(f"shimgen: {spec}: ")


@pytest.mark.skipif(shutil.which("nvcc") is None and not Path("/usr/local/cuda/bin/nvcc").exists(), reason="needs nvcc to list its archs")
def test_arch_nvcc_cannot_target(tmp_path: Path, workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cuda = detect_cuda()
    message = _build_error(workdir, tmp_path, capsys, CUDA_SPEC.replace("ARCH", "sm_20"))
    assert message == f"target[1].archs[0]: nvcc {cuda.version} ({cuda.nvcc}) cannot target sm_20; it can target {', '.join(cuda.codes)}"


def test_nvcc_missing(tmp_path: Path, workdir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NVCC", str(tmp_path / "no-nvcc"))
    message = _build_error(workdir, tmp_path, capsys, CUDA_SPEC.replace("ARCH", "sm_90"))
    assert message == f"target[1]: NVCC={tmp_path / 'no-nvcc'} is not an executable; point it at nvcc or unset it"


@pytest.mark.skipif(shutil.which("nvcc") is None and not Path("/usr/local/cuda/bin/nvcc").exists(), reason="needs nvcc, to get past the arch check")
@pytest.mark.skipif(torch.version.cuda is not None, reason="needs a CPU-only torch")
def test_cuda_target_with_cpu_torch(tmp_path: Path, workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    message = _build_error(workdir, tmp_path, capsys, CUDA_SPEC.replace("ARCH", "sm_90"))
    torch_dir = Path(torch.__file__).parent
    assert message == f"target[1]: the installed torch at {torch_dir} has no CUDA support; cuda targets need a CUDA build of torch"


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_cuda_build_without_gpu(tmp_path: Path, workdir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A CUDA build of torch and nvcc, but no GPU (a CPU-only CI runner, say): stands in for both."""
    import shimgen.pipeline

    monkeypatch.setattr(shimgen.pipeline, "detect_cuda", lambda: CudaToolchain("/usr/bin/nvcc", "13.0", ("sm_90",)))
    monkeypatch.setattr(shimgen.pipeline, "torch_cuda_version", lambda: "13.0")
    message = _build_error(workdir, tmp_path, capsys, PROJECT + GOOD_GRAPH + '[[target]]\ndevice = "cuda"\narchs = ["sm_90"]\n')
    assert message == ("target[0]: building for cuda needs a GPU on this machine (Inductor tunes and compiles the Triton kernels on it); "
                       "torch sees none")
