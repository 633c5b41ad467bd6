"""CUDA targets, on a machine with a GPU: embedded Triton kernels, one package for cpu and cuda,
CUDA graphs inside the shim, TMA, and bad inputs. CI has no GPU; these run on the GPU machine and
what they printed is committed under benchmarks/results/."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import venv
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import build_json, edited, import_package, shimgen, spec_of_its_own
from cpp_program import cmake_built_program, read_tensors, run_graph

from shimgen.spec import load_spec
from shimgen.trace.entry import load_model, make_inputs

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.slow,
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False; CI has none)"
    ),
]


def eager(
    spec: Path, index: int, device: str, sizes: dict[str, int] | None = None, seed: int = 3
) -> tuple[Any, list[torch.Tensor]]:
    graph = load_spec(spec).graph[index]
    model = load_model(graph, f"graph[{index}]", spec.parent)
    if isinstance(model, torch.nn.Module):
        model = model.to(device)
    inputs = [
        t.to(device)
        for t in make_inputs(graph, {**{n: d.example for n, d in graph.dims.items()}, **(sizes or {})}, seed)
    ]
    return model, inputs


def fatbins(summary: dict[str, Any]) -> list[Path]:
    """The build's embedded kernels; every CUDA build here has some, so none is a failure, not an empty check."""
    meson_dir = Path(summary["package_dir"]).parent / "meson"
    found = sorted(meson_dir.glob("*.fatbin"))
    assert found, f"no fatbin under {meson_dir}"
    return found


def cuobjdump(*args: str | Path) -> str:
    tool = shutil.which("cuobjdump") or "/usr/local/cuda/bin/cuobjdump"
    return subprocess.run([tool, *map(str, args)], capture_output=True, text=True, check=True).stdout


@pytest.fixture(scope="module")
def built_gpu(workdir: Path) -> dict[str, Any]:
    return build_json(workdir / "projects" / "gpu.toml", workdir)


@pytest.fixture(scope="module")
def built_graphs(workdir: Path) -> dict[str, Any]:
    return build_json(workdir / "projects" / "gpu_graphs.toml", workdir)


def test_check_against_eager_on_cpu_and_cuda(built_gpu: dict[str, Any], workdir: Path) -> None:
    result = shimgen("check", workdir / "projects" / "gpu.toml", "--out", workdir, "--json")
    assert result.returncode == 0, result.stderr
    cases = {row["case"].split(":")[0] for row in json.loads(result.stdout)["comparisons"]}
    assert cases == {"cpu", "cuda"}
    print(result.stderr)


def test_small_gemms_get_cublas_untimed(built_gpu: dict[str, Any]) -> None:
    """kernel_choice.GPU_TEMPLATE_ROWS: at example batch 4 the mlp's Linears get cuBLAS, no Triton template compiled
    and timed (it would lose: results/gemm_rule_cuda.md)."""
    untimed = built_gpu["untimed_gemms"]["mlp_cuda"]
    assert sum(g["count"] for g in untimed) == 8 and {s for g in untimed for s in g["sizes"]} == {"4x32"}, untimed
    assert "mlp_cuda" not in built_gpu["kernel_choices"]


def test_one_package_dispatches_on_device(built_gpu: dict[str, Any], workdir: Path) -> None:
    gpu = import_package(built_gpu)
    for device in ("cpu", "cuda"):
        model, (x,) = eager(workdir / "projects" / "gpu.toml", 0, device, {"batch": 9})
        out = gpu.mlp(x)
        assert out.device == x.device
        torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match=r"input 'x' is on meta; this package was built for cpu-native and cuda-sm_90"):
        gpu.mlp(torch.empty(4, 32, device="meta"))


def test_kernels_are_embedded_and_their_sources_shipped(built_gpu: dict[str, Any]) -> None:
    package = Path(built_gpu["package_dir"]) / "gpu"
    sources = sorted((package / "kernels" / "mlp_cuda").glob("*.py"))
    ptx = sorted((package / "kernels" / "mlp_cuda").glob("*.ptx"))
    assert sources and len(ptx) == len(sources)
    assert all("@triton.jit" in s.read_text() for s in sources)
    extensions = sorted(package.glob("_*_cuda*.so"))
    assert extensions, f"no cuda extension module in {package}"
    for so in extensions:
        assert not re.search(rb"/[\w./-]+\.cubin", so.read_bytes()), f"{so.name} names a kernel file to load"
    listing = cuobjdump("--list-elf", "--list-ptx", fatbins(built_gpu)[0])
    assert re.search(r"sm_90a?\.cubin", listing) and ".ptx" in listing, listing


