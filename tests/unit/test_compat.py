"""shimgen/inductor/ as the one adapter to torch's internals: the running torch meets every requirement, a torch that
changed one is refused by name, the edits of Inductor's C++ fail loudly where they find nothing, and no module outside
shimgen/inductor/ touches torch's private API. Run by both torch legs of CI (scripts/test.sh)."""

from __future__ import annotations

import contextlib
import io
import itertools
import os
import re
import sys
import tokenize
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from shimgen.errors import UserError
from shimgen.inductor import codegen, compat, user_triton
from shimgen.inductor.openmp import gemm_threads_from_caller
from shimgen.spec import Flags, Target

SHIMGEN = Path(__file__).resolve().parents[2] / "shimgen"
ADAPTER = SHIMGEN / "inductor"


@pytest.fixture
def unchecked(monkeypatch: pytest.MonkeyPatch) -> None:
    """compat.check as in a fresh process: nothing checked yet."""
    monkeypatch.setattr(compat, "_checked", set())


def refusal(what: str) -> str:
    """The message's pattern for a torch whose `what` changed."""
    return (
        rf"^torch \d+\.\d+\.\d+: (.*; )?{re.escape(what)} changed \(.*\)(; .*)?; "
        rf"shimgen supports torch {re.escape(compat.supported_range())}$"
    )


@pytest.mark.parametrize("stage", [compat.TRACE, compat.CODEGEN])
def test_the_running_torch_meets_every_requirement(stage: str, unchecked: None) -> None:
    assert [(r.what, problem) for r, problem in compat.problems(stage)] == []
    compat.check(stage)


def test_the_supported_range_comes_from_pyproject() -> None:
    from shimgen.toolchain import supported_torch

    assert compat.supported_range().startswith(">=")
    assert set(compat.supported_range().split(",")) == {str(s) for s in supported_torch()}


def test_a_missing_inductor_function_is_named(monkeypatch: pytest.MonkeyPatch, unchecked: None) -> None:
    from torch._inductor.codecache import PersistentCache

    monkeypatch.delattr(PersistentCache, "lookup")
    with pytest.raises(UserError, match=refusal("Inductor's PersistentCache.lookup")):
        compat.check(compat.CODEGEN)
    assert compat.CODEGEN not in compat._checked


def test_a_missing_private_torch_module_is_named(monkeypatch: pytest.MonkeyPatch, unchecked: None) -> None:
    import torch.utils._pytree as pytree

    monkeypatch.delattr(pytree, "SUPPORTED_NODES")
    with pytest.raises(UserError, match=refusal("torch.utils._pytree's node registry")):
        compat.check(compat.TRACE)


def test_a_changed_signature_of_a_patched_function_is_named(monkeypatch: pytest.MonkeyPatch, unchecked: None) -> None:
    from torch._inductor.codegen.cpp import CppKernel

    def decide_parallel_depth(self: Any, max_parallel_depth: Any, threads: int, extra: bool) -> Any:
        return None

    monkeypatch.setattr(CppKernel, "decide_parallel_depth", decide_parallel_depth)
    with pytest.raises(UserError, match=refusal("Inductor's CppKernel.decide_parallel_depth")) as raised:
        compat.check(compat.CODEGEN)
    assert "takes (self, max_parallel_depth, threads, extra)" in str(raised.value)


def test_a_patched_staticmethod_that_became_a_method_is_named(monkeypatch: pytest.MonkeyPatch, unchecked: None) -> None:
    from torch._inductor.codecache import CacheBase

    monkeypatch.setattr(CacheBase, "get_local_cache_path", classmethod(lambda cls: None))
    with pytest.raises(UserError, match=refusal("Inductor's CacheBase.get_local_cache_path")):
        compat.check(compat.CODEGEN)


def test_a_config_key_this_torch_lacks_is_named(monkeypatch: pytest.MonkeyPatch, unchecked: None) -> None:
    monkeypatch.setattr(codegen, "CONFIG_KEYS", (*codegen.CONFIG_KEYS, "cpp.no_such_key"))
    with pytest.raises(UserError, match=refusal("Inductor's config")) as raised:
        compat.check(compat.CODEGEN)
    assert "cpp.no_such_key" in str(raised.value)


