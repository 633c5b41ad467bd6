"""Freezing's incremental fake-tensor propagation (shimgen/inductor/fake_prop.py): the same generated code as
Inductor's whole-graph propagation, from fewer nodes propagated."""

from __future__ import annotations

import re
import zipfile
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from unittest import mock

import pytest
import torch
from torch import nn

from shimgen.inductor import fake_prop


class ConvBnHead(nn.Module):
    """Convolutions with batch norms (freezing folds them in rounds), a layer norm and a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.Conv2d(8, 8, 3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(),
        )
        self.norm = nn.LayerNorm(8)
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.body(x).mean((2, 3))))


@pytest.fixture(scope="module")
def program() -> torch.export.ExportedProgram:
    torch.manual_seed(0)
    model = ConvBnHead().eval()
    batch = torch.export.Dim("batch", min=1, max=16)
    return torch.export.export(model, (torch.randn(2, 3, 8, 8),), dynamic_shapes={"x": {0: batch}})


def generated(
    program: torch.export.ExportedProgram, tmp: Path, propagation: AbstractContextManager[None]
) -> tuple[str, int]:
    """The wrapper Inductor generates with freezing (addresses and paths, which differ run to run, blanked), and the
    nodes fake-propagated meanwhile."""
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    run_node = FakeTensorProp.run_node
    propagated = 0

    def counted(self: FakeTensorProp, n: torch.fx.Node) -> object:
        nonlocal propagated
        propagated += 1
        return run_node(self, n)

    with mock.patch.object(FakeTensorProp, "run_node", counted), torch.no_grad(), propagation:
        package = torch._inductor.aoti_compile_and_package(
            program,
            package_path=str(tmp / "model.pt2"),
            inductor_configs={"freezing": True, "aot_inductor.package_cpp_only": True, "force_disable_caches": True},
        )
    with zipfile.ZipFile(package) as archive:
        [wrapper] = [name for name in archive.namelist() if name.endswith(".wrapper.cpp")]
        text = archive.read(wrapper).decode()
    return re.sub(r"0x[0-9a-f]+|/tmp\S*|[a-z0-9]{20,}", "_", text), propagated


def test_incremental_propagation_generates_the_same_code_propagating_fewer_nodes(
    program: torch.export.ExportedProgram, tmp_path: Path
) -> None:
    (tmp_path / "whole").mkdir()
    (tmp_path / "incremental").mkdir()
    whole, whole_nodes = generated(program, tmp_path / "whole", nullcontext())
    incremental, incremental_nodes = generated(program, tmp_path / "incremental", fake_prop.incremental())
    assert incremental == whole
    assert incremental_nodes < whole_nodes, (incremental_nodes, whole_nodes)


def test_a_node_whose_input_changed_shape_is_propagated_again() -> None:
    """A pass that changes a node in place (here: keepdim) changes its value's shape; its users, whose own arguments are
    untouched, are propagated again."""
    from torch._inductor.fx_passes import freezing_patterns
    from torch._subclasses.fake_tensor import FakeTensorMode

    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten.sum.dim_IntList(x, [1]) + 1

    gm = torch.fx.symbolic_trace(f)
    total, add = [n for n in gm.graph.nodes if n.op == "call_function"]
    x = FakeTensorMode().from_tensor(torch.randn(2, 3))
    with fake_prop.incremental():
        freezing_patterns.fake_tensor_prop(gm, [x], True)
        assert add.meta["val"].shape == (2,)
        total.args = (*total.args, True)  # keepdim
        freezing_patterns.fake_tensor_prop(gm, [x], True)
    assert total.meta["val"].shape == (2, 1)
    assert add.meta["val"].shape == (2, 1)