def test_wheel_runs_in_fresh_venv_without_build_machine_files(
    built_gpu: dict[str, Any], workdir: Path, tmp_path: Path
) -> None:
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # This machine has no package index: the environment gets torch by path, the wheel by pip.
    Path(site, "torch_from_base.pth").write_text(str(Path(torch.__file__).parents[1]) + "\n")
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", built_gpu["wheel"]], check=True
    )
    model, (x,) = eager(workdir / "projects" / "gpu.toml", 0, "cuda", {"batch": 5})
    torch.save({"x": x.cpu(), "expected": model(x).cpu()}, tmp_path / "case.pt")
    script = """
import sys, torch, gpu
case = torch.load(sys.argv[1])
torch.testing.assert_close(gpu.mlp(case["x"].cuda()).cpu(), case["expected"], rtol=1e-4, atol=1e-4)
assert "shimgen" not in sys.modules
print("ok", gpu.__file__)
"""
    hidden = [p for p in Path("/tmp").glob("torchinductor_*") if p.is_dir()]
    for p in hidden:
        p.rename(p.with_name(p.name + ".hidden"))
    build_dir = Path(built_gpu["package_dir"]).parent
    build_dir.rename(build_dir.with_name("gpu.hidden"))
    try:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        run = subprocess.run(
            [str(python), "-c", script, str(tmp_path / "case.pt")],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env={**env, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "empty-cache")},
        )
    finally:
        build_dir.with_name("gpu.hidden").rename(build_dir)
        for p in hidden:
            if p.exists():  # made again meanwhile, by a build beside this test
                shutil.copytree(p.with_name(p.name + ".hidden"), p, dirs_exist_ok=True, symlinks=True)
                shutil.rmtree(p.with_name(p.name + ".hidden"))
            else:
                p.with_name(p.name + ".hidden").rename(p)
    assert run.returncode == 0, run.stderr
    assert str(env_dir) in run.stdout


def test_cpp_package_runs_cuda_and_cuda_graphs_and_dispatches_by_device(
    built_gpu: dict[str, Any], built_graphs: dict[str, Any], workdir: Path, tmp_path: Path
) -> None:
    """A C++ program (examples/cpp, CMake) runs graph heads of the cpu+cuda package on either device's tensors and of
    the cuda_graphs package on the GPU, as eager does."""
    for summary, spec in ((built_gpu, "gpu.toml"), (built_graphs, "gpu_graphs.toml")):
        program = cmake_built_program(Path(summary["cpp_prefix"]), summary["name"], "heads", tmp_path / summary["name"])
        devices = ("cuda", "cpu") if summary is built_gpu else ("cuda",)
        for device in devices:
            model, (x, scale) = eager(workdir / "projects" / spec, 1, device, {"batch": 4})
            done = run_graph(program, "heads", [x.cpu(), scale.cpu()], tmp_path, "--device", device, "--threads", "3")
            assert done.returncode == 0, (summary["name"], device, done.stderr)
            with torch.no_grad():
                want = model(x, scale=scale)
            got = read_tensors(tmp_path / "out.bin")
            torch.testing.assert_close(
                got, [want["logits"].cpu(), *(t.cpu() for t in want["stats"])], rtol=1e-4, atol=1e-4
            )


def test_bad_cuda_inputs(built_graphs: dict[str, Any]) -> None:
    pkg = import_package(built_graphs)
    x = torch.randn(4, 32, device="cuda")
    with pytest.raises(ValueError, match=r"input 'x' is on cpu; this package was built for cuda-sm_90"):
        pkg.mlp(x.cpu())
    with pytest.raises(TypeError, match=r"input 'x' has dtype torch.float16, expected torch.float32"):
        pkg.mlp(x.half())
    with pytest.raises(ValueError, match=r"input 'scale' is on cpu"):
        pkg.heads(x, scale=torch.ones(32))
    pkg.mlp(x)
    if torch.cuda.device_count() < 2:
        pytest.skip("one GPU here: a tensor on another GPU index needs two")
    with pytest.raises(ValueError, match=r"inputs are on cuda:1, but this callable's model was loaded on cuda:0"):
        pkg.mlp(x.to("cuda:1"))
    with pytest.raises(ValueError, match=r"input 'scale' is on cuda:1 but input 'x' is on cuda:0"):
        pkg.heads(x, scale=torch.ones(32, device="cuda:1"))


