"""[[custom_op]]: C++ ops compiled into the package, Python ops called back, incremental rebuilds, bad input."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import FAST_FLAGS, build_json, edited, rss_growth_over_10000_calls, shimgen, with_flags

RUN_SCRIPT = """
import json, sys, torch
sys.path.insert(0, sys.argv[1])
package = __import__(sys.argv[2])
torch.manual_seed(0)
x = torch.randn(int(sys.argv[3]), int(sys.argv[4]))
torch.save({"x": x, "y": package.forward(x)}, sys.argv[5])
"""


def run_package(
    summary: dict[str, Any], rows: int, width: int, tmp: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-c",
            RUN_SCRIPT,
            summary["package_dir"],
            summary["name"],
            str(rows),
            str(width),
            str(tmp / "out.pt"),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        cwd=tmp,
    )


def eager(workdir: Path, entry: str, x: torch.Tensor, **kwargs: Any) -> torch.Tensor:
    """The model of `entry` (models.custom_ops:...) built as the spec builds it (seed 0), run eagerly."""
    script = f"""
import sys, torch
sys.path.insert(0, {str(workdir / "projects")!r})
for library in sys.argv[2:]:
    torch.ops.load_library(library)
import models.pyops
from {entry.split(":")[0]} import {entry.split(":")[1]} as Model
torch.manual_seed(0)
model = Model(**{kwargs!r}).eval()
case = torch.load(sys.argv[1])
with torch.no_grad():
    case["eager"] = model(case["x"])
