"""Bad specs: one line naming file and key path, exit code 2, no traceback."""

from __future__ import annotations

import dataclasses
import errno
import importlib.metadata
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import edited

from shimgen.commands.cli import main
from shimgen.errors import SpecError, UserError
from shimgen.spec import Graph, load_spec
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
TOKENS = (
    '[{ name = "ids", shape = ["batch", "seq"], dtype = "int64", high = 99 },'
    ' { name = "mask", shape = ["batch", "seq"], dtype = "int64", low = 1, high = 2 }]'
)
INT64 = "does not fit in 64 bits: TOML integers go from -2**63 to 2**63 - 1"


def dims(text: str) -> str:
    """The good spec with the batch dim's table replaced."""
    return PROJECT + edited(GOOD_GRAPH, "{ min = 1, max = 8 }", text)


def input_keys(text: str) -> str:
    """The good spec with more keys on input x."""
    return PROJECT + edited(GOOD_GRAPH, 'shape = ["batch", 32] }', f'shape = ["batch", 32], {text} }}')


CASES = [
    (
        "toml syntax",
        "[project\nname = 1",
        "not valid TOML: Expected ']' at the end of a table declaration (at line 1, column 9)",
    ),
    (
        "unknown key",
        PROJECT + edited(GOOD_GRAPH, 'name = "forward"', 'nmae = "forward"'),
        "graph[0].nmae: unknown key (did you mean 'name'?)",
    ),
    ("unknown table", PROJECT + GOOD_GRAPH + "[flag]\nsplit = 1\n", "flag: unknown key (did you mean 'flags'?)"),
    (
        "wrong type",
        '[project]\nname = "demo"\nversion = 1\n' + GOOD_GRAPH,
        "project.version: expected a string, got an integer (1)",
    ),
    (
        "bad dtype",
        PROJECT + edited(GOOD_GRAPH, 'shape = ["batch", 32] }', 'shape = ["batch", 32], dtype = "float33" }'),
        f"graph[0].inputs[0].dtype: 'float33' is not a dtype (expected one of: {DTYPES})",
    ),
    (
        "missing key",
        PROJECT + edited(GOOD_GRAPH, 'entry = "models.mlp:mlp"\n', ""),
        "graph[0].entry: missing required key",
    ),
    (
        "name not identifier",
        '[project]\nname = "my-model"\n' + GOOD_GRAPH,
        "project.name: 'my-model' is not a valid Python identifier",
    ),
    (
        "name escapes out dir",
        '[project]\nname = "../../etc"\n' + GOOD_GRAPH,
        "project.name: '../../etc' is not a valid Python identifier",
    ),
    (
        "graph name escapes",
        PROJECT + edited(GOOD_GRAPH, 'name = "forward"', 'name = "a/b"'),
        "graph[0].name: 'a/b' is not a valid Python identifier",
    ),
    (
        "reserved graph name",
        PROJECT + edited(GOOD_GRAPH, 'name = "forward"', 'name = "_hidden"'),
        "graph[0].name: '_hidden' is reserved (no leading underscore, not 'torch')",
    ),
    ("duplicate graph", PROJECT + GOOD_GRAPH + GOOD_GRAPH, "graph[1].name: graph name 'forward' is used twice"),
    (
        "standard library name",
        edited(PROJECT, 'name = "demo"', 'name = "stat"') + GOOD_GRAPH,
        "project.name: 'stat' is a module of Python's standard library: the package could not be imported",
    ),
    (
        "unknown dim",
        PROJECT + edited(GOOD_GRAPH, '["batch", 32]', '["btach", 32]'),
        "graph[0].inputs[0].shape[0]: 'btach' is not a dim of this graph (dims: batch)",
    ),
    (
        "dim range",
        PROJECT + edited(GOOD_GRAPH, "min = 1, max = 8", "min = 9, max = 8"),
        "graph[0].dims.batch.max: max 8 is below min 9",
    ),
    (
        "entry syntax",
        PROJECT + edited(GOOD_GRAPH, "models.mlp:mlp", "models/mlp.py"),
        "graph[0].entry: 'models/mlp.py' is not 'package.module:callable'",
    ),
    (
        "tma on cpu",
        PROJECT + GOOD_GRAPH + "[flags]\ntma = true\n",
        'flags.tma: tma applies to cuda targets only; add a [[target]] with device = "cuda"',
    ),
    (
        "tma before hopper",
        PROJECT + GOOD_GRAPH + '[[target]]\ndevice = "cuda"\narchs = ["sm_80", "sm_90"]\n[flags]\ntma = true\n',
        "flags.tma: TMA needs Hopper or newer (sm_90+); the cuda target lists sm_80",
    ),
    (
        "arch twice",
        PROJECT + GOOD_GRAPH + '[[target]]\ndevice = "cuda"\narchs = ["sm_90", "sm_90"]\n',
        "target[0].archs[1]: 'sm_90' is listed twice",
    ),
    (
        "bad arch",
        PROJECT + GOOD_GRAPH + '[[target]]\ndevice = "cuda"\narchs = ["hopper"]\n',
        "target[0].archs[0]: 'hopper' is not a CUDA arch such as 'sm_90'",
    ),
    (
        "isa on cuda",
        PROJECT + GOOD_GRAPH + '[[target]]\ndevice = "cuda"\nisa = "avx2"\narchs = ["sm_90"]\n',
        "target[0].isa: isa applies to cpu targets only",
    ),
    (
        "threads on cuda",
        PROJECT + GOOD_GRAPH + '[[target]]\ndevice = "cuda"\nthreads = 4\narchs = ["sm_90"]\n',
        "target[0].threads: threads applies to cpu targets only",
    ),
    (
        "no threads",
        PROJECT + GOOD_GRAPH + '[[target]]\ndevice = "cpu"\nthreads = 0\n',
        "target[0].threads: threads must be at least 1, got 0",
    ),
    (
        "bad isa",
        PROJECT + GOOD_GRAPH + '[[target]]\ndevice = "cpu"\nisa = "sse9"\n',
        "target[0].isa: 'sse9' is not a valid isa (expected one of: native, avx2, avx512, default)",
    ),
    (
        "empty custom op",
        PROJECT + GOOD_GRAPH + "[[custom_op]]\n",
        "custom_op[0]: give `sources` (C++/CUDA files defining ops with TORCH_LIBRARY) or `module` (a Python module), or both",
    ),
    (
        "cu without cuda",
        PROJECT + GOOD_GRAPH + '[[custom_op]]\nsources = ["k.cu"]\n',
        "custom_op[0].sources[0]: 'k.cu' is CUDA: .cu sources need a [[target]] with device = \"cuda\"",
    ),
    (
        "custom op source type",
        PROJECT + GOOD_GRAPH + '[[custom_op]]\nsources = ["k.py"]\n',
        "custom_op[0].sources[0]: 'k.py' is not a C++ (.cpp, .cc, .cxx) or CUDA (.cu) source",
    ),
    (
        "custom op module name",
        PROJECT + GOOD_GRAPH + '[[custom_op]]\nmodule = "my-ops"\n',
        "custom_op[0].module: 'my-ops' is not a Python module name such as 'my_ops' or 'pkg.ops'",
    ),
    (
        "custom op module under the project's name",
        PROJECT + GOOD_GRAPH + '[[custom_op]]\nmodule = "demo.ops"\n',
        "custom_op[0].module: 'demo.ops' is under the project's name: the built package 'demo' would be imported in "
        "its place; rename the project or the module",
    ),
    (
        "no module",
        PROJECT + edited(GOOD_GRAPH, "models.mlp:mlp", "nowhere.model:build"),
        "graph[0].entry: cannot import 'nowhere.model': ModuleNotFoundError: No module named 'nowhere'",
    ),
    (
        "no attribute",
        PROJECT + edited(GOOD_GRAPH, "models.mlp:mlp", "models.mlp:nope"),
        "graph[0].entry: module 'models.mlp' has no attribute 'nope'",
    ),
    (
        "module raises",
        PROJECT + edited(GOOD_GRAPH, "models.mlp:mlp", "broken:model"),
        "graph[0].entry: cannot import 'broken': RuntimeError: cannot build at import (at broken.py:2)",
    ),
    ("empty file", "", "project: missing required key"),
    (
        "project name too long",
        f'[project]\nname = "{"p" * 101}"\n' + GOOD_GRAPH,
        "project.name: 101 characters long; at most 100 (it goes into file names)",
    ),
    (
        "graph name too long",
        PROJECT + edited(GOOD_GRAPH, 'name = "forward"', f'name = "{"g" * 240}"'),
        "graph[0].name: 240 characters long; at most 100 (it goes into file names)",
    ),
    (
        "version too long",
        f'[project]\nname = "demo"\nversion = "1{".0" * 40}"\n' + GOOD_GRAPH,
        "project.version: 81 characters long; at most 64 (it goes into file names)",
    ),
    (
        "version not pep 440",
        '[project]\nname = "demo"\nversion = "one point oh"\n' + GOOD_GRAPH,
        "project.version: 'one point oh' is not a PEP 440 version such as '1.0', '0.2.1' or '1.0rc1'",
    ),
    (
        "description two lines",
        '[project]\nname = "demo"\ndescription = """one\ntwo"""\n' + GOOD_GRAPH,
        "project.description: must be a single line of printable text (it is the wheel's Summary); it holds a line break",
    ),
    (
        "description carriage return",
        '[project]\nname = "demo"\ndescription = "one\\rtwo"\n' + GOOD_GRAPH,
        "project.description: must be a single line of printable text (it is the wheel's Summary); it holds a line break",
    ),
    (
        "description line separator",
        '[project]\nname = "demo"\ndescription = "one\\u2028two"\n' + GOOD_GRAPH,
        "project.description: must be a single line of printable text (it is the wheel's Summary); it holds a line break",
    ),
    (
        "description NUL",
        '[project]\nname = "demo"\ndescription = "one\\u0000two"\n' + GOOD_GRAPH,
        "project.description: must be a single line of printable text (it is the wheel's Summary); it holds the control character '\\x00'",
    ),
    (
        "dim max beyond torch",
        dims("{ max = 9223372036854775807 }"),
        "graph[0].dims.batch.max: max 9223372036854775807 is beyond 9223372036854775806 (2**63 - 2), "
        "the largest dim size torch.export supports (sys.maxsize - 1)",
    ),
    (
        "dim max equals min",
        dims("{ min = 4, max = 4 }"),
        "graph[0].dims.batch.max: max equals min (4): a size that never changes is static; write 4 in the input shapes instead of 'batch'",
    ),
    ("dim min zero", dims("{ min = 0, max = 8 }"), "graph[0].dims.batch.min: min must be at least 1, got 0"),
    ("dim unused", dims("{ max = 8 }, seq = { max = 4 }"), "graph[0].dims.seq: not used by any input shape"),
    (
        "negative size",
        PROJECT + edited(GOOD_GRAPH, '["batch", 32]', '["batch", -32]'),
        "graph[0].inputs[0].shape[1]: size -32 is negative",
    ),
    (
        "multiple_of zero",
        dims("{ max = 8, multiple_of = 0 }"),
        "graph[0].dims.batch.multiple_of: multiple_of must be at least 1, got 0",
    ),
    (
        "min not multiple",
        dims("{ min = 3, max = 16, multiple_of = 4 }"),
        "graph[0].dims.batch.min: min 3 is not a multiple of 4 (multiple_of); use 4",
    ),
    (
        "min not multiple, two near",
        dims("{ min = 6, max = 16, multiple_of = 4 }"),
        "graph[0].dims.batch.min: min 6 is not a multiple of 4 (multiple_of); use 4 or 8",
    ),
    (
        "max not multiple",
        dims("{ min = 4, max = 10, multiple_of = 4 }"),
        "graph[0].dims.batch.max: max 10 is not a multiple of 4 (multiple_of); use 8 or 12",
    ),
    (
        "max not multiple, above min",
        dims("{ min = 4, max = 6, multiple_of = 4 }"),
        "graph[0].dims.batch.max: max 6 is not a multiple of 4 (multiple_of); use 8",
    ),
    (
        "example not multiple",
        dims("{ min = 4, max = 16, multiple_of = 4, example = 6 }"),
        "graph[0].dims.batch.example: example 6 is not a multiple of 4 (multiple_of); use 4 or 8",
    ),
    (
        "specialize outside",
        dims("{ max = 8, specialize = [1, 9] }"),
        "graph[0].dims.batch.specialize[1]: size 9 is outside [1, 8]",
    ),
    (
        "specialize not multiple",
        dims("{ min = 4, max = 16, multiple_of = 4, specialize = [6] }"),
        "graph[0].dims.batch.specialize[0]: specialize[0] 6 is not a multiple of 4 (multiple_of); use 4 or 8",
    ),
    (
        "specialize twice",
        dims("{ max = 8, specialize = [2, 2] }"),
        "graph[0].dims.batch.specialize[1]: size 2 is listed twice",
    ),
    (
        "too many variants",
        PROJECT
        + edited(
            edited(GOOD_GRAPH, '["batch", 32]', '["batch", "width"]'),
            "{ min = 1, max = 8 }",
            "{ min = 1, max = 8, specialize = [1, 2, 3, 4, 5] }, width = { min = 1, max = 64, specialize = [8, 16, 32, 64] }",
        ),
        "graph[0].dims: 5 (batch) x 4 (width) = 20 specialized variants; at most 16 per graph, each a compiled copy of the model: list fewer sizes",
    ),
    (
        "example below 2",
        dims("{ max = 8, example = 1 }"),
        "graph[0].dims.batch.example: example 1 is below 2 (torch.export specializes sizes 0 and 1)",
    ),
    ("example outside", dims("{ max = 8, example = 9 }"), "graph[0].dims.batch.example: example 9 is outside [1, 8]"),
    (
        "default example too big",
        dims("{ max = 1099511627776 }"),
        "graph[0].dims.batch.example: the example inputs take 64 TiB (x: float32[batch=549755813888, 32]), beyond the 4 GiB shimgen "
        "allocates to trace; set dims.batch.example (now the middle of [min, max], 549755813888) to a smaller size: the package still "
        "takes every size up to max",
    ),
    (
        "example too big",
        dims("{ max = 1099511627776, example = 67108864 }"),
        "graph[0].dims.batch.example: the example inputs take 8 GiB (x: float32[batch=67108864, 32]), beyond the 4 GiB shimgen "
        "allocates to trace; set dims.batch.example to a smaller size: the package still takes every size up to max",
    ),
    (
        "static shape too big",
        PROJECT + edited(GOOD_GRAPH, '["batch", 32]', '["batch", 1000000000]'),
        "graph[0].inputs[0].shape: the example inputs take 7.5 GiB (x: float32[batch=2, 1000000000]), beyond the 4 GiB shimgen "
        "allocates to trace, even with every dim at its smallest example; make the static sizes smaller",
    ),
    ("atol nan", PROJECT + GOOD_GRAPH + "atol = nan\n", "graph[0].atol: expected a finite number, got nan"),
    ("rtol inf", PROJECT + GOOD_GRAPH + "rtol = inf\n", "graph[0].rtol: expected a finite number, got inf"),
    (
        "rtol negative",
        PROJECT + GOOD_GRAPH + "rtol = -0.5\n",
        "graph[0].rtol: tolerances must not be negative, got -0.5",
    ),
    ("low -inf", input_keys("low = -inf"), "graph[0].inputs[0].low: expected a finite number, got -inf"),
    (
        "low a boolean",
        input_keys("low = true"),
        "graph[0].inputs[0].low: expected an integer or a number, got a boolean (True)",
    ),
    (
        "int8 high",
        input_keys('dtype = "int8", high = 1000'),
        "graph[0].inputs[0].high: high 1000 is outside int8's values [-128, 127]: low >= -128, high (exclusive) <= 128",
    ),
    (
        "int64 high",
        input_keys('dtype = "int64", low = -9223372036854775808, high = 9223372036854775807'),
        "graph[0].inputs: the model rejected the example inputs (x=(4, 32)): RuntimeError: mat1 and mat2 must have the same dtype, "
        "but got Long and Float",
    ),
    (
        "int low not whole",
        input_keys('dtype = "int32", low = 0.5'),
        "graph[0].inputs[0].low: int32 inputs need a whole number, got 0.5",
    ),
    (
        "high below default low",
        input_keys('dtype = "int32", high = -5'),
        "graph[0].inputs[0].high: low 0 must be below high -5 (the other bound is the default)",
    ),
    ("low above high", input_keys("low = 2, high = 1"), "graph[0].inputs[0].low: low 2 must be below high 1"),
    (
        "bool low",
        input_keys('dtype = "bool", low = 0'),
        "graph[0].inputs[0].low: bool inputs take random true/false values; low and high do not apply",
    ),
    (
        "float16 high",
        input_keys('dtype = "float16", high = 1e6'),
        "graph[0].inputs[0].high: high 1000000.0 is outside float16's values [-65504, 65504]",
    ),
    (
        "float span",
        input_keys("low = -3e38, high = 3e38"),
        "graph[0].inputs[0].high: high - low is beyond the largest float32 (3.402823e+38), in which example values are drawn",
    ),
    (
        "kwargs nested deep",
        PROJECT + GOOD_GRAPH + "kwargs = { a = " + "[" * 100 + "]" * 100 + " }\n",
        "graph[0].kwargs.a: arrays or tables nested more than 64 levels deep",
    ),
    (
        "toml nested deep",
        PROJECT + GOOD_GRAPH + "kwargs = { a = " + "[" * 1000 + "]" * 1000 + " }\n",
        "not valid TOML: arrays or tables nested too deeply to parse",
    ),
    (
        "integer of 5000 digits",
        PROJECT + GOOD_GRAPH + "seed = " + "1" * 5000 + "\n",
        "not valid TOML: an integer has thousands of digits; TOML integers are 64-bit",
    ),
    ("split zero", PROJECT + GOOD_GRAPH + "[flags]\nsplit = 0\n", "flags.split: split must be at least 1, got 0"),
    (
        "instances huge",
        PROJECT + GOOD_GRAPH + "[runtime]\ninstances = 1000000000\n",
        "runtime.instances: instances must be from 1 to 1024, got 1000000000",
    ),
    (
        "instances zero",
        PROJECT + GOOD_GRAPH + "[runtime]\ninstances = 0\n",
        "runtime.instances: instances must be from 1 to 1024, got 0",
    ),
    (
        "kwargs the model rejects",
        PROJECT + GOOD_GRAPH + 'kwargs = { width = "wide" }\n',
        "graph[0].entry: calling 'models.mlp:mlp' with args/kwargs failed: TypeError: empty(): argument 'size' (position 1) must be "
        "tuple of ints, but found element of type str at pos 0 (at models/mlp.py:10)",
    ),
    (
        "inputs rejected",
        PROJECT + edited(GOOD_GRAPH, '["batch", 32]', '["batch", 31]'),
        "graph[0].inputs: the model rejected the example inputs (x=(4, 31)): "
        "RuntimeError: mat1 and mat2 shapes cannot be multiplied (4x31 and 32x32)",
    ),
]