def test_cuda_graphs_replay_with_fresh_outputs(built_graphs: dict[str, Any], workdir: Path) -> None:
    pkg = import_package(built_graphs)
    spec = workdir / "projects" / "gpu_graphs.toml"
    model, _ = eager(spec, 0, "cuda")
    xs = [torch.randn(4, 32, device="cuda") for _ in range(3)]
    outs = [pkg.mlp(x) for x in xs]
    torch.cuda.synchronize()
    for x, out in zip(xs, outs, strict=True):  # each call's result survives the later replays
        torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-4)
    assert len({o.data_ptr() for o in outs}) == len(outs)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        on_stream = pkg.mlp(xs[0])
    stream.synchronize()
    torch.testing.assert_close(on_stream, model(xs[0]), rtol=1e-4, atol=1e-4)
    heads, (hx, scale) = eager(spec, 1, "cuda")
    torch.testing.assert_close(pkg.heads(hx, scale=scale), heads(hx, scale=scale), rtol=1e-4, atol=1e-4)


def test_tma_kernels_use_tensor_memory_copies(workdir: Path, tmp_path: Path) -> None:
    spec = workdir / "projects" / "tma.toml"
    with_tma = build_json(spec, workdir)
    assert with_tma["compiled_units"]["done"] > 0
    result = shimgen("check", spec, "--out", workdir)
    assert result.returncode == 0, result.stderr
    sass = "".join(cuobjdump("--dump-sass", f) for f in fatbins(with_tma))
    assert "UTMALDG" in sass, "no TMA load in the built kernels"
    plain = tmp_path / "projects"
    shutil.copytree(spec.parent, plain)
    (plain / "tma.toml").write_text(edited(spec.read_text(), "tma = true", "tma = false"))
    without = build_json(plain / "tma.toml", tmp_path)
    assert "UTMALDG" not in "".join(cuobjdump("--dump-sass", f) for f in fatbins(without))
    print(
        f"TMA: {sass.count('UTMALDG')} UTMALDG instructions in {len(fatbins(with_tma))} kernels; none without flags.tma"
    )


def test_static_then_dynamic_build_embeds_its_own_kernels(workdir: Path, tmp_path: Path) -> None:
    """The same model traced with a static and then a dynamic batch: Inductor names their kernels alike."""
    projects = tmp_path / "projects"
    shutil.copytree(workdir / "projects" / "models", projects / "models")
    text = (workdir / "projects" / "gpu.toml").read_text()
    (projects / "dyn.toml").write_text(edited(text, 'name = "gpu"', 'name = "dyn"'))
    dynamic_batch = 'shape = ["batch", 32] }]\ndims = { batch = { min = 1, max = 64, example = 4 } }'
    static = edited(edited(text, 'name = "gpu"', 'name = "static_mlp"'), dynamic_batch, "shape = [4, 32] }]")
    assert static.count("shape = [4, 32]") == 1
    (projects / "stat.toml").write_text(static)
    build_json(projects / "stat.toml", tmp_path)
    dyn = import_package(build_json(projects / "dyn.toml", tmp_path))
    model, (x,) = eager(projects / "dyn.toml", 0, "cuda", {"batch": 9})
    torch.testing.assert_close(dyn.mlp(x), model(x), rtol=1e-4, atol=1e-4)


def test_cuda_custom_op_compiled_by_nvcc_and_captured(workdir: Path) -> None:
    """A .cu op compiled for the spec's archs and shipped in the package; with cuda_graphs it runs inside the graph."""
    spec = workdir / "projects" / "cuda_ops.toml"
    built = build_json(spec, workdir)
    result = shimgen("check", spec, "--out", workdir)
    assert result.returncode == 0, result.stderr
    library = Path(built["package_dir"], "cuda_ops", "ops", "libcuda_ops_ops0.so")
    assert "sm_90" in cuobjdump("--list-elf", library)
    pkg = import_package(built)
    model, (x,) = eager(spec, 0, "cuda")
    outs = [pkg.forward(x * k) for k in (1.0, 2.0, 3.0)]
    for k, out in zip((1.0, 2.0, 3.0), outs, strict=True):  # replays of the captured graph, each with its own input
        torch.testing.assert_close(out, model(x * k), rtol=1e-4, atol=1e-4)
    print(f"cuda custom op: {library.name} holds sm_90 code; 3 replays of the captured graph match eager")


