"""Install a built wheel into a fresh venv that has torch and nothing else, call every graph there on
every device this machine has, and compare with eager here.

    python scripts/check_wheel.py WHEEL SPEC

Used on the GPU machine for a wheel built on another machine. The venv gets this Python's torch
through a .pth file (that machine has no package index); shimgen stays out of it.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import venv
from pathlib import Path

import torch
import torch.utils._pytree as pytree

from shimgen.spec import load_spec
from shimgen.trace.entry import call_model, example_sizes, load_model, make_inputs

CALL = """
import sys, torch
package = __import__(sys.argv[1])
cases = torch.load(sys.argv[2])
torch.save([getattr(package, graph)(*(t.to(device) for t in inputs)) for graph, device, inputs in cases], sys.argv[3])
assert "shimgen" not in sys.modules, "the package imported shimgen"
print(package.__file__)
"""


def main() -> int:
    wheel, spec_path = Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve()
    spec = load_spec(spec_path)
    tmp = Path(tempfile.mkdtemp(prefix="shimgen-wheel-"))
    venv.create(tmp / "venv", with_pip=True)
    python = str(tmp / "venv" / "bin" / "python")
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    )
    Path(site.stdout.strip(), "torch_from_base.pth").write_text(str(Path(torch.__file__).parents[1]) + "\n")
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], check=True)

    devices = [t.device for t in spec.target if t.device == "cpu" or torch.cuda.is_available()]
    cases, expected = [], []
    for i, graph in enumerate(spec.graph):
        if any(inp.keyword for inp in graph.inputs):
            continue  # positional calls only, to keep the call script small
        for device in devices:
            model = load_model(graph, f"graph[{i}]", spec_path.parent)
            if isinstance(model, torch.nn.Module):
                model = model.to(device)
            inputs = make_inputs(graph, example_sizes(graph), graph.seed + 1)
            with torch.no_grad():
                expected.append(call_model(model, graph, [t.to(device) for t in inputs]))
            cases.append((graph.name, device, inputs))
    torch.save(cases, tmp / "cases.pt")
    env = {"PATH": "/usr/bin:/bin", "TORCHINDUCTOR_CACHE_DIR": str(tmp / "empty-cache")}
    run = subprocess.run(
        [python, "-c", CALL, spec.project.name, str(tmp / "cases.pt"), str(tmp / "got.pt")],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp,
    )
    if run.returncode != 0:
        print(run.stderr, file=sys.stderr)
        return 1
    print(f"installed {wheel.name} into a fresh venv; imported from {run.stdout.strip()}")
    failed = 0
    results = torch.load(tmp / "got.pt")
    if len(results) != len(cases):
        print(f"the installed package answered {len(results)} of {len(cases)} cases", file=sys.stderr)
        return 1
    for (graph, device, _), want, got in zip(cases, expected, results, strict=True):
        g = next(g for g in spec.graph if g.name == graph)
        got_leaves, want_leaves = pytree.tree_leaves(got), pytree.tree_leaves(want)
        if len(got_leaves) != len(want_leaves):
            print(f"{graph:<10} {device:<5} {len(got_leaves)} output tensors, eager has {len(want_leaves)} MISMATCH")
            failed += 1
            continue
        for a, b in zip(got_leaves, want_leaves, strict=True):
            ok = torch.allclose(a.cpu().double(), b.cpu().double(), rtol=g.rtol, atol=g.atol)
            failed += not ok
            print(
                f"{graph:<10} {device:<5} {str(a.device):<7} max abs err {(a.cpu().double() - b.cpu().double()).abs().max().item():.3g} "
                f"{'ok' if ok else 'MISMATCH'}"
            )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
