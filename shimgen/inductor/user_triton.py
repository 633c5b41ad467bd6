"""User Triton kernels (torch.library.triton_op + wrap_triton) under AOTInductor: what shimgen mends or refuses.

Inductor compiles a user kernel like its own, from the kernel's source text, which it pastes into a '''...''' literal
of its autotuning script and into a /* */ comment of the C++ wrapper. torch before 2.13 doubles no backslashes there,
so a docstring holding \\"\\"\\" ends the literal early (SyntaxError, pytorch#155006): the text Inductor gets has its
docstrings and comments removed, and its backslashes doubled where this torch does not do it itself.

A kernel taking host-side TMA descriptors (TensorDescriptor.from_tensor) hides its tensors from the graph: torch up to
2.14 records the descriptors as constants outside torch.compile, its mutation analysis fails, and the compiled kernel
writes a buffer nobody reads (wrong results, pytorch#155879). shimgen hands the graph the descriptor's tensor instead,
with the metadata torch.compile's own tracing records for it (the block shape): the mutation analysis then sees the
tensor, and the wrapper builds the descriptor from it at each call. A descriptor that from_tensor would not make again
(other shape, strides or padding) is refused, by name.
"""

from __future__ import annotations

import ast
import inspect
import io
import tokenize
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any
from unittest import mock


class UserKernelError(Exception):
    """A user Triton kernel that AOTInductor would compile wrongly; the message names it."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message  # torch's FX interpreter appends its node and traceback to args[0] on the way out


@contextmanager
def guarded() -> Iterator[None]:
    """Around aoti_compile_and_package for a CUDA target."""
    from torch._higher_order_ops import triton_kernel_wrap
    from torch._inductor.codegen import wrapper

    source = "user_defined_triton_kernel_transitive_closure_source_code"
    hopifier = triton_kernel_wrap.TracingTritonHOPifier
    with ExitStack() as stack:
        stack.enter_context(
            mock.patch.object(wrapper, source, _embeddable(getattr(wrapper, source), doubles_backslashes(wrapper)))
        )
        stack.enter_context(mock.patch.object(hopifier, "call_HOP", _descriptors_as_tensors(hopifier.call_HOP)))
        yield


def doubles_backslashes(wrapper: Any) -> bool:
    """Whether this torch escapes backslashes in user kernel sources itself (pytorch#183433, torch 2.13)."""
    if hasattr(wrapper, "_escape_triton_kernel_source_for_wrapper"):
        return True
    return '.replace("\\\\", "\\\\\\\\")' in inspect.getsource(
        wrapper.PythonWrapperCodegen.define_user_defined_triton_kernel
    )


def _embeddable(original: Any, torch_doubles_backslashes: bool) -> Any:
    def source(kernel: Any, *args: Any, **kwargs: Any) -> str:
        text = without_docstrings_and_comments(original(kernel, *args, **kwargs))
        if "*/" in text:
            raise UserKernelError(
                f"Triton kernel {kernel_name(kernel)}: its code holds '*/', which AOTInductor cannot embed in C++"
            )
        return text if torch_doubles_backslashes else text.replace("\\", "\\\\")

    return source


def _descriptors_as_tensors(original: Any) -> Any:
    # torch 2.14 added parameters after combined_args (launch_kwargs, kernel_arg_names): passed on as they come.
    def call_hop(self: Any, variable: Any, grids: Any, combined_args: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        from torch._higher_order_ops import triton_kernel_wrap

        metadata = {}
        combined_args = dict(combined_args)
        for name, value in combined_args.items():
            if _is_stable_descriptor(value) and _made_by_from_tensor(value):
                combined_args[name] = value.base
                metadata[name] = triton_kernel_wrap.create_tma_stable_metadata(list(value.block_shape))
        hidden = [name for name, value in combined_args.items() if _hides_tensor(value)]
        if hidden:
            raise UserKernelError(
                f"Triton kernel {kernel_name(variable.kernel)}: its argument{'s' if len(hidden) > 1 else ''} "
                f"{', '.join(hidden)} hold tensors the graph cannot see. shimgen builds host-side descriptors made by "
                "TensorDescriptor.from_tensor(tensor, block_shape) (no other shape, strides or padding), from the "
                "tensor the graph passes; make them that way, or build them in the kernel (tl.make_tensor_descriptor)"
            )
        if not metadata:
            return original(self, variable, grids, combined_args, *args, **kwargs)
        hop = triton_kernel_wrap.triton_kernel_wrapper_mutation

        def with_descriptors(**hop_kwargs: Any) -> Any:
            tma = {**hop_kwargs.get("tma_descriptor_metadata", {}), **metadata}
            return hop(**{**hop_kwargs, "tma_descriptor_metadata": tma})

        # call_HOP calls the operator by its module's name; the operator itself stays as it is for everyone else.
        with mock.patch.object(triton_kernel_wrap, "triton_kernel_wrapper_mutation", with_descriptors):
            return original(self, variable, grids, combined_args, *args, **kwargs)

    return call_hop


def _is_stable_descriptor(value: Any) -> bool:
    return type(value).__name__ == "TensorDescriptor" and type(value).__module__.startswith("triton.")


def _made_by_from_tensor(descriptor: Any) -> bool:
    """Whether TensorDescriptor.from_tensor(base, block_shape) gives this descriptor again."""
    import torch
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    base = descriptor.base
    if not isinstance(base, torch.Tensor) or getattr(descriptor, "padding", "zero") != "zero":
        return False
    if len(descriptor.shape) != base.dim() or len(descriptor.strides) != base.dim():
        return False
    pairs = [*zip(descriptor.shape, base.shape, strict=True), *zip(descriptor.strides, base.stride(), strict=True)]
    return all(a is b or statically_known_true(a == b) for a, b in pairs)


def _hides_tensor(value: Any) -> bool:
    import torch

    if isinstance(value, torch.Tensor):
        return False
    if isinstance(value, (list, tuple)):
        return any(isinstance(v, torch.Tensor) or _hides_tensor(v) for v in value)
    return isinstance(getattr(value, "base", None), torch.Tensor)  # TensorDescriptor and Triton's TMA descriptor types


def kernel_name(kernel: Any) -> str:
    while hasattr(kernel, "fn"):  # Autotuner, Heuristics → JITFunction → the Python function
        kernel = kernel.fn
    return getattr(kernel, "__name__", repr(kernel))


def without_docstrings_and_comments(source: str) -> str:
    """`source` with each docstring replaced by `pass` and its `#` comments dropped; as it is if it does not parse."""
    try:
        tree = ast.parse(source)
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (SyntaxError, tokenize.TokenError):
        return source
    lines = source.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))

    def offset(lineno: int, column: int, byte_column: bool = False) -> int:
        if byte_column:  # ast columns count UTF-8 bytes
            column = len(lines[lineno - 1].encode()[:column].decode(errors="ignore"))
        return starts[lineno - 1] + column

    spans: list[tuple[int, int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                assert first.end_lineno is not None and first.end_col_offset is not None
                spans.append(
                    (
                        offset(first.lineno, first.col_offset, True),
                        offset(first.end_lineno, first.end_col_offset, True),
                        "pass",
                    )
                )
    spans += [(offset(*t.start), offset(*t.end), "") for t in tokens if t.type == tokenize.COMMENT]
    for begin, end, replacement in sorted(spans, reverse=True):
        source = source[:begin] + replacement + source[end:]
    return source