def test_user_triton_kernels_with_docstrings_and_autotune(workdir: Path) -> None:
    """triton_op kernels (one with \"\"\" and backslashes in its docstring, one autotuned) beside TMA GEMMs."""
    spec = workdir / "projects" / "triton_ops.toml"
    built = build_json(spec, workdir)
    result = shimgen("check", spec, "--out", workdir)
    assert result.returncode == 0, result.stderr
    kernels = [p.name for p in Path(built["package_dir"], "triton_ops", "kernels", "forward_cuda").glob("*.ptx")]
    assert any(k.startswith("scaled_add_kernel") for k in kernels) and any(
        k.startswith("relu_kernel") for k in kernels
    ), kernels
    sass = "".join(cuobjdump("--dump-sass", f) for f in fatbins(built))
    assert "UTMALDG" in sass
    print(f"user triton kernels embedded: {sorted(kernels)}; TMA loads in the GEMMs; check matches eager")


def test_an_edit_of_a_triton_ops_kernel_generates_the_code_again(workdir: Path, tmp_path: Path) -> None:
    """A triton_op's kernel is compiled from its source: an edit of it makes the code again (the files the trace read
    count for the code, unlike for a Python op, whose body is called), and the package runs the edited kernel."""
    project = tmp_path / "project"
    (project / "models").mkdir(parents=True)
    (project / "models" / "__init__.py").write_text("")
    source = project / "models" / "triton_ops.py"
    shutil.copy(workdir / "projects" / "models" / "triton_ops.py", source)
    spec = project / "triton_ops.toml"
    shutil.copy(workdir / "projects" / "triton_ops.toml", spec)
    out = tmp_path / "out"
    build_json(spec, out)
    source.write_text(edited(source.read_text(), "x + alpha * y, mask=mask", "x - alpha * y, mask=mask"))
    after = build_json(spec, out)
    assert not [s for s in after["skipped"] if s.startswith("codegen:")], after["skipped"]
    result = shimgen("check", spec, "--out", out)
    assert result.returncode == 0, result.stderr
    print(
        f"triton_op kernel edited: code generated again; check matches eager ({result.stderr.strip().splitlines()[-1]})"
    )


HOST_TMA_MODULE = """import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton
from triton.tools.tensor_descriptor import TensorDescriptor


@triton.jit
def tma_scale_kernel(in_desc, out_desc, scale, BLOCK: tl.constexpr):
    m, n = tl.program_id(0) * BLOCK, tl.program_id(1) * BLOCK
    out_desc.store([m, n], in_desc.load([m, n]) * scale)


@triton_op("host_tma::scale", mutates_args={})
def scale(x: torch.Tensor, factor: float) -> torch.Tensor:
    out = torch.empty_like(x)
    grid = (triton.cdiv(x.shape[0], 32), triton.cdiv(x.shape[1], 32))
    wrap_triton(tma_scale_kernel)[grid](TensorDescriptor.from_tensor(x, [32, 32]), TensorDescriptor.from_tensor(out,
    [32, 32]), factor, BLOCK=32)
    return out


@triton_op("host_tma::scale_top", mutates_args={})
def scale_top(x: torch.Tensor, factor: float) -> torch.Tensor:
    out = torch.zeros_like(x)
    top = [x.shape[0] // 2, x.shape[1]]  # a descriptor over half the tensor: not one from_tensor makes
    grid = (triton.cdiv(top[0], 32), triton.cdiv(top[1], 32))
    wrap_triton(tma_scale_kernel)[grid](TensorDescriptor(x, top, list(x.stride()), [32, 32]),
    TensorDescriptor(out, top, list(out.stride()), [32, 32]), factor, BLOCK=32)
    return out


class Model(torch.nn.Module):
    def forward(self, x):
        return torch.ops.host_tma.scale(x + 1, 3.0) + 1


class Top(torch.nn.Module):
    def forward(self, x):
        return torch.ops.host_tma.scale_top(x + 1, 3.0)
"""


def host_tma_spec(tmp_path: Path, entry: str, rows: str = "min = 16, max = 256, example = 64") -> Path:
    (tmp_path / "tma_ops.py").write_text(HOST_TMA_MODULE)
    spec = tmp_path / "host_tma.toml"
    spec.write_text(
        '[project]\nname = "host_tma"\n\n[[custom_op]]\nmodule = "tma_ops"\n\n[[graph]]\nname = "forward"\n'
        f'entry = "tma_ops:{entry}"\ninputs = [{{ name = "x", shape = ["rows", 64] }}]\n'
        f"dims = {{ rows = {{ {rows} }} }}\n\n"
        '[[target]]\ndevice = "cuda"\narchs = ["sm_90"]\n'
    )
    return spec


