"""OpenMP teams of the calling thread in Inductor's CPU kernels.

Serial fast paths:
libgomp enters every `#pragma omp parallel` through a team, even a team of one thread, and ends each
worksharing loop and the region itself at a team barrier that makes a futex system call: about 0.3 us
twice per region. Microsecond models called with one thread spend most of their time there (a tiny
MLP: 16 system calls per call). Each region therefore gets a copy of its body without OpenMP
directives, taken when the calling thread would run the region alone (`torch.set_num_threads(1)`
sets what `omp_get_max_threads()` reads). A team of one executes its region exactly as the serial
copy does: the thread number is 0 and the team size 1 in both.

GEMM thread partitions: Inductor's C++ GEMM template is written for `parallel_num_threads()` at
codegen, the build machine's core count (`constexpr int64_t num_threads = 2;` and a worksharing loop
over 2 partitions), so a wheel built on 2 cores would run each GEMM in 2 partitions on any machine.
Where the template computes its blocking at run time (a dynamic M), the count becomes the caller's
team size, or one thread for a GEMM too small to repay waking a team; with a static M the blocking is
constant, made for the build machine's count.
"""

from __future__ import annotations

import re

from shimgen.errors import UserError
from shimgen.inductor import compat

# Only regions whose team is the caller's (no num_threads clause: codegen sets cpp.dynamic_threads), or one thread
# where their `if` clause is false; a region with a fixed team size may keep per-thread state that a serial run
# would leave unset.
_REGION = re.compile(r"^([ \t]*)#pragma omp parallel(?:[ \t]+if\(([^()\n]*)\))?[ \t]*\n[ \t]*(?=\{)", re.M)
_BARE_REGION = re.compile(r"^([ \t]*)#pragma omp parallel[ \t]*\n", re.M)
# Directives of the region's own team; `simd` (vectorization) and `declare` are not team directives.
_TEAM_DIRECTIVE = re.compile(r"^[ \t]*#pragma omp (?!simd\b|declare\b)[^\n]*\n", re.M)
_SKIP = re.compile(r'"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'|//[^\n]*|/\*.*?\*/', re.S)


_GEMM_THREADS = re.compile(r"constexpr int64_t num_threads = (\d+);")
# Multiply-adds below which a GEMM runs on the calling thread alone: waking a team costs more than it saves.
SERIAL_GEMM_WORK = 1 << 16


def gemm_threads_from_caller(source: str) -> str:
    """`source` with each C++ GEMM template whose blocking is computed at run time (a dynamic M) sharing its
    partitions among the caller's team, `omp_get_max_threads()`, or running alone when the GEMM is small."""
    out: list[str] = []
    pos = 0
    for found in _GEMM_THREADS.finditer(source):
        count, end = int(found.group(1)), _enclosing_block_end(source, found.end())
        body = source[found.end() : end]
        # A template made for one thread (the BMM template's per-batch GEMM) has no partitions to share.
        if end is None or count < 2 or "mm_get_thread_blocking(num_threads," not in body:
            continue
        # Every edit must apply: partitions left at the build machine's count while the blocking follows the caller's
        # team would leave some of the GEMM uncomputed.
        body, told = re.subn(
            rf"#pragma omp parallel num_threads\({count}\)", "#pragma omp parallel num_threads(num_threads)", body
        )
        if not told:  # torch >= 2.12: a worksharing loop over the partitions, in the caller's team
            body = _replaced(body, f"tid < {count}; tid++)", "tid < num_threads; tid++)")
        body = _replaced(body, f"Kt_blocks * {count} >=", "Kt_blocks * num_threads >=")
        body = _replaced(
            body,
            "mm_get_thread_blocking(num_threads,",
            f"if (M * N * K < {SERIAL_GEMM_WORK}) num_threads = 1;\n    mm_get_thread_blocking(num_threads,",
            1,
        )
        body, regions = _BARE_REGION.subn(r"\1#pragma omp parallel if(num_threads > 1)\n", body)
        if not regions and not told:
            raise _template_changed("#pragma omp parallel")
        out += [source[pos : found.start()], "int64_t num_threads = omp_get_max_threads();", body]
        pos = end
    return "".join(out) + source[pos:]


def _replaced(text: str, old: str, new: str, count: int = -1) -> str:
    if old not in text:
        raise _template_changed(old)
    return text.replace(old, new, count)


def _template_changed(text: str) -> UserError:
    return compat.changed(
        f"Inductor's C++ GEMM template changed (a GEMM whose blocking is computed at run time has no {text!r})"
    )


def serial_fast_paths(source: str) -> str:
    """`source` with each outermost `#pragma omp parallel { ... }` region preceded by its serial copy."""
    out: list[str] = []
    pos = 0
    for region in _REGION.finditer(source):
        if region.start() < pos:
            continue  # nested in a region already copied
        end = _block_end(source, region.end())
        if end is None:
            continue
        indent, team_if = region.group(1), region.group(2)
        serial = _TEAM_DIRECTIVE.sub("", source[region.end() : end])
        alone = "omp_get_max_threads() == 1" + (f" || !({team_if})" if team_if else "")
        out += [
            source[pos : region.start()],
            f"{indent}if ({alone})\n{indent}{serial}\n",
            f"{indent}else\n{indent}{{\n{source[region.start() : end]}\n{indent}}}",
        ]
        pos = end
    return "".join(out) + source[pos:]


def _enclosing_block_end(source: str, start: int) -> int | None:
    """The index of the brace that closes the block `start` lies in, skipping strings and comments."""
    depth = 0
    i = start
    while i < len(source):
        skipped = _SKIP.match(source, i)
        if skipped:
            i = skipped.end()
            continue
        if source[i] == "{":
            depth += 1
        elif source[i] == "}":
            if depth == 0:
                return i
            depth -= 1
        i += 1
    return None


def _block_end(source: str, start: int) -> int | None:
    """The index just past the brace block opening at `start`."""
    close = _enclosing_block_end(source, start + 1)
    return None if close is None else close + 1
