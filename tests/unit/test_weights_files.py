"""Weights files (shimgen/inductor/weights.py) as the package's runtime reads them (_shimgen_weights.py): a unit's own
file, with its variants and the compiled code it is laid out for, and an "external" package's one file for all units."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest
import torch

from shimgen.inductor import weights
from shimgen.inductor.weights import Constant
from shimgen.runtime import _shimgen_weights as runtime


def constant(name: str, fqn: str, tensor: torch.Tensor) -> Constant:
    return Constant(
        name=name,
        fqn=f"model.{fqn}",
        dtype="float32",
        shape=tuple(tensor.shape),
        stride=tuple(tensor.stride()),
        offset=0,
        data_size=tensor.numel() * 4,
        layout="strided",
        from_folded=False,
        kind="Parameter",
        plain=True,
    )


def unit_file(root: Path, unit: str, values: dict[str, torch.Tensor], layout: str) -> tuple[Path, list[Constant]]:
    """A unit's weights file as render writes it (its constants one per weight), and the constants."""
    constants = [constant(f"{unit}_{name}", name, t) for name, t in values.items()]
    dynamic = root / f"{unit}.dynamic.safetensors"
    assert weights.write_from_tensors(constants, {c.fqn: values[c.weight[6:]] for c in constants}, dynamic)
    path = root / f"{unit}.safetensors"
    path.write_bytes(weights.unit_file(dynamic, [], layout))
    return path, constants


def runtime_unit(name: str, constants: list[Constant], layout: str) -> runtime.Unit:
    sys.modules.setdefault(f"fakepkg._{name}", types.ModuleType(f"fakepkg._{name}"))
    info = {"name": name, "graph": name, "device": "cpu", "weights_layout": layout}
    return runtime.Unit(
        "fakepkg", "", {**info, "constants": weights.package_view(constants)}, freezing=True, external=False
    )


def test_an_external_file_holds_each_tensor_once_and_gives_every_unit_its_constants(tmp_path: Path) -> None:
    ones, other = torch.ones(4, 4), torch.arange(16.0).reshape(4, 4)
    # Two LayerNorm-like weights of equal bytes in one unit, and one weight shared by both units.
    f_path, f_constants = unit_file(tmp_path, "f_cpu", {"ln1.weight": ones, "ln2.weight": ones, "w": other}, "f-code")
    g_path, g_constants = unit_file(tmp_path, "g_cpu", {"w": other, "b": torch.zeros(4)}, "g-code")
    external = tmp_path / "pkg.safetensors"
    external.write_bytes(weights.external_file([("f_cpu", f_path.read_bytes()), ("g_cpu", g_path.read_bytes())]))
    tensors, metadata = runtime.read_safetensors(str(external))
    assert len(tensors) == 3  # ones, arange, zeros
    for unit, values in (
        (runtime_unit("f_cpu", f_constants, "f-code"), [ones, ones, other]),
        (runtime_unit("g_cpu", g_constants, "g-code"), [other, torch.zeros(4)]),
    ):
        given = unit.from_file(tensors, metadata)
        assert not isinstance(given, str), given
        assert [t.view(torch.float32).reshape(v.shape).tolist() for t, v in zip(given[0], values, strict=True)] == [
            v.tolist() for v in values
        ]
    # The same files' own views: each unit's file by itself.
    own = runtime_unit("f_cpu", f_constants, "f-code").from_file(*runtime.read_safetensors(str(f_path)))
    assert not isinstance(own, str) and len(own[0]) == 3


@pytest.mark.parametrize("layout", ["another build's", ""])
def test_a_file_laid_out_for_other_code_is_refused(tmp_path: Path, layout: str) -> None:
    path, constants = unit_file(tmp_path, "f_cpu", {"w": torch.ones(2)}, layout)
    given = runtime_unit("f_cpu", constants, "f-code").from_file(*runtime.read_safetensors(str(path)))
    if layout:
        assert given == "its weights are laid out for other compiled code (another build, spec or shimgen)"
    else:  # a file that does not say (made before layouts were recorded): sizes are checked
        assert not isinstance(given, str)


def test_external_files_of_two_targets_merge_into_one(tmp_path: Path) -> None:
    """`shimgen merge` of per-target wheels built with external weights joins their files: every unit of each, each
    tensor once."""
    ones, other = torch.ones(4, 4), torch.arange(16.0).reshape(4, 4)
    cpu_path, cpu_constants = unit_file(tmp_path, "f_cpu", {"w": other, "ln.weight": ones}, "cpu-code")
    cuda_path, cuda_constants = unit_file(tmp_path, "f_cuda", {"w": other, "ln.weight": ones}, "cuda-code")
    per_target = [
        weights.external_file([(unit, path.read_bytes())])
        for unit, path in (("f_cpu", cpu_path), ("f_cuda", cuda_path))
    ]
    merged = tmp_path / "merged.safetensors"
    merged.write_bytes(weights.external_file([("", data) for data in per_target]))
    tensors, metadata = runtime.read_safetensors(str(merged))
    assert len(tensors) == 2
    for name, constants, layout in (("f_cpu", cpu_constants, "cpu-code"), ("f_cuda", cuda_constants, "cuda-code")):
        given = runtime_unit(name, constants, layout).from_file(tensors, metadata)
        assert not isinstance(given, str), given
        assert [t.view(torch.float32).sum().item() for t in given[0]] == [other.sum().item(), 16.0]