@pytest.mark.parametrize(
    "rows,sizes",
    [
        # 40: the last block runs past the rows, which TMA leaves unwritten
        ("min = 16, max = 256, example = 64", (16, 40, 256)),
        # A derived dim (32 * Dim), whose example size torch.export.load loses (internals.load_program)
        ("min = 32, max = 256, multiple_of = 32", (32, 96, 256)),
    ],
)
def test_host_tma_descriptors_build_and_equal_eager(tmp_path: Path, rows: str, sizes: tuple[int, ...]) -> None:
    """A user kernel taking TensorDescriptor.from_tensor descriptors: the graph sees their tensors, the wrapper builds
    the descriptors at each call (a dynamic row count), the kernel loads through TMA, and the package equals eager."""
    spec = host_tma_spec(tmp_path, "Model", rows)
    built = build_json(spec, tmp_path / "out")
    sass = "".join(cuobjdump("--dump-sass", f) for f in fatbins(built))
    assert "UTMALDG" in sass and "UTMASTG" in sass
    pkg = import_package(built)
    model, _ = eager(spec, 0, "cuda")
    for size in sizes:
        x = torch.randn(size, 64, device="cuda")
        torch.testing.assert_close(pkg.forward(x), model(x))
    result = shimgen("check", spec, "--out", tmp_path / "out")
    assert result.returncode == 0, result.stderr
    print(f"host TMA descriptors: {sass.count('UTMALDG')} UTMALDG, {sass.count('UTMASTG')} UTMASTG; equal to eager")


def test_host_tma_descriptors_from_tensor_would_not_make_are_refused(tmp_path: Path) -> None:
    """A descriptor over part of its tensor cannot be made again from the tensor: refused in one paragraph, naming
    the kernel, without torch's traceback."""
    spec = host_tma_spec(tmp_path, "Top")
    result = shimgen("build", spec, "--out", tmp_path / "out")
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and "While executing" not in result.stderr, result.stderr
    assert "tlparse" not in result.stderr, result.stderr
    assert (
        "Triton kernel tma_scale_kernel: its arguments in_desc, out_desc hold tensors the graph cannot see"
        in result.stderr
    )
    assert not (tmp_path / "out" / "dist").exists()
    print(result.stderr.strip().splitlines()[-1])


@pytest.mark.parametrize("weights", ["file", "external"])
def test_per_target_wheels_merge_into_the_multi_target_package(
    built_gpu: dict[str, Any], workdir: Path, tmp_path: Path, weights: str
) -> None:
    """A matrix's jobs build gpu.toml's cpu and cuda identifiers apart (--only); `shimgen merge` joins their wheels
    (and, built with external weights, their weights files) into one package with both targets, whose callables
    dispatch on the input's device like the full build's."""
    spec = workdir / "projects" / "gpu.toml"
    if weights == "external":
        spec = spec_of_its_own(
            workdir, tmp_path / "gpu.toml", spec.read_text().replace("[flags]\n", '[flags]\nweights = "external"\n')
        )
    ids = shimgen("matrix", spec).stdout.split()
    assert len(ids) == 2 and ids[0].endswith("-cpu-native") and "-cu" in ids[1]
    wheels = []
    for identifier in ids:
        built = shimgen("build", spec, "--out", tmp_path, "--only", identifier, "--json")
        assert built.returncode == 0, built.stderr
        wheels.append(json.loads(built.stdout)["wheel"])
    assert len(set(wheels)) == 2
    merged = shimgen("merge", *wheels, "--out", tmp_path / "merged")
    assert merged.returncode == 0, merged.stderr
    wheel = Path(merged.stdout.strip())
    assert wheel.name == Path(built_gpu["wheel"]).name  # the full build's name: same version label, same tags
    site = tmp_path / "site"
    shutil.unpack_archive(wheel, site, "zip")
    env = dict(os.environ)
    if weights == "external":
        env["GPU_WEIGHTS"] = str(wheel.with_name(wheel.name.split("-cp3")[0] + ".safetensors"))
        assert Path(env["GPU_WEIGHTS"]).is_file()
    call = (
        "import sys, torch; sys.path.insert(0, sys.argv[1]); import gpu; "
        "torch.save(gpu.mlp(torch.load(sys.argv[2]).to(sys.argv[3])).cpu(), sys.argv[4])"
    )
    for device in ("cpu", "cuda"):
        model, (x,) = eager(spec, 0, device, {"batch": 7})
        torch.save(x.cpu(), tmp_path / "x.pt")
        run = subprocess.run(
            [sys.executable, "-c", call, str(site), str(tmp_path / "x.pt"), device, str(tmp_path / "y.pt")],
            capture_output=True,
            text=True,
            env=env,
        )
        assert run.returncode == 0, run.stderr
        torch.testing.assert_close(torch.load(tmp_path / "y.pt"), model(x).cpu(), rtol=1e-4, atol=1e-4)


