"""Trace stage: a spec graph → torch.export ExportedProgram with the spec's dynamic dims, saved.

The model is wrapped so the exported program takes exactly the spec's inputs, positionally, in
spec order: the binding can hand them to AOTInductor as they come.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import keyword
import pickle
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shimgen.errors import SpecError
from shimgen.files import file_hash, shimgen_fingerprint, stage_key
from shimgen.inductor import internals, weights
from shimgen.results import (
    DICT,
    KEYWORD,
    LIST,
    NONE,
    OBJECT,
    POSITIONAL,
    SEQUENCE,
    TENSOR,
    TUPLE,
    UNFLATTEN,
    CustomOps,
    OutNode,
    OutType,
    TraceResult,
)
from shimgen.spec import Graph, Target
from shimgen.spec.model import build_fields
from shimgen.toolchain import Toolchain
from shimgen.trace import custom_ops, dims
from shimgen.trace.entry import call_model, describe, example_sizes, load_model, make_inputs, project_scope

_CONTAINERS: dict[type, int] = {tuple: TUPLE, list: LIST, dict: DICT}
AUTO_SIZES = 8  # sizes of a dim beyond what torch.export keeps in its dynamic range that become variants of their own


def trace_key(graph: Graph, target: Target, tc: Toolchain, spec_dir: Path, ops_key: str | None) -> str:
    """What a trace depends on besides the files it reads: the graph's spec, the files its `depends`
    globs match, the device, torch, the custom ops' schemas and fakes, and shimgen."""
    declared = sorted({p for pattern in graph.depends for p in spec_dir.glob(pattern) if p.is_file()})
    return stage_key(
        build_fields(graph),
        [(str(p.relative_to(spec_dir)), file_hash(p)) for p in declared],
        target.device,
        tc.torch_version,
        ops_key,
        shimgen_fingerprint(),
    )


def still_valid(traced: TraceResult, key: str) -> bool:
    return (
        traced.key == key
        and traced.program.is_file()
        and all(file_hash(Path(path)) == digest for path, digest in traced.reads)
    )


def trace(
    graph: Graph, where: str, spec_dir: Path, device: str, program_file: Path, key: str, ops: CustomOps | None = None
) -> TraceResult:
    """Export on `device` (Inductor generates kernels for the device the program's tensors are on) into `program_file`."""
    try:
        return _trace(graph, where, spec_dir, device, program_file, key)
    except SpecError as exc:
        better = custom_ops.explain_trace_failure(exc.message, ops) if ops else None
        if better:
            raise SpecError(exc.file, where, better) from None
        raise


def _trace(graph: Graph, where: str, spec_dir: Path, device: str, program_file: Path, key: str) -> TraceResult:
    import torch

    with project_scope(spec_dir) as reads:
        model = load_model(graph, where, spec_dir)
        if isinstance(model, torch.nn.Module):
            model = model.to(device)
        inputs = [t.to(device) for t in make_inputs(graph, example_sizes(graph), graph.seed)]
        initial = Saved(model_state(model))
        with torch.no_grad():
            try:
                eager = call_model(model, graph, inputs)
            except (Exception, SystemExit) as exc:
                shapes = ", ".join(f"{i.name}={tuple(t.shape)}" for i, t in zip(graph.inputs, inputs, strict=True))
                raise SpecError(
                    "",
                    f"{where}.inputs",
                    f"the model rejected the example inputs ({shapes}): {describe(exc, spec_dir)}",
                ) from None
            initial.restore()  # the program starts from the state the model had before any call
            out_nodes = _out_nodes(eager, spec_dir, where)
            adapter = _spec_order_module(model, graph)
            program, narrowed = _export_narrowing(adapter, model, inputs, graph, where, device, initial)
    num_outputs = sum(1 for n in out_nodes if n.kind == TENSOR)
    if program.call_spec.out_spec.num_leaves != num_outputs:
        raise SpecError(
            "", where, f"the traced model returns {program.call_spec.out_spec.num_leaves} tensors, eager {num_outputs}"
        )
    program_file.parent.mkdir(parents=True, exist_ok=True)
    torch.export.save(program, str(program_file))
    called = library_ops(program)
    return TraceResult(
        key=key,
        program=program_file,
        out_nodes=tuple(out_nodes),
        num_outputs=num_outputs,
        reads=tuple((str(p), file_hash(p)) for p in sorted(reads)),
        structure=stage_key(internals.saved_program_json(program_file).decode()),
        weights=weights_key(program),
        state=mutated_state(program),
        library_ops=called,
        kernel_sources=tuple((p, file_hash(Path(p))) for p in internals.triton_source_files(program, called)),
        op_modules=custom_ops.installed_op_modules(called),
        narrowed=tuple(narrowed),
    )


