"""User Triton kernels (torch.library.triton_op + wrap_triton) under AOTInductor: what shimgen mends or refuses.

Inductor compiles a user kernel like its own, from the kernel's source text, which it pastes into a '''...''' literal
of its autotuning script and into a /* */ comment of the C++ wrapper. torch before 2.13 doubles no backslashes there,
so a docstring holding \\"\\"\\" ends the literal early (SyntaxError, pytorch#155006): the text Inductor gets has its
docstrings and comments removed, and its backslashes doubled where this torch does not do it itself.

A kernel taking host-side TMA descriptors (TensorDescriptor.from_tensor) hides its tensors from the graph: torch up to
2.14 records them as constants, its mutation analysis fails, and the compiled kernel writes a buffer nobody reads
(wrong results, pytorch#155879, fixed by PR #193608). Such a kernel is refused, by name.
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
        stack.enter_context(mock.patch.object(hopifier, "call_HOP", _refusing_hidden_tensors(hopifier.call_HOP)))
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


def _refusing_hidden_tensors(original: Any) -> Any:
    # torch 2.14 added parameters after combined_args (launch_kwargs, kernel_arg_names): passed on as they come.
    def call_hop(self: Any, variable: Any, grids: Any, combined_args: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        hidden = [name for name, value in combined_args.items() if _hides_tensor(value)]
        if hidden:
            raise UserKernelError(
                f"Triton kernel {kernel_name(variable.kernel)}: its argument{'s' if len(hidden) > 1 else ''} {', '.join(hidden)} "
                "hold tensors the graph cannot see (host-side TensorDescriptor.from_tensor); this torch's AOTInductor compiles such a "
                "kernel to wrong results (pytorch#155879). Pass the tensors and build the descriptors in the kernel "
                "(tl.make_tensor_descriptor), or use flags.tma for Inductor's own TMA GEMMs"
            )
        return original(self, variable, grids, combined_args, *args, **kwargs)

    return call_hop


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
