"""End to end: real Meson, ninja, g++, meson-python and pip, on the mlp and two-graph specs."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import time
import urllib.request
import venv
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import (
    FAST_FLAGS,
    build_json,
    cache_sharing_the_toolchain,
    edited,
    import_package,
    shimgen,
    spec_of_its_own,
    with_flags,
)

from shimgen import toolchain
from shimgen.build import workers
from shimgen.errors import UserError
from shimgen.spec import load_spec
from shimgen.toolchain import probe
from shimgen.trace.entry import load_model, make_inputs

pytestmark = pytest.mark.slow


def eager_and_inputs(
    spec_path: Path, graph_index: int, sizes: dict[str, int], seed: int = 7
) -> tuple[Any, Any, list[torch.Tensor]]:
    spec = load_spec(spec_path)
    graph = spec.graph[graph_index]
    model = load_model(graph, f"graph[{graph_index}]", spec_path.parent)
    return graph, model, make_inputs(graph, sizes, seed)


def test_build_summary(built_mlp: dict[str, Any], workdir: Path) -> None:
    assert built_mlp["graphs"] == ["forward"]
    assert Path(built_mlp["wheel"]).is_file() and Path(built_mlp["wheel"]).parent == workdir / "dist"
    assert Path(built_mlp["package_dir"], "mlp", "__init__.py").is_file()
    assert {"toolchain", "trace", "codegen", "render", "compile", "package"} <= set(built_mlp["stages"])
    assert built_mlp["compiled_units"]["done"] == built_mlp["compiled_units"]["total"] > 0
    assert built_mlp["target"] == "cpu-native"
    # kernel_choice.untimed_kernel: at 4 rows (the example batch) each Linear takes Inductor's C++ GEMM template
    # against oneDNN untimed, and the summary says so.
    assert built_mlp["untimed_gemms"] == {
        "forward_cpu": [{"sizes": ["4x32", "32x32"], "kernel": "template", "count": 8}]  # mlp.toml: 8 Linear layers
    }
    assert "forward_cpu" not in built_mlp["kernel_choices"]
    # The template's partitions were rewritten to follow the caller's team (batch is dynamic): a torch whose template
    # text differs would leave it made for this machine's cores.
    kernels = "".join(
        p.read_text() for p in (workdir / "build" / "mlp" / "codegen" / "forward_cpu").glob("kernels_*.cpp")
    )
    assert "int64_t num_threads = omp_get_max_threads();" in kernels and "constexpr int64_t num_threads" not in kernels


LARGE_KERNEL = """
[project]
name = "scanner"