def _export_narrowing(
    adapter: Any, model: Any, inputs: list[Any], graph: Graph, where: str, device: str, initial: Saved
) -> tuple[Any, list[tuple[str, int, int, str]]]:
    """The exported program, and the dims whose sizes at an end of the range it leaves out: where torch.export cannot
    keep a dim's sizes below or above some bound inside the dynamic range (`x.shape[0] > 1`), the program takes the
    range up to that bound and each size beyond it becomes a variant of its own (dim, new min, new max, the condition),
    up to AUTO_SIZES per dim."""
    narrowed: list[tuple[str, int, int, str]] = []
    traced = graph
    while True:
        try:
            program = dims.export(adapter, inputs, traced, where)
            state_as_buffers(program)
            initial.restore()
            program_initial = Saved(program_state(program))
            dims.check_against_eager(
                program, model, traced, where, device, initial, program_initial, mutated_state(program)
            )
            program_initial.restore()
            initial.restore()
            without_cudnn_paths(program)  # after the check against eager, which takes cuDNN's path as the model does
            return program, narrowed
        except dims.RangeError as exc:
            initial.restore()
            dim = graph.dims.get(exc.dim)
            if dim is None or (exc.raised_min is None and exc.lowered_max is None):
                raise
            current = traced.dims[exc.dim]
            kept = dataclasses.replace(
                current,
                min=current.min if exc.raised_min is None else exc.raised_min,
                max=current.max if exc.lowered_max is None else exc.lowered_max,
            )
            if (kept.min - dim.min + dim.max - kept.max) // dim.multiple_of > AUTO_SIZES or (
                kept.example is not None and not kept.min <= kept.example <= kept.max
            ):
                raise
            narrowed.append((exc.dim, kept.min, kept.max, exc.condition))
            traced = dataclasses.replace(traced, dims={**traced.dims, exc.dim: kept})


def without_cudnn_paths(program: Any) -> None:
    """The program's `grid_sampler` (grid_sample's op) as what it computes on the CPU, `grid_sampler_2d` or `_3d` by
    the input's rank, in place. On CUDA torch takes it apart into cuDNN's sampler (bilinear, zeros padding, aligned
    corners: RAFT's correlation lookup), which Inductor cannot compile: it has no fake implementation."""
    import torch

    aten = torch.ops.aten
    nodes = [
        node for node in program.graph.nodes if node.op == "call_function" and node.target == aten.grid_sampler.default
    ]
    for node in nodes:
        rank = node.args[0].meta["val"].dim()
        node.target = aten.grid_sampler_2d.default if rank == 4 else aten.grid_sampler_3d.default
    if nodes:
        program.graph_module.recompile()


class Saved:
    """Tensors' values, to put back in place: the state a call may change (a running counter, a KV cache), so that eager
    and the traced program run from the same state and the program is saved with the state the model started with."""

    def __init__(self, tensors: dict[str, Any]) -> None:
        self.tensors = tensors
        self.values = {name: t.detach().clone() for name, t in tensors.items()}

    def restore(self) -> None:
        import torch

        with torch.no_grad():
            for name, t in self.tensors.items():
                t.copy_(self.values[name])


def model_state(model: Any) -> dict[str, Any]:
    """A model's buffers and plain tensor attributes (a static KV cache's position, say) by name: what a call may mutate."""
    import torch

    if not isinstance(model, torch.nn.Module):
        return {}
    state = dict(model.named_buffers())
    for prefix, module in model.named_modules():
        for attr, value in vars(module).items():
            if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter):
                state[f"{prefix}.{attr}" if prefix else attr] = value
    return state


def program_state(program: Any) -> dict[str, Any]:
    """An exported program's buffers and tensor constants by name (its parameters are never mutated)."""
    import torch

    buffers = set(program.graph_signature.buffers)
    return {
        name: t
        for name, t in {**program.state_dict, **program.constants}.items()
        if isinstance(t, torch.Tensor) and (name in buffers or name in program.constants)
    }


