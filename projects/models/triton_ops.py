"""Custom ops written in Triton (torch.library.triton_op + wrap_triton): Inductor compiles their kernels into the
package like its own. One kernel's docstring holds triple quotes and backslashes, one is @triton.autotune'd."""

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton


@triton.jit
def scaled_add_kernel(x_ptr, y_ptr, out_ptr, alpha, n_elements, BLOCK: tl.constexpr):
    """out = x + alpha * y, elementwise.

    Quoting trouble for code generators: \"\"\" and a backslash, C:\\temp\\new.
    """
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x + alpha * y, mask=mask)


@triton_op("shimgen_triton::scaled_add", mutates_args={})
def scaled_add(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
    x, y = x.contiguous(), y.contiguous()
    out = torch.empty_like(x)
    n = x.numel()
    wrap_triton(scaled_add_kernel)[(triton.cdiv(n, 1024),)](x, y, out, alpha, n, BLOCK=1024)
    return out


@triton.autotune(
    configs=[
        triton.Config({"BLOCK": 256}, num_warps=2),
        triton.Config({"BLOCK": 1024}, num_warps=4),
        triton.Config({"BLOCK": 2048}, num_warps=8),
    ],
    key=["n_elements"],
)
@triton.jit
def relu_kernel(x_ptr, out_ptr, n_elements, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    tl.store(out_ptr + offsets, tl.maximum(tl.load(x_ptr + offsets, mask=mask), 0.0), mask=mask)


@triton_op("shimgen_triton::autotuned_relu", mutates_args={})
def autotuned_relu(x: torch.Tensor) -> torch.Tensor:
    x = x.contiguous()
    out = torch.empty_like(x)
    n = x.numel()
    wrap_triton(relu_kernel)[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, out, n)
    return out


class TritonMLP(torch.nn.Module):
    """Linear (a TMA GEMM with flags.tma) → scaled_add with the input → autotuned_relu → Linear."""

    def __init__(self, width: int = 256) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(width, width)
        self.fc2 = torch.nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.ops.shimgen_triton.scaled_add(self.fc1(x), x, 0.5)
        return self.fc2(torch.ops.shimgen_triton.autotuned_relu(h))