[[graph]]
name = "steps"
entry = "models.shapes:chunked_scan"
inputs = [{ name = "x", shape = ["batch", 4, "n", "n"] }]
dims = { batch = { min = 2, max = 8 }, n = { min = 16, max = 64 } }
"""


def test_a_kernel_too_large_for_o3_compiles_at_o2(workdir: Path, tmp_path: Path) -> None:
    """A chunked scan that Inductor fuses into one kernel of 0.4 MB: its file compiles at -O2 (-O3 takes minutes on
    kernels ten times that size), the summary says so, and the package computes what eager does."""
    spec = spec_of_its_own(workdir, tmp_path / "spec" / "scanner.toml", LARGE_KERNEL)
    summary = build_json(spec, tmp_path)
    [(unit, files)] = summary["large_kernels"].items()
    assert unit == "steps_cpu" and [f["file"] for f in files] == ["kernels_0.cpp"], files
    assert files[0]["kernel_bytes"] >= 256 << 10
    eager = load_model(load_spec(spec).graph[0], "graph[0]", spec.parent)
    x = torch.randn(3, 4, 20, 20)
    torch.testing.assert_close(import_package(summary).steps(x), eager(x))


def test_mlp_matches_eager(built_mlp: dict[str, Any], workdir: Path) -> None:
    mlp = import_package(built_mlp)
    for batch in (1, 5, 64):
        graph, model, inputs = eager_and_inputs(workdir / "projects" / "mlp.toml", 0, {"batch": batch})
        with torch.no_grad():
            torch.testing.assert_close(mlp.forward(*inputs), model(*inputs), rtol=1e-5, atol=1e-5)


def test_two_graphs_keep_structure(built_multi: dict[str, Any], workdir: Path) -> None:
    multi = import_package(built_multi)
    spec_path = workdir / "projects" / "multi.toml"
    graph, model, (x, scale) = eager_and_inputs(spec_path, 0, {"batch": 3})
    with torch.no_grad():
        want = model(x, scale=scale)
    got = multi.heads(x, scale=scale)
    assert isinstance(got, dict) and list(got) == ["logits", "stats"] and isinstance(got["stats"], tuple)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    with pytest.raises(TypeError, match="takes 1 positional input but 2 were given"):
        multi.heads(x, scale)  # scale is keyword-only, as in the model

    graph, fn, (a, b) = eager_and_inputs(spec_path, 1, {"n": 7, "m": 2})
    torch.testing.assert_close(multi.distance(a, b=b), fn(a, b), rtol=1e-5, atol=1e-5)


def test_two_graphs_trace_and_generate_at_once(built_multi: dict[str, Any]) -> None:
    if not workers.count(2, in_process=False):
        pytest.skip(
            f"this machine runs one worker process ({os.cpu_count()} cores, {workers.MEMORY_PER_WORKER >> 30} GiB each)"
        )
    for stage in ("trace", "codegen"):
        (a_start, a_end), (b_start, b_end) = sorted(
            (e["start"], e["end"]) for e in built_multi["timeline"] if e["stage"] == stage
        )
        assert b_start < a_end, f"{stage} of the two graphs ran one after the other: {built_multi['timeline']}"
    assert built_multi["elapsed"] < sum(built_multi["stages"].values())


def test_docstrings_list_inputs(built_multi: dict[str, Any]) -> None:
    multi = import_package(built_multi)
    doc = multi.heads.__doc__
    assert doc.startswith("heads(x, *, scale)")
    assert "x: float32[batch, 32]" in doc and "scale: float32[32]" in doc and "batch: 1..16" in doc
    assert "Returns: {'logits': Tensor, 'stats': (Tensor, Tensor)}" in doc
    assert "n: 1..32" in multi.distance.__doc__ and "m: 2..8" in multi.distance.__doc__


def test_noop_rebuild_skips_every_stage(built_mlp: dict[str, Any], workdir: Path) -> None:
    again = build_json(workdir / "projects" / "mlp.toml", workdir)
    assert {"trace:forward_cpu", "codegen:forward_cpu", "package"} <= set(again["skipped"])
    assert again["compiled_units"]["done"] in (0, 1)  # at most Meson's own regeneration step
    assert again["wheel"] == built_mlp["wheel"]


def test_check_passes(built_multi: dict[str, Any], workdir: Path) -> None:
    result = shimgen("check", workdir / "projects" / "multi.toml", "--out", workdir, "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["ok"]
    cases = {(c["graph"], c["case"]) for c in report["comparisons"]}
    assert {
        ("heads", "example"),
        ("heads", "batch=1"),
        ("heads", "batch=16"),
        ("distance", "m=2"),
        ("distance", "n=32"),
    } <= cases
    assert "all 19 outputs match eager" in result.stderr


def test_check_fails_beyond_tolerance(built_multi: dict[str, Any], workdir: Path) -> None:
    spec = (workdir / "projects" / "multi.toml").read_text()
    tight = workdir / "projects" / "multi_tight.toml"
    # Same project and graphs (no rebuild: tolerances are check-only); zero tolerance on `heads`,
    # whose LayerNorm and softmax reductions are ordered differently from eager.
    tight.write_text(
        edited(
            spec,
            "dims = { batch = { min = 1, max = 16 } }",
            "dims = { batch = { min = 1, max = 16 } }\natol = 0.0\nrtol = 0.0",
        )
    )
    result = shimgen("check", tight, "--out", workdir)
    assert result.returncode == 1, result.stderr
    assert "MISMATCH" in result.stderr and "beyond tolerance" in result.stderr
    assert "Traceback" not in result.stderr


@contextlib.contextmanager
def package_index(wheels: list[Path], root: Path) -> Iterator[str]:
    """A real package index (pypiserver) on localhost serving these wheels alone (no fallback to PyPI); its URL."""
    served = root / "served"
    served.mkdir()
    for wheel in wheels:
        shutil.copy(wheel, served)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = (root / "pypiserver.log").open("w")
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pypiserver",
            "run",
            "-p",
            str(port),
            "-i",
            "127.0.0.1",
            "--disable-fallback",
            str(served),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}/simple/"
    try:
        for _ in range(100):
            try:
                with urllib.request.urlopen(url, timeout=1):
                    break
            except OSError:
                assert server.poll() is None, (root / "pypiserver.log").read_text()
                time.sleep(0.1)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=10)
        log.close()


def test_wheels_are_manylinux_pass_twine_and_install_from_a_package_index_into_a_fresh_venv(
    built_mlp: dict[str, Any], built_multi: dict[str, Any], workdir: Path, tmp_path: Path
) -> None:
    """The wheels carry the manylinux tag auditwheel's symbol-version check gives them (torch's libraries excluded, as
    PyTorch extension projects exclude them), pass `twine check --strict`, and install by name from a package index
    into a fresh venv that has torch, where they run without shimgen."""
    wheels = [Path(built_mlp["wheel"]), Path(built_multi["wheel"])]
    twine = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", *map(str, wheels)], capture_output=True, text=True
    )
    assert twine.returncode == 0, twine.stdout + twine.stderr
    torch_libs = {p.name for p in (Path(torch.__file__).parent / "lib").iterdir()}
    for wheel in wheels:
        shown = subprocess.run(
            [sys.executable, "-m", "auditwheel", "show", "--json", str(wheel)], capture_output=True, text=True
        )
        assert shown.returncode == 0, shown.stderr
        audit = json.loads(shown.stdout)
        assert wheel.name.endswith(f"-{audit['sym_tag']}.whl")
        upgrade = audit["policy_upgrades"].get(audit["sym_tag"], {"libs_to_eliminate": []})
        assert set(upgrade["libs_to_eliminate"]) <= torch_libs

    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    torch_version = torch.__version__.split("+")[0]
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    # torch first and explicitly (never resolved by a wheel's requirement), then the built wheels from the index.
    subprocess.run([*pip, f"torch=={torch_version}"], check=True)
    with package_index(wheels, tmp_path) as index:
        installed = subprocess.run([*pip, "--index-url", index, "mlp", "multi"], capture_output=True, text=True)
    assert installed.returncode == 0, installed.stdout + installed.stderr

    graph, model, (x,) = eager_and_inputs(workdir / "projects" / "mlp.toml", 0, {"batch": 6})
    hgraph, heads, (hx, scale) = eager_and_inputs(workdir / "projects" / "multi.toml", 0, {"batch": 2})
    with torch.no_grad():
        expected = {"mlp": model(x), "heads": heads(hx, scale=scale)}
    torch.save({"inputs": (x, hx, scale), "expected": expected}, tmp_path / "case.pt")
    script = f"""
