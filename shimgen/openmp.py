"""Serial fast paths for Inductor's OpenMP regions.

libgomp enters every `#pragma omp parallel` through a team, even a team of one thread, and ends each
worksharing loop and the region itself at a team barrier that makes a futex system call: about 0.3 us
twice per region. Microsecond models called with one thread spend most of their time there (a tiny
MLP: 16 system calls per call). Each region therefore gets a copy of its body without OpenMP
directives, taken when the calling thread would run the region alone (`torch.set_num_threads(1)`
sets what `omp_get_max_threads()` reads). A team of one executes its region exactly as the serial
copy does: the thread number is 0 and the team size 1 in both.
"""

from __future__ import annotations

import re

# Only regions whose team is the caller's (no num_threads clause: codegen sets cpp.dynamic_threads);
# a region with a fixed team size may keep per-thread state that a serial run would leave unset.
_REGION = re.compile(r"^([ \t]*)#pragma omp parallel[ \t]*\n[ \t]*(?=\{)", re.M)
# Directives of the region's own team; `simd` (vectorization) and `declare` are not team directives.
_TEAM_DIRECTIVE = re.compile(r"^[ \t]*#pragma omp (?!simd\b|declare\b)[^\n]*\n", re.M)
_SKIP = re.compile(r'"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'|//[^\n]*|/\*.*?\*/', re.S)


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
        indent = region.group(1)
        serial = _TEAM_DIRECTIVE.sub("", source[region.end() : end])
        out += [source[pos : region.start()], f"{indent}if (omp_get_max_threads() == 1)\n{indent}{serial}\n",
                f"{indent}else\n{indent}{{\n{source[region.start() : end]}\n{indent}}}"]
        pos = end
    return "".join(out) + source[pos:]


def _block_end(source: str, start: int) -> int | None:
    """The index just past the brace block opening at `start`, skipping strings and comments."""
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
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return None