torch.save(case, sys.argv[1])
"""
    path = workdir / "eager_case.pt"
    torch.save({"x": x}, path)
    libraries = [str(p) for p in (workdir / "build" / "custom_ops" / "ops" / "meson").glob("lib*.so")]
    subprocess.run([sys.executable, "-c", script, str(path), *libraries], check=True)
    return torch.load(path)["eager"]


@pytest.fixture(scope="session")
def built_cpp_ops(workdir: Path) -> dict[str, Any]:
    return build_json(workdir / "projects" / "custom_ops.toml", workdir)


@pytest.fixture(scope="session")
def built_py_ops(workdir: Path) -> dict[str, Any]:
    return build_json(workdir / "projects" / "py_ops.toml", workdir)


def test_cpp_ops_are_compiled_into_the_package(built_cpp_ops: dict[str, Any], workdir: Path, tmp_path: Path) -> None:
    names = zipfile.ZipFile(built_cpp_ops["wheel"]).namelist()
    assert "custom_ops/ops/libcustom_ops_ops0.so" in names, names
    run = run_package(built_cpp_ops, 37, 64, tmp_path)
    assert run.returncode == 0, run.stderr
    case = torch.load(tmp_path / "out.pt")
    torch.testing.assert_close(
        case["y"], eager(workdir, "models.custom_ops:SoftClampMLP", case["x"], width=64, k=8), rtol=1e-5, atol=1e-5
    )
    # Importing the package registers its ops for everyone in the process.
    script = (
        f"import sys, torch; sys.path.insert(0, {built_cpp_ops['package_dir']!r}); import custom_ops; "
        "print(torch.ops.shimgen_ops.soft_clamp(torch.tensor([0.0, 100.0]), 2.0).tolist())"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [0.0, 2.0]


def test_memory_stays_flat_over_10000_calls(built_cpp_ops: dict[str, Any]) -> None:
    """Tensors passed to and returned by fallback kernels are released (AOTInductor once leaked their handles)."""
    grown = rss_growth_over_10000_calls(built_cpp_ops, 64, 64)
    # Each call allocates and frees ~50 KB of tensors through the ops; a leak would be ~500 MB.
    assert grown < 4 * 2**20, f"resident memory grew by {grown / 2**20:.1f} MiB over 10,000 calls"


def test_check_compares_cpp_ops_with_eager(built_cpp_ops: dict[str, Any], workdir: Path) -> None:
    result = shimgen("check", workdir / "projects" / "custom_ops.toml", "--out", workdir)
    assert result.returncode == 0, result.stderr
    assert "all 4 outputs match eager" in result.stderr


def test_python_op_is_called_back(built_py_ops: dict[str, Any], workdir: Path, tmp_path: Path) -> None:
    run = run_package(built_py_ops, 5, 32, tmp_path, {"PYTHONPATH": str(workdir / "projects")})
    assert run.returncode == 0, run.stderr
    case = torch.load(tmp_path / "out.pt")
    torch.testing.assert_close(
        case["y"], eager(workdir, "models.custom_ops:PyOpModel", case["x"]), rtol=1e-5, atol=1e-5
    )


def test_python_op_module_missing_at_import(built_py_ops: dict[str, Any], tmp_path: Path) -> None:
    run = run_package(built_py_ops, 5, 32, tmp_path, {"PYTHONPATH": ""})
    assert run.returncode == 1
    assert run.stderr.strip().splitlines()[-1] == (
        "ImportError: py_ops needs the Python module models.pyops, which is not installed or on sys.path "
        "(custom_op[0].module of the spec; it defines ops that graph forward calls)"
    )


def test_edits_that_leave_the_program_as_it_was_keep_the_code_of_a_graph_calling_a_python_op(
    built_py_ops: dict[str, Any], workdir: Path, tmp_path: Path
) -> None:
    """A Python custom op is called by the code, not compiled into it: an edit of its body, and one elsewhere in the
    model's file (another model, say), trace again and keep the generated code; the package calls the edited body."""
    op_source, model_source = (
        workdir / "projects" / "models" / "pyops.py",
        workdir / "projects" / "models" / "custom_ops.py",
    )
    originals = {path: path.read_text() for path in (op_source, model_source)}
    try:
        op_source.write_text(
            edited(originals[op_source], "torch.cummax(x, dim=-1).values.clone()", "torch.cummax(x, dim=-1).values * 2")
        )
        model_source.write_text(originals[model_source] + "\n\nclass Another(torch.nn.Module):\n    pass\n")
        after = build_json(workdir / "projects" / "py_ops.toml", workdir)
        assert "trace:forward_cpu" not in after["skipped"] and "codegen:forward_cpu" in after["skipped"], after[
            "skipped"
        ]
        run = run_package(after, 5, 32, tmp_path, {"PYTHONPATH": str(workdir / "projects")})
        assert run.returncode == 0, run.stderr
        case = torch.load(tmp_path / "out.pt")
        want = eager(workdir, "models.custom_ops:PyOpModel", case["x"])
        torch.testing.assert_close(case["y"], want, rtol=1e-5, atol=1e-5)
    finally:
        for path, text in originals.items():
            path.write_text(text)