def test_a_gemm_template_without_the_text_openmp_edits_is_named(
    monkeypatch: pytest.MonkeyPatch, unchecked: None
) -> None:
    import inspect

    source = inspect.getsource
    monkeypatch.setattr(
        inspect, "getsource", lambda obj: source(obj).replace("mm_get_thread_blocking(num_threads,", "blocking(")
    )
    with pytest.raises(UserError, match=refusal("Inductor's C++ GEMM template")) as raised:
        compat.check(compat.CODEGEN)
    assert "mm_get_thread_blocking(num_threads," in str(raised.value)


def test_every_config_key_codegen_sets_is_checked() -> None:
    targets = [Target(device="cpu", isa=isa) for isa in ("native", "avx2", "avx512", "default")] + [
        Target(device="cuda", archs=["sm_90"])
    ]
    for target, weights, gemm, full, tma, onednn in itertools.product(
        targets, ("embedded", "file"), *[(False, True)] * 4
    ):
        flags = Flags(weights=weights, gemm_autotune=gemm, max_autotune=full, tma=tma, onednn=onednn)
        assert set(codegen.inductor_configs(target, flags, "g++")) <= set(codegen.CONFIG_KEYS)


GEMM = """extern "C" void cpp_fused_a(int* done, int64_t M) {{
    constexpr int64_t num_threads = 2;
    mm_get_thread_blocking(num_threads, 1, M, 64, 64, 1, 1, 1, Mt_blocks, Nt_blocks, Kt_blocks);
    AOTI_TORCH_CHECK(Mt_blocks * Nt_blocks * Kt_blocks * 2 >= M, "Not all partitions are assigned.");
    #pragma omp parallel
    {{
        #pragma omp for schedule(static, 1)
        for (int64_t tid = 0; {loop}; tid++) {{ done[tid] = 1; }}
    }}
}}
"""


def test_a_gemm_edit_that_finds_nothing_is_an_error_naming_the_template() -> None:
    assert "tid < num_threads; tid++)" in gemm_threads_from_caller(GEMM.format(loop="tid < 2"))
    # Partitions left at the build machine's count while the blocking follows the caller's team: a wrong GEMM.
    with pytest.raises(
        UserError, match=r"Inductor's C\+\+ GEMM template changed \(.*'tid < 2; tid\+\+\)'.*shimgen supports torch"
    ):
        gemm_threads_from_caller(GEMM.format(loop="tid < int64_t(2)"))


def test_user_kernel_guard_passes_on_the_arguments_torch_2_14_added() -> None:
    calls: list[tuple[Any, ...]] = []
    call_hop = user_triton._descriptors_as_tensors(lambda *args: calls.append(args))
    call_hop("hopifier", "variable", "grids", {"x": 1}, "launch_kwargs", "kernel_arg_names", "tx")  # torch 2.14
    call_hop("hopifier", "variable", "grids", {"x": 1}, "tx")  # torch 2.13
    assert calls == [
        ("hopifier", "variable", "grids", {"x": 1}, "launch_kwargs", "kernel_arg_names", "tx"),
        ("hopifier", "variable", "grids", {"x": 1}, "tx"),
    ]


class TensorDescriptor:
    """Triton's host-side descriptor, as triton.tools.tensor_descriptor defines it (this machine has no triton)."""

    __module__ = "triton.tools.tensor_descriptor"

    def __init__(self, base: torch.Tensor, shape: list[int], strides: list[int], block_shape: list[int]) -> None:
        self.base, self.shape, self.strides, self.block_shape, self.padding = base, shape, strides, block_shape, "zero"

    @classmethod
    def from_tensor(cls, tensor: torch.Tensor, block_shape: list[int]) -> TensorDescriptor:
        return cls(tensor, list(tensor.shape), list(tensor.stride()), block_shape)


