"""Why a sweep case fails on one machine and not another: where its data-dependent sizes are made, and where its traced
program departs from eager.

    python benchmarks/unbacked_origin.py [--device cpu|cuda] NAME... [--out FILE]

For each model_sweep.py case named, the model is built and traced as `shimgen build` traces it. Each unbacked size
torch makes during the trace is reported with the model's frames that made it (the frames outside torch and shimgen,
by module path, not by a directory name). Where the trace succeeds (narrowing a range as the build does, but without
its check at the smallest sizes), the program is run against eager at each dim's min, next size and max in its range,
the other dims at their example.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

from common import REPO, Report
from model_sweep import CASES, HERE, Case, spec_text


def _outside(filename: str) -> bool:
    import torch

    import shimgen

    inside = (os.path.dirname(torch.__file__) + os.sep, os.path.dirname(shimgen.__file__) + os.sep, str(HERE))
    return not filename.startswith((*inside, "<"))


def _project(case: Case, device: str) -> Path:
    """A directory holding the case's spec and the sweep's model module, as model_sweep.py writes them."""
    work = Path(tempfile.mkdtemp(prefix="shimgen-unbacked-"))
    (work / "models").mkdir()
    for source in (HERE / "sweep_models.py", REPO / "projects" / "models" / "torchvision_ops.py"):
        (work / "models" / source.name).write_text(source.read_text())
    (work / "models" / "__init__.py").write_text("")
    (work / "sweep.toml").write_text(spec_text(case, device))
    return work


def diagnose(case: Case, device: str, report: Report) -> None:
    import torch
    from torch.fx.experimental import symbolic_shapes

    from shimgen.spec import load_spec
    from shimgen.trace import dims
    from shimgen.trace.entry import call_model, example_sizes, load_model, make_inputs, project_scope
    from shimgen.trace.export import Saved, _export_narrowing, _spec_order_module, model_state, output_tensors

    report(f"\n### {case.name} on {device}\n")
    work = _project(case, device)
    graph = load_spec(work / "sweep.toml").graph[0]
    made: list[str] = []
    create = symbolic_shapes.ShapeEnv.create_unbacked_symint

    def recorded(self: Any, *args: Any, **kwargs: Any) -> Any:
        symbol = create(self, *args, **kwargs)
        frames = [f for f in traceback.extract_stack() if _outside(f.filename)][-2:]
        made.append(f"- `{symbol}` made at " + " < ".join(f"{f.filename}:{f.lineno} (`{f.line}`)" for f in frames))
        return symbol

    with project_scope(work):
        model = load_model(graph, "graph[0]", work)
        model = model.to(device) if isinstance(model, torch.nn.Module) else model
        inputs = [t.to(device) for t in make_inputs(graph, example_sizes(graph), graph.seed)]
        symbolic_shapes.ShapeEnv.create_unbacked_symint = recorded
        check_against_eager = dims.check_against_eager
        dims.check_against_eager = lambda *args, **kwargs: None  # the comparisons below make it, at more sizes
        try:
            with torch.no_grad():
                adapter = _spec_order_module(model, graph)
                initial = Saved(model_state(model))
                program, narrowed = _export_narrowing(adapter, model, inputs, graph, "graph[0]", device, initial)
        except Exception as exc:
            program = None
            report(f"trace failed: {str(exc)[:800]}")
        finally:
            symbolic_shapes.ShapeEnv.create_unbacked_symint = create
            dims.check_against_eager = check_against_eager
        report("\n".join(made) or "no unbacked sizes")
        if program is None:
            return
        ranges = {name: (dim.min, dim.max) for name, dim in graph.dims.items()}
        for name, low, high, condition in narrowed:
            report(f"- {name} narrowed to [{low}, {high}] ({condition}); the sizes outside are variants")
            ranges[name] = (low, high)
        for name, (low, high) in ranges.items():
            for size in sorted({low, min(low + graph.dims[name].multiple_of, high), high}):
                tensors = [t.to(device) for t in make_inputs(graph, {**example_sizes(graph), name: size}, graph.seed)]
                try:
                    with torch.no_grad():
                        got = program.module()(*tensors)
                        want = output_tensors(call_model(model, graph, tensors))
                    errors = [f"{(g - w).abs().max().item():.3g}" for g, w in zip(got, want, strict=True)]
                    report(f"- {name} = {size}: max abs error of each output against eager: {', '.join(errors)}")
                except Exception as exc:
                    report(f"- {name} = {size}: {type(exc).__name__}: {str(exc)[:300]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="+")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    import torch

    sys.path.insert(0, str(REPO / "projects"))
    import models.torchvision_ops  # noqa: F401  (torchvision imports where its ops library does not load)

    report = Report()
    report(f"## unbacked_origin.py --device {args.device}, torch {torch.__version__}")
    for name in args.names:
        case = next((c for c in CASES if c.name == name), None)
        if case is None:
            report(f"\n### {name}: no such sweep case")
            continue
        try:
            diagnose(case, args.device, report)
        except Exception as exc:
            report(f"failed: {type(exc).__name__}: {str(exc)[:500]}")
        if args.out:
            report.save(args.out)


if __name__ == "__main__":
    main()
