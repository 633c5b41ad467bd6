"""Kernel choices Inductor measures at codegen (`gemm_autotune`, `max_autotune`), recorded for the build summary and
the lockfile, and replayed from the lockfile.

Inductor times each GEMM's candidate kernels for the traced sizes (the dims' examples) and keeps the
fastest. Every selection is recorded here, also those answered from Inductor's autotuning cache, whose
timings are the ones measured when it was filled.

CPU candidates are timed with one thread. A build machine is rarely idle (parallel compiles, other
builds), and an OpenMP kernel whose second thread waits for a core takes milliseconds at every team
barrier; one-thread times rank the candidates by their work, which is what a microsecond GEMM's choice
turns on. The kernels still run with the caller's threads. These timings are cached in a file of their
own beside Inductor's autotuning cache, which holds timings taken with all threads.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

from shimgen import devices
from shimgen.inductor.lockfile import Timings
from shimgen.results import KernelChoice

# Where timing pays on a CPU, measured with one thread on 2-core AVX2 and AVX-512 machines, K x N from 384 x 384 to
# 2048 x 8192 (benchmarks/gemm_rule.py, results/gemm_rule.md). Timing Inductor's C++ GEMM template means rendering and
# compiling it: about 3 s per GEMM shape of a first build on each kind of machine the lockfile has not seen.
# A GEMM with at least this many rows (the product of the output's leading dims at the traced example) gets the library
# kernel (oneDNN, MKL, ATen) untimed: the template took 0.8-2.9x oneDNN's time from 16 rows on.
CPU_LIBRARY_ROWS = 16
# A float32 GEMM with at most this many rows gets the template untimed where oneDNN is the other candidate: it took
# 0.08-0.91x oneDNN's time there (oneDNN's tens of microseconds per call are most of a small GEMM). Between the two
# bands the template won or lost by shape (0.49-1.98x at 8 rows): timed.
CPU_TEMPLATE_ROWS = 4
# On a GPU the other way round: a GEMM with fewer rows than this gets cuBLAS (through ATen) untimed. Measured on the
# H100 (benchmarks/gemm_rule.py --device cuda, results/gemm_rule_cuda.md), fp32, K x N from 512 x 1000 to 4096 x 4096:
# the best of Inductor's Triton templates takes 1.2-4.4x cuBLAS's time from 1 to 512 rows and 2.0-2.1x at 4096 rows
# but for 4096 x 4096 (0.87x); timing them means compiling 6-18 templates, 6 s per GEMM of every build.
GPU_TEMPLATE_ROWS = 4096
RULE = (
    f"the library on a CPU from {CPU_LIBRARY_ROWS} rows, on a GPU below {GPU_TEMPLATE_ROWS}; "
    f"Inductor's C++ template on a CPU up to {CPU_TEMPLATE_ROWS} rows"
)

# Extern (library) kernels by the name Inductor's choice carries; the rest are Inductor's own templates.
LIBRARIES = {
    "_linear_pointwise": "oneDNN",
    "_mkl_linear": "MKL",
    "_convolution_pointwise": "oneDNN",
}


def kind(choice_name: str, extern: bool) -> str:
    """What kind of kernel a candidate is: a library's, ATen's, or one of Inductor's templates."""
    if extern:
        return LIBRARIES.get(choice_name.split(".")[0], "ATen")  # _linear_pointwise.binary: oneDNN too
    if choice_name.startswith("cpp_"):
        return "Inductor C++ GEMM template"
    return "Inductor Triton template" if choice_name.startswith("triton_") else "Inductor template"


@dataclass
class Recording:
    choices: list[KernelChoice] = field(default_factory=list)
    untimed: dict[tuple[tuple[str, ...], str], int] = field(
        default_factory=dict
    )  # (GEMM sizes, "library" or "template") given untimed -> count
    asked: dict[int, Any] = field(default_factory=dict)  # the GEMMs' output layouts by id, kept so no id is reused
    timings: Timings = field(
        default_factory=dict
    )  # every timing record Inductor's selections used, in the lockfile's shape