@pytest.mark.parametrize("text,message", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_spec(tmp_path: Path, workdir: Path, capsys: pytest.CaptureFixture[str], text: str, message: str) -> None:
    spec = workdir / "projects" / "bad.toml"
    (workdir / "projects" / "broken.py").write_text(
        'def model(x):\n    raise RuntimeError("cannot build at import")\nmodel(None)\n'
    )
    spec.write_text(text)
    assert main(["build", str(spec), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"shimgen: {spec}: {message}"
    assert not any("Traceback" in line for line in err)
    assert not (tmp_path / "dist").exists()


def test_torchvision_ops_of_another_torch_are_named_as_the_cause(
    tmp_path: Path, workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What importing transformers or timm raises where the installed torchvision was built for another torch (as
    here: a CUDA build beside the CPU torch) gets the reason and the ways out."""
    (workdir / "projects" / "tv_ops.py").write_text('raise RuntimeError("operator torchvision::nms does not exist")\n')
    spec = workdir / "projects" / "tv_ops.toml"
    spec.write_text(PROJECT + edited(GOOD_GRAPH, "models.mlp:mlp", "tv_ops:model"))
    assert main(["build", str(spec), "--out", str(tmp_path)]) == 2
    try:
        version = importlib.metadata.version("torchvision")
    except importlib.metadata.PackageNotFoundError:
        version = "?"
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"shimgen: {spec}: graph[0].entry: cannot import 'tv_ops': RuntimeError: operator torchvision::nms does not "
        f"exist (at tv_ops.py:1). torchvision {version}'s compiled ops do not load with this torch ({torch.__version__}): "
        "it was built for another torch or CUDA. Install the torchvision release built for this torch, or uninstall "
        "torchvision (transformers and timm import it wherever it is installed)"
    )


def test_missing_spec_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["build", str(tmp_path / "nope.toml")]) == 2
    assert (
        capsys.readouterr().err.strip()
        == f"shimgen: {tmp_path / 'nope.toml'}: cannot read spec: No such file or directory"
    )


@pytest.mark.parametrize(
    "data,message",
    [
        (
            b'[project]\nname = "d\xffmo"\n',
            "not UTF-8 text (invalid byte 0xff at offset 19, line 2); save the spec as UTF-8",
        ),
        (
            '[project]\nname = "d\u00e9mo"\n'.encode("latin-1"),
            "not UTF-8 text (invalid byte 0xe9 at offset 19, line 2); save the spec as UTF-8",
        ),
        (
            b"\x7fELF\x02\x01\x01\x00" + bytes(64),
            "an ELF binary (a program or compiled extension), not a TOML spec; give the spec's .toml file, saved as UTF-8",
        ),
        (
            b"PK\x03\x04\x14\x00\x00\x00",
            "a zip archive (a wheel, or a .pt2?), not a TOML spec; give the spec's .toml file, saved as UTF-8",
        ),
        ("[project]\n".encode("utf-16"), "UTF-16 text, not a TOML spec; give the spec's .toml file, saved as UTF-8"),
        (
            b"[project]\nname = 1\x00\x01\x02",
            "a binary file (NUL byte at offset 18), not a TOML spec; give the spec's .toml file, saved as UTF-8",
        ),
    ],
    ids=["invalid byte", "latin-1", "elf", "zip", "utf-16", "nul"],
)
def test_not_utf8_or_binary(tmp_path: Path, capsys: pytest.CaptureFixture[str], data: bytes, message: str) -> None:
    spec = tmp_path / "bad.toml"
    spec.write_bytes(data)
    assert main(["build", str(spec), "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == f"shimgen: {spec}: {message}"


def test_utf8_byte_order_mark_is_read(tmp_path: Path) -> None:
    spec = tmp_path / "bom.toml"
    spec.write_bytes(b"\xef\xbb\xbf" + (PROJECT + GOOD_GRAPH).encode())
    assert load_spec(spec).project.name == "demo"


@pytest.mark.parametrize("name", [os.fsdecode(b"lat\xe9.toml"), "two\nlines.toml"], ids=["not utf-8", "newline"])
def test_spec_file_name_not_printable(tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str) -> None:
    """The name goes into generated files, which are UTF-8."""
    spec = tmp_path / name
    spec.write_text(PROJECT + GOOD_GRAPH)
    assert main(["build", str(spec), "--out", str(tmp_path)]) == 2
    message = "the file name is not printable UTF-8 text; rename the spec (the name goes into generated files)"
    assert capsys.readouterr().err.strip() == f"shimgen: {spec}: {message}".encode("utf-8", "backslashreplace").decode(
        "utf-8"
    )


def test_out_not_utf8(tmp_path: Path, workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / os.fsdecode(b"out\xe9")
    assert main(["build", str(workdir / "projects" / "mlp.toml"), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith(": the path is not UTF-8 text; choose another output directory") and err.startswith(
        "shimgen: --out "
    )


def test_spec_path_is_a_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["build", str(tmp_path), "--out", str(tmp_path)]) == 2
    assert (
        capsys.readouterr().err.strip()
        == f"shimgen: {tmp_path}: is a directory; give the spec file inside it, such as projects/mlp.toml"
    )


BIG = "100000000000000000000"


@pytest.mark.parametrize(
    "text,where",
    [
        (dims(f"{{ max = {BIG} }}"), "graph[0].dims.batch.max"),
        (dims(f"{{ max = 8, min = -{BIG} }}"), "graph[0].dims.batch.min"),
        (PROJECT + GOOD_GRAPH + f"seed = {BIG}\n", "graph[0].seed"),
        (PROJECT + edited(GOOD_GRAPH, '["batch", 32]', f'["batch", {BIG}]'), "graph[0].inputs[0].shape[1]"),
        (PROJECT + GOOD_GRAPH + f"kwargs = {{ width = {BIG} }}\n", "graph[0].kwargs.width"),
        (PROJECT + GOOD_GRAPH + f"args = [1, [2, -{BIG}]]\n", "graph[0].args[1][1]"),
        (PROJECT + GOOD_GRAPH + f"atol = {BIG}\n", "graph[0].atol"),
        (input_keys(f'dtype = "int64", high = {BIG}'), "graph[0].inputs[0].high"),
        (PROJECT + GOOD_GRAPH + f"[runtime]\ninstances = {BIG}\n", "runtime.instances"),
    ],
    ids=["dim max", "dim min", "seed", "shape", "kwargs", "args", "float key", "union key", "runtime"],
)
def test_integer_beyond_int64(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, where: str) -> None:
    """Python's TOML parser takes integers of any size; torch and the generated C++ would not."""
    spec = tmp_path / "bad.toml"
    spec.write_text(text)
    assert main(["build", str(spec), "--out", str(tmp_path)]) == 2
    value = BIG if f"-{BIG}" not in text else f"-{BIG}"
    assert capsys.readouterr().err.strip() == f"shimgen: {spec}: {where}: {value} {INT64}"
    assert not (tmp_path / "build").exists()


def test_int64_bounds_themselves_load(tmp_path: Path) -> None:
    spec = tmp_path / "edge.toml"
    spec.write_text(PROJECT + GOOD_GRAPH + "seed = 9223372036854775807\nkwargs = { a = -9223372036854775808 }\n")
    graph = load_spec(spec).graph[0]
    assert (graph.seed, graph.kwargs["a"]) == (2**63 - 1, -(2**63))


@pytest.mark.parametrize(
    "table,example",
    [
        ("{ min = 1, max = 8 }", 4),
        ("{ min = 1, max = 2 }", 2),
        ("{ min = 8, max = 64, multiple_of = 8 }", 32),
        ("{ min = 4, max = 12, multiple_of = 4 }", 8),
        ("{ min = 6, max = 9, multiple_of = 3 }", 6),
    ],
)
def test_default_example_is_a_multiple(tmp_path: Path, table: str, example: int) -> None:
    spec = tmp_path / "dims.toml"
    spec.write_text(dims(table))
    assert load_spec(spec).graph[0].dims["batch"].example == example


def test_a_range_of_one_and_two_builds_one_as_a_variant(tmp_path: Path) -> None:
    """Inductor compiles a dynamic dim for sizes of 2 and up: for [1, 2] that is the size 2 alone (a BERT built so
    failed its package check at batch 1)."""
    spec = tmp_path / "dims.toml"
    spec.write_text(dims("{ min = 1, max = 2 }"))
    assert load_spec(spec).graph[0].dims["batch"].specialize == [1]
    spec.write_text(dims("{ min = 1, max = 3 }"))
    assert load_spec(spec).graph[0].dims["batch"].specialize == []


def test_out_is_not_a_directory(tmp_path: Path, workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "file").write_text("")
    assert main(["build", str(workdir / "projects" / "mlp.toml"), "--out", str(tmp_path / "file" / "out")]) == 2
    assert (
        capsys.readouterr().err.strip()
        == f"shimgen: --out {tmp_path / 'file' / 'out'}: {tmp_path / 'file'} is not a directory"
    )


def test_a_bound_torch_writes_size_last_reads_and_narrows_as_one_written_size_first(tmp_path: Path) -> None:
    """timm's BEiT fails at batch 1 with torch's guard `1 != L['tensors'][0].size()[0]`: read as `x.shape[0] != 1`, with
    the range that meets it, which lets the build make batch 1 a variant of its own."""
    from shimgen.trace import dims as trace_dims

    spec = tmp_path / "dims.toml"
    spec.write_text(dims("{ min = 1, max = 8 }"))
    graph = load_spec(spec).graph[0]
    for guard in ("1 != L['tensors'][0].size()[0]", "L['tensors'][0].size()[0] != 1"):
        condition = trace_dims._readable(guard, graph)
        assert condition == "x.shape[0] != 1"
        error = trace_dims.range_error(graph, "graph[0]", "batch", condition, trace_dims._bound_fix(condition, graph))
        assert error.raised_min == 2, error.message
    assert trace_dims._readable("2 < L['tensors'][0].size()[0]", graph) == "x.shape[0] > 2"


def _range_error(tmp_path: Path, model: torch.nn.Module, batch: str, x: torch.Tensor) -> Any:
    """The RangeError of exporting `model`, traced at `x`, over the good spec with the batch dim's table `batch`."""
    from shimgen.trace import dims as trace_dims

    spec = tmp_path / "dims.toml"
    spec.write_text(dims(batch))
    with pytest.raises(trace_dims.RangeError) as raised:
        trace_dims.export(model, [x], load_spec(spec).graph[0], "graph[0]")
    return raised.value


def test_a_dim_the_model_makes_constant_is_named_with_the_fix(tmp_path: Path) -> None:
    """transformers' Mamba scans its sequence in a Python loop, which torch.export turns into one size: said in the
    spec's terms, not torch.export's (mark_dynamic, Dim.STATIC)."""
    from shimgen.trace import dims as trace_dims

    class Scan(torch.nn.Module):  # called as shimgen's trace calls a model: the spec's inputs as *tensors
        def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
            return torch.stack([row * 2 for row in tensors[0]])

    spec = tmp_path / "dims.toml"
    spec.write_text(dims("{ min = 2, max = 8 }"))
    graph = load_spec(spec).graph[0]
    with pytest.raises(SpecError) as raised:
        trace_dims.export(Scan(), [torch.randn(5, 32)], graph, "graph[0]")
    assert raised.value.where == "graph[0].dims.batch"
    assert raised.value.message.startswith(
        f"the model's code fixes 'batch' at the size it was traced at (5) at {__file__}:"
    ), raised.value.message
    assert "(`return torch.stack([row * 2 for row in tensors[0]])`), so it cannot be dynamic" in raised.value.message
    assert "Dim" not in raised.value.message and "mark_dynamic" not in raised.value.message
    assert isinstance(raised.value, trace_dims.RangeError) and raised.value.raised_min is None

    # Traced at the range's largest size, the sizes below it can be variants of their own (a variant is traced static).
    raised_to_max = _range_error(tmp_path, Scan(), "{ min = 1, max = 3, example = 3 }", torch.randn(3, 32))
    assert raised_to_max.raised_min == 3 and raised_to_max.dim == "batch"


def test_a_condition_that_narrows_the_range_is_named_at_the_models_line(tmp_path: Path) -> None:
    """DETR on CUDA took batch <= 3 only: the message names the model's line that made the condition."""

    class Branch(torch.nn.Module):
        def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
            if tensors[0].shape[0] <= 3:
                return tensors[0] * 2
            return tensors[0] * 3

    raised = _range_error(tmp_path, Branch(), "{ min = 1, max = 4 }", torch.randn(2, 32))
    assert raised.message.startswith(
        "the model cannot take every size of 'batch' in [1, 4]: it needs x.shape[0] <= 3 (not met at batch = 4) at "
        f"{__file__}:"
    ), raised.message
    assert "(`if tensors[0].shape[0] <= 3:`); write dims.batch = { min = 1, max = 3 }" in raised.message


class Chunks(torch.nn.Module):
    """transformers' Mamba-2 and Qwen3-Next scan a sequence padded to whole chunks of 64, chunk by chunk."""

    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        x = tensors[0]
        padded = torch.nn.functional.pad(x, (0, 0, 0, (64 - x.shape[1] % 64) % 64))
        chunks = padded.reshape(x.shape[0], -1, 64, x.shape[2])
        return torch.cat([chunks[:, k].cumsum(1) for k in range(chunks.shape[1])], 1)[:, : x.shape[1]]


class Pair(torch.nn.Module):
    """A batch concatenated with itself and chunked again (RAFT's two frames, classifier-free guidance): torch cannot
    prove `(3*b - 1) // b == 2` over a range, though every batch meets it."""

    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        first, second = torch.cat([tensors[0], tensors[0] * 2], 0).chunk(2, 0)
        return first - second


def test_a_condition_every_size_meets_but_torch_cannot_prove_keeps_the_range(tmp_path: Path) -> None:
    """torch.export cannot simplify a chunked sequence's arithmetic over a range, though every size of [2, 32] fills one
    chunk; nor a re-chunked batch's. Each is exported over its whole range and computes what the model does at every
    size. Where that cannot be done, the message says each size meets the condition (not that the range is too wide)
    and how to build it, and leaves out what torch appends to the condition."""
    from shimgen.inductor import internals
    from shimgen.trace import dims as trace_dims

    spec = tmp_path / "dims.toml"
    chunked = edited(GOOD_GRAPH, '["batch", 32]', '[2, "seq", 8]')
    spec.write_text(
        PROJECT + edited(chunked, "dims = { batch = { min = 1, max = 8 } }", "dims = { seq = { min = 2, max = 32 } }")
    )
    graph = load_spec(spec).graph[0]
    program = trace_dims.export(Chunks(), [torch.randn(2, 17, 8)], graph, "graph[0]")
    assert internals.input_size_ranges(program) == {(0, 1): (2, 32)}
    for size in (2, 9, 32):
        x = torch.randn(2, size, 8)
        torch.testing.assert_close(program.module()(x), Chunks()(x))

    batch = tmp_path / "batch.toml"
    batch.write_text(PROJECT + GOOD_GRAPH)
    program = trace_dims.export(Pair(), [torch.randn(3, 32)], load_spec(batch).graph[0], "graph[0]")
    assert internals.input_size_ranges(program) == {(0, 0): (1, 8)}
    for size in (1, 2, 8):
        x = torch.randn(size, 32)
        torch.testing.assert_close(program.module()(x), Pair()(x))

    refused = _strict_export_error(Chunks(), torch.randn(2, 17, 8), 1, 2, 32)
    message = trace_dims._spec_error(Exception(refused), graph, "graph[0]").message
    assert message.startswith("torch.export cannot prove that every size of 'seq' in [2, 32] meets (")
    assert "x.shape[1]" in message and "Give 'seq' a fixed size" in message and "narrow the range" not in message

    glued = (
        "Constraints violated (seq)!\n  - Not all values of seq = L['tensors'][0].size()[1] in the specified range "
        "seq <= 32 satisfy the generated guard (L['tensors'][0].size()[1] // 64) == 0.Specializations unexpectedly "
        'required (seq)! For more information, run with TORCH_LOGS="+dynamic".'
    )
    error = trace_dims._spec_error(Exception(glued), graph, "graph[0]")
    assert "meets (x.shape[1] // 64) == 0, a condition" in error.message and "Specializations" not in error.message
    wrong_above = glued.replace("// 64) == 0", "// 4) == 0")
    error = trace_dims._spec_error(Exception(wrong_above), graph, "graph[0]")
    assert error.message.startswith(
        "the model cannot take every size of 'seq' in [2, 32]: it needs (x.shape[1] // 4) == 0"
    )


class PaddedChunks(Chunks):
    """Bamba's scan: chunks of 64, and a step that runs only where the sequence is not a whole number of 16s."""

    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        scanned = super().forward(*tensors)
        if (16 - tensors[0].shape[1] % 16) % 16 > 0:
            return scanned * 2
        return scanned


class AboveOne(torch.nn.Module):
    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        return tensors[0] * 2 if tensors[0].shape[0] > 1 else tensors[0] * 3


def test_a_condition_the_program_checks_at_each_call_holds_over_the_whole_range(tmp_path: Path) -> None:
    """torch keeps some conditions unproven as checks of the program: `batch > 1` over a range from 1 (size-oblivious),
    and whatever a hinted export meets (Bamba's `pad_size > 0`, on CUDA). A program that would fail its own check at a
    size of the declared range is not returned: the sizes are named, and a bound narrows the range as torch's own
    refusals do."""
    from shimgen.trace import dims as trace_dims

    raised = _range_error(tmp_path, AboveOne(), "{ min = 1, max = 4 }", torch.randn(2, 32))
    assert raised.message.startswith(
        "the model cannot take every size of 'batch' in [1, 4]: it needs x.shape[0] > 1 (not met at batch = 1)"
    ), raised.message
    assert raised.raised_min == 2 and raised.message.endswith("write dims.batch = { min = 2, max = 4 }")

    spec = tmp_path / "dims.toml"
    chunked = edited(GOOD_GRAPH, '["batch", 32]', '[2, "seq", 8]')
    spec.write_text(
        PROJECT + edited(chunked, "dims = { batch = { min = 1, max = 8 } }", "dims = { seq = { min = 2, max = 32 } }")
    )
    graph = load_spec(spec).graph[0]
    hinted = {1: torch.export.Dim.DYNAMIC(min=2, max=32)}
    program = torch.export.export(PaddedChunks(), (torch.randn(2, 17, 8),), dynamic_shapes=((hinted,),))
    unmet = trace_dims._unmet_guard(program, graph)
    assert unmet is not None and unmet[1:] == ("seq", [16, 32])
    message = trace_dims._condition_error(*unmet, graph, "graph[0]", None).message
    assert message == (
        "the model cannot take every size of 'seq' in [2, 32]: it needs ((16 + (-1)*(x.shape[1] % 16)) % 16) > 0 "
        "(not met at seq = 16, 32); narrow the range, or change the model so that it takes every size in it"
    )


class HybridDecoder(torch.nn.Module):
    """transformers' Bamba from a small config (Mamba-2 layers scanning chunks of 16, one attention layer), called as
    shimgen's trace calls a model."""

    def __init__(self) -> None:
        super().__init__()
        import transformers

        config = transformers.AutoConfig.for_model(
            "bamba",
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=37,
            vocab_size=99,
            max_position_embeddings=64,
            mamba_n_heads=4,
            mamba_d_head=16,
            mamba_d_state=8,
            mamba_n_groups=1,
            attn_layer_indices=[1],
            mamba_chunk_size=16,
            use_cache=False,
        )
        self.model = transformers.AutoModelForCausalLM.from_config(config).eval()

    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        return self.model(tensors[0], attention_mask=tensors[1]).logits


def _tokens_graph(tmp_path: Path, batch: str, seq: str) -> Graph:
    """The good spec's graph with token inputs (ids, mask) over dims `batch` and `seq` (TOML tables)."""
    spec = tmp_path / "tokens.toml"
    text = edited(GOOD_GRAPH, '[{ name = "x", shape = ["batch", 32] }]', TOKENS)
    spec.write_text(PROJECT + edited(text, "{ min = 1, max = 8 }", f"{batch}, seq = {seq}"))
    return load_spec(spec).graph[0]


def _equal_at(program: Any, model: torch.nn.Module, sizes: tuple[tuple[int, int], ...]) -> None:
    """The exported program computes what the model does at each (batch, seq)."""
    with torch.no_grad():
        for batch, seq in sizes:
            ids = torch.randint(0, 99, (batch, seq))
            torch.testing.assert_close(program.module()(ids, torch.ones_like(ids)), model(ids, torch.ones_like(ids)))


def test_a_chunked_scan_is_refused_at_the_sizes_it_cannot_take_and_keeps_a_range_it_can(tmp_path: Path) -> None:
    """Bamba pads its sequence to whole chunks of 16, a path that a sequence of whole chunks does not take. Over [2, 32]
    torch's suggested fixes assert ("Cannot create Dim with inconsistent min=2, max=2") before listing the conditions:
    the message names the one some sizes fail, those sizes, and Bamba's line. Over [17, 31] torch's conditions (an
    `or`, `min(...)`) hold at every size: the range is kept, and the program equals the model at every size tried."""
    pytest.importorskip("transformers", reason="the test builds transformers' Bamba")
    from shimgen.inductor import internals
    from shimgen.trace import dims as trace_dims

    def graph(seq: str) -> Graph:
        return _tokens_graph(tmp_path, "{ min = 2, max = 4 }", seq)

    torch.manual_seed(0)
    model = HybridDecoder()
    ids = torch.randint(0, 99, (2, 17))
    with pytest.raises(SpecError) as raised:
        trace_dims.export(model, [ids, torch.ones_like(ids)], graph("{ min = 2, max = 32 }"), "graph[0]")
    assert raised.value.where == "graph[0].dims.seq"
    message = raised.value.message
    assert (
        message.startswith("the model cannot take every size of 'seq' in [2, 32]: it needs (") and "Dim" not in message
    )
    assert "(not met at seq = 16, 32) at " in message
    assert "/modeling_bamba.py:" in message and "(`if pad_size > 0:`); narrow the range" in message

    program = trace_dims.export(model, [ids, torch.ones_like(ids)], graph("{ min = 17, max = 31 }"), "graph[0]")
    assert internals.input_size_ranges(program) == {(0, 0): (2, 4), (0, 1): (17, 31), (1, 0): (2, 4), (1, 1): (17, 31)}
    _equal_at(program, model, ((2, 17), (3, 24), (4, 31)))


class Mamba2Decoder(HybridDecoder):
    """transformers' Mamba-2 from a small config (its sequence padded to whole chunks of 256)."""

    def __init__(self) -> None:
        torch.nn.Module.__init__(self)
        import transformers

        config = transformers.AutoConfig.for_model(
            "mamba2", hidden_size=32, num_hidden_layers=2, vocab_size=99, num_heads=4, head_dim=16, state_size=8,
            n_groups=1, use_cache=False,
        )  # fmt: skip
        self.model = transformers.AutoModelForCausalLM.from_config(config).eval()


def test_a_bound_that_torch_finds_only_once_another_dim_is_hinted_narrows_the_range(tmp_path: Path) -> None:
    """Mamba-2 over batch [1, 4] and seq [2, 32]: torch first reports only the sequence's chunk count, which every size
    meets (a hint then); exported so, it finds `batch != 1`. That bound narrows the batch to [2, 4] (batch 1 becomes a
    variant), where the refusal named the sequence's condition before; over [2, 4] the program equals the model."""
    pytest.importorskip("transformers", reason="the test builds transformers' Mamba-2")
    from shimgen.trace import dims as trace_dims

    def graph(batch: str) -> Graph:
        return _tokens_graph(tmp_path, batch, "{ min = 2, max = 32 }")

    torch.manual_seed(0)
    model = Mamba2Decoder()
    ids = torch.randint(0, 99, (2, 16))
    with pytest.raises(trace_dims.RangeError) as raised:
        trace_dims.export(model, [ids, torch.ones_like(ids)], graph("{ min = 1, max = 4 }"), "graph[0]")
    assert (raised.value.dim, raised.value.raised_min) == ("batch", 2), raised.value.message

    program = trace_dims.export(model, [ids, torch.ones_like(ids)], graph("{ min = 2, max = 4 }"), "graph[0]")
    _equal_at(program, model, ((2, 2), (3, 17), (4, 32)))


class DoubledAtOne(torch.nn.Module):
    """Doubles a batch of one, but not where it is exported: the program computes otherwise at the smallest size alone."""

    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_exporting():
            return tensors[0]
        return tensors[0] * 2 if tensors[0].shape[0] == 1 else tensors[0]


class SummedWhereExported(torch.nn.Module):
    """Computes otherwise whenever it is exported, as transformers 5.17's UMT5 decoder (causal only then)."""

    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        return tensors[0].cumsum(1) if torch.compiler.is_exporting() else tensors[0]


def test_a_model_that_computes_otherwise_at_the_smallest_sizes_says_by_how_much(tmp_path: Path) -> None:
    from shimgen.trace import dims as trace_dims
    from shimgen.trace.export import Saved

    spec = tmp_path / "doubled.toml"
    spec.write_text(PROJECT + GOOD_GRAPH)
    graph = load_spec(spec).graph[0]
    model = DoubledAtOne()
    program = trace_dims.export(model, [torch.ones(4, 32)], graph, "graph[0]")
    with pytest.raises(SpecError) as raised:
        trace_dims.check_against_eager(program, model, graph, "graph[0]", "cpu", Saved({}), Saved({}), ())
    assert raised.value.where == "graph[0].dims"
    assert raised.value.message.startswith(
        "at the smallest sizes (batch=1) the traced model's output 0 differs from eager (max abs error "
    )
    assert raised.value.message.endswith(
        f"; atol {graph.atol:g}, rtol {graph.rtol:g}): the model behaves differently there than at the example sizes; "
        "raise the dims' min (or atol and rtol, where the difference is rounding)"
    )


def test_a_model_that_computes_otherwise_whenever_it_is_traced_is_refused_with_or_without_dims(tmp_path: Path) -> None:
    """A graph without dims is compared with eager at its sizes too; with dims, a difference at the smallest sizes that
    the example sizes show as well is not put down to the small sizes."""
    from shimgen.trace import dims as trace_dims
    from shimgen.trace.export import Saved

    spec = tmp_path / "exported.toml"
    spec.write_text(PROJECT + GOOD_GRAPH)
    dynamic = load_spec(spec).graph[0]
    fixed = dataclasses.replace(dynamic, dims={}, inputs=[dataclasses.replace(dynamic.inputs[0], shape=[4, 32])])
    model = SummedWhereExported()
    for graph in (fixed, dynamic):
        program = trace_dims.export(model, [torch.ones(4, 32)], graph, "graph[0]")
        with pytest.raises(SpecError) as raised:
            trace_dims.check_against_eager(program, model, graph, "graph[0]", "cpu", Saved({}), Saved({}), ())
        assert raised.value.where == "graph[0]"
        assert raised.value.message.startswith(
            ("at the example sizes " if graph.dims else "") + "the traced model's output 0 differs from eager ("
        ), raised.value.message
        assert "computes otherwise when torch.export traces it than when it runs" in raised.value.message


class Noisy(torch.nn.Module):
    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        return tensors[0] + torch.randn_like(tensors[0])


def test_a_model_that_computes_otherwise_at_each_call_is_told_so(tmp_path: Path) -> None:
    from shimgen.trace import dims as trace_dims
    from shimgen.trace.export import Saved

    spec = tmp_path / "noisy.toml"
    spec.write_text(PROJECT + GOOD_GRAPH)
    graph = load_spec(spec).graph[0]
    program = trace_dims.export(Noisy(), [torch.ones(4, 32)], graph, "graph[0]")
    with pytest.raises(SpecError) as raised:
        trace_dims.check_against_eager(program, Noisy(), graph, "graph[0]", "cpu", Saved({}), Saved({}), ())
    assert raised.value.message.startswith(
        "the model's output 0 differs between two eager calls on the same inputs and state (a random op in its forward?)"
    ), raised.value.message


class ExpertsHit(torch.nn.Module):
    """A loop over the experts that some token chose, as transformers' DBRX routes: its count depends on the values."""

    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        x = tensors[0]
        hit = (x.argmax(-1).bincount(minlength=8) > 0).nonzero()
        return sum((x[:, int(k)] for k in hit), torch.zeros(x.shape[0]))


@pytest.mark.parametrize("torch_says_where", [True, False])
def test_a_loop_over_a_tensors_values_is_named_at_its_line(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, torch_says_where: bool
) -> None:
    """The line is the one torch's message names, else the deepest of the model's frames in the traceback (torch 2.11
    on CUDA said nothing of where transformers' SEW failed)."""
    from shimgen.trace import dims as trace_dims

    if not torch_says_where:
        monkeypatch.setattr(trace_dims, "_RAISED_AT", re.compile("(?!)"))

    spec = tmp_path / "experts.toml"
    spec.write_text(PROJECT + GOOD_GRAPH)
    graph = load_spec(spec).graph[0]
    with pytest.raises(SpecError) as raised:
        trace_dims.export(ExpertsHit(), [torch.randn(2, 32)], graph, "graph[0]")
    message = raised.value.message
    assert message.startswith(f"torch.export cannot trace the model: its code at {__file__}:")
    assert "(`return sum((x[:, int(k)] for k in hit), torch.zeros(x.shape[0]))`) branches, loops" in message
    assert "guard_or_false" not in message and "TORCHDYNAMO" not in message and "\n" not in message
    assert "def forward(" not in capfd.readouterr().err, "torch's partial graph is not printed above the message"


def _strict_export_error(model: torch.nn.Module, x: torch.Tensor, axis: int, low: int, high: int) -> str:
    """What torch.export says of `model` with a Dim of [low, high] at `axis` of its input."""
    from shimgen.inductor import internals

    try:
        with internals.backed_size_oblivious():
            dynamic = ({axis: torch.export.Dim("seq", min=low, max=high)},)
            torch.export.export(model, (x,), dynamic_shapes=(dynamic,))
    except Exception as exc:
        return str(exc)
    return ""


TALKING_HEADS = """import torch
from torch import nn


class TalkingHeads(nn.Module):
    \"\"\"CaiT's mixing of attention heads: a linear layer over a last dim of 2 heads.\"\"\"

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
"""


def test_a_dynamic_size_onednns_fusion_fixes_at_its_example_is_generated_without_onednn(
    tmp_path: Path, workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Inductor's oneDNN fusion pass compares the linear layer's output sizes with its bias's ([2]): at the example
    batch 2 that guard fixes the batch at 2, and the code would serve batch 2 alone (timm's CaiT failed its package
    check at every other batch). The graph is generated again without oneDNN, in a new interpreter (the pass stays
    registered in a process); `shimgen check` says so, and compares it with eager at batch 1, 2 and 4."""
    (workdir / "projects" / "heads.py").write_text(TALKING_HEADS)
    spec = workdir / "projects" / "heads.toml"
    spec.write_text(
        PROJECT + '[[graph]]\nname = "mix"\nentry = "heads:TalkingHeads"\n'
        'inputs = [{ name = "x", shape = ["batch", 2, 16, 16] }]\ndims = { batch = { min = 1, max = 4, example = 2 } }\n'
    )
    assert main(["check", str(spec), "--out", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert "check: all 4 outputs match eager" in err, err  # the example, 1, 2 (the middle) and 4
    assert "mix_cpu: generated without oneDNN: its fusion pass fixed a dynamic size at the example (Eq(s" in err, err
    assert "mkldnn_fusion.py" in err
    assert len(list(tmp_path.glob("dist/*.whl"))) == 1


def test_model_that_exits(tmp_path: Path, workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """sys.exit in the project's code is not a successful build (it used to end shimgen with status 0)."""
    (workdir / "projects" / "exits.py").write_text("import sys\n\ndef model(x):\n    return x\n\nsys.exit(0)\n")
    spec = workdir / "projects" / "exits.toml"
    spec.write_text(PROJECT + edited(GOOD_GRAPH, "models.mlp:mlp", "exits:model"))
    assert main(["build", str(spec), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"shimgen: {spec}: graph[0].entry: cannot import 'exits': SystemExit: 0 (at exits.py:6)"


def _boom(*args: object, **kwargs: object) -> None:
    raise RuntimeError("boom\nsecond line")


def _no_space(*args: object, **kwargs: object) -> None:
    raise OSError(errno.ENOSPC, "No space left on device")


def _short_write(*args: object, **kwargs: object) -> None:
    raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 106112 vs 106000")


def test_a_full_disk_is_told_as_such_not_as_a_bug(
    tmp_path: Path, workdir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A build that fails for want of disk space exits 2 with what to do, no crash file: an ENOSPC in the failure, or
    a short write that a library reports otherwise while a place the build writes to has almost no space left."""
    import tempfile
    from collections import namedtuple

    import shimgen.pipeline

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    spec = workdir / "projects" / "mlp.toml"
    monkeypatch.setattr(shimgen.pipeline, "load_spec", _no_space)
    assert main(["build", str(spec), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("shimgen: the disk is full: a place the build writes to; the previous outputs are left")
    assert err.rstrip().endswith("(OSError: [Errno 28] No space left on device)")

    usage = namedtuple("usage", "total used free")
    real = shutil.disk_usage
    out = tmp_path / "out"
    monkeypatch.setattr(
        shutil, "disk_usage", lambda path: usage(1 << 40, 1 << 40, 5 << 20) if Path(path) == tmp_path else real(path)
    )
    monkeypatch.setattr(shimgen.pipeline, "load_spec", _short_write)
    assert main(["build", str(spec), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"shimgen: the disk is full: the output directory ({tmp_path}: 5 MB free);"), err
    assert not list((tmp_path / "tmp").glob("shimgen-crash-*"))

    # With space left, the same failure is a bug of shimgen's.
    monkeypatch.setattr(shutil, "disk_usage", real)
    assert main(["build", str(spec), "--out", str(out)]) == 3
    assert "internal error (a bug in shimgen" in capsys.readouterr().err
    assert list((tmp_path / "tmp").glob("shimgen-crash-*"))  # where the full-disk cases would have left theirs


def test_internal_error(
    tmp_path: Path, workdir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shimgen bug: one paragraph, exit 3, the traceback in a file under the temp directory."""
    import tempfile

    import shimgen.pipeline

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(shimgen.pipeline, "load_spec", _boom)
    spec = workdir / "projects" / "mlp.toml"
    assert main(["build", str(spec), "--out", str(tmp_path)]) == 3
    err = capsys.readouterr().err
    (crash,) = (tmp_path / "tmp").glob("shimgen-crash-*.txt")
    assert err == (
        f"shimgen: internal error (a bug in shimgen; please report it): RuntimeError: boom ...; "
        f"the full traceback is in {crash}\n"
    )
    saved = crash.read_text()
    assert saved.startswith(f"shimgen build {spec} --out {tmp_path}\n")
    assert (
        "Traceback (most recent call last)" in saved
        and "in _boom" in saved
        and saved.endswith("RuntimeError: boom\nsecond line\n")
    )


def test_interrupt_is_not_an_internal_error(
    tmp_path: Path, workdir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import shimgen.pipeline

    def interrupt(*args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(shimgen.pipeline, "load_spec", interrupt)
    assert main(["build", str(workdir / "projects" / "mlp.toml"), "--out", str(tmp_path)]) == 130
    assert capsys.readouterr().err.strip() == "shimgen: interrupted; previous outputs are left as they were"


def test_cli_usage_error_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["bulid"])
    assert exc.value.code == 2
    assert "invalid choice: 'bulid'" in capsys.readouterr().err


def test_output_nobody_reads_ends_quietly(tmp_path: Path) -> None:
    """stderr a closed pipe (`shimgen build ... 2>&1 | head`, a parent that went away): shimgen exits as SIGPIPE would
    have ended it, with no traceback and no crash report."""
    import subprocess
    import sys

    read, write = os.pipe()
    os.close(read)
    try:
        ended = subprocess.run(
            [sys.executable, "-m", "shimgen", "build", str(tmp_path / "missing.toml")],
            stdout=write,
            stderr=write,
            env={**os.environ, "TMPDIR": str(tmp_path), "SHIMGEN_SERVER": "off"},  # the build in this process
        )
    finally:
        os.close(write)
    assert ended.returncode == 141
    assert not list(tmp_path.glob("shimgen-crash-*"))


CUDA_SPEC = PROJECT + GOOD_GRAPH + '[[target]]\ndevice = "cpu"\n[[target]]\ndevice = "cuda"\narchs = ["ARCH"]\n'


def _build_error(workdir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str) -> str:
    spec = workdir / "projects" / "bad.toml"
    spec.write_text(text)
    assert main(["build", str(spec), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert not any("Traceback" in line for line in err)
    assert not (tmp_path / "dist").exists()
    return err[-1].removeprefix(f"shimgen: {spec}: ")


@pytest.mark.skipif(
    shutil.which("nvcc") is None and not Path("/usr/local/cuda/bin/nvcc").exists(),
    reason="needs nvcc to list its archs",
)
def test_arch_nvcc_cannot_target(tmp_path: Path, workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cuda = detect_cuda()
    message = _build_error(workdir, tmp_path, capsys, edited(CUDA_SPEC, "ARCH", "sm_20"))
    assert (
        message
        == f"target[1].archs[0]: nvcc {cuda.version} ({cuda.nvcc}) cannot target sm_20; it can target {', '.join(cuda.codes)}"
    )


def test_nvcc_missing(
    tmp_path: Path, workdir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NVCC", str(tmp_path / "no-nvcc"))
    message = _build_error(workdir, tmp_path, capsys, edited(CUDA_SPEC, "ARCH", "sm_90"))
    assert message == f"target[1]: NVCC={tmp_path / 'no-nvcc'} is not an executable; point it at nvcc or unset it"


@pytest.mark.skipif(
    shutil.which("nvcc") is None and not Path("/usr/local/cuda/bin/nvcc").exists(),
    reason="needs nvcc, to get past the arch check",
)
@pytest.mark.skipif(torch.version.cuda is not None, reason="needs a CPU-only torch")
def test_cuda_target_with_cpu_torch(tmp_path: Path, workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    message = _build_error(workdir, tmp_path, capsys, edited(CUDA_SPEC, "ARCH", "sm_90"))
    torch_dir = Path(torch.__file__).parent
    assert (
        message
        == f"target[1]: the installed torch at {torch_dir} has no CUDA support; cuda targets need a CUDA build of torch"
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_cuda_build_without_gpu(
    tmp_path: Path, workdir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A CUDA build of torch and nvcc, but no GPU (a CPU-only CI runner, say): stands in for both."""
    import shimgen.pipeline

    monkeypatch.setattr(
        shimgen.pipeline, "detect_cuda", lambda: CudaToolchain(nvcc="/usr/bin/nvcc", version="13.0", codes=("sm_90",))
    )
    monkeypatch.setattr(shimgen.pipeline, "torch_cuda_version", lambda: "13.0")
    message = _build_error(
        workdir, tmp_path, capsys, PROJECT + GOOD_GRAPH + '[[target]]\ndevice = "cuda"\narchs = ["sm_90"]\n'
    )
    assert message == (
        "target[0]: building for cuda needs a GPU on this machine (Inductor tunes and compiles the Triton kernels on it); "
        "torch sees none"
    )


CUSTOM_OP_MODEL = """import torch


@torch.library.custom_op("shimgen_test::scale", mutates_args=())
def scale(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@scale.register_fake
def _(x):
    return torch.empty_like(x)


class Scaled(torch.nn.Module):
    def forward(self, x):
        return scale(x + 1)
"""


def test_python_op_outside_any_entry_is_refused_at_build(
    tmp_path: Path, workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The compiled graph calls such an op back in Python, so the package would have to import the model's own file:
    the build says to declare the module instead of leaving a package that fails on import."""
    (workdir / "projects" / "customop.py").write_text(CUSTOM_OP_MODEL)
    message = _build_error(workdir, tmp_path, capsys, PROJECT + edited(GOOD_GRAPH, "models.mlp:mlp", "customop:Scaled"))
    assert message == (
        f"graph[0]: the graph calls shimgen_test::scale, a Python custom op defined in {workdir / 'projects' / 'customop.py'}, "
        'which the package would have to import when it loads: name its module in a [[custom_op]] entry (module = "...")'
    )


def test_python_ops_of_installed_distributions_are_imported_by_the_package_and_the_projects_are_not() -> None:
    """transformers routes Mixtral's experts through its own Python custom op: the module defining it is recorded at
    trace (workers that load the traced program import it first) and imported by the package when it loads, where an op
    defined in a project's file (in no installed distribution) stays refused as above."""
    from shimgen.trace import custom_ops

    pytest.importorskip(
        "transformers.integrations.moe", reason="transformers without its MoE integration defines no such op"
    )
    op = "transformers::grouped_mm_fallback"
    if not hasattr(torch.ops.transformers, "grouped_mm_fallback"):
        pytest.skip(f"this transformers defines no {op}")
    assert custom_ops.installed_op_modules((op, "aten::mm")) == ("transformers.integrations.moe",)
    assert custom_ops.run_time_modules([op], None, ("transformers.integrations.moe",)) == (
        "transformers.integrations.moe",
    )

    @torch.library.custom_op("shimgen_test::project_op", mutates_args=())
    def project_op(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    assert custom_ops.installed_op_modules(("shimgen_test::project_op",)) == ()
    with pytest.raises(UserError, match=r"name its module in a \[\[custom_op\]\] entry"):
        custom_ops.run_time_modules(["shimgen_test::project_op"], None, ())


ONE_ROW_APART = """import torch
from torch import nn


class OneRowApart(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == 1:
            return self.proj(x) * 2
        return self.proj(x)
"""


def test_a_range_the_model_takes_only_between_its_ends_builds_the_ends_as_variants(
    tmp_path: Path, workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """DETR on CUDA took batch 2 and 3 only of [1, 4] (torch's upsampling guards on its channels, there the batch).
    Here the model branches at batch 1 and at 3 or more, over [1, 3]: batch 1 and 3 become variants that compute what
    the model does at those sizes, and the range left, [2, 2], one size, is exported static (torch.export.Dim refuses
    min == max: an internal error before)."""
    (workdir / "projects" / "ends_apart.py").write_text(
        ONE_ROW_APART.replace("OneRowApart", "EndsApart").replace(
            "if x.shape[0] == 1:", "if x.shape[0] == 1 or x.shape[0] >= 3:"
        )
    )
    spec = workdir / "projects" / "ends_apart.toml"
    spec.write_text(  # a project name of its own: `shimgen check` imports the package in this process
        '[project]\nname = "ends_apart"\n[[graph]]\nname = "forward"\nentry = "ends_apart:EndsApart"\n'
        'inputs = [{ name = "x", shape = ["batch", 8] }]\ndims = { batch = { min = 1, max = 3, example = 2 } }\n'
    )
    assert main(["check", str(spec), "--out", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert "variant batch=1" in err and "variant batch=3" in err, err
    assert "check: all 6 outputs match eager" in err, err  # the example (2), 1, 2, 3 and the two variants
