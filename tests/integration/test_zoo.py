"""Models nobody here wrote, checked against eager at min, middle and max of every dynamic dim:
transformers architectures from small configs returning their own output classes (a decoder's DynamicCache too),
timm's ConvNeXt and Swin, the shapes of AOTInductor's test suite (torch.cond, embedding bags, index_put, a mutated
buffer), sizes derived from the dims (a slice of a range that starts at 2, a multiple of 2), and outputs holding topk
indices and a view. The same specs run on the GPU machine (benchmarks/results/)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import build_json, edited, import_package, shimgen

pytest.importorskip(
    "transformers", reason="the zoo's transformers models need transformers (scripts/setup.sh installs it)"
)
pytestmark = pytest.mark.slow


def check(spec: Path, out: Path) -> dict[str, Any]:
    result = shimgen("check", spec, "--out", out, "--json")
    assert "Traceback" not in result.stderr
    assert result.stdout, result.stderr
    report = json.loads(result.stdout)
    print(
        f"\n{spec.name}:\n"
        + "\n".join(
            f"  {c['graph']:<12} {c['case']:<12} {c['output']:<28} max abs err {c['max_abs']:.3g}"
            for c in report["comparisons"]
        )
    )
    assert result.returncode == 0 and report["ok"], result.stderr
    assert report["comparisons"], f"{spec.name}: check compared nothing"
    return report


@pytest.fixture(scope="session")
def built_shapes(workdir: Path) -> dict[str, Any]:
    return build_json(workdir / "projects" / "shapes.toml", workdir)


@pytest.mark.parametrize(
    "spec_name",
    [
        "shapes.toml",  # with the file's other tests, which build it too
        pytest.param("hf.toml", marks=pytest.mark.xdist_group("zoo-hf")),
        pytest.param("vision.toml", marks=pytest.mark.xdist_group("zoo-vision")),
        pytest.param("aoti_shapes.toml", marks=pytest.mark.xdist_group("zoo-aoti")),
    ],
)
def test_zoo_matches_eager_across_every_range(workdir: Path, spec_name: str) -> None:
    report = check(workdir / "projects" / spec_name, workdir)
    cases = {(c["graph"], c["case"]) for c in report["comparisons"]}
    if spec_name == "shapes.toml":
        assert {("cat_slices", "q=2"), ("cat_slices", "q=64"), ("pairs", "rows=2"), ("topk", "batch=1")} <= cases
    elif spec_name == "vision.toml":
        # ConvNeXt's batch 1 is a variant of its own (torch.export cannot keep it in the range); the package runs at
        # every batch.
        assert {
            ("convnext", "batch=1"),
            ("convnext", "variant batch=1"),
            ("convnext", "batch=4"),
            ("swin", "batch=1"),
            ("swin", "batch=4"),
        } <= cases
    elif spec_name == "aoti_shapes.toml":
        assert {
            (g, case) for g in ("cond", "counter") for case in ("batch=1", "batch=16" if g == "cond" else "batch=4")
        } <= cases
        assert {("bags", "ids=1"), ("bags", "ids=64"), ("scatter", "n=1"), ("scatter", "n=32")} <= cases
    else:
        assert {
            ("bert", "seq=2"),
            ("bert", "seq=64"),
            ("gpt2", "batch=1"),
            ("vit", "batch=8"),
            ("t5_encoder", "seq=2"),
            ("llama", "seq=32"),
            ("mixtral", "batch=4"),
        } <= cases
        # LlamaModel's DynamicCache comes back as a DynamicCache (check compares types too), its layers' tensors equal.
        assert {c["output"] for c in report["comparisons"] if c["graph"] == "llama"} >= {
            "out.past_key_values.key_cache[1]",
            "out.last_hidden_state",
        }


def test_multiple_of_is_checked_on_every_call(built_shapes: dict[str, Any]) -> None:
    shapes = import_package(built_shapes)
    assert torch.equal(shapes.pairs(torch.ones(6, 8)), torch.full((3, 8), 2.0))
    with pytest.raises(ValueError, match=r"input 'x' dim 0 \('rows'\) must be a multiple of 2, got 7"):
        shapes.pairs(torch.ones(7, 8))


def test_topk_indices_and_view_keep_their_types(built_shapes: dict[str, Any]) -> None:
    shapes = import_package(built_shapes)
    values, indices, view = shapes.topk(torch.randn(5, 16))
    assert indices.dtype == torch.int64 and values.shape == indices.shape == (5, 3) and view.shape == (5, 2, 8)


@pytest.mark.parametrize(
    "edit,message",
    [
        # A reshape into pairs needs an even size: torch's suggested fix, in the spec's terms, and the model's line.
        (
            ("shapes.toml", ", multiple_of = 2", ""),
            "graph[1].dims.rows: the model cannot take every size of 'rows' in [2, 64]: it needs (8*x.shape[0]) == (16*(x.shape[0] // 2)) "
            "at {workdir}/projects/models/shapes.py:13 (`return x.view(x.shape[0] // 2, 2, x.shape[1]).sum(1)`); "
            "write dims.rows = { min = 2, max = 64, multiple_of = 2 }",
        ),
    ],
)
def test_ranges_a_model_cannot_take_are_spec_errors(
    workdir: Path, tmp_path: Path, edit: tuple[str, str, str], message: str
) -> None:
    name, old, new = edit
    original = (workdir / "projects" / name).read_text()
    assert old in original
    spec = workdir / "projects" / f"narrow_{name}"
    spec.write_text(edited(original, old, new))
    result = shimgen("build", spec, "--out", tmp_path)
    assert result.returncode == 2, result.stderr
    # Every graph the edit breaks is reported, in spec order: the first line is graph[0]'s.
    pattern = re.escape(f"shimgen: {spec}: {message.replace('{workdir}', str(workdir))}").replace(
        re.escape("{input}"), "(input_ids|attention_mask|token_type_ids)"
    )
    reported = [line for line in result.stderr.strip().splitlines() if line.startswith("shimgen: ")]
    assert re.fullmatch(pattern, reported[0]), result.stderr
    where = [line.removeprefix(f"shimgen: {spec}: ").split(":")[0] for line in reported]
    assert where == sorted(where), result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.cuda
@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False; CI has none)"
)
@pytest.mark.parametrize(
    "spec_name,graphs,kwargs,devices",
    [
        # MiniLM-sized BERT (hidden 384, 6 layers, 12 heads), dynamic batch and sequence length. cuda only: torch
        # 2.11's CPU attention still guards batch != 1 under size-oblivious tracing (2.13's does not).
        (
            "hf.toml",
            ["bert"],
            "kwargs = { hidden = 384, layers = 6, heads = 12, intermediate = 1536, positions = 512 }\n",
            ["cuda"],
        ),
        ("shapes.toml", ["cat_slices", "pairs", "topk"], "", ["cpu", "cuda"]),
    ],
)
def test_zoo_on_cuda(workdir: Path, spec_name: str, graphs: list[str], kwargs: str, devices: list[str]) -> None:
    major, minor = torch.cuda.get_device_capability()
    text = (workdir / "projects" / spec_name).read_text()
    blocks = text.split("[[graph]]")
    kept = [b for b in blocks[1:] if any(f'name = "{g}"' in b for g in graphs)]
    assert len(kept) == len(graphs), f"{spec_name} lacks one of the graphs {graphs}"
    if kwargs:
        kept = [edited(b, "inputs = [", kwargs + "inputs = [", 1) for b in kept]
        kept = [
            edited(
                b,
                "batch = { min = 1, max = 8 }, seq = { min = 2, max = 64 }",
                "batch = { min = 1, max = 16 }, seq = { min = 8, max = 128 }",
            )
            for b in kept
        ]
    name = spec_name.removesuffix(".toml") + "_cuda"
    spec = workdir / "projects" / f"{name}.toml"
    targets = "".join(
        f'\n[[target]]\ndevice = "{d}"\n' + (f'archs = ["sm_{major}{minor}"]\n' if d == "cuda" else "") for d in devices
    )
    spec.write_text(
        re.sub(r'(?m)^name = ".*"$', f'name = "{name}"', blocks[0], count=1)
        + "".join("[[graph]]" + b for b in kept)
        + targets
    )
    report = check(spec, workdir)
    if len(devices) > 1:
        assert {c["case"].split(":")[0] for c in report["comparisons"]} == set(devices)