# A project of its own: a C++ op whose fake is in Python, and a Python op taking every kind of argument the generated
# dispatcher calls pass (tensor lists, optional tensors, int lists, floats, strings, dtypes, defaults).
OPS_CPP = """#include <ATen/ATen.h>
#include <torch/library.h>

at::Tensor shifted(const at::Tensor& x, double by) {
  TORCH_CHECK(x.abs().max().item<double>() < 1e6, "shifted: input too large");
  return x + by * SCALE;
}

TORCH_LIBRARY(inc_ops, m) { m.def("shifted(Tensor x, float by) -> Tensor"); }
TORCH_LIBRARY_IMPL(inc_ops, CPU, m) { m.impl("shifted", shifted); }
"""
OPS_PY = """import torch


@torch.library.register_fake("inc_ops::shifted")
def _(x, by):
    return torch.empty_like(x)


@torch.library.custom_op("inc_ops::mix", mutates_args=())
def mix(xs: list[torch.Tensor], w: torch.Tensor | None, dims: list[int], scale: float, mode: str,
        dtype: torch.dtype | None = None, flip: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    total = sum(xs) * scale
    if w is not None:
        total = total * w
    total = total.sum(dim=dims, keepdim=True) if mode == "sum" else total.amax(dim=dims, keepdim=True)
    out = total.to(dtype) if dtype is not None else total
    return (-out if flip else out), xs[0] * 2


@mix.register_fake
def _(xs, w, dims, scale, mode, dtype=None, flip=True):
    shape = list(xs[0].shape)
    for d in dims:
        shape[d] = 1
    return xs[0].new_empty(shape, dtype=dtype or xs[0].dtype), torch.empty_like(xs[0])
"""
OPS_MODEL = """import torch
import ops_fakes  # noqa: F401


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)
        self.register_buffer("w", torch.rand(16))

    def forward(self, x):
        h = torch.ops.inc_ops.shifted(self.fc(x), 0.5)
        a, b = torch.ops.inc_ops.mix([h, x.relu()], self.w, [1], 0.25, "sum", dtype=torch.float64)
        c, _ = torch.ops.inc_ops.mix([h], None, [0, 1], 2.0, "max", flip=False)
        return a.float() + c + b.sum()
"""
OPS_SPEC = """[project]
name = "inc"

[[custom_op]]
sources = ["ops.cpp"]
module = "ops_fakes"

[[graph]]
name = "forward"
entry = "ops_model:Model"
inputs = [{ name = "x", shape = [4, 16] }]
"""


