"""Trace and codegen of independent units (graph x target) in worker processes, bounded by cores and memory.

Each task runs in a fresh process (spawned, so no thread of the build process is forked; or, in a build server's
child, which has imported torch and run nothing, forked), which also gives each codegen its own Inductor state:
Inductor registers its oneDNN passes once per process, as the first CPU freezing finds oneDNN on or off. A build with
one unit to generate, or with custom ops (loaded into the build process), runs it in the build process instead.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import multiprocessing
import multiprocessing.connection
import os
import pickle
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from shimgen.build import libraries, process
from shimgen.errors import SpecError, SpecErrors, UserError
from shimgen.inductor import codegen, compat
from shimgen.inductor.lockfile import Timings
from shimgen.results import CodegenResult, CustomOps, TraceResult
from shimgen.spec import Flags, Graph, Target
from shimgen.trace import export as trace

MEMORY_PER_WORKER = 3 << 30  # a transformer's trace or codegen peaks at 1-3 GiB
T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class TraceTask:
    graph: Graph
    where: str
    spec_dir: Path
    device: str
    program_file: Path
    key: str


@dataclass(frozen=True, kw_only=True)
class CodegenTask:
    traced: TraceResult
    target: Target
    flags: Flags
    cxx: str | None  # the proved compiler, for what Inductor compiles itself (CPU targets)
    out_dir: Path
    key: str
    locked: list[Timings]  # the lockfile's sets for the unit
    retune: bool
    where: str
    scalar_kernels: str = ""  # why the CPU kernels are generated without vectorization
    vec_isas: Path | None = None  # where the compiler's and CPU's vector ISAs are kept (codegen._vec_isas_kept)
    onednn_threads: int | None = None  # what oneDNN's weights are packed for (codegen.packing_threads)
    onednn_off: str = ""  # why the graph is generated without oneDNN
    gemm_templates_off: str = ""  # why the graph is generated without GEMM templates as candidates


@contextlib.contextmanager
def full_collections_deferred() -> Iterator[None]:
    """The garbage collector's full collections put off until the block ends; the younger generations are collected as
    usual. A trace or a codegen makes hundreds of thousands of objects that live until it ends (FX nodes, fake tensors,
    sympy expressions), and every full collection walks all of them: on two cores, the two in a ResNet-18 unit's trace
    and codegen took 0.9-1.5 s, the four in MiniLM's 2.1 s (benchmarks/results/gc_pauses.md). What they would have freed
    is at most 5% of the peak memory; a worker process ends with the block."""
    thresholds = gc.get_threshold()
    gc.set_threshold(thresholds[0], thresholds[1], 1 << 30)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)


def run_trace(task: TraceTask, ops: CustomOps | None = None) -> TraceResult:
    compat.check(compat.TRACE)
    before = set(sys.modules)
    with full_collections_deferred():
        traced = trace.trace(task.graph, task.where, task.spec_dir, task.device, task.program_file, task.key, ops)
    libraries.note(before)
    return traced


def run_codegen(task: CodegenTask, ops: CustomOps | None = None) -> CodegenResult:
    if task.onednn_off and ops is None:
        return _codegen_in_new_interpreter(task)
    return _codegen(task, ops)


def _codegen(task: CodegenTask, ops: CustomOps | None) -> CodegenResult:
    compat.check(compat.TRACE)
    compat.check(compat.CODEGEN)
    try:
        with full_collections_deferred():
            return codegen.generate(
                task.traced,
                task.target,
                task.flags,
                task.cxx,
                task.out_dir,
                task.key,
                ops,
                task.locked,
                task.retune,
                scalar_kernels=task.scalar_kernels,
                vec_isas=task.vec_isas,
                onednn_threads=task.onednn_threads,
                onednn_off=task.onednn_off,
                gemm_templates_off=task.gemm_templates_off,
            )
    except codegen.TemplatesFailed as failed:
        why = f"Inductor failed on the graph with them as candidates ({failed.failure})"
        return _codegen(dataclasses.replace(task, gemm_templates_off=why), ops)
    except codegen.SizeFixed as fixed:
        if not fixed.by_onednn or task.onednn_off or ops is not None:  # custom ops: loaded in this process only
            raise SpecError("", task.where, str(fixed)) from None
        why = (
            f"its fusion pass fixed a dynamic size at the example ({fixed.guard}); "
            "another `example` size for that dim gives it back"
        )
        return _codegen_in_new_interpreter(dataclasses.replace(task, onednn_off=why))
    except SpecError:
        raise
    except UserError as exc:
        raise SpecError("", task.where, str(exc)) from None


def _codegen_in_new_interpreter(task: CodegenTask) -> CodegenResult:
    """Inductor registers its oneDNN fusion passes in a process once, whatever later codegens ask for: a codegen without
    oneDNN runs where none came before it."""
    with tempfile.TemporaryDirectory(prefix="shimgen-codegen-task-") as tmp:
        asked, answered = Path(tmp) / "task.pickle", Path(tmp) / "outcome.pickle"
        asked.write_bytes(pickle.dumps(task))
        completed = process.run_python(
            "shimgen.build.workers:codegen_main", [str(asked), str(answered)], fresh=("torch",)
        )
        if not answered.is_file():
            raise UserError(f"{task.where}: the codegen without oneDNN failed: {completed.tail(1)}")
        outcome = pickle.loads(answered.read_bytes())
    if isinstance(outcome, BaseException):
        raise outcome
    assert isinstance(outcome, CodegenResult)
    return outcome


def codegen_main(argv: list[str]) -> int:
    """The codegen of the pickled task in argv[0], in this new interpreter; its result or exception pickled into
    argv[1]."""
    task = pickle.loads(Path(argv[0]).read_bytes())
    try:
        outcome: Any = _codegen(task, None)
    except BaseException as exc:  # noqa: BLE001  (handed to the process that asked)
        outcome = exc
    Path(argv[1]).write_bytes(pickle.dumps(outcome))
    return 0


def count(tasks: int, in_process: bool, forking: bool = False) -> int:
    """Worker processes for `tasks` tasks: one per core, as many as memory allows; 0 runs them in this process. With
    `forking` (workers forked from this process), even one task gets a worker: running it here would start OpenMP's
    threads in this process (a model's weights initialised, constants folded), which every later fork would inherit
    half-made, and the first parallel region in such a child waits forever for threads it does not have."""
    if in_process or (tasks < 2 and not forking):
        return 0
    try:
        with open("/proc/meminfo") as f:
            available = next(int(line.split()[1]) << 10 for line in f if line.startswith("MemAvailable:"))
    except (OSError, ValueError, StopIteration):
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    workers = min(tasks, os.cpu_count() or 1, max(1, available // MEMORY_PER_WORKER))
    return workers if workers > 1 or forking else 0


def run_all(
    tasks: list[tuple[str, T]],
    work: Callable[..., Any],
    workers: int,
    ops: CustomOps | None,
    done: Callable[[str, Any, float, float], None],
    fork: bool = False,
) -> None:
    """Run `work` on each (name, task), in `workers` processes or here (0); `done(name, result, start, end)` in this
    process as each finishes, times from time.time(). The processes are forked from this one with `fork` (a build
    server's child, whose torch is imported and unused), else spawned. Once every task has ended, the errors are raised in the tasks'
    order, whichever finished first: the spec errors all together (SpecErrors where there are several), else the
    first."""
    errors: dict[int, BaseException] = {}
    threads = max(1, _threads() // max(1, workers))
    if not workers:
        for k, (name, task) in enumerate(tasks):
            start = time.time()
            try:
                result = work(task, ops) if ops else work(task)
            except UserError as exc:
                errors[k] = exc
                continue
            done(name, result, start, time.time())
    elif fork and not process.threads_a_fork_keeps():  # else (an OpenMP team) forking is not safe: spawned
        for k, outcome in _forked(tasks, work, workers, threads):
            if isinstance(outcome, BaseException):
                errors[k] = outcome
            else:
                done(tasks[k][0], *outcome)
    else:
        context = multiprocessing.get_context("spawn")
        if sys.version_info >= (3, 11):
            pool = ProcessPoolExecutor(workers, mp_context=context, max_tasks_per_child=1)
        else:  # no fresh process per task before Python 3.11
            pool = ProcessPoolExecutor(workers, mp_context=context)
        with pool:
            futures: dict[Future[tuple[Any, float, float]], int] = {
                pool.submit(_timed, work, task, threads): k for k, (_, task) in enumerate(tasks)
            }
            for future in as_completed(futures):
                k = futures[future]
                try:
                    result, start, end = future.result()
                except BaseException as exc:  # noqa: BLE001  (raised below, after the other tasks)
                    errors[k] = exc
                    continue
                done(tasks[k][0], result, start, end)
    _raise_in_order([errors[k] for k in sorted(errors)])


def _forked(
    tasks: list[tuple[str, T]], work: Callable[[T], Any], workers: int, threads: int
) -> Iterator[tuple[int, tuple[Any, float, float] | BaseException]]:
    """(task index, (result, start, end) or the exception it raised) as each task ends, each in a process of its own
    forked from this one (ProcessPoolExecutor reuses its processes when forking), `workers` at a time."""
    context = multiprocessing.get_context("fork")
    pending = list(enumerate(tasks))
    running: dict[Any, tuple[int, Any]] = {}
    while pending or running:
        while pending and len(running) < workers:
            k, (_, task) = pending.pop(0)
            receiver, sender = context.Pipe(duplex=False)
            process = context.Process(target=_send_outcome, args=(sender, work, task, threads), daemon=True)
            process.start()
            sender.close()
            running[receiver] = (k, process)
        for ready in multiprocessing.connection.wait(list(running)):
            answer: Any = ready
            k, process = running.pop(answer)
            try:
                outcome = answer.recv()  # before the join: a large result fills the pipe until read
            except EOFError:
                outcome = None
            process.join()
            if outcome is None:
                outcome = RuntimeError(f"a worker process died (exit status {process.exitcode}) before it answered")
            yield k, outcome


def _send_outcome(sender: Any, work: Callable[[T], Any], task: T, threads: int) -> None:
    try:
        outcome: Any = _timed(work, task, threads)
    except BaseException as exc:  # noqa: BLE001  (handed to the build process, which raises it)
        outcome = exc
    sender.send(outcome)


def _raise_in_order(errors: list[BaseException]) -> None:
    spec_errors = [e for e in errors if isinstance(e, SpecError)]
    if len(errors) != len(spec_errors):
        raise next(e for e in errors if not isinstance(e, SpecError))
    if len(spec_errors) > 1:
        raise SpecErrors(spec_errors)
    if spec_errors:
        raise spec_errors[0]


def _threads() -> int:
    """The threads torch runs here: $OMP_NUM_THREADS, as torch reads it, else one per core."""
    value = os.environ.get("OMP_NUM_THREADS", "")
    return int(value) if value.isdigit() and int(value) > 0 else os.cpu_count() or 1


def _timed(work: Callable[[T], Any], task: T, threads: int) -> tuple[Any, float, float]:
    """`work(task)` in a worker process whose torch runs `threads` threads: the workers share the cores (with each
    taking them all, constant folding and tracing ran several OpenMP teams spinning against each other)."""
    import torch

    torch.set_num_threads(threads)
    start = time.time()
    return work(task), start, time.time()
