"""Refit programs (shimgen/inductor/refit.py) recorded from operations on weights, and run again by the package's
runtime (shimgen/runtime/_shimgen_refit.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from shimgen.inductor import refit, weights
from shimgen.inductor.weights import Constant
from shimgen.runtime import _shimgen_refit as replay


def constant(name: str, tensor: torch.Tensor) -> Constant:
    return Constant(
        name=name,
        fqn=name,
        dtype=str(tensor.dtype).removeprefix("torch."),
        shape=tuple(tensor.shape),
        stride=tuple(tensor.stride()),
        offset=0,
        data_size=tensor.numel() * tensor.element_size(),
        layout="strided",
        from_folded=False,
        kind="Buffer",
    )


def record(recording: refit.Recording, func: Any, *args: Any, **kwargs: Any) -> Any:
    out = func(*args, **kwargs)
    recording.note(func, args, kwargs, out)
    return out


def folded_batch_norm(weights: dict[str, torch.Tensor], recording: refit.Recording) -> torch.Tensor:
    """A convolution's weight merged with its batch norm, as freezing computes it."""
    aten = torch.ops.aten
    scale = record(recording, aten.rsqrt.default, record(recording, aten.add.Tensor, weights["model.bn.var"], 1e-5))
    scale = record(recording, aten.mul.Tensor, scale, weights["model.bn.weight"])
    return record(
        recording, aten.mul.Tensor, weights["model.conv.weight"], record(recording, aten.view.default, scale, [-1, 1])
    )


def test_a_recorded_program_computes_the_constant_again_from_new_weights() -> None:
    built = {
        "model.conv.weight": torch.randn(4, 3),
        "model.bn.var": torch.rand(4) + 0.5,
        "model.bn.weight": torch.randn(4),
    }
    recording = refit.Recording({refit._storage_key(t): name for name, t in built.items()})
    folded = folded_batch_norm(built, recording)
    recording.constants["constant0"] = folded
    program = recording.program([constant("constant0", folded)], built)
    assert program["missing"] == {} and sorted(name for name, _, _ in program["inputs"].values()) == [
        "bn.var",
        "bn.weight",
        "conv.weight",
    ]
    new = {name.removeprefix("model."): torch.randn_like(t).abs() for name, t in built.items()}
    again = replay.run(program, new, torch.device("cpu"))["constant0"]
    expected = new["conv.weight"] * (torch.rsqrt(new["bn.var"] + 1e-5) * new["bn.weight"]).view(-1, 1)
    assert torch.equal(again, expected)


def test_a_constant_computed_after_a_weight_was_read_back_has_no_program() -> None:
    built = {"model.w": torch.randn(4), "model.s": torch.randn(1)}
    recording = refit.Recording({refit._storage_key(t): name for name, t in built.items()})
    record(recording, torch.ops.aten._local_scalar_dense.default, built["model.s"])
    doubled = record(recording, torch.ops.aten.mul.Tensor, built["model.w"], 2)
    recording.constants["constant0"] = doubled
    program = recording.program([constant("constant0", doubled)], built)
    assert program["outputs"] == {} and "aten::_local_scalar_dense" in program["missing"]["constant0"]


def test_an_operation_on_a_large_tensor_not_made_from_the_weights_leaves_its_result_without_program() -> None:
    built = {"model.w": torch.randn(128)}
    recording = refit.Recording({refit._storage_key(built["model.w"]): "model.w"})
    summed = record(recording, torch.ops.aten.add.Tensor, built["model.w"], torch.randn(128))
    recording.constants["constant0"] = summed
    program = recording.program([constant("constant0", summed)], built)
    assert program["missing"] == {"constant0": "computed in a way the build did not record"}