def _eager_inc(project: Path, x: torch.Tensor, library: Path) -> torch.Tensor:
    script = f"""
import sys, torch
sys.path.insert(0, {str(project)!r})
torch.ops.load_library({str(library)!r})
from ops_model import Model
torch.manual_seed(0)
print(Model().eval()(torch.load(sys.argv[1])).tolist())
"""
    out = subprocess.run([sys.executable, "-c", script, str(project / "x.pt")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return torch.tensor(json.loads(out.stdout))


@pytest.fixture(scope="module")
def inc_project(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A project of a C++ op (ops.cpp), its Python fake and a model calling it; `edited` once a build followed an edit
    of ops.cpp (which starts the precompiled header of the torch header it includes first)."""
    root = tmp_path_factory.mktemp("inc")
    project = root / "inc"
    project.mkdir()
    (project / "ops.cpp").write_text(edited(OPS_CPP, "SCALE", "1.0"))
    (project / "ops_fakes.py").write_text(OPS_PY)
    (project / "ops_model.py").write_text(OPS_MODEL)
    spec = project / "inc.toml"
    spec.write_text(with_flags(OPS_SPEC, **FAST_FLAGS))
    return {"project": project, "spec": spec, "out": root / "out", "edited": False}


def test_edits_rebuild_what_depends_on_them(inc_project: dict[str, Any]) -> None:
    project, spec, out = inc_project["project"], inc_project["spec"], inc_project["out"]
    first = build_json(spec, out)
    library = out / "build" / "inc" / "ops" / "meson" / "libinc_ops0.so"
    x = torch.randn(4, 16)
    torch.save(x, project / "x.pt")

    def call() -> torch.Tensor:
        script = (
            f"import sys, torch; sys.path[:0] = [{first['package_dir']!r}, {str(project)!r}]; import inc; "
            f"print(inc.forward(torch.load({str(project / 'x.pt')!r})).tolist())"
        )
        run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        return torch.tensor(json.loads(run.stdout))

    torch.testing.assert_close(call(), _eager_inc(project, x, library), rtol=1e-5, atol=1e-5)
    # An error inside the op reaches the caller as a RuntimeError with the op's message; the interpreter lives on.
    script = (
        f"import sys, torch; sys.path[:0] = [{first['package_dir']!r}, {str(project)!r}]; import inc\n"
        "try:\n    inc.forward(torch.full((4, 16), 1e9))\nexcept RuntimeError as e:\n    print('shifted: input too large' in str(e))\n"
        "print(inc.forward(torch.zeros(4, 16)).shape)"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.split() == ["True", "torch.Size([4,", "1])"], run.stdout + run.stderr

    # The op's body alone: its library is rebuilt and shipped; no trace, codegen or package compile.
    (project / "ops.cpp").write_text(edited(OPS_CPP, "SCALE", "3.0"))
    second = build_json(spec, out)
    inc_project["edited"] = True
    assert {"trace:forward_cpu", "codegen:forward_cpu"} <= set(second["skipped"]), second["skipped"]
    assert second["compiled_units"]["done"] == 0
    torch.testing.assert_close(call(), _eager_inc(project, x, library), rtol=1e-5, atol=1e-5)

    # A compile error: exit 1 with the compiler's first error, file and line; the last good package stays.
    (project / "ops.cpp").write_text(
        edited(edited(OPS_CPP, "SCALE", "3.0"), "return x + by", "return x + undefined_name + by")
    )
    failed = shimgen("build", spec, "--out", out)
    assert failed.returncode == 1, failed.stderr
    assert "ops.cpp:6" in failed.stderr and "undefined_name" in failed.stderr and "Traceback" not in failed.stderr
    torch.testing.assert_close(call(), _eager_inc(project, x, library), rtol=1e-5, atol=1e-5)

    # The fake implementation: traced again.
    (project / "ops_fakes.py").write_text(OPS_PY + "\n# edited\n")
    (project / "ops.cpp").write_text(edited(OPS_CPP, "SCALE", "3.0"))
    third = build_json(spec, out)
    assert "trace:forward_cpu" not in third["skipped"]


def _wait_for_precompiled(header: str, timeout: float = 900) -> None:
    """Until the per-user cache holds `header` precompiled for custom ops (entry `prebuilt/<key>/include/<header>.gch`)."""
    from shimgen import toolchain

    prebuilt = toolchain.cache_dir().parent / "prebuilt"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for gch in prebuilt.glob(f"*/include/{header}.gch"):
            entry = prebuilt / gch.relative_to(prebuilt).parts[0]
            if "." not in entry.name and (entry / "done").is_file():
                return
        assert not list(prebuilt.glob("*.failed")), f"{header} did not compile on its own"
        time.sleep(1)
    raise AssertionError(f"{header} was not precompiled within {timeout} s")


def _headers_read(build_dir: Path) -> list[str]:
    """What GCC's -H prints for the one compile of `build_dir` (Meson's compile_commands.json), rerun."""
    (entry,) = json.loads((build_dir / "compile_commands.json").read_text())
    command = shlex.split(entry["command"])
    command = [a for a in command if not a.endswith("ccache")]
    drop = {k + 1 for k, a in enumerate(command) if a in ("-o", "-MQ", "-MF")}
    command = [a for k, a in enumerate(command) if k not in drop and a not in ("-o", "-MQ", "-MF", "-MD")]
    run = subprocess.run(
        [*command, "-H", "-o", os.devnull], cwd=entry["directory"], capture_output=True, text=True, check=True
    )
    return run.stderr.splitlines()


BAD_MODEL = """import torch
import bad_ops  # noqa: F401


class Model(torch.nn.Module):
    def forward(self, x):
        return torch.ops.OP(x)
"""
BAD_OPS = """import torch


@torch.library.custom_op("bad_ops::nofake", mutates_args=())
def nofake(x: torch.Tensor) -> torch.Tensor:
    return x.sin()
"""
# torch/extension.h, as torch.utils.cpp_extension's tutorials start: it needs the C++ API's include directory.
NO_META_CPP = """#include <torch/extension.h>

at::Tensor twice(const at::Tensor& x) { return x * 2; }
TORCH_LIBRARY(nometa_ops, m) { m.def("twice(Tensor x) -> Tensor"); }
TORCH_LIBRARY_IMPL(nometa_ops, CPU, m) { m.impl("twice", twice); }
"""
BAD_SPEC = """[project]
name = "bad"

[[custom_op]]
ENTRY

[[graph]]
name = "forward"
entry = "bad_model:Model"
inputs = [{ name = "x", shape = [4, 16] }]
"""


@pytest.mark.parametrize(
    ("entry", "op", "message"),
    [
        (
            'sources = ["missing.cpp"]',
            "bad_ops.nofake",
            "custom_op[0].sources[0]: 'missing.cpp' does not exist (paths are relative to the spec's directory, {dir})",
        ),
        (
            'module = "no_such_module"',
            "bad_ops.nofake",
            "custom_op[0].module: no module named 'no_such_module' in the spec's directory ({dir}) or the environment",
        ),
        (
            'module = "broken_ops"',
            "bad_ops.nofake",
            "custom_op[0].module: cannot import 'broken_ops': ZeroDivisionError: division by zero (at broken_ops.py:1)",
        ),
        (
            'module = "bad_ops"',
            "bad_ops.absent",
            "graph[0]: the model calls torch.ops.bad_ops.absent, which no [[custom_op]] registers (they register: bad_ops::nofake); "
            "define it in an entry's sources (TORCH_LIBRARY) or module (torch.library.custom_op)",
        ),
        (
            'sources = ["nometa.cpp"]',
            "nometa_ops.twice",
            "graph[0]: nometa_ops::twice (custom_op[0]) has no fake implementation, which tracing needs for its output's shapes: register one "
            'with torch.library.register_fake("nometa_ops::twice") in a module, or a Meta kernel with TORCH_LIBRARY_IMPL(nometa_ops, Meta, m)',
        ),
        (
            'module = "bad_ops"',
            "bad_ops.nofake",
            "graph[0]: bad_ops::nofake (custom_op[0]) has no fake implementation, which tracing needs for its output's shapes: register one "
            'with torch.library.register_fake("bad_ops::nofake") in a module, or a Meta kernel with TORCH_LIBRARY_IMPL(bad_ops, Meta, m)',
        ),
    ],
)
def test_bad_custom_ops_exit_2(tmp_path: Path, entry: str, op: str, message: str) -> None:
    project = tmp_path / "bad"
    project.mkdir()
    (project / "bad_model.py").write_text(edited(BAD_MODEL, "OP", op))
    (project / "bad_ops.py").write_text(BAD_OPS)
    (project / "broken_ops.py").write_text("1 / 0\n")
    (project / "nometa.cpp").write_text(NO_META_CPP)
    spec = project / "bad.toml"
    spec.write_text(edited(BAD_SPEC, "ENTRY", entry))
    result = shimgen("build", spec, "--out", tmp_path / "out")
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == f"shimgen: {spec}: " + message.format(dir=project)


# Last in this file: the precompiled header that the edits above started compiles at low priority while the tests
# between run, instead of this worker waiting for it.
def test_an_edited_op_compiles_with_the_precompiled_header_made_aside(inc_project: dict[str, Any]) -> None:
    """Edits pay for the per-user precompiled ATen/ATen.h (the header ops.cpp includes first), made aside by the edit's
    build; the next compile takes it: GCC's -H marks a header it took precompiled with "!" (an invalid one with "x")."""
    from shimgen import toolchain

    if "clang" in toolchain.detect().cxx_identity.lower():
        pytest.skip("the precompiled header is made for GCC alone")
    project, spec, out = inc_project["project"], inc_project["spec"], inc_project["out"]
    if not inc_project["edited"]:  # this test run alone
        build_json(spec, out)
        (project / "ops.cpp").write_text(edited(OPS_CPP, "SCALE", "3.0"))
        build_json(spec, out)
    _wait_for_precompiled("ATen/ATen.h")
    (project / "ops.cpp").write_text(edited(OPS_CPP, "SCALE", "2.0"))
    build_json(spec, out)
    seen = _headers_read(out / "build" / "inc" / "ops" / "meson")
    used = [line for line in seen if line.endswith("ATen/ATen.h.gch")]
    assert used and used[0].startswith("! ") and str(toolchain.cache_dir().parent) in used[0], seen[:20]
