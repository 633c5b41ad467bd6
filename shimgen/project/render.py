"""Render stage: templates under shimgen/templates → a generated Meson project, the toolchain probe,
or the per-user prebuilt pieces.

Files are written only when their content changes, so ninja rebuilds only what really changed.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from pathlib import Path
from typing import Any

import jinja2
from packaging.version import Version

from shimgen import devices
from shimgen.files import file_hash, stage_key, write_if_changed
from shimgen.inductor import generated, proxy_executor, weights
from shimgen.project import escape
from shimgen.results import (
    OBJECT,
    CodegenResult,
    CustomOps,
    OutNode,
    OutType,
    Prebuilt,
    RenderedProject,
    Unit,
    Variant,
    kernel_compile_args,
    target_compile_args,
    wrapper_compile_args,
)
from shimgen.spec import Flags, Graph, ProjectSpec, Target
from shimgen.spec.model import SCALAR_TYPES
from shimgen.toolchain import Toolchain, cache_dir
from shimgen.toolchain.cuda import CudaToolchain
from shimgen.trace import entry, variants

TEMPLATES = Path(__file__).parent / "templates"
RUNTIME = Path(__file__).parents[1] / "runtime"  # shipped or compiled as they are
MODEL_BASE_INSTANCE = (
    b"template class torch::aot_inductor::AOTInductorModelBase<torch::aot_inductor::AOTInductorModel>;\n"
    b'#include "shimgen_regex_once.h"\n#ifdef SHIMGEN_REGEX_ONCE\nSHIMGEN_REGEX_ONCE(template)\n#endif\n'
)
REGEX_ONCE = "shimgen_regex_once.h"  # under RUNTIME: what model_base.cpp instantiates and model.cpp declares
PACKAGE_MODULES = ("_shimgen_weights.py", "_shimgen_refit.py")  # under RUNTIME, shipped in every package
TORCH_DEPENDENCY = "project/torch_dependency.meson.j2"  # included by every Meson project shimgen writes
PROBE_FILES = ("probe.cpp", "check_probe.py")  # under RUNTIME
# What __init__.py is rendered from, shipped beside it as BUILD_MANIFEST for `shimgen merge`.
INIT_CONTEXT = (
    "name",
    "version",
    "description",
    "spec_file",
    "target_ids",
    "torch_version",
    "targets",
    "units",
    "graphs",
    "op_libraries",
    "op_modules",
    "docstrings",
    "freezing",
    "weights_env",
)
BUILD_MANIFEST = "_shimgen_build.json"
OPT = {"O0": "0", "O1": "1", "O2": "2", "O3": "3", "Os": "s"}


@functools.cache
def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        finalize=escape.require_escaped,
    )
    env.filters.update(escape.FILTERS)
    return env


def load_templates() -> None:
    """Compile every template now (the build server does, before it forks its builds)."""
    env = _env()
    for name in env.list_templates(extensions=["j2"]):
        env.get_template(name)


def render_probe(tc: Toolchain, out: Path) -> None:
    env = _env()
    write_if_changed(
        out / "meson.build", env.get_template("probe/meson.build.j2").render(tc=tc, path_maps=path_maps(tc))
    )
    for name in PROBE_FILES:
        write_if_changed(out / name, (RUNTIME / name).read_bytes())


# shimgen/runtime's sources of the runtime library (runtime_lib.py): every shimgen_* C++ file there.
RUNTIME_LIBRARY = tuple(sorted(p.name for p in RUNTIME.glob("shimgen_*") if p.suffix in (".h", ".cpp")))
RUNTIME_TESTS = ("tests/runtime_tests.cpp",)
# The runtime headers a generated project compiles against (the CPython binding, the C++ front door).
PROJECT_HEADERS = tuple(name for name in RUNTIME_LIBRARY if name.endswith(".h"))


def runtime_sources(tests: bool) -> list[tuple[str, bytes]]:
    """(name, content) of the runtime library's Meson project: its sources, and its template."""
    names = RUNTIME_LIBRARY + (RUNTIME_TESTS if tests else ())
    return [(name, (RUNTIME / name).read_bytes()) for name in names] + [
        ("meson.build.j2", (TEMPLATES / "runtime" / "meson.build.j2").read_bytes()),
        ("torch_dependency.meson.j2", (TEMPLATES / TORCH_DEPENDENCY).read_bytes()),
    ]


