"""Shape-specialized variants against the packages they stand in for, per call and in bytes, side by side in one run.

    python benchmarks/specialize.py [--models resnet,minilm,mlp] [--device cpu|cuda] [--out
    benchmarks/results/specialize_cpu.md]

For each model (projects/resnet.toml: batch; projects/minilm.toml: batch x seq) it builds, from copies of the spec:
  - shimgen specialized: the spec with `specialize` sizes (one package: the dynamic code and a static variant per size);
  - shimgen dynamic: the spec as it is (dynamic only);
  - shimgen static: one package per specialized size, built for that size alone;
and AOTInductor (freezing, as shimgen's default) static at each measured size and dynamic. Every contender is checked
against eager at each size, then timed side by side at a specialized size and at sizes no variant covers. All shimgen
builds share one cache (--cache), so a static package reuses its variant's trace and generated code. On cuda, the
specialized and static packages capture CUDA graphs (flags.cuda_graphs), which a dynamic package cannot.
"""

from __future__ import annotations

import argparse
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from common import (
    REPO,
    Report,
    aoti_binder,
    differs,
    import_built,
    load_graph,
    load_spec,
    module_binder,
    project,
    shimgen_build,
    show_time,
    time_side_by_side,
)

from shimgen.trace import dims, variants
from shimgen.trace import export as trace

# model: (spec, sizes to specialize per dim, sizes no variant covers)
MODELS: dict[str, tuple[str, dict[str, list[int]], list[dict[str, int]]]] = {
    "resnet": ("resnet.toml", {"batch": [1, 8]}, [{"batch": 4}, {"batch": 16}]),
    "minilm": ("minilm.toml", {"batch": [1, 8], "seq": [128]}, [{"batch": 4, "seq": 64}, {"batch": 8, "seq": 100}]),
    # Microseconds per call: at an unspecialized size both packages run the same dynamic code, so their ratio is the
    # cost
    # of looking through four variants first.
    "mlp": ("mlp.toml", {"batch": [1, 2, 8, 16]}, [{"batch": 4}, {"batch": 32}]),
}
SPECIALIZED, DYNAMIC, STATIC, AOTI_STATIC, AOTI_DYNAMIC, EAGER = (
    "shimgen specialized",
    "shimgen dynamic",
    "shimgen static",
    "AOTI static",
    "AOTI dynamic",
    "eager",
)


def write_spec(
    source: Path,
    out: Path,
    name: str,
    device: str,
    specialize: dict[str, list[int]] | None = None,
    static: dict[str, int] | None = None,
    cuda_graphs: bool = False,
) -> Path:
    """A copy of `source` named `name`, without the sizes it specializes: its dims given `specialize` lists, or written
    as
    the `static` sizes."""
    text = source.read_text().replace(f'name = "{source.stem}"', f'name = "{name}"', 1)
    text = re.sub(r",\s*specialize = \[[^\]]*\]", "", text)
    for dim, sizes in (specialize or {}).items():
        text = re.sub(rf"(\b{dim} = {{[^}}]*?) }}", rf"\1, specialize = {sizes} }}", text, count=1)
    if static:
        for dim, size in static.items():
            text = text.replace(f'"{dim}"', str(size))
        text = re.sub(r"^dims = .*\n", "", text, flags=re.M)
    if device == "cuda":
        arch = "sm_{}{}".format(*torch.cuda.get_device_capability())
        text = re.sub(r'device = "cpu"\nisa = "native"', f'device = "cuda"\narchs = ["{arch}"]', text)
    if cuda_graphs:
        text = text.replace("[flags]", "[flags]\ncuda_graphs = true", 1)
    path = out / f"{name}.toml"
    path.write_text(text)
    return path


def label(sizes: dict[str, int]) -> str:
    return ", ".join(f"{dim}={size}" for dim, size in sizes.items())


def package_bytes(summary: dict[str, Any]) -> int:
    root = Path(summary["package_dir"]) / summary["name"]
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts)