def test_load_weights_on_cuda_recaptures_the_cuda_graph(workdir: Path, tmp_path: Path) -> None:
    spec = spec_of_its_own(
        workdir,
        tmp_path / "graphs_refit.toml",
        edited((workdir / "projects" / "gpu_graphs.toml").read_text(), 'name = "gpu_graphs"', 'name = "graphs_refit"')
        + "freezing = false\n",
    )
    summary = build_json(spec, tmp_path)
    assert (Path(summary["package_dir"]) / "graphs_refit" / "mlp_cuda.safetensors").is_file()
    package = import_package(summary)
    model, (x,) = eager(spec, 0, "cuda")
    with torch.no_grad():
        torch.testing.assert_close(package.mlp(x), model(x), rtol=1e-4, atol=1e-5)  # captured with the built weights
        for p in model.parameters():
            p.mul_(-0.5)
        package.load_weights(model.state_dict(), graphs="mlp")
        for _ in range(3):  # replays of a new capture, not of the one holding the old weights
            torch.testing.assert_close(package.mlp(x), model(x), rtol=1e-4, atol=1e-5)
        package.load_weights({k: v.cpu() for k, v in model.state_dict().items()}, graphs=["mlp"])
        torch.testing.assert_close(package.mlp(x), model(x), rtol=1e-4, atol=1e-5)


def test_external_weights_on_cuda_and_a_state_dict_refit_with_freezing(workdir: Path, tmp_path: Path) -> None:
    """flags.weights = "external": the package takes the weights file its build wrote, then a new state dict, whose
    batch norms the default build folded into the convolutions: folded again on the GPU, for the dynamic code and the
    batch-1 variant."""
    spec = spec_of_its_own(
        workdir,
        tmp_path / "cuda_refit.toml",
        textwrap.dedent("""
        [project]
        name = "cuda_refit"

        [[graph]]
        name = "forward"
        entry = "models.convnet:ConvNet"
        inputs = [{ name = "x", shape = ["batch", 3, 32, 32] }]
        dims = { batch = { min = 1, max = 8, example = 4, specialize = [1] } }

        [[target]]
        device = "cuda"
        archs = ["sm_90"]

        [flags]
        weights = "external"
    """),
    )
    summary = build_json(spec, tmp_path)
    with zipfile.ZipFile(summary["wheel"]) as wheel:
        assert not [n for n in wheel.namelist() if n.endswith(".safetensors")]
    package = import_package(summary)
    model, (x,) = eager(spec, 0, "cuda")
    with torch.no_grad():
        with pytest.raises(RuntimeError, match="no weights are loaded"):
            package.forward(x)
        package.load_weights(summary["weights_file"])
        torch.testing.assert_close(package.forward(x), model(x), rtol=1e-4, atol=1e-4)
        for bn in [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]:
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.uniform_(-0.5, 0.5)
        assert (package.forward(x) - model(x)).abs().max() > 1e-2
        package.load_weights(model.state_dict())
        for batch in (x, x[:1]):  # the dynamic code and the batch-1 variant
            torch.testing.assert_close(package.forward(batch), model(batch), rtol=1e-4, atol=1e-4)