def render_runtime(tc: Toolchain, device: str, out: Path, tests_against: Path | None = None) -> None:
    """The runtime library's Meson project for `device` into `out`; with `tests_against` (the core library the per-user
    cache built from the same sources), its unit tests instead, linked with that library."""
    cuda_includes: list[str] = []
    if devices.device(device).gpu:
        from shimgen.toolchain.cuda import detect_cuda

        cuda_includes = detect_cuda().include_dirs
    context = {
        "tc": tc,
        "device": device,
        "cuda": devices.device(device).gpu,
        "cuda_includes": cuda_includes,
        "tests_against": tests_against,
        "path_maps": path_maps(tc),
    }
    write_if_changed(out / "meson.build", _env().get_template("runtime/meson.build.j2").render(context))
    for name, content in runtime_sources(tests_against is not None):
        if not name.endswith(".j2"):
            write_if_changed(out / name, content)


def render_prebuilt(
    tc: Toolchain, device: str, compile_args: list[str], flags: Flags, interface: bytes, out: Path
) -> None:
    env = _env()
    context = {
        "tc": tc,
        "inductor_args": compile_args,
        "wrapper_opt": OPT[flags.wrapper_opt],
        "pch": flags.pch,
        "path_maps": path_maps(tc),
    }
    write_if_changed(out / "meson.build", env.get_template("prebuilt/meson.build.j2").render(context))
    write_if_changed(out / "aoti_interface.cpp", interface)
    # What shimgen_model_base.h declares: the model base class instantiated once, with the interface's headers.
    headers = b"".join(line + b"\n" for line in interface.splitlines() if line.startswith(b"#include"))
    write_if_changed(out / "model_base.cpp", headers + MODEL_BASE_INSTANCE)
    write_if_changed(out / REGEX_ONCE, (RUNTIME / REGEX_ONCE).read_bytes())
    write_if_changed(out / "empty.cpp", "")
    write_if_changed(out / "pch" / "wrapper_pch.h", env.get_template("prebuilt/wrapper_pch.h.j2").render(device=device))
    write_if_changed(out / "pch" / "runtime_pch.h", (RUNTIME / "runtime_pch.h").read_bytes())


def render_kernel_pch(tc: Toolchain, compile_args: list[str], kernel_opt: str, out: Path) -> None:
    context = {"tc": tc, "inductor_args": compile_args, "kernel_opt": OPT[kernel_opt], "path_maps": path_maps(tc)}
    write_if_changed(out / "meson.build", _env().get_template("prebuilt/kernel_pch.meson.j2").render(context))
    write_if_changed(out / "empty.cpp", "")
    write_if_changed(out / "pch" / "kernel_pch.h", (RUNTIME / "kernel_pch.h").read_bytes())


def render_ops_pch(tc: Toolchain, header: str, out: Path) -> None:
    """A Meson project that precompiles the torch `header` with the flags of the custom ops' project (render_ops)."""
    context = {"tc": tc, "path_maps": path_maps(tc)}
    write_if_changed(out / "meson.build", _env().get_template("prebuilt/ops_pch.meson.j2").render(context))
    write_if_changed(out / "empty.cpp", "")
    write_if_changed(out / "pch" / "ops_pch.h", f"#include <{header}>\n")


def render_ops(
    spec: ProjectSpec,
    spec_file: str,
    tc: Toolchain,
    cuda: CudaToolchain | None,
    sources: list[list[Path]],
    out: Path,
    pch_dirs: tuple[Path, ...] = (),
) -> dict[int, str]:
    """Write the Meson project of the custom ops' libraries into `out`; their target names by entry. `pch_dirs` hold
    precompiled torch headers (prebuilt.ops_headers), searched first."""
    libraries: list[dict[str, Any]] = []
    for i, entry_sources in enumerate(sources):
        if entry_sources:
            libraries.append(
                {
                    "entry": i,
                    "name": f"{spec.project.name}_ops{i}",
                    "cxx": [str(s) for s in entry_sources if s.suffix != ".cu"],
                    "cuda": [str(s) for s in entry_sources if s.suffix == ".cu"],
                }
            )
    maps = path_maps(tc, tuple(sorted({s.parent for entry_sources in sources for s in entry_sources})))
    nvcc_args: list[str] = []
    uses_cuda = any(lib["cuda"] for lib in libraries)
    if cuda and uses_cuda:
        archs = next(t.archs for t in spec.target if devices.device(t.device).gpu)
        nvcc_args = [
            "-std=c++17",
            "-O3",
            "--expt-relaxed-constexpr",
            "-ccbin",
            tc.cxx,
            "-Xcompiler",
            "-fPIC",
            "-D__CUDA_NO_HALF_OPERATORS__",
            "-D__CUDA_NO_HALF_CONVERSIONS__",
            "-D__CUDA_NO_BFLOAT16_CONVERSIONS__",
            "-D__CUDA_NO_HALF2_OPERATORS__",
            *[a for d in tc.extension_includes for a in ("-isystem", d)],
            *[a for m in maps if "," not in m for a in ("-Xcompiler", m)],
        ]  # nvcc splits -Xcompiler at commas
        for arch in archs:
            number = arch[3:]
            nvcc_args.append(f"-gencode=arch=compute_{number},code={arch}")
        nvcc_args.append(f"-gencode=arch=compute_{archs[-1][3:]},code=compute_{archs[-1][3:]}")  # PTX for newer GPUs
    context = {
        "name": spec.project.name,
        "spec_file": spec_file,
        "tc": tc,
        "cuda": cuda if uses_cuda else None,
        "nvcc_args": nvcc_args,
        "libraries": libraries,
        "path_maps": maps,
        "pch_dirs": [str(d) for d in pch_dirs],
    }
    write_if_changed(out / "meson.build", _env().get_template("ops/meson.build.j2").render(context))
    return {lib["entry"]: lib["name"] for lib in libraries}