@contextmanager
def recorded(device: str, locked: list[Timings], retune: bool, every_gemm: bool = False) -> Iterator[Recording]:
    """Inductor's configuration for the duration: every kernel selection recorded; a selection whose candidates
    all have timings in one of the `locked` sets takes them from the first such set instead of measuring (none does
    with `retune`). GEMMs where `untimed_kernel` names one get it untimed, unless `every_gemm` (max_autotune, TMA)."""
    import torch
    from torch._inductor import config, select_algorithm
    from torch._inductor.codecache import CacheBase, PersistentCache
    from torch._inductor.virtualized import V

    recording = Recording()
    choices = recording.choices
    measure = PersistentCache.lookup
    gpu = devices.device(device).gpu
    ruled: set[int] = set()  # ids of the templates taken by the rule, whose selections are not timings to report

    def lookup(
        self: Any, candidates: list[Any], op: str, inputs: str, benchmark: Any, hint_override: int | None = None
    ) -> dict[Any, float]:
        key = f"{inputs}_{hint_override}" if hint_override is not None else inputs
        template = None if every_gemm else _ruled_template(candidates, gpu)
        if template is not None:
            library = next(c for c in candidates if c is not template)  # the template's inputs are its packed ones
            sizes = tuple(_sizes(V.graph, node) for node in library.input_nodes[:2])
            recording.untimed[sizes, "template"] = recording.untimed.get((sizes, "template"), 0) + 1
            ruled.add(id(template))
            return {c: 0.0 if c is template else float("inf") for c in candidates}
        benchmark = _keeping_input_layouts(benchmark, candidates)
        precision = torch.get_float32_matmul_precision()
        names = locked_keys(candidates)
        sets = [] if retune or not candidates else [t.get(op, {}).get(key, {}).get(precision, {}) for t in locked]
        replay = next((held for held in sets if all(names[c] in held for c in candidates)), None)
        if replay is not None:
            timings = {c: replay[names[c]] for c in candidates}
        elif retune:
            timings = benchmark(candidates) if benchmark is not None else {}
        else:
            timings = measure(self, candidates, op, inputs, benchmark, hint_override)
        record = recording.timings.setdefault(op, {}).setdefault(key, {}).setdefault(precision, {})
        record.update({names[c]: t for c, t in timings.items()})
        return timings

    def log_results(name: str, input_nodes: list[Any], timings: dict[Any, float], *args: Any, **kwargs: Any) -> None:
        if timings and not any(id(c) in ruled for c in timings):
            choices.append(_choice(name, [_sizes(V.graph, node) for node in input_nodes], timings))

    threads = torch.get_num_threads()
    with ExitStack() as stack:
        stack.enter_context(
            config.patch({"trace.log_autotuning_results": True})
        )  # makes Inductor report cached selections too
        stack.enter_context(
            mock.patch.object(select_algorithm.AlgorithmSelectorCache, "log_results", staticmethod(log_results))
        )
        stack.enter_context(mock.patch.object(PersistentCache, "lookup", lookup))
        if not every_gemm:
            gate = "use_triton_template" if gpu else "use_cpp_gemm_template"
            for module, original in _gemm_gates(gate):
                stack.enter_context(mock.patch.object(module, gate, _gated(original, recording)))
        if not gpu:
            cache = CacheBase.get_local_cache_path()
            one_thread_cache = cache.with_name(f"{cache.name}-shimgen-cpu-one-thread")
            stack.enter_context(
                mock.patch.object(CacheBase, "get_local_cache_path", staticmethod(lambda: one_thread_cache))
            )
            torch.set_num_threads(1)
            stack.callback(torch.set_num_threads, threads)
        yield recording


# What a C++ GEMM template's source holds of the machine that rendered it: its core count (the partitions, the blocking
# made for them) and cache sizes, all in constants. The GEMM's own sizes are constants too, but a lockfile entry is
# already keyed by them.
_MACHINE_CONSTANTS = re.compile(r"(constexpr int64_t \w+ = |\btid < |num_threads\(|_blocks \* )\d+")