def test_specialized_variants_on_cuda_are_captured_and_share_weights(workdir: Path, tmp_path: Path) -> None:
    """Batch 1 and 8 run captured static variants, other batches the dynamic code; the GPU holds one copy of the weights
    for all three, and load_weights reaches each."""
    spec = spec_of_its_own(
        workdir,
        tmp_path / "cuda_variants.toml",
        edited(
            edited(
                edited(
                    edited(
                        edited(
                            (workdir / "projects" / "gpu_graphs.toml").read_text(),
                            'name = "gpu_graphs"',
                            'name = "cuda_variants"',
                        ),
                        "kwargs = { width = 32, depth = 8 }",
                        "kwargs = { width = 256, depth = 8 }",
                    ),
                    'inputs = [{ name = "x", shape = [4, 32] }]',
                    'inputs = [{ name = "x", shape = ["batch", 256] }]\ndims = { batch = { min = 1, max = 16, specialize = [1, 8] } }',
                ),
                '{ name = "x", shape = [4, 32] },',
                '{ name = "x", shape = ["batch", 32] },',
            ),
            '{ name = "scale", shape = [32], keyword = true },\n]',
            '{ name = "scale", shape = [32], keyword = true },\n]\ndims = { batch = { min = 1, max = 16, specialize = [2] } }',
        )
        + "freezing = false\n",
    )
    summary = build_json(spec, tmp_path)
    package = import_package(summary)
    model, _ = eager(spec, 0, "cuda")
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    extension = package._mlp_cuda
    with torch.no_grad():
        x = torch.randn(1, 256, device="cuda")
        # cuBLAS's workspaces (32 MiB each on sm_90), which the package's GEMMs take on the first call, are not weights
        torch._C._cuda_clearCublasWorkspaces()
        before = torch.cuda.memory_allocated()
        package.mlp(x)  # the first call loads the three models and copies the weights file to the GPU
        torch.cuda.synchronize()
        torch._C._cuda_clearCublasWorkspaces()
        assert torch.cuda.memory_allocated() - before < 1.5 * weights  # one copy, not one per model
        for batch, variant in ((1, "batch=1"), (3, ""), (8, "batch=8"), (16, "")):
            x = torch.randn(batch, 256, device="cuda")
            assert extension._variant_mlp(x) == variant
            outs = [package.mlp(x) for _ in range(3)]  # replays return fresh tensors
            for out in outs:
                torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-5)
        for p in model.parameters():
            p.mul_(-0.5)
        package.load_weights({k: v.cpu() for k, v in model.state_dict().items()}, graphs="mlp")
        for batch in (1, 3, 8):
            x = torch.randn(batch, 256, device="cuda")
            torch.testing.assert_close(package.mlp(x), model(x), rtol=1e-4, atol=1e-5)
        heads, (hx, scale) = eager(spec, 1, "cuda", {"batch": 2})
        assert package._heads_cuda._variant_heads(hx, scale=scale) == "batch=2"
        torch.testing.assert_close(package.heads(hx, scale=scale), heads(hx, scale=scale), rtol=1e-4, atol=1e-4)


def test_llm_decode_on_cuda_with_cuda_graphs_shares_one_cache(workdir: Path) -> None:
    # projects/llm.toml on the GPU: decode (static) is captured, prefill's dynamic code is not, its seq=1 variant is;
    # the
    # one KV cache on the GPU is written by prefill and read by decode, in place across replays.
    major, minor = torch.cuda.get_device_capability()
    spec = workdir / "projects" / "llm_cuda.toml"
    text = edited((workdir / "projects" / "llm.toml").read_text(), 'name = "llm"', 'name = "llm_cuda"', 1)
    spec.write_text(
        text + f'\n[[target]]\ndevice = "cuda"\narchs = ["sm_{major}{minor}"]\n\n[flags]\ncuda_graphs = true\n'
    )
    summary = build_json(spec, workdir)
    assert summary["verified"]["cases"], summary["verified"]
    run = subprocess.run(
        [
            sys.executable,
            str(Path(__file__).resolve().parents[2] / "scripts" / "llm_generate.py"),
            "--spec",
            str(spec),
            "--out",
            str(workdir),
            "--tokens",
            "16",
            "--device",
            "cuda",
        ],
        capture_output=True,
        text=True,
    )
    print(run.stdout)
    assert run.returncode == 0 and "tokens equal" in run.stdout, run.stdout + run.stderr
    llm = import_package(summary)
    assert "Replayed from a CUDA graph" in llm.decode.__doc__ and "not captured" in llm.prefill.__doc__
    llm.reset_state()
    cache = next(name for name in llm.state("cuda") if "key_cache" in name)
    assert not llm.state("cuda")[
        cache
    ].any()  # before the first call: the initial values the first call takes to the GPU
    llm.prefill(torch.tensor([[5, 7, 9]], device="cuda"), cache_position=torch.arange(3, device="cuda"))
    before = llm.state("cuda")[cache]
    assert before.is_cuda and before[..., :3, :].any() and not before[..., 3:, :].any()
    for position in (3, 4):  # the first call captures, the second replays: both write the cache
        llm.decode(torch.tensor([[11]], device="cuda"), cache_position=torch.tensor([position], device="cuda"))
    after = llm.state("cuda")[cache]
    assert torch.equal(after[..., :3, :], before[..., :3, :]) and after[..., 3, :].any() and after[..., 4, :].any()


