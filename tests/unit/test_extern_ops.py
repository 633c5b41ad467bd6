"""The table of ops Inductor leaves to run time (shimgen/inductor/proxy_executor.py), read from a `wrapper.json` node:
each argument's place in the call's flattened arrays, counted in the order Inductor passes them (not the schema's),
schema defaults as literals, and outputs after the inputs. The runtime side is tested by building and calling such
graphs (tests/integration/test_custom_ops.py)."""

from __future__ import annotations

import pytest
import torch

from shimgen.errors import UserError
from shimgen.inductor import proxy_executor

torch.library.define(
    "shimgen_table_test::op",
    "(Tensor x, SymInt[] dims, Tensor?[] maybe, *, str mode='sum', float[] scales=[1.5, 2.0], Tensor? w=None) "
    "-> (Tensor, Tensor[])",
)


def _node(inputs: list[dict[str, object]], outputs: list[dict[str, object]]) -> dict[str, object]:
    return {"nodes": [{"node": {"target": "shimgen_table_test::op", "inputs": inputs, "outputs": outputs}}]}


def test_places_follow_inductors_order_and_defaults_are_literals() -> None:
    tensor = {"as_tensor": {"name": "buf"}}
    (node,) = proxy_executor.extern_nodes(
        _node(
            # w before x: the flattened tensors are w's, then x's, then maybe's present item.
            [
                {"name": "w", "arg": tensor},
                {"name": "x", "arg": tensor},
                {"name": "dims", "arg": {"as_sym_ints": [{"as_int": 3}, {"as_int": 4}]}},
                {"name": "maybe", "arg": {"as_optional_tensors": [{"as_none": True}, {"as_tensor": {"name": "m"}}]}},
            ],
            [tensor, {"as_tensors": [tensor, tensor]}],
        )
    )
    assert (node.name, node.overload, node.num_ints, node.num_tensors) == ("shimgen_table_test::op", "", 2, 6)
    assert list(node.args) == [
        "{.kind = shimgen::ExternArg::kTensor, .index = 1}",
        "{.kind = shimgen::ExternArg::kInts, .index = 0, .count = 2}",
        "{.kind = shimgen::ExternArg::kOptionalTensors, .index = 2, .count = 2, .flags = node0_0}",
        '{.kind = shimgen::ExternArg::kString, .text = "sum"}',
        "{.kind = shimgen::ExternArg::kFloats, .count = 2, .numbers = node0_1}",
        "{.kind = shimgen::ExternArg::kTensor, .index = 0}",
    ]
    assert list(node.arrays) == ["const bool node0_0[] = {false, true};", "const double node0_1[] = {1.5, 2.0};"]
    assert list(node.results) == [
        "{.kind = shimgen::ExternResult::kTensor, .index = 3}",
        "{.kind = shimgen::ExternResult::kTensors, .index = 4, .count = 2}",
    ]


@pytest.mark.parametrize(
    "inputs,outputs,message",
    [
        ([{"name": "nope", "arg": {"as_none": True}}], [], "passes an argument 'nope' its schema does not have"),
        ([], [], "passes no value for 'x', which has no default"),
    ],
)
def test_what_the_table_cannot_hold_is_refused_by_name(
    inputs: list[dict[str, object]], outputs: list[dict[str, object]], message: str
) -> None:
    with pytest.raises(UserError, match=message):
        proxy_executor.extern_nodes(_node(inputs, outputs))