import importlib.util, torch, mlp, multi
assert importlib.util.find_spec("shimgen") is None, "shimgen must not be needed at run time"
case = torch.load({str(tmp_path / "case.pt")!r})
x, hx, scale = case["inputs"]
torch.testing.assert_close(mlp.forward(x), case["expected"]["mlp"], rtol=1e-5, atol=1e-5)
torch.testing.assert_close(multi.heads(hx, scale=scale), case["expected"]["heads"], rtol=1e-4, atol=1e-5)
print("venv ok", mlp.__file__)
"""
    run = subprocess.run([str(python), "-c", script], capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert str(env_dir) in run.stdout
    requires = subprocess.run([str(python), "-m", "pip", "show", "mlp"], capture_output=True, text=True).stdout
    assert "Requires: torch" in requires
    metadata = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; print(m.requires('mlp'))"], capture_output=True, text=True
    ).stdout
    assert f"torch=={torch_version}" in metadata


def test_gemms_with_many_rows_get_the_library_kernel_untimed(workdir: Path) -> None:
    """kernel_choice.untimed_kernel: at example batch 32 the mlp's Linears are not timed (the template would lose
    there); the summary lists them, the lockfile has nothing for them, and the package computes what eager does."""
    spec = workdir / "projects" / "mlp_rows.toml"
    spec.write_text(
        edited(
            edited((workdir / "projects" / "mlp.toml").read_text(), 'name = "mlp"', 'name = "mlp_rows"'),
            "example = 4",
            "example = 32",
        )
    )
    summary = build_json(spec, workdir)
    assert summary["untimed_gemms"] == {"forward_cpu": [{"sizes": ["32x32", "32x32"], "kernel": "library", "count": 8}]}
    assert "forward_cpu" not in summary["kernel_choices"]
    lock = spec.with_name(spec.name + ".lock")
    assert not lock.is_file() or not json.loads(lock.read_text())["units"]
    package = import_package(summary)
    graph, model, (x,) = eager_and_inputs(spec, 0, {"batch": 40})
    with torch.no_grad():
        torch.testing.assert_close(package.forward(x), model(x), rtol=1e-5, atol=1e-5)


def test_meson_python_makes_the_same_package(built_mlp: dict[str, Any], workdir: Path, tmp_path: Path) -> None:
    """shimgen writes the wheel from Meson's install plan; meson-python, run on the generated project (reusing its
    build directory, as pip would without build isolation), packs the same files under the same names."""
    project, build_dir = workdir / "build" / "mlp" / "project", workdir / "build" / "mlp" / "meson"
    made = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, mesonpy; print(mesonpy.build_wheel(sys.argv[1], {'build-dir': sys.argv[2]}))",
            str(tmp_path),
            str(build_dir),
        ],
        cwd=project,
        capture_output=True,
        text=True,
        env={**os.environ, "MESON": toolchain.detect().meson},
    )
    assert made.returncode == 0, made.stdout + made.stderr
    theirs, ours = tmp_path / made.stdout.split()[-1], Path(built_mlp["wheel"])
    # meson-python tags the platform as it is (auditwheel's job to narrow); shimgen checks the manylinux policies.
    assert re.sub(r"manylinux_\d+_\d+_", "linux_", ours.name) == theirs.name

    def contents(wheel: Path) -> dict[str, bytes]:
        with zipfile.ZipFile(wheel) as zf:
            return {n: zf.read(n) for n in zf.namelist() if not n.endswith(("/RECORD", "/WHEEL"))}

    assert contents(theirs) == contents(ours)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_failed_builds_keep_previous_outputs(built_mlp: dict[str, Any], workdir: Path, tmp_path: Path) -> None:
    wheel, site = Path(built_mlp["wheel"]), Path(built_mlp["package_dir"])
    before = (_digest(wheel), sorted(p.name for p in (site / "mlp").iterdir()))
    assert "__init__.py" in before[1], before
    spec = workdir / "projects" / "mlp.toml"
    original = spec.read_text()
    try:
        # A model edit that breaks tracing.
        spec.write_text(edited(original, 'shape = ["batch", 32]', 'shape = ["batch", 33]'))
        result = shimgen("build", spec, "--out", workdir)
        assert result.returncode == 2 and "the model rejected the example inputs" in result.stderr
        spec.write_text(original)

        # The failures below come from a compiler cache on PATH, which shimgen puts in front of the proved compiler
        # (the session's, whose headers are built): on the binding it fails, or renames the module's init function,
        # as the file `mode` says.
        (tmp_path / "bin").mkdir()
        fake, mode = tmp_path / "bin" / "sccache", tmp_path / "mode"  # found before any ccache
        fake.write_text(
            f'#!/bin/sh\ncxx="$1"; shift\ncase "$*" in *binding.cpp*) case "$(cat {mode})" in\n'
            '  fail) echo "binding.cpp:1:1: error: injected failure" >&2; exit 1;;\n'
            '  rename) exec "$cxx" -DPyInit__forward_cpu=PyInit_elsewhere "$@";;\nesac;; esac\nexec "$cxx" "$@"\n'
        )
        fake.chmod(0o755)
        failing = {"PATH": f"{fake.parent}{os.pathsep}{os.environ['PATH']}"}

        # A compiler that fails on the binding: the message names the unit and its first error.
        mode.write_text("fail")
        result = shimgen("build", spec, "--out", workdir, env=failing)
        assert result.returncode == 1, result.stderr
        assert "compile failed in" in result.stderr and "src/forward_cpu/binding.cpp" in result.stderr
        assert "error: injected failure" in result.stderr and "Traceback" not in result.stderr

        # A binding that compiles and links but does not import: the package stage refuses it.
        mode.write_text("rename")
        result = shimgen("build", spec, "--out", workdir, env=failing)
        assert result.returncode == 1, result.stderr
        assert "the built package 'mlp' does not import; the previous package is left in place" in result.stderr
        assert "does not define module export function" in result.stderr and "Traceback" not in result.stderr

        # A package that builds and imports but computes something else than the program it was compiled from (here its
        # weights file altered after codegen) fails the build.
        weights_file = workdir / "build" / "mlp" / "codegen" / "forward_cpu" / "weights.safetensors"
        good_weights = weights_file.read_bytes()
        (length,) = struct.unpack("<Q", good_weights[:8])
        data = torch.frombuffer(bytearray(good_weights[8 + length :]), dtype=torch.float32) * 1.5
        weights_file.write_bytes(good_weights[: 8 + length] + data.numpy().tobytes())
        try:
            result = shimgen("build", spec, "--out", workdir)
        finally:
            weights_file.write_bytes(good_weights)
        assert result.returncode == 1, result.stderr
        # Its code passed every size in an earlier build: the check runs it at its example.
        assert (
            "the built package 'mlp' does not compute what its traced program does; the previous package is left in place: "
            "graph[0] (forward, cpu) at example (batch=4): output 0 differs from the traced program"
        ) in result.stderr
        # The same code passed before: not generated again without oneDNN (test_fallbacks), whose fusions are not why.
        assert "oneDNN" not in result.stderr
        assert "Traceback" not in result.stderr
    finally:
        spec.write_text(original)
    assert (_digest(wheel), sorted(p.name for p in (site / "mlp").iterdir())) == before
    check = subprocess.run(
        [
            sys.executable,
            "-c",
            f"import sys, torch; sys.path.insert(0, {str(site)!r}); import mlp; print(mlp.forward(torch.ones(2, 32)).shape)",
        ],
        capture_output=True,
        text=True,
    )
    assert check.stdout.strip() == "torch.Size([2, 32])", check.stderr


def test_every_graph_error_is_reported_in_spec_order(workdir: Path, tmp_path: Path) -> None:
    # Two graphs whose models reject their inputs, traced at once in worker processes: whichever finishes first, the
    # build reports both, graph[0] first.
    spec = workdir / "projects" / "two_broken.toml"
    graph = '[[graph]]\nname = "{}"\nentry = "models.mlp:mlp"\nkwargs = {{ width = 32, depth = 2 }}\ninputs = [{{ name = "x", shape = [2, {}] }}]\n'
    spec.write_text('[project]\nname = "two_broken"\n\n' + graph.format("first", 31) + graph.format("second", 33))
    result = shimgen("build", spec, "--out", tmp_path)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("shimgen: ")]
    assert [line.split(": ")[2] for line in lines] == ["graph[0].inputs", "graph[1].inputs"], result.stderr
    assert all("the model rejected the example inputs" in line for line in lines) and "Traceback" not in result.stderr


def test_an_inductor_cache_path_a_shell_would_split_is_refused_by_name(workdir: Path, tmp_path: Path) -> None:
    """Inductor compiles through a command line it does not quote: in a cache directory whose path holds a space, every
    compile fails with a linker error. shimgen says so, and how to fix it, before Inductor starts."""
    inductor = tmp_path / "inductor cache"
    text = with_flags((workdir / "projects" / "mlp.toml").read_text(), **FAST_FLAGS)
    spec = spec_of_its_own(workdir, tmp_path / "spec" / "mlp.toml", text)
    env = {"TORCHINDUCTOR_CACHE_DIR": str(inductor), "SHIMGEN_CACHE_DIR": str(cache_sharing_the_toolchain(tmp_path))}
    result = shimgen("build", spec, "--out", tmp_path / "out", env=env)
    assert result.returncode == 2, result.stderr
    assert f"Inductor's cache directory {str(inductor)!r} holds ' '" in result.stderr, result.stderr
    assert "Set TORCHINDUCTOR_CACHE_DIR" in result.stderr and "Traceback" not in result.stderr


def test_a_first_build_that_fails_leaves_no_warm_up_running(tmp_path: Path) -> None:
    """On an empty per-user cache a build proves the compiler and builds the runtime library in a process of its own
    while it traces; a build that fails in its trace stops that process, and what it runs, before it exits."""
    cache = tmp_path / "cache" / "toolchain"
    (tmp_path / "slow_broken.py").write_text(
        "import time\n\ndef model():\n"
        "    time.sleep(5)  # meanwhile the warm-up proves the compiler\n"
        "    raise RuntimeError('this model cannot be built')\n"
    )
    spec = tmp_path / "slow_broken.toml"
    spec.write_text(
        '[project]\nname = "slow_broken"\n\n[[graph]]\nname = "forward"\nentry = "slow_broken:model"\n'
        'inputs = [{ name = "x", shape = [2, 4] }]\n'
    )
    result = shimgen("build", spec, "--out", tmp_path / "out", env={"SHIMGEN_CACHE_DIR": str(cache)})
    assert result.returncode == 2 and "this model cannot be built" in result.stderr, result.stderr
    assert list(cache.glob("*.lock")), "no warm-up took the toolchain probe's lock"
    marker = f"SHIMGEN_CACHE_DIR={cache}".encode()
    left = []
    for proc in Path("/proc").iterdir():
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
            command = (proc / "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:  # not a process, gone meanwhile, or another user's
            continue
        if marker in environ and b"shimgen.commands.server" not in command:  # the build server stays, idle
            left.append(command.decode(errors="replace"))
    assert not left, left


def test_portable_isa_builds_without_native_flags(workdir: Path) -> None:
    spec = workdir / "projects" / "mlp_portable.toml"
    spec.write_text(
        edited((workdir / "projects" / "mlp.toml").read_text(), 'name = "mlp"', 'name = "mlp_portable"')
        + '\n[[target]]\ndevice = "cpu"\nisa = "default"\n'
    )
    summary = build_json(spec, workdir)
    assert summary["target"] == "cpu-default"
    commands = json.loads((workdir / "build" / "mlp_portable" / "meson" / "compile_commands.json").read_text())
    assert commands and all(
        "-march=native" not in c["command"] and "-march=x86-64 " in c["command"] + " " for c in commands
    )
    assert not any("CPU_CAPABILITY_AVX" in c["command"] for c in commands)
    # Kernel choice is timed here too, among candidates the target can run: never a library's packed weights.
    picked = {c["picked"].split(" cpp_")[0] for c in summary["kernel_choices"]["forward_cpu"]}
    assert picked <= {"ATen addmm", "Inductor C++ GEMM template"}, picked
    model_cpp = (workdir / "build" / "mlp_portable" / "codegen" / "forward_cpu" / "model.cpp").read_text()
    assert "mkldnn" not in model_cpp and "_mkl_" not in model_cpp
    package = import_package(summary)
    graph, model, (x,) = eager_and_inputs(spec, 0, {"batch": 9})
    with torch.no_grad():
        torch.testing.assert_close(package.forward(x), model(x), rtol=1e-5, atol=1e-5)


def test_probe_rejects_a_compiler_whose_extensions_crash(
    workdir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A compiler whose libraries segfault when loaded is caught in a subprocess and skipped."""
    real = shutil.which("g++")
    assert real, "these tests need g++"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # Only in shared objects (-fPIC without -fPIE), so that Meson's sanity check still passes; a
    # constructor raising the signal survives any optimisation level (a null store does not).
    (tmp_path / "crash.h").write_text(
        "#if defined(__PIC__) && !defined(__PIE__)\n#include <signal.h>\n"
        "__attribute__((constructor)) static void shimgen_crash(void) { raise(SIGSEGV); }\n#endif\n"
    )
    # Named as no usual compiler is: the one that works after it is the session's (its headers and runtime library are
    # built already).
    crashing = bin_dir / "crashing-c++"
    crashing.write_text(f'#!/bin/sh\nexec {real} -include {tmp_path / "crash.h"} "$@"\n')
    crashing.chmod(0o755)
    env = {"SHIMGEN_CACHE_DIR": str(cache_sharing_the_toolchain(tmp_path)), "CXX": str(crashing)}
    doctor = shimgen("doctor", env=env)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert f"FAIL {crashing}" in doctor.stdout and "crash when loaded (signal 11)" in doctor.stdout
    assert f"selected:       {crashing}" not in doctor.stdout and "selected:       none" not in doctor.stdout

    # CXX names the broken compiler: tried first, then another that works, with a warning.
    text = with_flags((workdir / "projects" / "mlp.toml").read_text(), **FAST_FLAGS)
    spec = spec_of_its_own(workdir, tmp_path / "spec" / "mlp.toml", text)
    build = shimgen("build", spec, "--out", tmp_path, "--json", env=env)
    assert build.returncode == 0, build.stderr
    assert f"warning: {crashing}" in build.stderr and "crash when loaded (signal 11)" in build.stderr

    # Only broken compilers: one message naming each failure and the fix.
    monkeypatch.setenv("SHIMGEN_CACHE_DIR", env["SHIMGEN_CACHE_DIR"])
    monkeypatch.setattr(toolchain, "candidate_compilers", lambda: [str(crashing)])
    with pytest.raises(UserError) as exc:
        probe.select()
    assert "failed with every C++ compiler here" in str(exc.value)
    assert (
        f"{crashing} (" in str(exc.value)
        and "crash when loaded (signal 11)" in str(exc.value)
        and "Fix:" in str(exc.value)
    )


def test_probe_falls_back_to_the_compilers_default_linker(tmp_path: Path) -> None:
    """Where the fastest linker installed fails, the compiler is proved again with its default linker and chosen so."""
    fast = toolchain.fast_linker()
    if not fast:
        pytest.skip("no linker faster than the default is installed here (ld.mold, ld.lld or ld.gold)")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    broken = bin_dir / f"ld.{fast}"  # found on PATH before the real one, by fast_linker and by the compiler
    broken.write_text("#!/bin/sh\necho 'injected linker failure' >&2\nexit 1\n")
    broken.chmod(0o755)
    env = {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "SHIMGEN_CACHE_DIR": str(tmp_path / "cache"),
        "CXX": "",
    }
    doctor = shimgen("doctor", env=env)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    first = toolchain.candidate_compilers()[0]
    assert re.search(rf"FAIL {re.escape(first)} with ld\.{fast} \(.*\): meson setup failed", doctor.stdout), (
        doctor.stdout
    )
    assert re.search(rf"ok   {re.escape(first)} \(.*\): builds and loads the probe", doctor.stdout), doctor.stdout
    assert re.search(rf"selected: +{re.escape(first)} \(", doctor.stdout), doctor.stdout