def state_as_buffers(program: Any) -> None:
    """In place: every tensor the program mutates is one of its buffers. torch.export lifts a tensor the model reaches
    through a plain Python object (transformers' StaticCache layers, whose tensors are also the model's buffers) as a
    constant, and Inductor refuses to compile a mutated constant ("mutating a non-functional tensor with a functional
    tensor is not allowed", AOTInductor too). A lifted constant that is a buffer's very tensor is read as that buffer;
    any
    other constant the program mutates becomes a buffer of its own."""
    from torch.export.graph_signature import InputKind, InputSpec

    signature = program.graph_signature
    placeholders = {node.name: node for node in program.graph.nodes if node.op == "placeholder"}
    buffers = {
        _tensor_identity(_value(program, spec.target)): spec
        for spec in signature.input_specs
        if spec.kind == InputKind.BUFFER
    }
    kept = []
    for spec in signature.input_specs:
        if spec.kind == InputKind.CONSTANT_TENSOR:
            same = buffers.get(_tensor_identity(program.constants[spec.target]))
            if same is not None:
                placeholders[spec.arg.name].replace_all_uses_with(placeholders[same.arg.name])
                program.graph.erase_node(placeholders[spec.arg.name])
                del program.constants[spec.target]
                continue
            if writes_into(placeholders[spec.arg.name]):
                program.state_dict[spec.target] = program.constants.pop(spec.target)
                spec = InputSpec(kind=InputKind.BUFFER, arg=spec.arg, target=spec.target, persistent=True)
        kept.append(spec)
    signature.input_specs[:] = kept
    program.graph_module.recompile()


def _value(program: Any, name: str) -> Any:
    return program.state_dict[name] if name in program.state_dict else program.constants[name]


def _tensor_identity(t: Any) -> tuple[Any, ...]:
    return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)


def mutated_state(program: Any) -> tuple[str, ...]:
    """The buffers and tensor constants the program writes into, by name: an op's argument its schema marks as written,
    on the tensor or on a view of it."""
    names = {
        spec.arg.name: spec.target
        for spec in program.graph_signature.input_specs
        if spec.target is not None and spec.kind.name in ("BUFFER", "CONSTANT_TENSOR")
    }
    return tuple(
        sorted(
            names[node.name]
            for node in program.graph.nodes
            if node.op == "placeholder" and node.name in names and writes_into(node)
        )
    )


def writes_into(node: Any) -> bool:
    """Whether an op writes into the graph node's tensor: an argument its schema marks as written, on the tensor or on a
    view of it."""
    for user in node.users:
        schema = internals.node_schema(user.target)
        if schema is None:
            continue
        for argument, value in zip(schema.arguments, user.args, strict=False):
            if value is not node or argument.alias_info is None:
                continue
            if argument.alias_info.is_write:
                return True
            if schema.returns and schema.returns[0].alias_info is not None and writes_into(user):  # a view of it
                return True
    return False


def library_ops(program: Any) -> tuple[str, ...]:
    """The ops outside torch's own (aten, prims) that the program calls, in any of its graphs: a custom op's kernel may
    be compiled from a source file the trace read (a triton_op's Triton kernel)."""
    names = set()
    for module in program.graph_module.modules():
        graph = getattr(module, "graph", None)
        for node in graph.nodes if graph is not None else ():
            schema = internals.node_schema(node.target)
            if schema is not None and schema.name.split("::")[0] not in ("aten", "prims"):
                names.add(schema.name)
    return tuple(sorted(names))


def weights_key(program: Any) -> str:
    """The values of the program's weights (parameters, buffers and tensor constants) by name."""
    import torch

    digest = hashlib.sha256()
    for name, value in sorted({**program.state_dict, **program.constants}.items()):
        if isinstance(value, torch.Tensor):
            digest.update(f"{name}\0{value.dtype}\0{tuple(value.shape)}\0".encode())
            digest.update(weights.tensor_bytes(value))
    return digest.hexdigest()


