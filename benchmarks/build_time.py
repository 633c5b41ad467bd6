"""Build time: shimgen against AOTInductor on the same models, torch, machine and cores, in one run.

    python benchmarks/build_time.py [--models resnet minilm] [--out benchmarks/results]

For ResNet-18 (projects/resnet.toml) and a MiniLM-L6-shaped BERT (projects/minilm.toml, 90 MB of weights):
the cold end-to-end build of each contender (shimgen build; AOTInductor's export + aoti_compile_and_package with
freezing, the very program shimgen exports, same dynamic dims), each in its own subprocess with a fresh Inductor
cache (TORCHINDUCTOR_CACHE_DIR) and timed from interpreter start, shimgen starting its build server (as a first build
does) with its per-user toolchain cache warm and no lockfile (kernel choices timed, as in a project's first build),
then again replaying the lockfile that build wrote;
shimgen's stage timeline; wheel (.pt2) size; import + first call in a fresh interpreter. Then the weights layouts
(flags.weights = "embedded" / "file", where the spec has that key) and load_weights() of a new checkpoint against
the rebuild it saves. ResNet-18 also gets the first-ever build, the C++ compile against one -O3 translation unit, a
no-op rebuild, a multi-graph project and the flag variants. Figures are ratios; see the printed tables. The specs'
lockfiles are left as they were; the variants' specs and lockfiles are removed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common import REPO, CommandFailed, GraphModel, Report, load_spec, run, shimgen_build, short_error

BENCHMARKS = Path(__file__).resolve().parent

# name: (label, spec); the graph timed is `forward` in both.
MODELS = {
    "resnet": ("ResNet-18", REPO / "projects" / "resnet.toml"),
    "minilm": ("MiniLM-L6 BERT", REPO / "projects" / "minilm.toml"),
}
GRAPH = "forward"

# AOTInductor's cold build, from interpreter start: the model and program come from shimgen's own helpers (the
# program shimgen compiles: spec-order inputs, flat outputs, the spec's dims, backed size-oblivious). Importing those
# helpers is timed apart (`helpers`) and taken off AOTI's wall time: AOTI needs no shimgen.
AOTI_SCRIPT = """
import json, sys, time
start = time.perf_counter()
import torch
torch_imported = time.perf_counter()
sys.path.insert(0, {benchmarks!r})
import shimgen.pipeline  # every module of shimgen's, imported as its build imports them
from common import export_graph, load_graph, load_spec, project
helpers = time.perf_counter() - torch_imported
from pathlib import Path
spec_path = Path({spec!r})
spec = load_spec(spec_path)
with project(spec_path) as spec_dir:
    program = export_graph(load_graph(spec, spec_dir, {graph!r}), {device!r})
exported = time.perf_counter()
with torch.no_grad():
    torch._inductor.aoti_compile_and_package(program, package_path={package!r}, inductor_configs={{"freezing": True}})
print(json.dumps({{"torch_import": torch_imported - start, "helpers": helpers, "export": exported - torch_imported -
helpers,
                  "compile": time.perf_counter() - exported}}))
"""

# Import and first call in a fresh interpreter: `import <package>` (which imports torch) or import torch +
# aoti_load_package, then the first call on the spec's example inputs (saved by the parent, loaded between the two
# timings) and the median of the next five.
FIRST_CALL_SCRIPT = """
import json, sys, time
start = time.perf_counter()
kind, where, name, inputs = sys.argv[1:5]
if kind == "shimgen":
    sys.path.insert(0, where)
    fn = getattr(__import__(name), {graph!r})
else:
    import torch
    fn = torch._inductor.aoti_load_package(where)
loaded = time.perf_counter()
import torch
tensors, keyword = torch.load(inputs)  # keyword: input name -> whether the model takes it by keyword
named = list(zip(keyword.items(), tensors))
args = [t for (n, k), t in named if not k or kind != "shimgen"]  # AOTI's program takes every input positionally
kwargs = {{n: t for (n, k), t in named if k and kind == "shimgen"}}
with torch.no_grad():
    t = time.perf_counter(); fn(*args, **kwargs); first = time.perf_counter() - t
    later = []
    for _ in range(5):
        t = time.perf_counter(); fn(*args, **kwargs); later.append(time.perf_counter() - t)
print(json.dumps({{"import": loaded - start, "first": first, "later": sorted(later)[2]}}))
"""

# load_weights of a new checkpoint (the spec's model with every parameter moved by 1%) on a built package, in a fresh
# interpreter: its seconds, and the package's error against the new model's eager output before and after.
LOAD_WEIGHTS_SCRIPT = """
import json, sys, time
sys.path.insert(0, {benchmarks!r})
import torch
from pathlib import Path
from common import load_graph, load_spec, project, short_error, tensors_of
spec_path = Path({spec!r})
spec = load_spec(spec_path)
with project(spec_path) as spec_dir:
    gm = load_graph(spec, spec_dir, {graph!r})