def render_project(
    spec: ProjectSpec,
    version: str,
    spec_file: str,
    tc: Toolchain,
    cuda: CudaToolchain | None,
    units: list[Unit],
    prebuilt: dict[str, Prebuilt],
    ops: CustomOps | None,
    out: Path,
) -> RenderedProject:
    """Write the generated Meson project into `out`; the package's `version` holds its local label. Each graph links
    the runtime library of its device from `prebuilt`."""
    env = _env()
    name = spec.project.name
    external = spec.flags.weights == "external"
    files: dict[Path, str | bytes] = {}
    made_from: dict[Path, str] = {}  # weights files: what they are made from, in the project's key for their bytes
    kept: set[Path] = set()  # files left as they are
    inputs: dict[Path, list[Path]] = {}  # weights files: the files they are made from
    binding = env.get_template("project/binding.cpp.j2")
    cpp_skipped = cpp_package_skipped(spec, units)
    target_ids = " and ".join(target_id(t) for t in spec.target)
    unit_context = []
    for u in units:
        models = []
        for (work, code), variant in zip(u.generated, (None, *u.variants), strict=True):
            src = out / "src" / work
            for path in (code.model, code.weights, *code.kernels, *code.ptx):
                files[src / path.name] = path.read_bytes()
            for path in code.triton:
                files[src / "triton" / path.name] = path.read_bytes()
            if code.extern_nodes:
                entry.import_op_modules(code.run_time_modules, u.graph.name)
                nodes = proxy_executor.extern_nodes(json.loads(code.extern_nodes.read_text()))
                files[src / "proxy_executor.cpp"] = env.get_template("project/proxy_executor.cpp.j2").render(
                    graph=u.graph.name, nodes=nodes
                )
            if variant is not None or cpp_skipped is None:
                files[src / ("variant.cpp" if variant else "entry.cpp")] = env.get_template(
                    "project/variant.cpp.j2"
                ).render(
                    graph=u.graph.name,
                    sizes=_label(variant) if variant else "",
                    device=u.target.device,
                    proxy_executor=code.extern_nodes is not None,
                    has_last_error=tc.has_last_error,
                )
            large = [p for p, _ in generated.large_kernels(code.kernels, spec.flags.kernel_opt)]
            models.append(
                {
                    "dir": work,
                    "library": u.library(variant) if variant else None,
                    "label": _label(variant) if variant else "",
                    "kernels": [p.name for p in code.kernels if p not in large],
                    "large_kernels": [p.name for p in large],
                    "cuda_kernels": [p.stem for p in code.ptx],
                    "triton": [p.name for p in code.triton],
                    "proxy_executor": code.extern_nodes is not None,
                }
            )
        # The compiled code the weights are laid out for: the models' constants tables and the kernels that read them.
        layout = stage_key(target_id(u.target), [file_hash(p) for _, c in u.generated for p in (c.model, *c.kernels)])
        if u.code.weights_file:
            path = out / "src" / u.name / weights_file_name(u)
            made_from[path] = stage_key(layout, [(c.key, c.weights_digest) for _, c in u.generated if c.weights_file])
            inputs[path] = [c.weights_file for _, c in u.generated if c.weights_file]
            made = _unit_weights(u, layout, path, made_from[path], inputs[path])
            files[path] = b"" if made is None else made
            if made is None:
                kept.add(path)
        context = _binding_context(u, tc, spec, target_ids)
        files[out / "src" / u.name / "graph_spec.h"] = env.get_template("project/graph_spec.h.j2").render(context)
        files[out / "src" / u.name / "binding.cpp"] = binding.render(context)
        files[out / "src" / u.name / "variants.cpp"] = env.get_template("project/variants.cpp.j2").render(context)
        unit_context.append(
            {
                "name": u.name,
                "graph": u.graph.name,
                "device": u.target.device,
                "models": models,
                # In the package's directory; "external" weights come from elsewhere (the manifest's weights_env).
                "weights_file": weights_file_name(u) if u.code.weights_file and not external else None,
                "weights_layout": layout,
                "constants": weights.package_view(weights.read_constants(u.code.constants), u.code.state)
                if u.code.constants
                else [],
                "refit": _refit(u.code),
                "unused_weights": list(u.code.unused_weights),
                # Graphs that build the same module share its state (prefill and decode over one KV cache).
                "state_owner": stage_key(u.graph.entry, u.graph.args, u.graph.kwargs, u.graph.seed)[:16],
                "variants": [
                    {
                        "name": v.name,
                        "label": _label(v),
                        "library": f"{u.library(v)}.so",
                        "constants": weights.package_view(weights.read_constants(v.code.constants), v.code.state)
                        if v.code.constants
                        else [],
                        "refit": _refit(v.code),
                    }
                    for v in u.variants
                ],
            }
        )
    libraries = []
    if ops:
        for k, path in zip([i for i, op in enumerate(spec.custom_op) if op.sources], ops.libraries, strict=True):
            files[out / "src" / "ops" / path.name] = path.read_bytes()
            libraries.append(
                {"file": path.name, "op": next(d.name for d in ops.ops if d.entry == k and d.module is None)}
            )
    targets = []
    target_args = {t.device: target_compile_args([u for u in units if u.target is t]) for t in spec.target}
    for t in spec.target:
        built = prebuilt[t.device]
        targets.append(
            {
                "device": t.device,
                "archs": t.archs,
                "inductor_args": kernel_compile_args(target_args[t.device]),
                "wrapper_args": wrapper_compile_args(target_args[t.device]),
                "interface_lib": str(built.interface_lib),
                "runtime_libs": [str(p) for p in built.runtime_libs],
                "extern_ops_lib": str(built.extern_ops_lib),
                "wrapper_pch_args": ["-include", str(built.wrapper_pch), "-Winvalid-pch"] if built.wrapper_pch else [],
                "kernel_pch_args": ["-include", str(built.kernel_pch), "-Winvalid-pch"] if built.kernel_pch else [],
                "runtime_pch_args": ["-include", str(built.runtime_pch), "-Winvalid-pch"] if built.runtime_pch else [],
            }
        )
    context = {
        "name": name,
        "version": version,
        "description": spec.project.description,
        "spec_file": spec_file,
        "target_ids": target_ids,
        "tc": tc,
        "path_maps": path_maps(tc),
        "cuda": cuda,
        "torch_version": tc.torch_version,
        "python_version": tc.python_version,
        "wrapper_opt": OPT[spec.flags.wrapper_opt],
        "kernel_opt": OPT[spec.flags.kernel_opt],
        "targets": targets,
        "units": unit_context,
        "graphs": [g.name for g in spec.graph],
        "op_libraries": libraries,
        "op_modules": _op_modules(spec, units),
        "freezing": spec.flags.freezing,
        "weights_env": weights_env(name) if external else None,
        "docstrings": {
            g.name: docstring(
                g,
                next(u.code.out_nodes for u in units if u.graph is g),
                spec.runtime.instances,
                any(not devices.device(t.device).gpu for t in spec.target),
                packed_threads=next((u.packed_threads for u in units if u.graph is g and u.packed_threads), None),
                state=next(u.code.state for u in units if u.graph is g),
                made=next(u.variants for u in units if u.graph is g),
            )
            for g in spec.graph
        },
    }
    context["cpp"] = None
    if cpp_skipped is None:
        context["cpp"] = _cpp_context(spec, tc, units, prebuilt, unit_context)
        cpp_context = {**context, **context["cpp"]}
        for template, path in (
            ("package.h.j2", out / "include" / name / f"{name}.h"),
            ("package.cpp.j2", out / "src" / "cpp" / "package.cpp"),
            ("layouts.cpp.j2", out / "src" / "cpp" / "layouts.cpp"),
            ("Config.cmake.j2", out / "src" / "cpp" / f"{name}Config.cmake"),
            ("ConfigVersion.cmake.j2", out / "src" / "cpp" / f"{name}ConfigVersion.cmake"),
            ("package.pc.j2", out / "src" / "cpp" / f"{name}.pc"),
        ):
            files[path] = env.get_template(f"project/cpp/{template}").render(cpp_context)
    files[out / "meson.build"] = env.get_template("project/meson.build.j2").render(context)
    files[out / "pyproject.toml"] = env.get_template("project/pyproject.toml.j2").render(
        context, readme=readme(name, spec.project.description, target_ids, context["docstrings"])
    )
    # Devices and names only: the manifest holds no path of the build machine.
    package = {
        **{k: context[k] for k in INIT_CONTEXT},
        "targets": [{"device": t["device"]} for t in targets],
        "units": [
            {
                k: u[k]
                for k in (
                    "name",
                    "graph",
                    "device",
                    "weights_file",
                    "weights_layout",
                    "constants",
                    "unused_weights",
                    "refit",
                    "state_owner",
                    "variants",
                )
            }
            for u in unit_context
        ],
    }
    files[out / name / "__init__.py"] = render_init(package)
    files[out / name / BUILD_MANIFEST] = json.dumps(package, indent=1, sort_keys=True) + "\n"
    for runtime_module in PACKAGE_MODULES:
        files[out / name / runtime_module] = (RUNTIME / runtime_module).read_text()
    for runtime_file in PROJECT_HEADERS + (("embed_kernel.py",) if cuda else ()):
        files[out / "src" / runtime_file] = (RUNTIME / runtime_file).read_text()
    for path, content in files.items():
        if path not in kept:
            write_if_changed(path, content)
    records = {_made_from_record(path): _made_from(key, path, inputs[path]) for path, key in made_from.items()}
    for record, text in records.items():  # once its weights file is written
        write_if_changed(record, text)
    _remove_stale(out, set(files) | set(records))
    digest = hashlib.sha256()
    for path in sorted(files):
        content = made_from.get(path, files[path])
        digest.update(
            f"{path.relative_to(out)}\0".encode() + (content.encode() if isinstance(content, str) else content)
        )
    return RenderedProject(key=digest.hexdigest(), root=out, sources=tuple(sorted(files)))