def _spec_order_module(model: Callable[..., Any], graph: Graph) -> Any:
    """An nn.Module taking the spec's inputs positionally in spec order and calling the model.

    It returns the output's tensors alone, flat: the binding rebuilds the structure from the
    OutNodes, and the exported program (saved, loaded and compiled without the model's modules)
    then holds no type of the model's own."""
    import torch

    class SpecOrderCall(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = (
                model  # a Module is registered as a submodule (weights.WEIGHT_PREFIX); a function stays an attribute
            )

        def forward(self, *tensors: torch.Tensor) -> Any:
            return output_tensors(call_model(self.model, graph, list(tensors)))

    return SpecOrderCall()


def output_tensors(output: Any) -> tuple[Any, ...]:
    """The output's tensors in pytree order: what the compiled model returns, flat."""
    return tuple(internals.tensor_leaves(output))


def _out_nodes(output: Any, spec_dir: Path, where: str) -> list[OutNode]:
    """The eager output's structure in preorder; each node of a type of its own says how it is rebuilt."""
    import torch

    nodes: list[OutNode] = []

    def visit(value: Any, key: str | int | None, path: str) -> None:
        if isinstance(value, torch.Tensor):
            nodes.append(OutNode(kind=TENSOR, arity=0, key=key))
            return
        if value is None:
            nodes.append(OutNode(kind=NONE, arity=0, key=key))
            return
        kind = _CONTAINERS.get(type(value), OBJECT)
        parts = node_parts(value)
        if parts is None:
            raise SpecError("", where, f"{path} is {type(value).__name__} {_short(value)}: {_leaf_advice(value)}")
        children, names = parts
        if kind == DICT:
            keys: list[Any] = list(value)
            bad = [k for k in keys if type(k) not in (str, int)]
            if bad:
                raise SpecError(
                    "",
                    where,
                    f"{path}: dict outputs need str or int keys, not {type(bad[0]).__name__} {_short(bad[0])}",
                )
        else:
            keys = list(names) if kind == OBJECT and names else [None] * len(children)
        out_type = describe_type(value, children, names, spec_dir) if kind == OBJECT else None
        nodes.append(OutNode(kind=kind, arity=len(children), key=key, type=out_type))
        for k, (child, child_key) in enumerate(zip(children, keys, strict=True)):
            visit(child, child_key, path + _step(kind, k, child_key))

    visit(output, None, "output")
    if not any(n.kind == TENSOR for n in nodes):
        raise SpecError("", where, "the output holds no tensor")
    return nodes


def _step(kind: int, index: int, key: str | int | None) -> str:
    if kind == DICT:
        return f"[{key!r}]"
    return f".{key}" if key is not None else f"[{index}]"


def _leaf_advice(value: Any) -> str:
    cls = type(value)
    if cls.__module__.startswith("transformers.") and cls.__name__.endswith("Cache"):
        return (
            f"torch.export returns a {cls.__name__} once transformers registers it: call "
            "transformers.integrations.executorch.register_dynamic_cache_export_support() where the model is built (the "
            "package then returns it too), or build the model with use_cache=False, or export it with transformers' "
            "static-cache recipe (TorchExportableModuleWithStaticCache, the KV cache kept as state in the package)"
        )
    if dataclasses.is_dataclass(value):
        return f"a dataclass in the output needs torch.export.register_dataclass({type(value).__name__}) where it is defined"
    return "outputs may hold tensors and None in any structure torch.export accepts, no other values (return it as a tensor)"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def node_parts(value: Any) -> tuple[list[Any], list[str] | None] | None:
    """A pytree node's children and, where the node names them, their names; None for a leaf."""
    node = internals.pytree_node(value)
    if node is None:
        return None
    children, _ = node.flatten(value)
    names: list[Any] = []
    if node.flatten_with_keys is not None:
        names = [internals.key_name(entry) for entry, _ in node.flatten_with_keys(value)[0]]
    if not _unique_strings(names, len(children)) and isinstance(value, tuple):
        names = list(
            getattr(type(value), "_fields", None) or getattr(type(value), "__match_args__", None) or ()
        )  # structseq
    return children, (names if _unique_strings(names, len(children)) else None)


def _unique_strings(names: list[Any], count: int) -> bool:
    return len(names) == count and all(isinstance(n, str) for n in names) and len(set(names)) == count


def describe_type(value: Any, children: list[Any], names: list[str] | None, spec_dir: Path) -> OutType:
    """How the binding rebuilds `value`'s node: the constructor call that gives back an equal node
    from its children, verified here on the eager output itself, and the fallback."""
    cls = type(value)
    out = OutType(
        module=cls.__module__,
        qualname=cls.__qualname__,
        fields=tuple(names) if names is not None else None,
        dropped=tuple(_dropped_fields(value, names)),
        construct=None,
        fallback=_fallback(value, names),
    )
    reason = _not_importable(cls, spec_dir)
    if reason:
        return dataclasses.replace(out, reason=reason)
    for how in [POSITIONAL, SEQUENCE, KEYWORD] if isinstance(value, tuple) else [KEYWORD, POSITIONAL]:
        if (how != KEYWORD or names is not None) and _rebuilds(value, children, out, how):
            return dataclasses.replace(out, construct=how)
    unflattened = _by_unflatten(value, children)
    if unflattened is not None:
        return dataclasses.replace(out, construct=UNFLATTEN, unflatten=unflattened[0], context=unflattened[1])
    return dataclasses.replace(
        out,
        reason="is not rebuilt from its fields by calling it, nor by an importable unflatten function of its "
        "pytree registration",
    )


def _by_unflatten(value: Any, children: list[Any]) -> tuple[str, str] | None:
    """("module:qualname", pickled context) where the type's pytree registration unflattens with a function the package
    can import by name and a context that pickles, and that rebuilds this very node (transformers' DynamicCache)."""
    node = internals.pytree_node(value)
    if node is None:
        return None
    fn = node.unflatten
    module = sys.modules.get(getattr(fn, "__module__", "") or "")
    found: Any = module
    for part in getattr(fn, "__qualname__", "<lambda>").split("."):
        found = getattr(found, part, None)
    if module is None or found is not fn:
        return None
    _, context = node.flatten(value)
    try:
        pickled = pickle.dumps(context)
        rebuilt = fn(list(children), pickle.loads(pickled))
        got, got_context = node.flatten(rebuilt)
    except Exception:
        return None
    same = (
        type(rebuilt) is type(value)
        and len(got) == len(children)
        and all(a is b for a, b in zip(got, children, strict=True))
    )
    return (
        (f"{fn.__module__}:{fn.__qualname__}", base64.b64encode(pickled).decode())
        if same and got_context == context
        else None
    )


def _dropped_fields(value: Any, names: list[str] | None) -> list[str]:
    """A dataclass's fields that are None and not among the node's children (register_dataclass
    keeps them aside): its constructor may need them."""
    if names is None or not dataclasses.is_dataclass(value):
        return []
    return [
        f.name
        for f in dataclasses.fields(value)
        if f.init and f.name not in names and getattr(value, f.name, 0) is None
    ]


def _fallback(value: Any, names: list[str] | None) -> str:
    if names is None:
        return "tuple"
    # What collections.namedtuple accepts: identifiers, no keywords, fields not starting with '_'.
    valid = all(n.isidentifier() and not keyword.iskeyword(n) for n in [type(value).__name__, *names])
    return "namedtuple" if isinstance(value, tuple) and valid and not any(n.startswith("_") for n in names) else "dict"


def _not_importable(cls: type, spec_dir: Path) -> str:
    """Why the package never imports `cls` at run time; empty when it does."""
    module = sys.modules.get(cls.__module__)
    file = getattr(module, "__file__", None)
    path = Path(file).resolve() if file else None
    # A virtual environment inside the project holds installed libraries, not the project's code.
    if path and path.is_relative_to(spec_dir.resolve()) and not {"site-packages", "dist-packages"} & set(path.parts):
        return "is defined in the project, which the package does not import"
    found: Any = module
    for part in cls.__qualname__.split("."):
        found = getattr(found, part, None)
    if module is None or cls.__module__ == "__main__" or found is not cls:
        return "cannot be imported by its name"
    return ""


def _rebuilds(value: Any, children: list[Any], out: OutType, how: str) -> bool:
    """Whether calling the type as `how` says gives back the same pytree node: same type, same
    context, the very same children."""
    cls = type(value)
    try:
        if how == POSITIONAL:
            rebuilt = cls(*children)
        elif how == SEQUENCE:
            rebuilt = cls(tuple(children))
        else:
            rebuilt = cls(**dict(zip(out.fields or (), children, strict=True)), **dict.fromkeys(out.dropped))
        if type(rebuilt) is not cls:
            return False
        node = internals.pytree_node(value)
        if node is None:
            return False
        (got, got_context), (want, want_context) = node.flatten(rebuilt), node.flatten(value)
        return (
            len(got) == len(want)
            and all(a is b for a, b in zip(got, want, strict=True))
            and bool(got_context == want_context)
        )
    except Exception:
        return False
