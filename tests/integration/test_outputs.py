"""Outputs of types of their own (projects/outputs.toml): a transformers ModelOutput comes back as
itself where transformers can be imported (imported on the first call, not at import) and as a
dict in field order where it cannot; the project's own namedtuple and dataclass always come back
as their fallbacks (a namedtuple of the same name and fields, a dict); torch's topk result as
itself; all of it nested with None, lists and an int key, and compared with eager."""

from __future__ import annotations

import collections
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from conftest import build_json, import_package, shimgen

pytest.importorskip("transformers", reason="the ModelOutput graph needs transformers (scripts/setup.sh installs it)")
pytestmark = pytest.mark.slow

MODELS_MODULE = "shimgen_test_output_models"
BERT_OUTPUT = "transformers.modeling_outputs.BaseModelOutputWithPoolingAndCrossAttentions"


@pytest.fixture(scope="session")
def built_outputs(workdir: Path) -> dict[str, Any]:
    return build_json(workdir / "projects" / "outputs.toml", workdir)


@pytest.fixture(scope="session")
def models(workdir: Path) -> ModuleType:
    """projects/models/outputs.py of the built copy, under a name of its own (its types are the eager ones)."""
    spec = importlib.util.spec_from_file_location(MODELS_MODULE, workdir / "projects" / "models" / "outputs.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[MODELS_MODULE] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def eager_bert(models: ModuleType, input_ids: torch.Tensor) -> Any:
    torch.manual_seed(0)  # the graph's seed: the weights the build traced
    with torch.no_grad():
        return models.bert().eval()(input_ids)


def assert_close(got: torch.Tensor, want: torch.Tensor) -> None:
    assert isinstance(got, torch.Tensor) and got.shape == want.shape
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def test_model_output_is_its_own_type_where_transformers_is_importable(
    built_outputs: dict[str, Any], models: ModuleType
) -> None:
    import transformers.modeling_outputs as modeling_outputs

    package = import_package(built_outputs)
    input_ids = torch.randint(0, 99, (3, 8))
    want = eager_bert(models, input_ids)
    got = package.bert(input_ids)
    assert type(got) is type(want) is modeling_outputs.BaseModelOutputWithPoolingAndCrossAttentions
    assert list(got.keys()) == list(want.keys()) == ["last_hidden_state", "pooler_output"]
    assert got.hidden_states is None and got.attentions is None
    assert_close(got.last_hidden_state, want.last_hidden_state)
    assert_close(got[1], want.pooler_output)


def test_project_namedtuple_comes_back_as_a_namedtuple_of_its_name_and_fields(
    built_outputs: dict[str, Any], models: ModuleType
) -> None:
    package = import_package(built_outputs)
    x = torch.randn(5, 16)
    got, want = package.pair(x), models.pair(x)
    # The project's module is not shipped with the package, so its class is never imported.
    assert type(got) is not models.Pair and type(got).__module__ == f"{built_outputs['name']}._pair_cpu"
    assert isinstance(got, tuple) and type(got).__name__ == "Pair" and got._fields == models.Pair._fields
    assert got[0] is got.scaled and len(got) == 2
    assert_close(got.scaled, want.scaled)
    assert_close(got.shifted, want.shifted)
    assert type(package.pair(x)) is type(got)  # made once


def test_nested_outputs_keep_structure_none_and_keys(built_outputs: dict[str, Any], models: ModuleType) -> None:
    package = import_package(built_outputs)
    x = torch.randn(4, 16)
    got, want = package.nested(x), models.nested(x)
    assert list(got) == list(want) == ["stats", "list", "pair", "top", 7]
    # The registered dataclass: a dict of the fields its pytree holds (mask was None), in field order.
    assert type(got["stats"]) is dict and list(got["stats"]) == ["mean", "spread"] and want["stats"].mask is None
    assert_close(got["stats"]["mean"], want["stats"].mean)
    assert_close(got["stats"]["spread"], want["stats"].spread)
    assert type(got["list"]) is list and len(got["list"]) == 3 and got["list"][1] is None
    assert type(got["list"][2]) is tuple and len(got["list"][2]) == 1
    assert_close(got["list"][0], want["list"][0])
    assert_close(got["list"][2][0], want["list"][2][0])
    assert type(got["pair"]).__name__ == "Pair" and got["pair"]._fields == ("scaled", "shifted")
    assert_close(got["pair"].shifted, want["pair"].shifted)
    assert type(got["top"]) is torch.return_types.topk  # torch's own: importable, rebuilt as itself
    assert torch.equal(got["top"].indices, want["top"].indices)
    assert_close(got["top"].values, want["top"].values)
    assert_close(got[7], want[7])


def test_docstrings_say_what_comes_back(built_outputs: dict[str, Any]) -> None:
    package = import_package(built_outputs)
    assert package.bert.__doc__.splitlines()[-1] == (
        "Returns: BaseModelOutputWithPoolingAndCrossAttentions(last_hidden_state: Tensor, pooler_output: Tensor): "
        f"a {BERT_OUTPUT} when that is importable, else a dict in field order"
    )
    assert package.pair.__doc__.splitlines()[-1] == (
        "Returns: Pair(scaled: Tensor, shifted: Tensor): a namedtuple Pair of the same fields "
        "(models.outputs.Pair is defined in the project, which the package does not import)"
    )
    returns = package.nested.__doc__.split("Returns: ")[1].splitlines()
    assert returns == [
        "{'stats': Stats(mean: Tensor, spread: Tensor), 'list': [Tensor, None, (Tensor,)], "
        "'pair': Pair(scaled: Tensor, shifted: Tensor), 'top': topk(values: Tensor, indices: Tensor), 7: Tensor}",
        "  Stats: a dict in field order (models.outputs.Stats is defined in the project, which the package does not import)",
        "  Pair: a namedtuple Pair of the same fields (models.outputs.Pair is defined in the project, which the package does not import)",
        "  topk: a torch.return_types.topk when that is importable, else a namedtuple topk of the same fields",
    ]


# Calls bert twice in a fresh interpreter where transformers is as `mode` says, and reports what came back.
BERT_SCRIPT = """
import sys, types, warnings, torch
mode, site, name, case, result = sys.argv[1:]
if mode == "blocked":
    sys.modules["transformers"] = None  # import transformers raises ImportError
elif mode in ("missing", "raising"):
    fake = types.ModuleType("transformers")
    fake.__path__ = []
    outputs = types.ModuleType("transformers.modeling_outputs")
    if mode == "raising":
        class BaseModelOutputWithPoolingAndCrossAttentions:
            def __init__(self, **fields):
                raise TypeError("fields changed")
        outputs.BaseModelOutputWithPoolingAndCrossAttentions = BaseModelOutputWithPoolingAndCrossAttentions
    sys.modules["transformers"], sys.modules["transformers.modeling_outputs"] = fake, outputs
sys.path.insert(0, site)
package = __import__(name)
at_import = sys.modules.get("transformers") is not None and mode == "importable"
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    first, second = (package.bert(torch.load(case)) for _ in range(2))
torch.save({
    "types": [f"{type(o).__module__}.{type(o).__qualname__}" for o in (first, second)],
    "first": dict(first), "second": dict(second), "transformers_at_import": at_import,
    "warnings": [str(w.message) for w in caught],
}, result)
"""


def call_bert(summary: dict[str, Any], tmp: Path, mode: str, input_ids: torch.Tensor) -> dict[str, Any]:
    case, result = tmp / f"{mode}-case.pt", tmp / f"{mode}-result.pt"
    torch.save(input_ids, case)
    run = subprocess.run(
        [sys.executable, "-c", BERT_SCRIPT, mode, summary["package_dir"], summary["name"], str(case), str(result)],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
    return torch.load(result)


@pytest.mark.parametrize("mode", ["importable", "blocked", "missing", "raising"])
def test_model_output_falls_back_to_a_dict_where_it_cannot_be_made(
    built_outputs: dict[str, Any],
    models: ModuleType,
    tmp_path: Path,
    mode: str,
) -> None:
    input_ids = torch.randint(0, 99, (2, 8))
    want = eager_bert(models, input_ids)
    out = call_bert(built_outputs, tmp_path, mode, input_ids)
    assert out["transformers_at_import"] is False  # imported by the first call that returns one, never at import
    expected = BERT_OUTPUT if mode == "importable" else "builtins.dict"
    assert out["types"] == [expected, expected]
    for got in (out["first"], out["second"]):
        assert list(got) == ["last_hidden_state", "pooler_output"]
        assert_close(got["last_hidden_state"], want.last_hidden_state)
        assert_close(got["pooler_output"], want.pooler_output)
    # A failed import falls back silently; a constructor that refuses the fields says so, once.
    assert out["warnings"] == (
        [f"bert(): {BERT_OUTPUT}(...) raised TypeError('fields changed'); returning a dict of its fields from now on"]
        if mode == "raising"
        else []
    )


def test_check_compares_both_the_same_types_and_the_fallbacks(built_outputs: dict[str, Any], workdir: Path) -> None:
    result = shimgen("check", workdir / "projects" / "outputs.toml", "--out", workdir, "--json")
    assert "Traceback" not in result.stderr
    report = json.loads(result.stdout)
    assert result.returncode == 0 and report["ok"], result.stderr
    outputs = {(c["graph"], c["output"]) for c in report["comparisons"] if c["case"] == "example"}
    assert outputs == {
        ("bert", "out.last_hidden_state"),
        ("bert", "out.pooler_output"),
        ("pair", "out.scaled"),
        ("pair", "out.shifted"),
        ("nested", "out['stats'].mean"),
        ("nested", "out['stats'].spread"),
        ("nested", "out['list'][0]"),
        ("nested", "out['list'][2][0]"),
        ("nested", "out['pair'].scaled"),
        ("nested", "out['pair'].shifted"),
        ("nested", "out['top'].values"),
        ("nested", "out['top'].indices"),
        ("nested", "out[7]"),
    }


def test_check_rejects_what_the_package_does_not_promise(workdir: Path, models: ModuleType) -> None:
    import transformers.modeling_outputs as modeling_outputs

    from shimgen.commands.check import StructureMismatch, _tensor_pairs

    spec_dir = workdir / "projects"
    a, b = torch.ones(2), torch.zeros(2)
    stats = models.Stats(mean=a, mask=None, spread=b)
    assert [p for p, _, _ in _tensor_pairs(stats, {"mean": a, "spread": b}, spec_dir)] == ["out.mean", "out.spread"]
    pair = models.Pair(a, b)
    assert len(_tensor_pairs(pair, collections.namedtuple("Pair", ["scaled", "shifted"])(a, b), spec_dir)) == 2
    bert_output = modeling_outputs.BaseModelOutputWithPoolingAndCrossAttentions(last_hidden_state=a, pooler_output=b)
    wrong = [
        (stats, {"spread": b, "mean": a}, "out is dict, but for eager's"),  # field order
        (pair, (a, b), "out is tuple, but for eager's"),  # a plain tuple is not the namedtuple fallback
        (
            bert_output,
            {"last_hidden_state": a, "pooler_output": b},
            f"out is dict, eager returns {BERT_OUTPUT}",
        ),  # importable: must be itself
        ({"x": [a, None]}, {"x": [a, b]}, "out['x'][1] is torch.Tensor, eager returns None"),
    ]
    for want, got, message in wrong:
        with pytest.raises(StructureMismatch, match=message.replace("[", r"\[").replace("(", r"\(")):
            _tensor_pairs(want, got, spec_dir)


def test_outputs_that_are_not_tensors_are_spec_errors(tmp_path: Path) -> None:
    (tmp_path / "counting.py").write_text("def model(x):\n    return {'y': x + 1, 'n': 3}\n")
    spec = tmp_path / "counting.toml"
    spec.write_text(
        '[project]\nname = "counting"\n\n[[graph]]\nname = "forward"\nentry = "counting:model"\n'
        'inputs = [{ name = "x", shape = [2, 4] }]\n'
    )
    result = shimgen("build", spec, "--out", tmp_path / "out")
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"shimgen: {spec}: graph[0]: output['n'] is int 3: outputs may hold tensors and None in any structure "
        "torch.export accepts, no other values (return it as a tensor)"
    )