def readme(name: str, description: str, target_ids: str, docstrings: dict[str, str]) -> str:
    """The wheel's long description (Markdown): what the package is, and each callable's docstring."""
    lines = [f"# {name}", ""] + ([description, ""] if description else [])
    lines += [f"A PyTorch model compiled by shimgen for {target_ids}; `import {name}` needs torch alone.", ""]
    for graph, text in docstrings.items():
        lines += [f"## `{name}.{graph}`", "", "```text", text.rstrip(), "```", ""]
    return "\n".join(lines)


def _made_from_record(weights_file: Path) -> Path:
    return weights_file.with_name(weights_file.name + ".made-from")


def _made_from(key: str, path: Path, inputs: list[Path]) -> str:
    """A weights file's record: the code and weights it holds (`key`), and the size and time of each file it was made
    from and of itself, so that a file changed outside a build is made again."""
    return json.dumps([key, [(str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in (*inputs, path)]]) + "\n"


def _unit_weights(u: Unit, layout: str, path: Path, key: str, inputs: list[Path]) -> bytes | None:
    """The unit's weights file (`weights.unit_file`, 91 MB for ResNet-18); None where the file there was made from the
    same code and weights, and neither it nor its inputs changed since (its record, written after it, says so)."""
    record = _made_from_record(path)
    if path.is_file() and record.is_file() and record.read_text() == _made_from(key, path, inputs):
        return None
    record.unlink(missing_ok=True)  # until the new file is written
    assert u.code.weights_file is not None
    return weights.unit_file(
        u.code.weights_file, [(v.name, v.code.weights_file) for v in u.variants if v.code.weights_file], layout
    )


def weights_file_name(unit: Unit) -> str:
    """A unit's weights file in the generated project (and, but for "external" weights, in the package)."""
    return f"{unit.name}.safetensors"


def weights_env(package: str) -> str:
    """The environment variable a package built with flags.weights = "external" takes its weights file's path from:
    RESNET_WEIGHTS."""
    return re.sub(r"\W", "_", package).upper() + "_WEIGHTS"


def cpp_package_skipped(spec: ProjectSpec, units: list[Unit]) -> str | None:
    """Why this build makes no C++ package (project.cpp = false, a graph that needs Python), or None."""
    if not spec.project.cpp:
        return "project.cpp = false"
    python_ops = sorted({m for u in units for m in u.code.run_time_modules})
    if python_ops:
        return f"graphs call ops defined in Python ({', '.join(python_ops)}), which a program without Python cannot run"
    return None


def _cpp_context(
    spec: ProjectSpec,
    tc: Toolchain,
    units: list[Unit],
    prebuilt: dict[str, Prebuilt],
    unit_context: list[dict[str, Any]],
) -> dict[str, Any]:
    """What the C++ package's files are rendered from. Its library links the runtime of the GPU where the spec has a
    GPU target (that build also runs CPU graphs), else the CPU's."""
    gpu = next((t.device for t in spec.target if devices.device(t.device).gpu), None)
    device = gpu or spec.target[0].device
    torch_dir = str(Path(tc.torch_lib).parent)
    torch_libraries = ["c10", "torch", "torch_cpu"] + (["c10_cuda", "torch_cuda"] if gpu else [])
    major, minor, patch = (tc.torch_version.split(".") + ["0", "0"])[:3]
    graph_docs = []
    for g in spec.graph:
        unit = next(u for u in units if u.graph is g)
        inputs = ", ".join(f"{inp.name}: {inp.dtype}[{', '.join(str(s) for s in inp.shape)}]" for inp in g.inputs)
        count = unit.code.num_outputs
        graph_docs.append(
            {
                "name": g.name,
                "inputs": f"({inputs})",
                "outputs": f"{count} output{'s' if count != 1 else ''} (the Python package's pytree leaves, in order)",
            }
        )
    return {
        "cuda": gpu is not None,
        "device": device,  # whose compile flags (ISA) and runtime library it takes
        "runtime_core": str(prebuilt[device].runtime_libs[-1]),  # link order: the CPython face, then the core
        "graphs": graph_docs,
        "units": [
            {
                **u,
                "spec_namespace": f"shimgen_graph_{u['name']}",
                "graph_index": [g.name for g in spec.graph].index(u["graph"]),
            }
            for u in unit_context
        ],
        "torch_major": int(major),
        "torch_minor": int(minor),
        "torch_patch": int("".join(c for c in patch if c.isdigit()) or 0),
        "torch_dir": torch_dir,
        "torch_lib": tc.torch_lib,
        "torch_includes": list(tc.extension_includes[:2]),
        "torch_libraries": [f"{tc.torch_lib}/lib{lib}.so" for lib in torch_libraries],
        "cmake_version": ".".join(str(n) for n in Version(spec.project.version).release[:4]),
    }


def path_maps(tc: Toolchain, source_dirs: tuple[Path, ...] = ()) -> list[str]:
    """Compiler arguments that give fixed names to the directories outside a build directory that compiled code may
    record in __FILE__ or debug information: the headers of torch and Python (their last two components), shimgen's
    per-user cache (precompiled headers, prebuilt libraries) and `source_dirs` (their own names)."""
    names = {d: "/".join(Path(d).parts[-2:]) for d in tc.torch_includes}
    names[str(cache_dir().parent)] = "shimgen-cache"
    names.update({str(d): d.name for d in source_dirs})
    return [f"-ffile-prefix-map={d}={name}" for d, name in names.items()]


def render_init(package: dict[str, Any]) -> str:
    """The package's __init__.py from its manifest (BUILD_MANIFEST), which `shimgen merge` combines."""
    return _env().get_template("project/__init__.py.j2").render(package)


def _op_modules(spec: ProjectSpec, units: list[Unit]) -> list[dict[str, str]]:
    """The modules the package imports before its graphs, each with what needs it, for the ImportError."""
    modules: dict[str, list[str]] = {}
    for u in units:
        for module in u.code.run_time_modules:
            modules.setdefault(module, []).append(u.graph.name)
    entries = {op.module: i for i, op in enumerate(spec.custom_op) if op.module}
    return [
        {
            "module": m,
            "needed_by": (f"custom_op[{entries[m]}].module of the spec; " if m in entries else "")
            + f"it defines ops that {'graphs' if len(set(g)) > 1 else 'graph'} {', '.join(sorted(set(g)))} call{'' if len(set(g)) > 1 else 's'}",
        }
        for m, g in modules.items()
    ]


def _binding_context(u: Unit, tc: Toolchain, spec: ProjectSpec, target_ids: str) -> dict[str, Any]:
    graph = u.graph
    dim_index = {name: k for k, name in enumerate(graph.dims)}
    cuda_graphs = spec.flags.cuda_graphs and devices.device(u.target.device).gpu
    inputs = []
    for inp in graph.inputs:
        dims_text = ", ".join(str(s) for s in inp.shape)
        inputs.append(
            {
                "name": inp.name,
                "scalar_type": SCALAR_TYPES[inp.dtype],
                "memory_format": "ChannelsLast" if inp.memory_format == "channels_last" else "Contiguous",
                "sizes": [-1 if isinstance(s, str) else s for s in inp.shape],
                "dims": [dim_index[s] if isinstance(s, str) else -1 for s in inp.shape],
                "signature": f"{inp.dtype}[{dims_text}]",
            }
        )
    return {
        "graph": graph.name,
        "module": f"_{u.name}",
        "spec_namespace": f"shimgen_graph_{u.name}",
        "target_ids": target_ids,
        "device": u.target.device,
        "gpu": devices.device(u.target.device).gpu,
        "inputs": inputs,
        "num_positional": sum(1 for inp in graph.inputs if not inp.keyword),
        "dims": [{"name": n, "min": d.min, "max": d.max, "multiple_of": d.multiple_of} for n, d in graph.dims.items()],
        "out_nodes": _out_node_table(u.code.out_nodes),
        "out_objects": _out_object_table(u.code.out_nodes),
        "num_outputs": u.code.num_outputs,
        "instances": spec.runtime.instances,
        "cuda_graphs": cuda_graphs,
        "keep_buffers": spec.runtime.keep_buffers and not devices.device(u.target.device).gpu,
        "packed_threads": u.packed_threads or 0,
        "has_last_error": tc.has_last_error,
        "proxy_executor": u.code.extern_nodes is not None,
        "weights_in_file": u.code.weights_file is not None,
        "no_weights": _no_weights(spec.project.name, spec.flags.weights),
        "state": sorted({name for _, code in u.generated for name in code.state}),
        "variants": [
            {
                "name": v.name,
                "label": _label(v),
                "library": f"{u.library(v)}.so",
                "dim_sizes": [dict(v.sizes).get(name, -1) for name in graph.dims],
                "captured": cuda_graphs and variants.fully_static(graph, dict(v.sizes)),
            }
            for v in u.variants
        ],
        "docstring": docstring(
            graph,
            u.code.out_nodes,
            spec.runtime.instances,
            not devices.device(u.target.device).gpu,
            cuda_graphs,
            u.code.state,
            u.variants,
            u.packed_threads,
        ),
    }


def _no_weights(package: str, where: str) -> str:
    """What a call says where the graph has no weights yet (shimgen_graph.h's GraphSpec::no_weights)."""
    if where != "external":
        return (
            "no weights are loaded; import the package, which maps its weights file, rather than its extension module"
        )
    return (
        f"no weights are loaded: package {package} was built with flags.weights = 'external' and ships none. Give it "
        f"the weights file its build wrote beside the wheel: set {weights_env(package)} to its path before the "
        f"package is imported (Python) or loaded (C++), or call {package}.load_weights(path) (Python), "
        f"{package}::load(path) or load_weights(path) (C++)"
    )


def _refit(code: CodegenResult) -> dict[str, Any] | None:
    """The model's refit program (inductor/refit.py), where it has constants computed from the weights or weights
    whose values the code holds."""
    if code.refit is None:
        return None
    program = json.loads(code.refit.read_text())
    return program if any(program.get(k) for k in ("outputs", "missing", "checks", "fixed")) else None


def _label(variant: Variant) -> str:
    """batch=1, seq=128"""
    return ", ".join(f"{dim}={size}" for dim, size in variant.sizes)


def docstring(
    graph: Graph,
    out_nodes: tuple[OutNode, ...],
    instances: int | None = None,
    cpu: bool = False,
    cuda_graphs: bool = False,
    state: tuple[str, ...] = (),
    made: tuple[Variant, ...] = (),
    packed_threads: int | None = None,
) -> str:
    """The callable's docstring; `instances` and `cpu` add how calls share threads (`packed_threads`, what oneDNN's
    weights are packed for), `state` what the graph mutates, `made` its variants."""
    positional = [i.name for i in graph.inputs if not i.keyword]
    keyword = [i.name for i in graph.inputs if i.keyword]
    params = ", ".join(positional + (["*"] + keyword if keyword else []))
    lines = [f"{graph.name}({params})", "", "Inputs (checked on every call):"]
    for inp in graph.inputs:
        shape = ", ".join(str(s) for s in inp.shape)
        layout = "" if inp.memory_format == "contiguous" else f", {inp.memory_format}"
        lines.append(f"  {inp.name}: {inp.dtype}[{shape}]{layout}")
    if graph.dims:
        lines.append("Dynamic dims:")
        lines += [
            f"  {name}: {d.min}..{d.max}"
            + (f", specialized for {', '.join(map(str, d.specialize))}" if d.specialize else "")
            for name, d in graph.dims.items()
        ]
    listed = [v for v in made if not v.automatic]
    if listed:
        captured = (
            " (replayed from CUDA graphs)"
            if cuda_graphs and variants.fully_static(graph, dict(listed[0].sizes))
            else ""
        )
        lines.append(f"Specialized variants{captured}, each compiled for its sizes; other sizes run the dynamic code:")
        lines.append("  " + "; ".join(_label(v) for v in listed))
    for v in made:
        if v.automatic:
            captured = (
                " (replayed from a CUDA graph)" if cuda_graphs and variants.fully_static(graph, dict(v.sizes)) else ""
            )
            lines.append(f"{_label(v)} runs code compiled for it{captured}: {v.automatic}.")
    if cuda_graphs:
        lines.append(
            "Replayed from a CUDA graph, captured on the first call."
            if not graph.dims
            else "Other sizes run the dynamic code, not captured (CUDA graphs replay static shapes)."
        )
    if cpu:
        lines.append(
            "Threads: CPU kernels run on as many threads as torch.get_num_threads() gives in the calling thread at the "
            "call (torch.set_num_threads); one thread runs them without an OpenMP team."
        )
        if packed_threads:
            lines.append(
                f"oneDNN's weights are packed for {packed_threads} threads ([[target]] threads): on CPUs where oneDNN's "
                "layout follows the threads, calls at another count repack them at every call, much slower."
            )
    if instances and cuda_graphs and not graph.dims:
        instances = 1
    if state:
        names = ", ".join(name.removeprefix(weights.WEIGHT_PREFIX) for name in state)
        lines.append(
            f"State: each call updates {names} in place, as the model does, and sees the updates of every call before "
            "it, also those of the package's other graphs that use the same state; these calls run one at a time "
            "(the GIL is released). state() reads it, reset_state() restores its initial values, load_weights() "
            "leaves it as it is."
        )
    elif instances:
        lines.append(
            f"Calls from {instances} Python threads run at once, each on its own model instance (the GIL is "
            "released); further calls wait for an instance."
        )
    notes = _type_notes(out_nodes)
    if len(notes) == 1 and out_nodes[0].kind == OBJECT:
        lines.append(f"Returns: {_structure_text(out_nodes)}: {notes[0][1]}")
    else:
        lines.append(f"Returns: {_structure_text(out_nodes)}")
        lines += [f"  {name}: {note}" for name, note in notes]
    return "\n".join(lines)


def _structure_text(nodes: tuple[OutNode, ...]) -> str:
    pos = 0

    def visit(parent_kind: int) -> str:
        nonlocal pos
        node = nodes[pos]
        pos += 1
        children = [visit(node.kind) for _ in range(node.arity)]
        kind = node.kind
        joined = ", ".join(children)
        if node.type:
            text = f"{node.type.name}({joined})"
        else:
            text = [
                "Tensor",
                f"({joined}{',' if len(children) == 1 else ''})",
                f"[{joined}]",
                "{" + joined + "}",
                "None",
            ][kind]
        if node.key is None:
            return text
        return f"{node.key}: {text}" if parent_kind == OBJECT else f"{node.key!r}: {text}"

    return visit(-1)


def _type_notes(nodes: tuple[OutNode, ...]) -> list[tuple[str, str]]:
    """(name, what the callable returns for it) for each type of the output's OBJECT nodes."""
    notes: dict[tuple[str, str], str] = {}
    for t in _types(nodes):
        full = f"{t.module}.{t.qualname}"
        fallback = {
            "namedtuple": f"a namedtuple {t.name} of the same fields",
            "dict": "a dict in field order",
            "tuple": "a tuple",
        }[t.fallback]
        notes.setdefault(
            (t.name, full),
            f"a {full} when that is importable, else {fallback}" if t.construct else f"{fallback} ({full} {t.reason})",
        )
    return [(name, note) for (name, _), note in notes.items()]


def _types(nodes: tuple[OutNode, ...]) -> list[OutType]:
    return [n.type for n in nodes if n.type]


def _out_node_table(nodes: tuple[OutNode, ...]) -> list[dict[str, Any]]:
    """The binding's kOutNodes: each OBJECT node with its index in kOutObjects."""
    objects = iter(range(len(nodes)))
    return [
        {
            "kind": n.kind,
            "arity": n.arity,
            "key": n.key,
            "int_key": int(isinstance(n.key, int)),
            "object": next(objects) if n.type else -1,
        }
        for n in nodes
    ]


def _out_object_table(nodes: tuple[OutNode, ...]) -> list[dict[str, Any]]:
    """The binding's kOutObjects: the OBJECT nodes' types in preorder (binding.cpp.j2's Construct, Fallback)."""
    construct = {None: 0, "positional": 1, "keyword": 2, "sequence": 3, "unflatten": 4}
    fallback = {"namedtuple": 0, "dict": 1, "tuple": 2}
    return [
        {
            "module": t.module,
            "qualname": t.qualname,
            "name": t.name,
            "fields": list(t.fields or ()),
            "dropped": list(t.dropped),
            "construct_id": construct[t.construct],
            "fallback_id": fallback[t.fallback],
            "unflatten": t.unflatten.split(":") if t.unflatten else ["", ""],
            "context": t.context,
        }
        for t in _types(nodes)
    ]


def _remove_stale(out: Path, keep: set[Path]) -> None:
    src = out / "src"
    if not src.is_dir():
        return
    for path in sorted(src.rglob("*"), reverse=True):
        if path.is_file() and path not in keep:
            path.unlink()
        elif path.is_dir() and not any(path.iterdir()):
            path.rmdir()


def target_id(target: Target) -> str:
    """Build identifier for CI matrices: cpu-native, cpu-avx2, cuda-sm_90."""
    return f"cpu-{target.isa}" if not devices.device(target.device).gpu else "cuda-" + "-".join(target.archs)