def test_host_descriptors_reach_the_graph_as_their_tensors_with_their_block_shape(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from torch._higher_order_ops import triton_kernel_wrap

    launched: list[dict[str, Any]] = []

    def launch(**kwargs: Any) -> None:
        launched.append(kwargs)

    monkeypatch.setattr(triton_kernel_wrap, "triton_kernel_wrapper_mutation", launch)

    def call_hop(self: Any, variable: Any, grids: Any, combined_args: dict[str, Any], tx: Any) -> None:
        triton_kernel_wrap.triton_kernel_wrapper_mutation(tma_descriptor_metadata={}, kwargs=combined_args)

    x, out = torch.ones(64, 64), torch.zeros(64, 64)
    args = {
        "in_desc": TensorDescriptor.from_tensor(x, [32, 16]),
        "out_desc": TensorDescriptor.from_tensor(out, [32, 16]),
    }
    user_triton._descriptors_as_tensors(call_hop)(None, None, None, {**args, "scale": 2.0}, None)
    assert launched[0]["kwargs"] == {"in_desc": x, "out_desc": out, "scale": 2.0}
    assert launched[0]["tma_descriptor_metadata"] == {name: ("stable", ([32, 16],)) for name in args}
    assert triton_kernel_wrap.triton_kernel_wrapper_mutation is launch  # the module's own name given back

    class Kernel:
        __name__ = "scale_kernel"

    half = TensorDescriptor(x, [32, 64], list(x.stride()), [32, 16])
    with pytest.raises(user_triton.UserKernelError, match="Triton kernel scale_kernel: its argument in_desc hold"):
        user_triton._descriptors_as_tensors(call_hop)(
            None, SimpleNamespace(kernel=Kernel()), None, {"in_desc": half}, None
        )
    assert len(launched) == 1


# What only shimgen/inductor/ may write: a private torch module or attribute (torch._C, torch.utils._pytree,
# torch.fx.experimental._config, ...), pytree by any name, a patch of anything.
_PRIVATE = re.compile(
    r"\btorch(?:\s*\.\s*\w+)*\s*\.\s*_\w+|\b_pytree\b|\bmock\s*\.\s*patch|\bfrom\s+unittest\s+import\s+mock\b|\bpatch\.object\b"
)


def _code_only(source: str) -> str:
    """`source` with its comments and string literals blanked (their text may name torch's internals)."""
    lines = source.splitlines(keepends=True)
    blank = {tokenize.COMMENT, tokenize.STRING} | {getattr(tokenize, "FSTRING_MIDDLE", -1)}
    for token in reversed(list(tokenize.generate_tokens(io.StringIO(source).readline))):
        if token.type in blank:
            (row, col), (end_row, end_col) = token.start, token.end
            for r in range(end_row, row - 1, -1):
                line = lines[r - 1]
                begin, end = (col if r == row else 0), (end_col if r == end_row else len(line.rstrip("\n")))
                lines[r - 1] = line[:begin] + " " * (end - begin) + line[end:]
    return "".join(lines)


def test_code_only_blanks_comments_and_strings() -> None:
    assert _PRIVATE.search(_code_only("import torch._C\n"))
    assert _PRIVATE.search(_code_only("from torch.utils import _pytree as p\n"))
    assert not _PRIVATE.search(_code_only('x = "torch._inductor"  # torch._C\n"""torch._export\n_pytree"""\n'))


def test_private_torch_is_used_only_in_shimgen_inductor() -> None:
    offenders = []
    for path in sorted(SHIMGEN.rglob("*.py")):
        if path.is_relative_to(ADAPTER):
            continue
        code = _code_only(path.read_text())
        offenders += [
            f"{path.relative_to(SHIMGEN.parent)}:{code.count(chr(10), 0, m.start()) + 1}: {m[0]}"
            for m in _PRIVATE.finditer(code)
        ]
    assert offenders == [], (
        "private torch API outside shimgen/inductor/ (call a function of the adapter instead):\n" + "\n".join(offenders)
    )


def test_the_trace_stage_imports_no_inductor_codegen() -> None:
    """The trace's checks must not cost Inductor's import: a trace worker never needs it."""
    import subprocess

    code = (
        "import sys; from shimgen.inductor import compat; import torch; compat.check(compat.TRACE); "
        "print('torch._inductor.codegen.cpp' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=SHIMGEN.parent)
    assert out.stdout.strip() == "False"


GEMM_TOLD_ITS_TEAM = """extern "C" void cpp_fused_a(int* done, int64_t M) {
    constexpr int64_t num_threads = 4;
    mm_get_thread_blocking(num_threads, 1, M, 64, 64, 1, 1, 1, Mt_blocks, Nt_blocks, Kt_blocks);
    AOTI_TORCH_CHECK(Mt_blocks * Nt_blocks * Kt_blocks * 4 >= M, "Not all partitions are assigned.");
    #pragma omp parallel num_threads(4)
    {
        const int tid = omp_get_thread_num();
        done[tid] = 1;
    }
}
"""


def test_the_torch_2_11_gemm_template_gets_the_callers_team_size() -> None:
    """torch 2.11's template tells its region the team size instead of looping over partitions: the team and the
    blocking both follow the caller's threads."""
    edited = gemm_threads_from_caller(GEMM_TOLD_ITS_TEAM)
    assert "#pragma omp parallel num_threads(num_threads)" in edited and "num_threads(4)" not in edited
    assert "Kt_blocks * num_threads >=" in edited and "int64_t num_threads = omp_get_max_threads();" in edited


def test_packages_are_compared_at_float32_and_the_callers_flags_come_back() -> None:
    """verify and `shimgen check` compare without TF32 (trace/entry.float32_as_float32); torch's flags for it are
    settable without a GPU, and the caller's return afterwards, also after an error."""
    from shimgen.trace.entry import float32_as_float32

    cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul
    before = (cudnn.allow_tf32, matmul.allow_tf32, cudnn.benchmark)
    matmul.allow_tf32, cudnn.benchmark = True, True
    try:
        with pytest.raises(RuntimeError), float32_as_float32():
            assert (cudnn.allow_tf32, matmul.allow_tf32, cudnn.benchmark) == (False, False, True)
            raise RuntimeError
        assert (cudnn.allow_tf32, matmul.allow_tf32, cudnn.benchmark) == (before[0], True, True)
    finally:
        cudnn.allow_tf32, matmul.allow_tf32, cudnn.benchmark = before


def test_a_loaded_programs_derived_dim_keeps_its_example_size(tmp_path: Path) -> None:
    """torch.export.load keys a `32 * Dim(...)` dim's example size by the expression, leaving the Dim's own symbol
    without one; internals.load_program solves for it, as torch.export had it before saving."""
    from torch._guards import detect_fake_mode

    from shimgen.inductor import internals

    class Model(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.sum(0)

    rows = torch.export.Dim("rows_over_32", min=1, max=8)
    program = torch.export.export(Model(), (torch.randn(96, 4),), dynamic_shapes=({0: 32 * rows},))
    torch.export.save(program, tmp_path / "program.pt2")

    def example_rows(loaded: Any) -> Any:
        fake_mode = detect_fake_mode([node.meta.get("val") for node in loaded.graph.nodes])
        (symbol,) = (
            loaded.graph_module.graph.find_nodes(op="placeholder")[0].meta["val"].shape[0].node.expr.free_symbols
        )
        return internals.example_sizes(fake_mode.shape_env).get(symbol)

    assert example_rows(internals.load_program(tmp_path / "program.pt2")) == 3


def test_a_loaded_program_with_sizes_sympy_cannot_solve_loads(tmp_path: Path) -> None:
    """A strided convolution over a dynamic length keeps example sizes keyed by expressions such as `(s//5) - 1`, which
    sympy has no algorithm to solve (wav2vec2's feature encoder, BART's shifted tokens): they are left as they are."""

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv1d(1, 4, 10, stride=5)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.conv(x.unsqueeze(1))[:, :, 1:]

    length = torch.export.Dim("length", min=40, max=4000)
    program = torch.export.export(Model(), (torch.randn(2, 400),), dynamic_shapes=({1: length},))
    torch.export.save(program, tmp_path / "program.pt2")

    from shimgen.inductor import internals

    loaded = internals.load_program(tmp_path / "program.pt2")
    x = torch.randn(2, 1000)
    torch.testing.assert_close(loaded.module()(x), program.module()(x))


FOLD = """
import sys
import torch
import torch.nn.functional as F
from shimgen.inductor import codegen

torch.set_num_threads(2)  # Inductor's scatter is atomic at more than one thread


def fold(y):  # timm VOLO's outlook attention: a fold of a permuted tensor
    return F.fold(y.permute(0, 1, 4, 3, 2).reshape(2, 6 * 32 * 9, 196), (28, 28), 3, padding=1, stride=2)


y = torch.randn(2, 6, 196, 9, 32)
with codegen._cpu_codegen(None):
    compiled = torch.compile(fold)
    torch.testing.assert_close(compiled(y), fold(y))
    torch.testing.assert_close(compiled(y), fold(y))
print("equal")
"""


@pytest.mark.slow  # 20 s; the second leg's torch 2.14 has the fix itself
def test_a_tiled_scatter_of_atomic_adds_writes_in_bounds(tmp_path: Path) -> None:
    """Inductor before torch 2.14 wrote a fold's atomic adds out of bounds in a kernel tiled in two dimensions (the heap
    corrupted, the process aborted: pytorch/pytorch#191837); CPU codegen applies the fix where that torch lacks it. Run
    in a process of its own, with an Inductor cache of its own (a cached kernel would skip codegen)."""
    import subprocess

    run = subprocess.run(
        [sys.executable, "-c", FOLD],
        capture_output=True,
        text=True,
        env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")},
    )
    assert run.returncode == 0 and run.stdout.strip() == "equal", run.stderr[-2000:]


def test_grid_sample_is_traced_to_the_op_it_computes_on_the_cpu() -> None:
    """On CUDA, torch takes grid_sample's op apart into cuDNN's sampler (RAFT's correlation lookup), which Inductor
    cannot compile: the program holds the op it computes on the CPU, grid_sampler_2d (or _3d), and computes the same."""
    from shimgen.trace.export import without_cudnn_paths

    class Sample(torch.nn.Module):
        def forward(self, x: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.grid_sample(x, grid, align_corners=True)

    aten = torch.ops.aten
    for x, grid, op in (
        (torch.randn(2, 3, 8, 8), torch.rand(2, 5, 5, 2) * 2 - 1, aten.grid_sampler_2d.default),
        (torch.randn(1, 2, 4, 4, 4), torch.rand(1, 3, 3, 3, 3) * 2 - 1, aten.grid_sampler_3d.default),
    ):
        program = torch.export.export(Sample(), (x, grid))
        assert program.graph.find_nodes(op="call_function", target=aten.grid_sampler.default)
        without_cudnn_paths(program)
        assert not program.graph.find_nodes(op="call_function", target=aten.grid_sampler.default)
        assert program.graph.find_nodes(op="call_function", target=op)
        torch.testing.assert_close(program.module()(x, grid), Sample()(x, grid))


def _slice_index_of_torch_2_11(size: Any, index: Any) -> Any:  # no min or max in its source, as torch 2.11 has it
    return index


def test_a_slice_torch_cannot_order_against_its_size_is_sized_by_min_and_max(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch 2.11 gave `y[:, :seq]` of a length padded to a multiple of 16 a size no input determines, and then refused
    the first condition on it (Mamba-2, Qwen3-Next, Falcon-H1, SEW over a dynamic length). Where torch slices so, the
    trace slices as torch 2.13 does (here forced on, since this torch does it already): a size of min and max of the
    input's, and the program computes what the model does at every length."""
    from torch._subclasses import fake_impls
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    from shimgen.inductor import internals

    class PaddedChunks(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            seq = x.shape[1]
            padded = torch.nn.functional.pad(x, (0, 0, 0, 16 * ((seq + 15) // 16) - seq)) * 2
            return padded[:, :seq] + padded[:, -seq:].flip(1)

    table, slice_op = fake_impls.op_implementations_dict, torch.ops.aten.slice.Tensor
    torch_own = table[slice_op]
    monkeypatch.setattr(fake_impls, "_compute_slice_index", _slice_index_of_torch_2_11)
    with internals.backed_size_oblivious(), internals.slices_sized_by_min_max():
        assert table[slice_op] is internals._slice_sized_by_min_max
        # Dim.DYNAMIC: torch cannot prove the two slices equal in size over the range (dims.export's hinted export)
        seq = torch.export.Dim.DYNAMIC(min=1, max=40)
        program = torch.export.export(PaddedChunks(), (torch.randn(2, 5, 3),), dynamic_shapes=({1: seq},))
    assert table[slice_op] is torch_own
    sizes = [n.meta["val"] for n in program.graph.nodes if isinstance(n.meta.get("val"), torch.Tensor)]
    assert not any(free_unbacked_symbols(v.shape) for v in sizes)
    for seq in (1, 5, 16, 17, 40):
        x = torch.randn(2, seq, 3)
        torch.testing.assert_close(program.module()(x), PaddedChunks()(x))


def test_torchs_own_warnings_stay_out_of_a_build_log() -> None:
    """torch 2.13's GEMM autotuning calls the deprecated `Tensor.storage()` (a UserWarning in a cold build's output),
    and a CUDA build of torch logs where it guessed CUDA_HOME when Inductor's C++ builder imports cpp_extension: codegen
    hides both, and only while it runs."""
    import logging
    import warnings

    def storage_warnings(context: Any) -> list[str]:
        torch.storage._reset_warn_typed_storage_removal()
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            with context:
                torch.empty(2).storage()
        return [str(w.message) for w in seen if "TypedStorage" in str(w.message)]

    assert storage_warnings(contextlib.nullcontext()), "torch no longer warns: the filter can go"
    assert storage_warnings(codegen._quiet_autotuning()) == []

    logger, logged = logging.getLogger("torch.utils.cpp_extension"), []
    handler = logging.Handler()
    handler.emit = lambda record: logged.append(record.getMessage())  # type: ignore[method-assign]
    logger.addHandler(handler)
    try:
        with codegen._cpu_codegen(None):
            logger.warning("No CUDA runtime is found")
        logger.warning("after codegen")
    finally:
        logger.removeHandler(handler)
    assert logged == ["after codegen"]


def test_scalars_that_freezing_folds_into_convolutions_keep_their_own_values() -> None:
    """Freezing folds each `conv(x) * scale` into the convolution's weights through one buffer name, so with two scales
    both convolutions took the last one (timm's Inception-ResNet-v2 built 20% off eager); codegen keeps them apart.
    Freezing's passes run on the model's graph and the folded graph runs in Python: nothing is compiled."""
    from torch import nn
    from torch._dynamo.utils import counters
    from torch._inductor.fx_passes.freezing_patterns import freezing_passes
    from torch.fx.experimental.proxy_tensor import make_fx

    class Scaled(nn.Module):
        def __init__(self, scale: float) -> None:
            super().__init__()
            self.conv, self.scale = nn.Conv2d(4, 4, 1), scale

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.conv(x) * self.scale

    torch.manual_seed(0)
    model, x = nn.Sequential(Scaled(0.5), Scaled(3.0)).eval(), torch.randn(1, 4, 2, 2)
    counters.clear()
    with torch.no_grad():
        graph = make_fx(model)(x)
        with codegen._scalar_folds_kept_apart():
            freezing_passes(graph, [x])
        graph.recompile()
        assert counters["inductor"]["binary_folding_conv"] == 2
        torch.testing.assert_close(graph(x), model(x))


def test_a_saved_programs_weights_read_from_its_archive_equal_torch_export_load(tmp_path: Path) -> None:
    from shimgen.inductor import internals

    class Tied(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(10, 4)
            self.head = torch.nn.Linear(4, 10, bias=False)
            self.head.weight = self.embed.weight  # one tensor under two names
            self.register_buffer("scale", torch.full((4,), 0.5))
            self.offset = torch.arange(4.0)  # a tensor constant

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.head(self.embed(ids) * self.scale + self.offset)

    path = tmp_path / "program.pt2"
    torch.export.save(torch.export.export(Tied(), (torch.tensor([[1, 2, 3]]),)), str(path))
    program = torch.export.load(str(path))
    loaded = {**program.state_dict, **program.constants}

    read = internals._archive_weights(path)  # this torch's archive reader, not the fallback
    assert read is not None and read.keys() == loaded.keys()
    for name, tensor in loaded.items():
        assert torch.equal(read[name], tensor) and read[name].stride() == tensor.stride(), name
    assert read["head.weight"].data_ptr() == read["embed.weight"].data_ptr()


def test_reading_a_saved_program_does_not_pass_on_torchs_warning_of_read_only_buffers(tmp_path: Path) -> None:
    """torch 2.11's archive reader warns that the weights it makes over the archive's bytes are not writable, at every
    build; torch 2.13's does not, so both ways of reading are made to warn here as torch 2.11's do."""
    import warnings
    from unittest import mock

    from shimgen.inductor import internals

    path = tmp_path / "program.pt2"
    torch.export.save(torch.export.export(torch.nn.Linear(4, 2), (torch.ones(1, 4),)), str(path))

    def warning(read: Any) -> Any:
        def warning_read(*args: Any) -> Any:
            warnings.warn(
                "The given buffer is not writable, and PyTorch does not support non-writable tensors.", stacklevel=2
            )
            return read(*args)

        return warning_read

    with (
        mock.patch.object(internals, "_archive_weights", warning(internals._archive_weights)),
        mock.patch.object(torch.export, "load", warning(torch.export.load)),
        warnings.catch_warnings(record=True) as shown,
    ):
        warnings.simplefilter("always")
        weights = internals.saved_program_weights(path)
        program = internals.load_program(path)
        warnings.warn("another warning", stacklevel=1)
    assert [str(w.message) for w in shown] == ["another warning"]
    assert weights.keys() == program.state_dict.keys() == {"weight", "bias"}
