"""Codegen stage: ExportedProgram → C++ sources through Inductor's AOT C++ codegen (cpp-only output).

Inductor writes one `<hash>.wrapper.cpp` holding the wrapper and, after an include of
`cpp_prefix.h`, the CPU kernels as `extern "C"` functions; plus the weights as an ELF object and
its compile flags as JSON. shimgen splits wrapper from kernels (each gets its own opt level) and
takes the ISA from the spec's target, never from the build machine.
"""

from __future__ import annotations

import json
import re
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import UserError
from .spec import Flags, Target

KERNELS_START = "#include <torch/csrc/inductor/cpp_prefix.h>"
# -march and CPU_CAPABILITY per spec isa; 'native' keeps what Inductor picked for this machine.
ISA_FLAGS = {
    "avx512": (512, ["-march=x86-64-v4", "-mfma"], "CPU_CAPABILITY_AVX512"),
    "avx2": (256, ["-march=x86-64-v3"], "CPU_CAPABILITY_AVX2"),
    "default": (1, ["-march=x86-64"], None),
}


@dataclass
class GeneratedSources:
    wrapper: Path
    kernels: Path | None
    weights: Path
    defines: list[str]
    inductor_args: list[str]


def inductor_configs(target: Target, flags: Flags) -> dict[str, Any]:
    configs: dict[str, Any] = {
        "aot_inductor.package_cpp_only": True,
        "aot_inductor.precompile_headers": False,
        "freezing": flags.freezing,
        "max_autotune": flags.max_autotune,
    }
    if target.isa != "native":
        configs["cpp.simdlen"] = ISA_FLAGS[target.isa][0]
        # mkldnn-prepacked weights are blocked for the build machine's CPU.
        configs["cpp.weight_prepack"] = False
    return configs


def generate(program: Any, target: Target, flags: Flags, out_dir: Path) -> GeneratedSources:
    """Run Inductor's AOT codegen for one graph and target into out_dir."""
    import torch

    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="shimgen-codegen-") as tmp:
        package = Path(tmp) / "model.pt2"
        try:
            torch._inductor.aoti_compile_and_package(
                program, package_path=str(package), inductor_configs=inductor_configs(target, flags)
            )
        except Exception as exc:  # Inductor raises many types; all mean "this graph cannot be compiled"
            raise UserError(f"Inductor could not compile the graph: {type(exc).__name__}: {_first_lines(str(exc))}") from exc
        files = _extract(package)
    wrapper_text = files[".wrapper.cpp"].decode()
    flags_json = json.loads(files[".wrapper_compile_flags.json"])
    wrapper_part, kernels_part = _split_kernels(wrapper_text)
    wrapper = _write(out_dir / "wrapper.cpp", wrapper_part)
    kernels = _write(out_dir / "kernels.cpp", kernels_part) if kernels_part else None
    if kernels is None:
        (out_dir / "kernels.cpp").unlink(missing_ok=True)
    weights = out_dir / "weights.o"
    weights.write_bytes(files[".weights.o"])
    defines, args = _compile_flags(flags_json, target)
    return GeneratedSources(wrapper, kernels, weights, defines, args)


def _extract(package: Path) -> dict[str, bytes]:
    found: dict[str, bytes] = {}
    with zipfile.ZipFile(package) as zf:
        for name in zf.namelist():
            for suffix in (".wrapper.cpp", ".wrapper_compile_flags.json", ".weights.o"):
                if name.endswith(suffix):
                    if suffix in found:
                        raise UserError(f"Inductor produced more than one {suffix} ({name}); unsupported graph")
                    found[suffix] = zf.read(name)
    missing = {".wrapper.cpp", ".wrapper_compile_flags.json", ".weights.o"} - set(found)
    if missing:
        raise UserError(f"Inductor's output lacks {', '.join(sorted(missing))}; this torch version is not supported")
    return found


def _split_kernels(text: str) -> tuple[str, str]:
    # Drop Inductor's trailing "// g++ ..." notes: they hold build-machine temp paths.
    text = re.sub(r"\n// (g\+\+|c\+\+|clang\+\+) [^\n]*", "", text).rstrip() + "\n"
    head, sep, kernels = text.partition("\n" + KERNELS_START + "\n")
    if not sep:
        return text, ""
    return head + "\n", KERNELS_START + "\n" + kernels


def _compile_flags(flags_json: dict[str, Any], target: Target) -> tuple[list[str], list[str]]:
    defines = [d.strip() for d in flags_json["definitions"] if d.strip() and d.strip() != "TORCH_INDUCTOR_PRECOMPILE_HEADERS"]
    # Inductor's math flags decide numerics (e.g. -ffp-contract=off); keep them, drop opt/debug/warning/ISA choices.
    drop = re.compile(r"^(O\d|Os|g\d?|march=.*|std=.*|W.*|pedantic|fPIC|shared|fopenmp|DNDEBUG)$")
    args = [f"-{c}" for c in flags_json["cflags"] if not drop.match(c)]
    if target.isa == "native":
        args.append("-march=native")
        args += [a for p in flags_json.get("passthrough_args", []) for a in p.split()]
    else:
        _, isa_args, capability = ISA_FLAGS[target.isa]
        args += isa_args
        defines = [d for d in defines if not d.startswith("CPU_CAPABILITY")]
        if capability:
            defines.append(capability)
    return defines, args


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _first_lines(text: str, n: int = 6) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return "\n".join(lines[:n]) + ("\n..." if len(lines) > n else "")