sys.path.insert(0, {package_dir!r})
pkg = __import__({name!r})
torch.manual_seed(1)
with torch.no_grad():
    for p in gm.model.parameters():
        p.mul_(1 + 0.01 * torch.randn_like(p))
    args, kwargs = gm.split(gm.inputs())
    expected = tensors_of(gm.model(*args, **kwargs))
    def error():
        got = tensors_of(getattr(pkg, {graph!r})(*args, **kwargs))
        return max((a.double() - b.double()).abs().max().item() for a, b in zip(got, expected))
    before = error()
    state = gm.model.state_dict()
    try:
        t = time.perf_counter(); pkg.load_weights(state); seconds = time.perf_counter() - t
    except Exception as exc:
        print(json.dumps({{"error": short_error(exc, 160)}})); sys.exit()
    print(json.dumps({{"seconds": seconds, "err_before": before, "err_after": error()}}))
"""

LATENCY_SCRIPT = """
import sys, time, torch
sys.path.insert(0, sys.argv[1])
forward = __import__(sys.argv[2]).forward
x = torch.randn(1, 3, 224, 224)
for _ in range(5):
    forward(x)
times = []
for _ in range(40):
    t = time.perf_counter(); forward(x); times.append(time.perf_counter() - t)
print(sorted(times)[len(times) // 2] * 1e3)
"""

# The weights layouts built per model: label -> [flags] lines. `load_weights` is timed on the "file" ones.
WEIGHT_VARIANTS = {
    "embedded": 'weights = "embedded"',
    "file": 'weights = "file"',
    "file, no freezing": 'weights = "file"\nfreezing = false',
}


def fresh_env(tmp: Path, tag: str, shimgen_cache: Path) -> dict[str, str]:
    """A first build's environment: fresh Inductor, Triton and compiler caches, and a TMPDIR of its own, where shimgen
    finds no build server and starts one, as a user's first `shimgen build` does (the default; a build in its own
    process, SHIMGEN_SERVER=off, took 9 s more of ResNet-18's 42 s here). The server stays for the edits after it."""
    scratch = tmp / "t" / tag
    scratch.mkdir(parents=True, exist_ok=True)
    return {
        **os.environ,
        "TMPDIR": str(scratch),
        "TORCHINDUCTOR_CACHE_DIR": str(tmp / f"inductor-{tag}"),
        "TRITON_CACHE_DIR": str(tmp / f"triton-{tag}"),
        # shimgen compiles through ccache where it finds one: a cold build starts from an empty one (AOTInductor uses
        # none), and the edits that follow share it, as a user's would.
        "CCACHE_DIR": str(tmp / f"ccache-{tag}"),
        "SHIMGEN_CACHE_DIR": str(shimgen_cache / "toolchain"),
        "SHIMGEN_SERVER": "on",
        "SHIMGEN_SERVER_IDLE": "120",
    }


def drop_lockfile(spec: Path) -> None:
    """Remove `<spec>.lock` (and the build's marker of writing it): the next build times its kernel choices again."""
    spec.with_name(spec.name + ".lock").unlink(missing_ok=True)
    spec.with_name(f".{spec.name}.lock.writing").unlink(missing_ok=True)


@contextmanager
def lockfiles_kept(specs: list[Path], tmp: Path) -> Iterator[None]:
    """The specs' lockfiles as they were before the block, whatever the block's builds write or remove."""
    kept = {
        spec: tmp / f"kept-{k}.lock" for k, spec in enumerate(specs) if spec.with_name(spec.name + ".lock").is_file()
    }
    for spec, aside in kept.items():
        shutil.copy2(spec.with_name(spec.name + ".lock"), aside)
    try:
        yield
    finally:
        for spec in specs:
            drop_lockfile(spec)
        for spec, aside in kept.items():
            shutil.copy2(aside, spec.with_name(spec.name + ".lock"))


@contextmanager
def spec_variant(tmp: Path, name: str, flags: str, source: Path = MODELS["resnet"][1]) -> Iterator[Path]:
    """`source` (projects/resnet.toml) with other [flags], as its own project `name` beside the real models, for the
    block; removed after it with the lockfile its build wrote."""
    text = re.sub(r'^name = "[^"]*"', f'name = "{name}"', source.read_text(), count=1, flags=re.M)
    head, _, _ = text.partition("[flags]")
    path = source.parent / f"_bench_{name}.toml"
    path.write_text(head + "[flags]\n" + flags + "\n")
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)
        drop_lockfile(path)


def monolithic_o3_seconds(build: Path, codegen: Path) -> float:
    """Inductor's wrapper as one translation unit (interface + model + all kernels) at -O3, no PCH."""
    commands = json.loads((build / "meson" / "compile_commands.json").read_text())
    model = next(c for c in commands if c["file"].endswith("model.cpp"))
    args = shlex.split(model["command"])
    args = [a for i, a in enumerate(args) if a != "-include" and (i == 0 or args[i - 1] != "-include")]
    args = ["-O3" if a.startswith("-O") else a for a in args]
    source = build / "monolithic.cpp"
    parts = [codegen / "interface.cpp", codegen / "model.cpp", *sorted(codegen.glob("kernels_*.cpp"))]
    source.write_text("".join(p.read_text() for p in parts))
    args[args.index(model["file"])] = str(source)
    args[args.index("-o") + 1] = str(build / "monolithic.o")
    start = time.perf_counter()
    subprocess.run(args, cwd=model["directory"], check=True, capture_output=True)
    return time.perf_counter() - start


def latency_ms(summary: dict) -> float:
    return float(
        run([sys.executable, "-c", LATENCY_SCRIPT, summary["package_dir"], summary["name"]], dict(os.environ))[1]
    )


def mb(path: str | Path) -> float:
    return Path(path).stat().st_size / 1e6


def save_inputs(spec_path: Path, path: Path) -> Path:
    """The graph's example inputs (shimgen's own, seeded) and which are keyword, as FIRST_CALL_SCRIPT loads them."""
    import torch

    spec = load_spec(spec_path)
    index = next(i for i, g in enumerate(spec.graph) if g.name == GRAPH)
    gm = GraphModel(spec, spec_path.parent, index, None)
    torch.save((gm.inputs(), {inp.name: inp.keyword for inp in gm.graph.inputs}), path)
    return path


def first_call(kind: str, where: str, name: str, inputs: Path, runs: int = 3) -> dict[str, float]:
    """Seconds of import, first call and later calls in a fresh interpreter, and its wall time from start to exit:
    the median of `runs` interpreters, each figure on its own (one slow moment of a shared machine is not kept)."""
    samples = []
    for _ in range(runs):
        wall, out = run(
            [sys.executable, "-c", FIRST_CALL_SCRIPT.format(graph=GRAPH), kind, where, name, str(inputs)],
            dict(os.environ),
        )
        samples.append({**json.loads(out), "wall": wall})
    return {key: statistics.median(s[key] for s in samples) for key in samples[0]}


def weights_layouts(tmp: Path) -> tuple[str, str | None]:
    """(why this shimgen's spec takes no flags.weights, empty when it does; the default layout), from a spec with the
    key validated as build validates it."""
    from shimgen.spec import Flags

    with spec_variant(tmp, "weights_probe", WEIGHT_VARIANTS["file"]) as probe:
        try:
            load_spec(probe)
        except (Exception, SystemExit) as exc:
            return short_error(exc, 160), None
    return "", getattr(Flags(), "weights", None)


@dataclass
class Built:
    """One cold shimgen build of a model's spec (as it is, or a flags variant) and what was measured on it."""

    wall: float = 0.0
    summary: dict[str, Any] = field(default_factory=dict)
    calls: dict[str, float] = field(default_factory=dict)
    load_weights: dict[str, Any] = field(default_factory=dict)
    missing: str = ""  # why there is no build: the spec refused the flags, or the build failed


def build_cold(spec: Path, out: Path, env: dict[str, str], inputs: Path | None) -> Built:
    """A cold build (fresh output and Inductor cache, no compiler cache) and, given inputs, its import + first call."""
    try:
        wall, summary = shimgen_build(spec, out, env, "--no-cache")
    except CommandFailed as exc:
        return Built(missing="build failed: " + short_error(exc, 200))
    return Built(
        wall, summary, first_call("shimgen", summary["package_dir"], summary["name"], inputs) if inputs else {}
    )


def time_load_weights(built: Built, spec: Path) -> dict[str, Any]:
    script = LOAD_WEIGHTS_SCRIPT.format(
        benchmarks=str(BENCHMARKS),
        spec=str(spec),
        graph=GRAPH,
        package_dir=built.summary["package_dir"],
        name=built.summary["name"],
    )
    try:
        return json.loads(run([sys.executable, "-c", script], dict(os.environ), cwd=REPO)[1])
    except CommandFailed as exc:
        return {"error": short_error(exc, 160)}


def stage_line(summary: dict[str, Any]) -> str:
    return ", ".join(f"{stage} {seconds:.1f}" for stage, seconds in summary["stages"].items())


def bench_model(
    key: str, tmp: Path, user_cache: Path, report: Report, layouts: tuple[str, str | None]
) -> dict[str, Any]:
    """Cold builds of shimgen and AOTI, first calls, the weights variants and load_weights, for one model. shimgen's
    cold
    builds start without the spec's lockfile (kernel choices timed, as a project's first build does), except the one
    that replays the lockfile the first wrote (a project whose lockfile is committed)."""
    label, spec = MODELS[key]
    inputs = save_inputs(spec, tmp / f"{key}-inputs.pt")
    report(f"\n## {label} ({spec.relative_to(REPO)})")

    package = tmp / f"{key}.pt2"
    script = AOTI_SCRIPT.format(
        benchmarks=str(BENCHMARKS), spec=str(spec), graph=GRAPH, package=str(package), device="cpu"
    )
    aoti_wall, out = run([sys.executable, "-c", script], fresh_env(tmp, f"aoti-{key}", user_cache), cwd=REPO)
    aoti = json.loads(out)
    aoti["wall"] = aoti_wall - aoti["helpers"]  # without importing shimgen's helpers, which AOTI does not need
    aoti["calls"] = first_call("aoti", str(package), "", inputs)
    aoti["size"] = mb(package)
    report(
        f"AOTI export + aoti_compile_and_package (freezing): {aoti['wall']:.1f}s wall (torch import {aoti['torch_import']:.1f}s, "
        f"model + export {aoti['export']:.1f}s, codegen + compile {aoti['compile']:.1f}s; shimgen helpers' import "
        f"{aoti['helpers']:.1f}s not counted); .pt2 {aoti['size']:.1f} MB"
    )

    drop_lockfile(spec)
    cold = build_cold(spec, tmp / f"cold-{key}", fresh_env(tmp, f"cold-{key}", user_cache), inputs)
    if cold.missing:
        raise SystemExit(f"{label}: {cold.missing}")
    report(
        f"shimgen, cold project build: {cold.wall:.1f}s wall; stages (s) {stage_line(cold.summary)}; wheel {mb(cold.summary['wheel']):.1f} MB"
    )
    replay = build_cold(spec, tmp / f"replay-{key}", fresh_env(tmp, f"replay-{key}", user_cache), None)
    if replay.missing:
        raise SystemExit(f"{label}: {replay.missing}")
    report(
        f"shimgen, cold project build replaying {spec.name}.lock: {replay.wall:.1f}s wall; stages (s) {stage_line(replay.summary)}"
    )

    refused, default_layout = layouts
    variants: dict[str, Built] = {}
    for n, (name, flags) in enumerate(WEIGHT_VARIANTS.items()):
        if refused:
            variants[name] = Built(missing="n/a: no flags.weights")
        elif flags == f'weights = "{default_layout}"':
            variants[name] = cold  # the spec's own flags are the defaults: this is the cold build above
        else:
            with spec_variant(tmp, f"{key}_w{n}", flags, spec) as variant:
                variants[name] = build_cold(
                    variant, tmp / f"w{n}-{key}", fresh_env(tmp, f"w{n}-{key}", user_cache), inputs
                )
    for name, built in variants.items():
        if not built.missing and name.startswith("file"):
            built.load_weights = time_load_weights(built, spec)
    return {"label": label, "aoti": aoti, "cold": cold, "replay": replay, "variants": variants}


def model_tables(results: dict[str, dict[str, Any]], report: Report) -> None:
    """The per-model figures side by side: cold builds, stages, sizes, first calls, weights variants, load_weights."""
    models = list(results.values())
    head = "| figure | " + " | ".join(m["label"] for m in models)
    rule = "| --- " * (len(models) + 1)

    def row(figure: str, cells: list[str], goal: str | None = None) -> None:
        report(f"| {figure} | " + " | ".join(cells) + (f" | {goal} |" if goal is not None else " |"))

    report(f"\n{head} | goal |\n{rule}| --- |")
    row("cold end-to-end shimgen / AOTI", [f"{m['cold'].wall / m['aoti']['wall']:.2f}" for m in models], "<= 0.6")
    row(
        "cold end-to-end shimgen replaying its lockfile / AOTI",
        [f"{m['replay'].wall / m['aoti']['wall']:.2f}" for m in models],
        "<= 0.6",
    )
    row(
        "shimgen cold build, s (replaying the lockfile)",
        [f"{m['cold'].wall:.1f} ({m['replay'].wall:.1f})" for m in models],
        "",
    )
    row(
        "AOTI cold build, s (export / codegen + compile)",
        [f"{m['aoti']['wall']:.1f} ({m['aoti']['export']:.1f} / {m['aoti']['compile']:.1f})" for m in models],
        "",
    )
    row(
        "wheel / .pt2 size",
        [
            f"{mb(m['cold'].summary['wheel']) / m['aoti']['size']:.2f} "
            f"({mb(m['cold'].summary['wheel']):.1f} / {m['aoti']['size']:.1f} MB)"
            for m in models
        ],
        "",
    )
    row(
        "import + first call, shimgen / AOTI",
        [
            f"{(m['cold'].calls['import'] + m['cold'].calls['first']) / (m['aoti']['calls']['import'] + m['aoti']['calls']['first']):.2f} "
            f"({m['cold'].calls['import']:.2f} + {m['cold'].calls['first']:.3f} s / "
            f"{m['aoti']['calls']['import']:.2f} + {m['aoti']['calls']['first']:.3f} s)"
            for m in models
        ],
        "",
    )
    row(
        "later calls (median), shimgen / AOTI",
        [
            f"{m['cold'].calls['later'] / m['aoti']['calls']['later']:.2f} "
            f"({m['cold'].calls['later'] * 1e3:.1f} / {m['aoti']['calls']['later'] * 1e3:.1f} ms)"
            for m in models
        ],
        "",
    )

    stages = list(dict.fromkeys(s for m in models for s in m["cold"].summary["stages"]))
    report(
        "\nshimgen cold build, stage timeline (s): without the lockfile / replaying it\n\n| stage | "
        + " | ".join(m["label"] for m in models)
        + f" |\n{rule}|"
    )
    for stage in stages:
        row(
            stage,
            [
                f"{m['cold'].summary['stages'].get(stage, 0.0):.2f} / {m['replay'].summary['stages'].get(stage, 0.0):.2f}"
                for m in models
            ],
        )
    row(
        "total of stages",
        [
            f"{sum(m['cold'].summary['stages'].values()):.2f} / {sum(m['replay'].summary['stages'].values()):.2f}"
            for m in models
        ],
    )
    row("wall (interpreter start to exit)", [f"{m['cold'].wall:.2f} / {m['replay'].wall:.2f}" for m in models])

    report(
        "\nweights layouts (cold builds; import + first call in a fresh interpreter)\n\n"
        "| model | flags | build s | / AOTI | wheel MB | import + first call s | stages (s) |\n| --- | --- | --- | --- | --- | --- | --- |"
    )
    for m in models:
        for name, b in m["variants"].items():
            flags = WEIGHT_VARIANTS[name].replace("\n", ", ")
            if b.missing:
                report(f"| {m['label']} | {flags} | {b.missing} | n/a | n/a | n/a | n/a |")
                continue
            report(
                f"| {m['label']} | {flags}{' (the cold build)' if b is m['cold'] else ''} | {b.wall:.1f} | {b.wall / m['aoti']['wall']:.2f} | "
                f"{mb(b.summary['wheel']):.1f} | {b.calls['import']:.2f} + {b.calls['first']:.3f} | {stage_line(b.summary)} |"
            )

    report(
        "\nload_weights(model.state_dict()) of a new checkpoint (every parameter moved by 1%) against rebuilding\n\n"
        "| model | flags | load_weights s | full cold rebuild s | load / rebuild | max abs err vs new eager: before, after |\n"
        "| --- | --- | --- | --- | --- | --- |"
    )
    for m in models:
        for name, b in m["variants"].items():
            if not name.startswith("file"):
                continue
            flags = WEIGHT_VARIANTS[name].replace("\n", ", ")
            lw = b.load_weights
            if b.missing or "error" in lw:
                why = b.missing or f"n/a: {lw['error']}"
                report(f"| {m['label']} | {flags} | {why} | {'n/a' if b.missing else f'{b.wall:.1f}'} | n/a | n/a |")
                continue
            report(
                f"| {m['label']} | {flags} | {lw['seconds']:.3f} | {b.wall:.1f} | {lw['seconds'] / b.wall:.4f} | "
                f"{lw['err_before']:.2e}, {lw['err_after']:.2e} |"
            )


def resnet_extras(
    tmp: Path,
    user_cache: Path,
    cold: Built,
    first: tuple[float, dict[str, Any]],
    aoti_wall: float,
    report: Report,
    results: dict[str, float],
) -> None:
    """ResNet-18 only: first-ever build, C++ compile against one -O3 TU, no-op rebuild, multi-graph project, flag variants."""
    resnet_spec = MODELS["resnet"][1]
    first_wall, first_summary = first
    results["first_ratio"] = first_wall / aoti_wall
    report(
        f"\n## ResNet-18: toolchain, compile, rebuilds, flags\nshimgen, first build on this machine (empty per-user cache: "
        f"toolchain probe and PCH): {first_wall:.1f}s wall; stages (s) {stage_line(first_summary)}"
    )

    # C++ compile portion: PCH + split + O1 wrapper (ninja, 2 cores) vs one monolithic -O3 TU.
    build_dir = Path(cold.summary["package_dir"]).parent
    mono = monolithic_o3_seconds(build_dir, build_dir / "codegen" / "forward_cpu")
    results["compile_ratio"] = cold.summary["stages"]["compile"] / mono
    report(f"C++ compile: shimgen {cold.summary['stages']['compile']:.1f}s vs monolithic -O3 wrapper.cpp {mono:.1f}s")

    # No-op rebuild of the cold build.
    out = build_dir.parent.parent
    noop_wall, noop = shimgen_build(resnet_spec, out, fresh_env(tmp, "cold-resnet", user_cache), "--no-cache")
    results["noop_seconds"] = noop_wall
    report(f"no-op rebuild: {noop_wall:.2f}s wall (skipped: {', '.join(noop['skipped'])})")

    # Multi-graph: full build of the three-graph zoo, then one model's source edited.
    zoo = REPO / "projects" / "zoo.toml"
    drop_lockfile(zoo)
    zoo_wall, _ = shimgen_build(zoo, tmp / "zoo", fresh_env(tmp, "zoo", user_cache), "--no-cache")
    convnet = REPO / "projects" / "models" / "convnet.py"
    original = convnet.read_text()
    try:
        convnet.write_text(
            original.replace(
                "return self.head(self.features(x).mean(dim=(2, 3)))",
                "return self.head(self.features(x).amax(dim=(2, 3)))",
            )
        )
        one_wall, one = shimgen_build(zoo, tmp / "zoo", fresh_env(tmp, "zoo", user_cache), "--no-cache")
    finally:
        convnet.write_text(original)
    results["one_graph_ratio"] = one_wall / zoo_wall
    report(
        f"zoo (3 graphs) full build {zoo_wall:.1f}s; convnet.py edited: rebuild {one_wall:.1f}s "
        f"(skipped: {', '.join(one['skipped'])}; compiled {one['compiled_units']['done']} of {one['compiled_units']['total']} steps)"
    )

    # Flag choices: C++ compile seconds and ResNet-18 batch-1 latency, same process order for all.
    variants = {
        "default (pch, split 4, wrapper O1, kernels O3)": "",
        "no pch": "pch = false",
        "split 1": "split = 1",
        "split 2": "split = 2",
        "wrapper O3": 'wrapper_opt = "O3"',
        "kernels O1": 'kernel_opt = "O1"',
    }
    report("\n| variant | C++ compile s | ResNet-18 batch 1 ms |\n| --- | --- | --- |")
    built = {}
    for label, flags in variants.items():
        with spec_variant(tmp, "resnet_" + str(len(built)), flags) as spec:
            _, summary = shimgen_build(spec, tmp / "variants", fresh_env(tmp, "variants", user_cache), "--no-cache")
        built[label] = summary
    for label, summary in built.items():
        ms = latency_ms(summary)
        results[f"latency_ms[{label}]"] = ms
        report(f"| {label} | {summary['stages']['compile']:.1f} | {ms:.2f} |")


# Edits of an edit-rebuild loop, made in a copy of projects/models: the function's return line, and what replaces it.
EDITS = {
    "resnet": (
        "models/resnet.py",
        "    return ResNet((2, 2, 2, 2), num_classes)",
        "    model = ResNet((2, 2, 2, 2), num_classes)",
    ),
    "minilm": (
        "models/hf.py",
        "    return bert(hidden=384, layers=6, heads=12, intermediate=1536, vocab=30522, positions=512).eval()",
        "    model = bert(hidden=384, layers=6, heads=12, intermediate=1536, vocab=30522, positions=512).eval()",
    ),
}
SPECIALIZE = re.compile(r",\s*specialize\s*=\s*\[[^\]]*\]")

EDIT_KINDS = {
    # one layer's code: the last block's activation
    "code": {
        "resnet": "model.layer4[1].relu = nn.GELU()",
        "minilm": 'model.encoder.layer[5].intermediate.intermediate_act_fn = transformers.activations.ACT2FN["relu"]',
    },
    # one weight: a bias element of the last layer
    "weight": {
        "resnet": "model.fc.bias.data[0] += 1.0",
        "minilm": "model.encoder.layer[5].output.dense.bias.data[0] += 1.0",
    },
}


def edit_loop(
    key: str, device: str, servers: list[str], aoti_too: bool, tmp: Path, user_cache: Path, report: Report
) -> dict[str, Any]:
    """Cold builds (AOTI unless not `aoti_too`, and shimgen: fresh processes and Inductor and Triton caches, shimgen
    replaying the committed lockfile and starting its build server), then edit-rebuilds in the same output directory
    with the build server on and/or off: each edit made and rebuilt, then taken back and rebuilt, both timed."""
    label, spec = MODELS[key]
    projects = tmp / f"loop-{key}"
    shutil.copytree(REPO / "projects", projects, ignore=shutil.ignore_patterns("__pycache__"))
    spec = projects / spec.name
    on_device(spec, device)
    aoti_line, aoti_wall = "not built (--no-aoti)", float("nan")
    if aoti_too:
        package = tmp / f"loop-{key}.pt2"
        script = AOTI_SCRIPT.format(
            benchmarks=str(BENCHMARKS), spec=str(spec), graph=GRAPH, package=str(package), device=device
        )
        aoti_wall, out = run([sys.executable, "-c", script], fresh_env(tmp, f"loop-aoti-{key}", user_cache), cwd=REPO)
        aoti = json.loads(out)
        aoti_wall -= aoti["helpers"]
        aoti_line = f"{aoti_wall:.1f}s (export {aoti['export']:.1f}, codegen + compile {aoti['compile']:.1f})"
    env = fresh_env(tmp, f"loop-{key}", user_cache)
    cold_wall, cold = shimgen_build(spec, tmp / f"loop-out-{key}", env)
    report(
        f"\n## {label}: cold AOTI {aoti_line}; cold shimgen {cold_wall:.1f}s"
        f"{f' = {cold_wall / aoti_wall:.2f}x' if aoti_too else ''}; "
        f"stages (s) {stage_line(cold)}"
    )
    figures: dict[str, Any] = {"label": label, "aoti": aoti_wall, "cold": cold_wall}
    if aoti_too and SPECIALIZE.search(spec.read_text()):
        # The same work as AOTInductor's: one unit, without the spec's variants compiled for fixed sizes.
        single = spec.with_name(f"{spec.stem}_single.toml")
        single.write_text(SPECIALIZE.sub("", spec.read_text()))
        if spec.with_name(spec.name + ".lock").is_file():
            shutil.copy(spec.with_name(spec.name + ".lock"), single.with_name(single.name + ".lock"))
        wall, summary = shimgen_build(
            single, tmp / f"loop-single-{key}", fresh_env(tmp, f"loop-single-{key}", user_cache)
        )
        figures["single"] = wall
        report(
            f"cold shimgen without the specialized variants (one unit, as AOTI builds): {wall:.1f}s = "
            f"{wall / aoti_wall:.2f}x; stages (s) {stage_line(summary)}"
        )
    model_file, line, assign = EDITS[key]
    source = projects / model_file
    original = source.read_text()
    served = {**env, "SHIMGEN_SERVER": "on", "SHIMGEN_SERVER_IDLE": "120"}
    shimgen_build(spec, tmp / f"loop-out-{key}", served)  # nothing to rebuild
    for kind, edits in EDIT_KINDS.items():
        edited = original.replace(line, f"{assign}\n    {edits[key]}\n    return model")
        assert edited != original, line
        for server in servers:
            for text, step, figure in (
                (edited, "edit", f"{kind} {server}"),
                (original, "edit undone", f"{kind} {server} undone"),
            ):
                source.write_text(text)
                wall, summary = shimgen_build(spec, tmp / f"loop-out-{key}", {**served, "SHIMGEN_SERVER": server})
                figures[figure] = wall
                report(
                    f"{kind} {step}, build server {server}: {wall:.1f}s = {wall / cold_wall:.2f}x the cold build; "
                    f"stages (s) {stage_line(summary)}; skipped {', '.join(summary['skipped']) or 'nothing'}"
                )
    return figures


def start_run(title: str) -> tuple[Path, Report, Path]:
    """A run's scratch directory, its report headed by `title` and the machine, and its per-user cache."""
    import torch

    tmp = Path(tempfile.mkdtemp(prefix="shimgen-bench-"))
    report = Report()
    report(
        f"# {title}, {time.strftime('%Y-%m-%d %H:%M')}, {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores, torch {torch.__version__}, python {platform.python_version()}"
    )
    return tmp, report, tmp / "user-cache"


def on_device(spec: Path, device: str) -> None:
    """`spec` (a copy) built for `device` (for CUDA, this machine's GPU's architecture) instead of the CPU."""
    if device != "cpu":
        import torch

        major, minor = torch.cuda.get_device_capability()
        text = spec.read_text()
        target = f'[[target]]\ndevice = "{device}"\narchs = ["sm_{major}{minor}"]'
        on_gpu = text.replace('[[target]]\ndevice = "cpu"\nisa = "native"', target)
        assert on_gpu != text, spec
        # Verification's tolerance: cuDNN's convolutions use TF32 by default (ResNet-18's logits differ by ~5e-3).
        spec.write_text(re.sub(r"(?m)^(atol|rtol) = .*$", r"\1 = 1e-2", on_gpu))


def loop_main(models: list[str], device: str, servers: list[str], aoti_too: bool, out: Path) -> None:
    tmp, report, user_cache = start_run(f"build_time.py --loop --device {device}")
    first = tmp / "first" / "resnet.toml"
    shutil.copytree(REPO / "projects", first.parent, ignore=shutil.ignore_patterns("__pycache__"))
    on_device(first, device)
    wall, _ = shimgen_build(first, tmp / "first", fresh_env(tmp, "first", user_cache))
    report(f"per-user cache (toolchain probe, prebuilt headers) warmed first, not counted: {wall:.1f}s")
    for key in models:  # an example project's lockfile is committed: written once here where it is missing
        spec = MODELS[key][1]
        if not spec.with_name(spec.name + ".lock").is_file():
            wall, _ = shimgen_build(spec, tmp / f"lock-{key}", fresh_env(tmp, f"lock-{key}", user_cache))
            written = "written" if spec.with_name(spec.name + ".lock").is_file() else "not written (nothing timed)"
            report(f"{spec.name}.lock {written} by a first build (not counted): {wall:.1f}s")
    results = [edit_loop(key, device, servers, aoti_too, tmp, user_cache, report) for key in models]
    report("\n| figure | " + " | ".join(r["label"] for r in results) + " | goal |")
    report("| --- " * (len(results) + 1) + "| --- |")
    if aoti_too:
        report("| cold shimgen / AOTI | " + " | ".join(f"{r['cold'] / r['aoti']:.2f}" for r in results) + " | <= 0.6 |")
        report(
            "| cold shimgen, one unit (no specialized variant) / AOTI | "
            + " | ".join(f"{r['single'] / r['aoti']:.2f}" if "single" in r else "n/a" for r in results)
            + " | |"
        )
    for kind in EDIT_KINDS:
        for server in servers:
            for figure, label in ((f"{kind} {server}", "edit-rebuild"), (f"{kind} {server} undone", "edit undone")):
                report(
                    f"| {kind} {label} / shimgen cold, server {server} | "
                    + " | ".join(f"{r[figure] / r['cold']:.2f}" for r in results)
                    + " | <= 0.25 |"
                )
    report.save(out / ("build_loop.md" if device == "cpu" else f"build_loop_{device}.md"))
    shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--models", nargs="+", choices=list(MODELS), default=list(MODELS), help="which models (default: all)"
    )
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    parser.add_argument(
        "--loop",
        action="store_true",
        help="only cold builds and edit-rebuilds, build server on and off (build_loop.md)",
    )
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="the device the loop builds for")
    parser.add_argument(
        "--servers", nargs="+", choices=["on", "off"], default=["on", "off"], help="the loop's build server settings"
    )
    parser.add_argument("--no-aoti", action="store_true", help="the loop without AOTInductor's cold build")
    args = parser.parse_args()
    if args.loop:
        loop_main(args.models, args.device, args.servers, not args.no_aoti, args.out)
        return
    tmp, report, user_cache = start_run("build_time.py")

    specs = [spec for _, spec in MODELS.values()] + [REPO / "projects" / "zoo.toml"]
    with lockfiles_kept(specs, tmp):
        # The first build ever (empty per-user cache: toolchain probe and PCH) warms the per-user cache every cold build
        # below starts from, as on a developer's machine; then the prebuilt pieces of the other weights layouts (their
        # runtime interface differs), so that no cold build below pays for them.
        drop_lockfile(MODELS["resnet"][1])
        first = shimgen_build(MODELS["resnet"][1], tmp / "first", fresh_env(tmp, "first", user_cache), "--no-cache")
        layouts = weights_layouts(tmp)
        if layouts[0]:
            report(f"weights layouts: n/a, this shimgen's spec refuses flags.weights: {layouts[0]}")
        else:
            for n, flags in enumerate(dict.fromkeys(f.split("\n")[0] for f in WEIGHT_VARIANTS.values())):
                if flags != f'weights = "{layouts[1]}"':
                    with spec_variant(tmp, f"warm{n}", flags) as spec:
                        wall, warm = shimgen_build(
                            spec, tmp / f"warm{n}", fresh_env(tmp, f"warm{n}", user_cache), "--no-cache"
                        )
                    report(
                        f"per-user cache warmed for {flags} (not counted): {wall:.1f}s, prebuilt {warm['stages'].get('prebuilt', 0):.1f}s"
                    )
        run_all(args.models, tmp, user_cache, report, layouts, first)
    report.save(args.out / "build_time.md")
    shutil.rmtree(tmp, ignore_errors=True)