def test_a_weights_file_written_by_the_refit_programs_holds_the_constants_a_build_of_the_new_weights_holds(
    tmp_path: Path,
) -> None:
    built = {
        "model.conv.weight": torch.randn(4, 3),
        "model.bn.var": torch.rand(4) + 0.5,
        "model.bn.weight": torch.randn(4),
        "model.fc.bias": torch.randn(4),
    }
    recording = refit.Recording({refit._storage_key(t): name for name, t in built.items()})
    folded = folded_batch_norm(built, recording)
    recording.constants["constant0"] = folded
    constants = [constant("constant0", folded), constant("model.fc.bias", built["model.fc.bias"])]
    constants = weights.mark_plain(constants, built)
    program = recording.program([constants[0]], built)
    new = {name: torch.randn_like(t).abs() for name, t in built.items()}
    assert weights.write_refitted(constants, new, program, "cpu", tmp_path / "refit.safetensors")
    expected = dict(
        zip(
            ("constant0", "model.fc.bias"),
            (folded_batch_norm(new, refit.Recording({})), new["model.fc.bias"]),
            strict=True,
        )
    )
    weights._write(
        constants, {name: weights.tensor_bytes(t) for name, t in expected.items()}, tmp_path / "built.safetensors"
    )
    assert (tmp_path / "refit.safetensors").read_bytes() == (tmp_path / "built.safetensors").read_bytes()

    # A program left without a constant, or new weights that change a literal of the code: the file is not written.
    missing = {**program, "outputs": {}, "missing": {"constant0": "computed in a way the build did not record"}}
    assert not weights.write_refitted(constants, new, missing, "cpu", tmp_path / "missing.safetensors")
    checked = {**program, "checks": [{"v": program["outputs"]["constant0"], "dtype": "float32", "values": [0.0] * 12}]}
    assert not weights.write_refitted(constants, new, checked, "cpu", tmp_path / "checked.safetensors")
    assert not (tmp_path / "missing.safetensors").exists() and not (tmp_path / "checked.safetensors").exists()


def test_a_weight_whose_value_the_build_read_is_fixed_for_refit_and_named() -> None:
    """Inductor reads a uniform weight's value and writes it into the kernels: no constant is left to recompute, so
    new weights must keep that value; the other weights stay free."""
    built = {"model.scale": torch.full((4,), 2.0), "model.w": torch.randn(4)}
    recording = refit.Recording({refit._storage_key(t): name for name, t in built.items()})
    first = record(recording, torch.ops.aten.select.int, built["model.scale"], 0, 0)
    record(recording, torch.ops.aten._local_scalar_dense.default, first)
    program = recording.program([], built)
    assert set(program["fixed"]) == {"scale"}
    replay.check_fixed(program, {"scale": torch.full((4,), 2.0), "w": torch.randn(4)})
    with pytest.raises(replay.RefitError, match="weight 'scale' cannot change without a rebuild"):
        replay.run(program, {"scale": torch.full((4,), 3.0), "w": built["model.w"]}, torch.device("cpu"))


def prepacked_convolution_weight(threads: int) -> tuple[dict[str, Any], Constant, dict[str, torch.Tensor]]:
    """The program of a convolution weight prepacked for oneDNN as freezing does it, recorded while torch ran
    `threads` threads."""
    built = {"model.conv.weight": torch.randn(16, 8, 3, 3)}
    recording = refit.Recording({refit._storage_key(t): name for name, t in built.items()})
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        packed = record(
            recording,
            torch.ops.mkldnn._reorder_convolution_weight.default,
            built["model.conv.weight"],
            [1, 1],
            [1, 1],
            [1, 1],
            1,
            [1, 8, 14, 14],
        )
    finally:
        torch.set_num_threads(before)
    recording.constants["packed0"] = packed
    c = dataclasses.replace(
        constant("packed0", built["model.conv.weight"]), layout="_mkldnn", data_size=torch.ops.mkldnn._nbytes(packed)
    )
    return recording.program([c], built), c, built


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch is built without oneDNN")
def test_a_prepacked_weight_is_packed_again_with_the_threads_and_checked_against_the_layout_of_the_build() -> None:
    # oneDNN's layout follows the threads it would run: on a 16-core AMX Xeon, 16 threads gave another layout than the
    # 8 that the build ran, and the refitted package computed garbage.
    program, _, built = prepacked_convolution_weight(threads=1)
    assert program["missing"] == {}
    (step,) = program["steps"]
    assert step["op"] == "mkldnn::_reorder_convolution_weight" and step["threads"] == 1
    assert list(program["packed_layouts"]) == ["packed0"]

    seen = []
    original = replay.op

    def spying(name: str) -> Any:
        if name == step["op"]:
            seen.append(torch.get_num_threads())
        return original(name)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(replay, "op", spying)
        torch.set_num_threads(2)
        replay.run(program, {"conv.weight": torch.randn(16, 8, 3, 3)}, torch.device("cpu"))
    assert seen == [1] and torch.get_num_threads() == 2

    program["packed_layouts"]["packed0"] = "00" + program["packed_layouts"]["packed0"][2:]
    with pytest.raises(
        replay.RefitError, match=r"oneDNN packed constant .packed0. in another layout here than at build time"
    ):
        replay.run(program, {"conv.weight": built["model.conv.weight"]}, torch.device("cpu"))