def bench_model(
    key: str, device: str, work: Path, report: Report, block_seconds: float, blocks: int, other_sizes: int
) -> None:
    source_name, specialize, others = MODELS[key]
    others = others[:other_sizes]
    source = work / "projects" / source_name
    graphs = device == "cuda"
    cache = ["--cache", f"file://{work / 'cache'}"]
    specs = {
        SPECIALIZED: write_spec(source, source.parent, f"{key}_specialized", device, specialize, cuda_graphs=graphs),
        DYNAMIC: write_spec(source, source.parent, f"{key}_dynamic", device),
    }
    specialized_sizes = variants.specializations(load_spec(specs[SPECIALIZED]).graph[0])
    built = {}
    for name, spec in specs.items():
        seconds, built[name] = shimgen_build(spec, work / "out", None, *cache)
        report(f"- built {name} in {seconds:.1f} s")
    for sizes in specialized_sizes:
        spec = write_spec(
            source,
            source.parent,
            f"{key}_static_{'_'.join(map(str, sizes.values()))}",
            device,
            static=sizes,
            cuda_graphs=graphs,
        )
        seconds, built[f"{STATIC} {label(sizes)}"] = shimgen_build(spec, work / "out", None, *cache)
        report(
            f"- built {STATIC} {label(sizes)} in {seconds:.1f} s (trace and codegen from the shared cache: "
            f"{', '.join(built[f'{STATIC} {label(sizes)}']['shared_cache']['found']) or 'nothing'})"
        )
    report("")
    report(f"Build of {SPECIALIZED} ({len(specialized_sizes)} variants), per model (this build's seconds):")
    report("")
    report("| model | trace s | codegen s | compile s | library MB | weights it adds MB |")
    report("| --- | --- | --- | --- | --- | --- |")
    for m in built[SPECIALIZED]["models"]:
        added = f"{m['weights_bytes'] / 1e6:.1f}" if m["weights_bytes"] is not None else "-"
        report(
            f"| {label(m['variant']) if m['variant'] else 'dynamic'} | {m['trace']:.1f} | {m['codegen']:.1f} | {m['compile']:.1f} | "
            f"{m['library_bytes'] / 1e6:.2f} | {added} |"
        )
    dynamic_bytes, specialized_bytes = package_bytes(built[DYNAMIC]), package_bytes(built[SPECIALIZED])
    goal = 1 + 0.2 * len(specialized_sizes)
    report("")
    report(
        f"Package size: {SPECIALIZED} {specialized_bytes / 1e6:.1f} MB, {DYNAMIC} {dynamic_bytes / 1e6:.1f} MB: "
        f"**{specialized_bytes / dynamic_bytes:.2f}x** (goal <= {goal:.1f}x, 1 + 0.2 x {len(specialized_sizes)} variants)"
    )
    report("")

    with project(specs[DYNAMIC]) as spec_dir:
        gm = load_graph(load_spec(specs[DYNAMIC]), spec_dir, "forward")
        if device == "cuda":
            gm.model = gm.model.cuda()
        packages = {name: import_built(summary) for name, summary in built.items()}

        def export(sizes: dict[str, int]) -> Any:
            graph = variants.traced_graph(gm.graph, sizes)
            inputs = [t.to(device) for t in gm.inputs(sizes)]
            with torch.no_grad():
                return dims.export(trace._spec_order_module(gm.model, graph), inputs, graph, gm.where)

        configs = {"freezing": True}
        with torch.no_grad():
            aoti_dynamic = aoti_binder(export({}), work / f"{key}_aoti_dynamic.pt2", configs)
        rows = []
        for sizes in specialized_sizes + others:
            tensors = [t.to(device) for t in gm.inputs(sizes, seed=7)]
            with torch.no_grad():
                aoti_static = aoti_binder(
                    export(sizes), work / f"{key}_aoti_{'_'.join(map(str, sizes.values()))}.pt2", configs
                )
            binders = {
                EAGER: module_binder(gm, gm.model),
                AOTI_STATIC: aoti_static,
                AOTI_DYNAMIC: aoti_dynamic,
                DYNAMIC: module_binder(gm, packages[DYNAMIC].forward),
                SPECIALIZED: module_binder(gm, packages[SPECIALIZED].forward),
            }
            static = f"{STATIC} {label(sizes)}"
            if static in packages:
                binders[STATIC] = module_binder(gm, packages[static].forward)
            calls, wrong = {}, {}
            with torch.no_grad():
                expected = binders[EAGER](tensors)()
                for name, bind in binders.items():
                    call = bind(tensors)
                    problem = differs(call(), expected, gm.graph.rtol * 10, gm.graph.atol * 10)
                    if problem:
                        wrong[name] = problem
                    calls[name] = (
                        (lambda c: lambda: (c(), torch.cuda.synchronize()))(call) if device == "cuda" else call
                    )
                us = time_side_by_side(calls, block_seconds, blocks)
            rows.append((sizes, sizes in specialized_sizes, us, wrong))
            report(
                f"- {label(sizes)}: "
                + ", ".join(f"{name} {show_time(t)}" for name, t in us.items())
                + (f"; differs from eager: {wrong}" if wrong else "")
            )
    report("")
    report(
        f"| sizes | specialized? | {SPECIALIZED} | {STATIC} | {DYNAMIC} | {AOTI_STATIC} | {AOTI_DYNAMIC} | {EAGER} | "
        f"specialized / static (goal <= 1.05) | specialized / dynamic (goal <= 1.0 elsewhere) | specialized / AOTI static | "
        "specialized / AOTI dynamic |"
    )
    report("| --- " * 12 + "|")
    for sizes, is_specialized, us, _ in rows:
        s = us[SPECIALIZED]
        static = us.get(STATIC)
        report(
            f"| {label(sizes)} | {'yes' if is_specialized else 'no'} | {show_time(s)} | {show_time(static) if static else '-'} | "
            f"{show_time(us[DYNAMIC])} | {show_time(us[AOTI_STATIC])} | {show_time(us[AOTI_DYNAMIC])} | {show_time(us[EAGER])} | "
            f"{f'**{s / static:.3f}**' if static else '-'} | {f'**{s / us[DYNAMIC]:.3f}**' if not static else f'{s / us[DYNAMIC]:.3f}'} | "
            f"{s / us[AOTI_STATIC]:.3f} | {s / us[AOTI_DYNAMIC]:.3f} |"
        )
    report("")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="resnet,minilm,mlp")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--block-seconds", type=float, default=0.5)
    parser.add_argument("--blocks", type=int, default=7)
    parser.add_argument(
        "--other-sizes", type=int, default=2, help="how many of the model's unspecialized sizes to time"
    )
    args = parser.parse_args()
    report = Report()
    report(
        f"# Shape-specialized variants ({args.device}, torch {torch.__version__}, {torch.get_num_threads()} threads"
        + (f", {torch.cuda.get_device_name()}" if args.device == "cuda" else "")
        + ")"
    )
    report("")
    report("Per-call times are medians of blocks taken in turn; ratios below 1 favour the specialized package.")
    report("")
    with tempfile.TemporaryDirectory(prefix="shimgen-specialize-") as tmp:
        work = Path(tmp)
        shutil.copytree(REPO / "projects", work / "projects", ignore=shutil.ignore_patterns("__pycache__", "*.lock"))
        for key in args.models.split(","):
            report(f"## {key}")
            report("")
            bench_model(key, args.device, work, report, args.block_seconds, args.blocks, args.other_sizes)
    if args.out:
        report.save(args.out)


if __name__ == "__main__":
    main()