def run_all(
    models: list[str],
    tmp: Path,
    user_cache: Path,
    report: Report,
    layouts: tuple[str, str | None],
    first: tuple[float, dict[str, Any]],
) -> None:
    figures: dict[str, float] = {}
    results = {key: bench_model(key, tmp, user_cache, report, layouts) for key in models}
    model_tables(results, report)
    if "resnet" in results:
        resnet = results["resnet"]
        resnet_extras(tmp, user_cache, resnet["cold"], first, resnet["aoti"]["wall"], report, figures)
        report("\n| figure | value | goal |\n| --- | --- | --- |")
        report(
            f"| cold end-to-end shimgen / AOTI, ResNet-18 | {resnet['cold'].wall / resnet['aoti']['wall']:.2f} | <= 0.6 |"
        )
        report(
            f"| the same, replaying resnet.toml.lock | {resnet['replay'].wall / resnet['aoti']['wall']:.2f} | <= 0.6 |"
        )
        report(f"| first-ever build (probe + PCH) / AOTI | {figures['first_ratio']:.2f} | |")
        report(f"| C++ compile shimgen / monolithic -O3 TU | {figures['compile_ratio']:.2f} | |")
        report(f"| no-op rebuild | {figures['noop_seconds']:.2f}s | <= 1 s |")
        report(f"| one graph of three changed / full build | {figures['one_graph_ratio']:.2f} | <= 0.4 |")


if __name__ == "__main__":
    main()