def locked_keys(candidates: list[Any]) -> dict[Any, str]:
    """Each candidate's key in the lockfile: Inductor's `hash_key`, which for a C++ GEMM template hashes its source.
    That source's machine constants are left out of the hash, so that a lockfile written on one machine replays on
    another with more cores; where that would give two candidates of one GEMM the same key, both keep Inductor's."""
    keys: dict[Any, str] = {}
    for candidate in candidates:
        key = candidate.hash_key()
        request = getattr(candidate, "bmreq", None)
        source, source_hash = getattr(request, "source_code", None), getattr(request, "hash_key", None)
        if isinstance(source, str) and isinstance(source_hash, str) and source_hash and key.endswith(source_hash):
            portable = hashlib.sha256(_MACHINE_CONSTANTS.sub(r"\1N", source).encode()).hexdigest()[:40]
            key = f"{key.removesuffix(source_hash)}portable-{portable}"
        keys[candidate] = key
    taken = Counter(keys.values())
    return {c: key if taken[key] == 1 else c.hash_key() for c, key in keys.items()}


def _gemm_gates(gate: str) -> list[tuple[Any, Any]]:
    """Each loaded Inductor module that asks `gate` (use_cpp_gemm_template or use_triton_template, imported by name into
    the lowerings) whether to offer a GEMM template, with it."""
    import sys

    import torch._inductor.kernel.bmm
    import torch._inductor.kernel.mm
    import torch._inductor.mkldnn_lowerings  # noqa: F401  (loaded before the lookup, as a compile loads them)
    from torch._inductor import utils

    original = getattr(utils, gate)
    return [
        (module, original)
        for name, module in list(sys.modules.items())
        if name.startswith("torch._inductor") and getattr(module, gate, None) is original
    ]


def listed(gemms: Iterable[tuple[Sequence[str], int]]) -> str:
    """GEMMs by their input sizes and count, as the build summary and the report print them."""
    return ", ".join(f"{' @ '.join(sizes)}{f' x{n}' if n > 1 else ''}" for sizes, n in gemms)


def untimed_kernel(rows: int, gpu: bool) -> str | None:
    """What a float32 GEMM of `rows` rows (at the traced example) gets without its candidates timed: "library",
    "template" (Inductor's C++ template, where it is a candidate), or None: its candidates are timed."""
    if gpu:
        return None if rows >= GPU_TEMPLATE_ROWS else "library"
    if rows >= CPU_LIBRARY_ROWS:
        return "library"
    return "template" if rows <= CPU_TEMPLATE_ROWS else None


def _rows(layout: Any) -> int:
    """A GEMM output's rows at the traced example: the product of its leading dims."""
    from torch._inductor.virtualized import V

    rows = 1
    for dim in V.graph.sizevars.optimization_hints(layout.size)[:-1]:
        rows *= int(dim)
    return rows


def _gated(original: Any, recording: Recording) -> Any:
    """A template gate (`use_cpp_gemm_template(layout, mat1, mat2, ...)` or `use_triton_template(layout, ...)`) that
    offers the template, and so times it, unless `untimed_kernel` gives the library."""

    def gate(layout: Any, *args: Any, **kwargs: Any) -> bool:
        if not original(layout, *args, **kwargs):
            return False
        from torch._inductor.virtualized import V

        if untimed_kernel(_rows(layout), devices.device(layout.device.type).gpu) != "library":
            return True
        if id(layout) not in recording.asked:  # a lowering may ask twice about one GEMM (one output layout)
            recording.asked[id(layout)] = layout
            inputs = [a for a in args[:2] if hasattr(a, "get_size")]  # use_triton_template has the output alone
            sizes = tuple(_sizes(V.graph, node) for node in inputs) or (
                "x".join(map(str, V.graph.sizevars.optimization_hints(layout.size))),
            )
            recording.untimed[sizes, "library"] = recording.untimed.get((sizes, "library"), 0) + 1
        return False

    return gate