def test_counter_state_on_cuda_across_graphs_and_threads(workdir: Path) -> None:
    major, minor = torch.cuda.get_device_capability()
    spec = workdir / "projects" / "counter_cuda.toml"
    spec.write_text(
        '[project]\nname = "counter_cuda"\n\n[[graph]]\nname = "step"\nentry = "models.stateful:Counter"\n'
        'inputs = [{ name = "x", shape = ["batch", 8] }]\ndims = { batch = { min = 1, max = 4 } }\n\n'
        '[[graph]]\nname = "peek"\nentry = "models.stateful:Counter"\ninputs = [{ name = "x", shape = [1, 8] }]\n\n'
        f'[[target]]\ndevice = "cuda"\narchs = ["sm_{major}{minor}"]\n\n[flags]\ncuda_graphs = true\n'
    )
    counter = import_package(build_json(spec, workdir))
    model, _ = eager(spec, 0, "cuda")
    x = torch.ones(1, 8, device="cuda")
    with torch.no_grad():
        for graph in (counter.step, counter.peek, counter.peek, counter.step):
            torch.testing.assert_close(graph(x), model(x))
    assert counter.state("cuda")["count"].item() == 4.0
    import threading

    threads = [threading.Thread(target=lambda g=g: [g(x) for _ in range(25)]) for g in (counter.step, counter.peek)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    torch.cuda.synchronize()
    assert counter.state("cuda")["count"].item() == 54.0
    counter.reset_state()
    assert counter.state("cuda")["count"].item() == 0.0


def test_cpp_package_reads_and_resets_the_state_on_cuda(workdir: Path, tmp_path: Path) -> None:
    """From C++ on the GPU: Package::state(true) gives the device buffers as eager's after its calls (CUDA graphs on,
    so the captured graph's writes must land in them), and reset_state() puts them back for the next call."""
    major, minor = torch.cuda.get_device_capability()
    spec = workdir / "projects" / "counter_cpp_cuda.toml"
    spec.write_text(
        '[project]\nname = "counter_cpp_cuda"\n\n[[graph]]\nname = "step"\nentry = "models.stateful:Counter"\n'
        'inputs = [{ name = "x", shape = [1, 8] }]\n\n'
        f'[[target]]\ndevice = "cuda"\narchs = ["sm_{major}{minor}"]\n\n[flags]\ncuda_graphs = true\n'
    )
    summary = build_json(spec, workdir)
    program = cmake_built_program(Path(summary["cpp_prefix"]), summary["name"], "step", tmp_path / "build")
    model, [x] = eager(spec, 0, "cuda")
    done = run_graph(
        program,
        "step",
        [x.cpu()],
        tmp_path,
        "--device",
        "cuda",
        "--repeat",
        "3",
        "--state",
        str(tmp_path / "state.bin"),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["count", "total"]
    with torch.no_grad():
        for _ in range(3):
            model(x)
    torch.testing.assert_close(read_tensors(tmp_path / "state.bin"), [model.count.cpu(), model.total.cpu()])

    done = run_graph(
        program, "step", [x.cpu()], tmp_path, "--device", "cuda", "--repeat", "2", "--reset", "1", "--then", "step"
    )
    assert done.returncode == 0, done.stderr
    model, _ = eager(spec, 0, "cuda")
    with torch.no_grad():
        want = model(x)
    torch.testing.assert_close(read_tensors(tmp_path / "out.bin"), [want.cpu()])


def test_a_graph_computing_partly_on_the_cpu_builds_beside_one_that_does_not(workdir: Path, tmp_path: Path) -> None:
    """A mask made on the CPU from the dynamic batch (timm's EdgeNeXt does so) leaves CPU kernels in the CUDA graph,
    whose runtime interface then includes the CPU's headers too; the batch-1 variant's mask is a constant. The target
    shares one interface all the same."""
    spec = spec_of_its_own(
        workdir,
        tmp_path / "host_mask.toml",
        textwrap.dedent("""
        [project]
        name = "host_mask"

        [[graph]]
        name = "masked"
        entry = "models.shapes:HostMask"
        inputs = [{ name = "x", shape = ["batch", 16] }]
        dims = { batch = { min = 1, max = 8, example = 4, specialize = [1] } }

        [[target]]
        device = "cuda"
        archs = ["sm_90"]
    """),
    )
    summary = build_json(spec, tmp_path)
    codegen = tmp_path / "build" / "host_mask" / "codegen"
    headers = {
        unit.name: sorted(
            re.findall(r"<torch/csrc/inductor/aoti_include/(\w+)\.h>", (unit / "interface.cpp").read_text())
        )
        for unit in sorted(codegen.iterdir())
    }
    print("interface headers:", headers)
    assert ["cpu", "cuda"] in headers.values(), headers
    package = import_package(summary)
    model, _ = eager(spec, 0, "cuda")
    with torch.no_grad():
        for batch in (1, 5):
            x = torch.randn(batch, 16, device="cuda")
            torch.testing.assert_close(package.masked(x), model(x), rtol=1e-4, atol=1e-5)