def _ruled_template(candidates: list[Any], gpu: bool) -> Any:
    """The one template among a float32 GEMM's `candidates`, the others oneDNN's (as measured), where
    `untimed_kernel` takes it untimed; else None."""
    import torch
    from torch._inductor.select_algorithm import ExternKernelCaller

    templates = [c for c in candidates if not isinstance(c, ExternKernelCaller)]
    libraries = {kind(getattr(c, "name", ""), True) for c in candidates if isinstance(c, ExternKernelCaller)}
    layout = getattr(templates[0], "layout", None) if len(templates) == 1 and libraries == {"oneDNN"} else None
    if layout is None or layout.dtype != torch.float32 or untimed_kernel(_rows(layout), gpu) != "template":
        return None
    return templates[0]


def _keeping_input_layouts(benchmark: Any, candidates: list[Any]) -> Any:
    """`benchmark` restoring the sizes and strides of the candidates' input nodes afterwards.

    Timing the C++ GEMM template runs its preprocessor on the example tensors, and for a weight input whose size has a
    symbol (a bmm's mat2 with the dynamic batch) that preprocessor writes the traced sizes into the list that is the
    input node's own layout (CppGemmTemplate.add_choices' normalize_shapes: `view_size[:] =
    guarding_hints_or_throw(...)`,
    `view_size` being `W.layout.size`). Every candidate shares that node, so whichever wins, the code generated
    afterwards reads the batch as its traced value: ATen's bmm is called with mat2 viewed as 128 matrices at any batch
    ("Expected size for first two dimensions of batch2 tensor to be: [64, 32] but got: [128, 32]"). A selection
    answered from timings already measured (the lockfile, Inductor's cache) never runs it and keeps the symbols."""
    if benchmark is None:
        return None
    layouts = []
    for node in {id(n): n for c in candidates for n in getattr(c, "input_nodes", ())}.values():
        try:
            layout = node.get_layout()
        except Exception:  # a node without a layout of its own (NoneAsConstantBuffer, a multi-output's parent)
            continue
        layouts += [
            (layout, attr, list(getattr(layout, attr)))
            for attr in ("size", "stride")
            if isinstance(getattr(layout, attr, None), list)
        ]

    def measure(*args: Any, **kwargs: Any) -> Any:
        try:
            return benchmark(*args, **kwargs)
        finally:
            for layout, attr, values in layouts:
                getattr(layout, attr)[:] = values  # in place: the template's preprocessor holds this same list

    return measure


def _sizes(graph: Any, node: Any) -> str:
    try:
        return "x".join(str(s) for s in graph.sizevars.optimization_hints(node.get_size()))
    except Exception:  # a node without a size (a scalar argument) or without hints
        return "?"


def _choice(op: str, sizes: list[str], timings: dict[Any, float]) -> KernelChoice:
    from torch._inductor.select_algorithm import ExternKernelCaller

    def label(caller: Any) -> str:
        name = getattr(caller, "name", str(caller))
        return f"{kind(name, isinstance(caller, ExternKernelCaller))} {name}"

    best = min(timings, key=timings.__getitem__)
    # Template candidates are numbered per selection (cpp_..._3); the number says nothing to a reader.
    us: dict[str, float] = {}
    for c, t in sorted(timings.items(), key=lambda kv: kv[1]):  # the fastest of each kind (a GPU has many templates)
        us.setdefault(label(c).rstrip("0123456789").rstrip("_"), round(t * 1000, 3))
    return KernelChoice(op=op, sizes=tuple(sizes), picked=label(best).rstrip("0123456789").rstrip("_"), us=us)


def merged(choices: list[KernelChoice]) -> tuple[KernelChoice, ...]:
    """Identical selections (same op, sizes and outcome) as one, with their count."""
    counts: dict[tuple[str, tuple[str, ...], str], KernelChoice] = {}
    for c in choices:
        key = (c.op, c.sizes, c.picked)
        seen = counts.get(key)
        counts[key] = (
            c
            if seen is None
            else KernelChoice(op=c.op, sizes=c.sizes, picked=c.picked, us=seen.us, count=seen.count + 1)
        )
    return tuple(counts.values())
