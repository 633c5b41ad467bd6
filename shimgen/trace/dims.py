"""Dynamic dims at trace time: export so that each declared [min, max] holds as a whole, and say in
the spec's own terms what to change when a model cannot take some of those sizes.

torch.export specializes sizes 0 and 1 and then rejects ranges that touch them (a slice `b[:, 1:]`
of a dim that starts at 2 yields a size that could be 1). Backed size-oblivious tracing treats such
sizes like any other, so the declared range holds; what a model truly needs (a maximum, a multiple)
still comes back from torch as a guard, which is translated here.
"""

from __future__ import annotations

import ast
import linecache
import operator
import re
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from shimgen.errors import SpecError
from shimgen.inductor import internals
from shimgen.inductor.weights import WEIGHT_PREFIX
from shimgen.spec import Dim, Graph
from shimgen.tolerance import difference
from shimgen.trace.entry import call_model, example_sizes, make_inputs

_SIZE = re.compile(r"(?:L\['tensors'\]\[|\btensors_)(\d+)\]?\.size\(\)\[(\d+)\]")
_BOUND = re.compile(r"^\(?(\w+)\.shape\[(\d+)\]\)? (!=|>=|<=|>|<) (\d+)$")
_REVERSED_BOUND = re.compile(r"^(\d+) (!=|>=|<=|>|<) (\(?\w+\.shape\[\d+\]\)?)$")
_MIRRORED = {"!=": "!=", ">=": "<=", "<=": ">=", ">": "<", "<": ">"}
_VIOLATION = re.compile(r"Not all values of (\w+) = .*? satisfy the generated guard (.*?)\.?$", re.M)
_DIM_FIX = re.compile(r"^\s*(\w+) = Dim\('\w+'((?:, (?:min|max)=\d+)*)\)\s*$", re.M)
_MULTIPLE_FIX = re.compile(r"^\s*(\w+) = (\d+)\*(\w+)\s*$", re.M)
_GUARD_FAILED = re.compile(r"Guard failed: (.*?)\.?$", re.M)
_EQUAL_FIX = re.compile(r"^\s*(\w+) = (\w+)\s*$", re.M)
# torch appends its next message to a violation's guard without a line break
_GLUED = re.compile(r"\.?(?:Specializations unexpectedly required|Constraints violated) \(.*$")
# where torch.export met a branch or loop on a tensor's values: the user's call, then its line of code
_RAISED_AT = re.compile(r"The following call raised this error:\n\s*File \"(.*?)\", line (\d+), in \w+\n\s*(.*)")
_SYMBOL = re.compile(r"\bs\d+\b")  # a size's symbol in sympy's conditions
_MADE_CONSTANT = re.compile(r"You marked (\w+) as dynamic but your code specialized it to be a constant \((\d+)\)")


def export_dims(graph: Graph) -> dict[str, Any]:
    """torch.export Dims for the spec's dims; a dim with `multiple_of = k` is k times a Dim of its own. A dim of one
    size (the range a narrowing left: [1, 2] without 1) gets none: the program takes that size alone."""
    import torch

    dims: dict[str, Any] = {}
    for name, d in graph.dims.items():
        if d.min == d.max:
            continue
        if d.multiple_of == 1:
            dims[name] = torch.export.Dim(name, min=d.min, max=d.max)
        else:
            base = torch.export.Dim(
                f"{name}_over_{d.multiple_of}", min=d.min // d.multiple_of, max=d.max // d.multiple_of
            )
            dims[name] = d.multiple_of * base
    return dims


def export(module: Any, inputs: list[Any], graph: Graph, where: str) -> Any:
    """torch.export.export with the spec's dynamic dims, each range held whole (backed size-oblivious).

    Where torch cannot prove a condition the code depends on (`(3*b - 1) // b == 2` of a batch concatenated and
    chunked again), though every size of the range meets it, the dim is exported again as a hint of the same range,
    under which torch keeps the condition without proving it; the program must then take the whole range. Where that
    export finds conditions on other dims (torch stopped at the first dim's before: Mamba-2's batch != 1 behind its
    sequence's chunk count), those are reported instead: a bound among them narrows the range (`RangeError`).

    A program is returned only where each condition it checks at a call holds over the whole range: torch keeps some
    unproven (`target > 1` of a range from 1, held size-oblivious; Bamba's `pad_size > 0` on CUDA)."""
    with internals.guard_sites() as sites:  # where the model's code made each condition, for the errors below
        program = _export_whole_ranges(module, inputs, graph, where, sites)
        unmet = _unmet_guard(program, graph)
        if unmet is not None:
            raise _condition_error(*unmet, graph, where, sites)
        return program


def _export_whole_ranges(
    module: Any, inputs: list[Any], graph: Graph, where: str, sites: list[tuple[str, str, int]]
) -> Any:
    import torch

    dims = export_dims(graph)
    try:
        return _export(module, inputs, graph, dims)
    except Exception as exc:
        reported = exc
        proven = _met_throughout(str(exc), graph)
        if proven:
            try:
                hinted = {n: torch.export.Dim.DYNAMIC(min=graph.dims[n].min, max=graph.dims[n].max) for n in proven}
                program = _export(module, inputs, graph, {**dims, **hinted})
            except Exception as hinted_exc:
                program = None
                if {_spec_dim(exported) for exported, _ in _VIOLATION.findall(str(hinted_exc))} - proven:
                    reported = hinted_exc
            if program is not None and _takes_every_range(program, graph):
                return program
        raise _spec_error(reported, graph, where, module, sites) from None


def _export(module: Any, inputs: list[Any], graph: Graph, dims: dict[str, Any]) -> Any:
    import torch

    dynamic = tuple({k: dims[s] for k, s in enumerate(inp.shape) if s in dims} for inp in graph.inputs)
    with internals.backed_size_oblivious(), internals.slices_sized_by_min_max(), internals.partial_graph_unprinted():
        return torch.export.export(module, tuple(inputs), dynamic_shapes=(dynamic,))


def _met_throughout(text: str, graph: Graph) -> set[str]:
    """The dims of torch's unproven conditions where each condition is met at every size of its dim's range; none
    unless all of them are."""
    violations = _VIOLATION.findall(text)
    names = {_spec_dim(exported) for exported, _ in violations}
    if not violations or not names <= graph.dims.keys() or any(graph.dims[n].multiple_of != 1 for n in names):
        return set()
    if all(_holds_throughout(_GLUED.sub("", guard), graph, _spec_dim(exported)) for exported, guard in violations):
        return names
    return set()


def _takes_every_range(program: Any, graph: Graph) -> bool:
    ranges = internals.input_size_ranges(program)
    for i, inp in enumerate(graph.inputs):
        for axis, size in enumerate(inp.shape):
            if isinstance(size, str) and ranges.get((i, axis)) != (graph.dims[size].min, graph.dims[size].max):
                return False
    return True


def _unmet_guard(program: Any, graph: Graph) -> tuple[str, str, list[int]] | None:
    """A condition the program checks at each call that some sizes of its dim's range do not meet (torch's
    condition, the dim, those sizes); None where every size meets each."""
    for raw in internals.program_guards(program):
        refs = _SIZE.findall(raw)
        name = _dim_at(graph, graph.inputs[int(refs[0][0])].name, int(refs[0][1])) if refs else None
        sizes = _sizes_not_meeting(raw, graph, name) if name else None
        if name and sizes:
            return raw, name, sizes
    return None


def _condition_error(
    raw: str,
    name: str,
    sizes: list[int] | None,
    graph: Graph,
    where: str,
    sites: list[tuple[str, str, int]] | None,
    text: str = "",
) -> RangeError:
    """The range error for torch's condition `raw` on the dim `name`, not met at `sizes`: the condition in the spec's
    terms, the sizes, the model's line where `sites` has it, and the spec line that fixes it where torch or the
    condition says."""
    guard = _readable(raw, graph)
    fix = _suggested_fix(text, name, graph) or _bound_fix(guard, graph)
    at = _site(sites, _same_condition(raw, graph, name)) if sizes and sites else ""
    return range_error(graph, where, name, guard + _not_met_at(sizes, graph, name) + at, fix)


def _at(file: str, line: int) -> str:
    """` at <file>:<line> (`<code>`)`: where in the model's code, as the messages say it."""
    return f" at {file}:{line} (`{linecache.getline(file, line).strip()}`)"


def _site(sites: list[tuple[str, str, int]], matches: Callable[[str], object]) -> str:
    """`_at` the first of `sites` whose condition `matches`; "" where none does."""
    return next((_at(file, line) for condition, file, line in sites if matches(condition)), "")


def _same_condition(guard: str, graph: Graph, name: str) -> Callable[[str], bool]:
    """Whether a traced condition (sympy's, on one symbol: `s77 <= 3`, `Ne(s77, 1)`, `Eq(8*s77, 16*((s77//2)))`) is
    one of the conjuncts of torch's `guard` (on sources: `2 <= L['tensors'][0].size()[0] and ...`): false at the same
    sizes of the dim `name`'s range."""
    failing = [_sizes_not_meeting(part, graph, name) for part in guard.split(" and ")]
    wanted = [sizes for sizes in failing if sizes]

    def matches(condition: str) -> bool:
        if len(set(_SYMBOL.findall(condition))) != 1:
            return False
        try:
            tree = ast.parse(_SYMBOL.sub("size", condition), mode="eval").body
            if all(_evaluate(tree, sizes[0]) is True for sizes in wanted):  # most conditions hold at a failing size
                return False
            return [size for size in _sizes(graph.dims[name]) if _evaluate(tree, size) is not True] in wanted
        except (SyntaxError, ValueError, ZeroDivisionError, TypeError):
            return False

    return matches


def _spec_error(
    exc: Exception,
    graph: Graph,
    where: str,
    module: Any = None,
    sites: list[tuple[str, str, int]] | None = None,
) -> SpecError:
    """What torch's export error says of the spec, with the model's line that made the condition where `sites`
    (internals.guard_sites) has it."""
    text = str(exc)
    violations = _VIOLATION.findall(text)
    name = _spec_dim(violations[0][0]) if violations else ""
    if name not in graph.dims:
        return (
            _made_constant(text, graph, where, sites)
            or _data_dependent(exc, module, where)
            or SpecError("", where, f"torch.export failed: {_first_lines(exc, graph)}")
        )
    failing = {raw: _sizes_not_meeting(raw, graph, name) for raw in _guards_of(violations, name)}
    # a condition some sizes fail, else one that could not be evaluated, else one every size meets
    raw = min(failing, key=lambda raw: 0 if failing[raw] else 1 if failing[raw] is None else 2)
    guard = _readable(raw, graph)
    if failing[raw] == []:
        dim = graph.dims[name]
        return SpecError(
            "",
            f"{where}.dims.{name}",
            f"torch.export cannot prove that every size of '{name}' in [{dim.min}, {dim.max}] meets {guard}, a "
            f"condition the model's code depends on, though each of them does (torch does not simplify such size "
            f"arithmetic over a range). Give '{name}' a fixed size: write the number in the inputs' shapes instead of "
            f"'{name}' (one graph for each size you need), or change the model",
        )
    return _condition_error(raw, name, failing[raw], graph, where, sites, text)


def _not_met_at(sizes: list[int] | None, graph: Graph, name: str) -> str:
    """` (not met at seq = 16, 32)`, where a few sizes of the range fail the condition."""
    if not sizes or len(sizes) > _MOST_SIZES_SHOWN or len(sizes) == len(_sizes(graph.dims[name])):
        return ""
    return f" (not met at {name} = {', '.join(map(str, sizes))})"


def _guards_of(violations: list[tuple[str, str]], name: str) -> list[str]:
    """torch's violated conditions on the spec's dim `name`, in its order, without what torch glues to them."""
    return [_GLUED.sub("", guard) for exported, guard in violations if _spec_dim(exported) == name]


def _data_dependent(exc: Exception, module: Any, where: str) -> SpecError | None:
    """A branch, loop or size that depends on a tensor's values, which one exported program cannot hold: where it is in
    the model's code, without torch's advice to its own developers."""
    if not any(t.__name__ == "GuardOnDataDependentSymNode" for t in type(exc).__mro__):
        return None
    found = _RAISED_AT.search(str(exc))
    raised = (found[1], int(found[2])) if found else internals.raised_in_model(exc)
    at = _at(*raised) if raised else ""
    model = getattr(module, "model", module)  # the user's, inside the module that takes the spec's inputs
    refused = ""
    if getattr(type(model), "_can_compile_fullgraph", None) is False:
        refused = f" transformers marks {type(model).__name__} as not compilable as one graph, for this reason."
    return SpecError(
        "",
        where,
        f"torch.export cannot trace the model: its code{at} branches, loops or sizes a tensor on values the inputs "
        f"compute (torch: {str(exc).splitlines()[0].strip()}), and an exported program is one sequence of operations "
        f"for every input.{refused} Rewrite that code without control flow on tensor values (masks, torch.where, "
        "torch.cond)",
    )


_ARITHMETIC: dict[type, Callable[..., Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.USub: operator.neg,
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}
_MOST_SIZES_TRIED = 100_000
_MOST_SIZES_SHOWN = 6
_CALLS: dict[str, Callable[..., Any]] = {
    "min": min,
    "max": max,
    "torch.sym_min": min,
    "torch.sym_max": max,
    # sympy's, in the conditions torch's guard log has
    "Min": min,
    "Max": max,
    "Eq": operator.eq,
    "Ne": operator.ne,
    "Mod": operator.mod,
    "PythonMod": operator.mod,
    "FloorDiv": operator.floordiv,
}

# what `_evaluate` takes, for eval(): no builtins, sympy's names, torch.sym_min and sym_max
_NAMES: dict[str, Any] = {
    "__builtins__": {},
    "torch": SimpleNamespace(sym_min=min, sym_max=max),
    **{name: call for name, call in _CALLS.items() if "." not in name},
}


def _holds_throughout(guard: str, graph: Graph, name: str) -> bool:
    """Whether torch's `guard`, integer arithmetic over sizes of the dim `name` alone, is true at every size of its
    declared range."""
    return _sizes_not_meeting(guard, graph, name) == []


def _sizes_not_meeting(guard: str, graph: Graph, name: str) -> list[int] | None:
    """The sizes of the dim `name`'s declared range at which torch's `guard` is false; None where the guard is not
    integer arithmetic over sizes of that dim alone."""
    refs = _SIZE.findall(guard)
    if not refs or any(_dim_at(graph, graph.inputs[int(i)].name, int(axis)) != name for i, axis in refs):
        return None
    sizes = _sizes(graph.dims[name])
    if len(sizes) > _MOST_SIZES_TRIED:
        return None
    try:
        tree = ast.parse(_SIZE.sub("size", guard), mode="eval")
        _evaluate(tree.body, sizes[0])  # ValueError for anything but size arithmetic
        code = compile(tree, "<guard>", "eval")  # then Python's own evaluation: a range can have many sizes
        return [size for size in sizes if eval(code, _NAMES, {"size": size}) is not True]
    except (SyntaxError, ValueError, ZeroDivisionError, IndexError):
        return None


def _sizes(dim: Dim) -> range:
    return range(-(-dim.min // dim.multiple_of) * dim.multiple_of, dim.max + 1, dim.multiple_of)


def _evaluate(node: ast.expr, size: int) -> Any:
    """`node` of a size guard at `size`: integers, `size`, arithmetic, min and max (sympy's Min, Max, Mod, FloorDiv,
    Eq and Ne too), one comparison, and/or of comparisons; ValueError for anything else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.Name) and node.id == "size":
        return size
    if isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:
        return _ARITHMETIC[type(node.op)](_evaluate(node.left, size), _evaluate(node.right, size))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _ARITHMETIC:
        return _ARITHMETIC[type(node.op)](_evaluate(node.operand, size))
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _ARITHMETIC:
        left, right = _evaluate(node.left, size), _evaluate(node.comparators[0], size)
        return _ARITHMETIC[type(node.ops[0])](left, right)
    if isinstance(node, ast.BoolOp):
        values = [_evaluate(value, size) for value in node.values]
        if all(isinstance(value, bool) for value in values):
            return any(values) if isinstance(node.op, ast.Or) else all(values)
    if isinstance(node, ast.Call) and not node.keywords and ast.unparse(node.func) in _CALLS:
        return _CALLS[ast.unparse(node.func)](*(_evaluate(arg, size) for arg in node.args))
    raise ValueError(ast.dump(node))


def _spec_dim(exported: str) -> str:
    """The spec's dim of a torch.export Dim (`export_dims` names a multiple_of dim's base `<dim>_over_<k>`)."""
    return re.sub(r"_over_\d+$", "", exported)


def _made_constant(
    text: str, graph: Graph, where: str, sites: list[tuple[str, str, int]] | None = None
) -> SpecError | None:
    """A dim that the model's code turned into the size it was traced at: no range of it can be dynamic. Traced at one
    end of its range, the other sizes can still be variants of their own (a RangeError narrowing the range to it):
    torch also says so where a condition such as `batch != 1` leaves one size of a range [1, 2]."""
    found = _MADE_CONSTANT.search(text)
    name = _spec_dim(found[1]) if found else ""
    if not found or name not in graph.dims:
        return None
    size, dim = int(found[2]), graph.dims[name]
    fixed = re.compile(rf"Eq\((s\d+, {size}|{size}, s\d+)\)")
    at = _site(sites, fixed.fullmatch) if sites else ""
    return RangeError(
        "",
        f"{where}.dims.{name}",
        f"the model's code fixes '{name}' at the size it was traced at ({size}){at}, so it cannot be dynamic: its "
        f"code depends on that size's value (a Python loop over it, len() of a tensor, say). Give '{name}' a fixed "
        f"size: write the number in the inputs' shapes instead of '{name}' (one graph for each size you need), or "
        "change the model",
        name,
        f"{name} = {size}{at}",
        size if size == dim.max > dim.min else None,
        size if size == dim.min < dim.max else None,
    )


class RangeError(SpecError):
    """A dim whose declared range the model cannot take as a whole: the condition it needs, and the part of the range
    that meets it where only sizes at its ends fail (`raised_min`, `lowered_max`: the build makes the sizes outside
    variants of their own)."""

    def __init__(
        self,
        file: str,
        where: str,
        message: str,
        dim: str = "",
        condition: str = "",
        raised_min: int | None = None,
        lowered_max: int | None = None,
    ) -> None:
        super().__init__(file, where, message)
        self.dim, self.condition, self.raised_min, self.lowered_max = dim, condition, raised_min, lowered_max

    def __reduce__(  # type: ignore[override]
        self,
    ) -> tuple[type[RangeError], tuple[str, str, str, str, str, int | None, int | None]]:
        return RangeError, (
            self.file,
            self.where,
            self.message,
            self.dim,
            self.condition,
            self.raised_min,
            self.lowered_max,
        )


_RANGE_FIX = re.compile(r"^dims\.(\w+) = \{ min = (\d+), max = (\d+)(?:, multiple_of = (\d+))? \}$")


def range_error(graph: Graph, where: str, name: str, condition: str, fix: str) -> RangeError:
    """The spec error for a dim whose declared range the model cannot take as a whole."""
    dim = graph.dims[name]
    need = f"; write {fix}" if fix else "; narrow the range, or change the model so that it takes every size in it"
    found = _RANGE_FIX.match(fix)
    low, high = (int(found[2]), int(found[3])) if found else (dim.min, dim.max)
    narrows = found is not None and found[1] == name and int(found[4] or 1) == dim.multiple_of and low <= high
    return RangeError(
        "",
        f"{where}.dims.{name}",
        f"the model cannot take every size of '{name}' in [{dim.min}, {dim.max}]: it needs {condition}{need}",
        name,
        condition,
        low if narrows and dim.min < low <= dim.max else None,
        high if narrows and dim.min <= high < dim.max else None,
    )


def _bound_fix(condition: str, graph: Graph) -> str:
    """For a plain bound such as `x.shape[0] != 1`: the spec line of the range that satisfies it."""
    match = _BOUND.match(condition)
    if not match:
        return ""
    name = _dim_at(graph, match[1], int(match[2]))
    if name is None:
        return ""
    dim, op, value = graph.dims[name], match[3], int(match[4])
    low, high = dim.min, dim.max
    if op == "!=" and value == low:
        low += 1
    elif op == "!=" and value == high:
        high -= 1
    elif op in (">", ">="):
        low = max(low, value + (op == ">"))
    elif op in ("<", "<="):
        high = min(high, value - (op == "<"))
    else:
        return ""
    step = dim.multiple_of
    low, high = -(-low // step) * step, high // step * step
    if low > high:
        return ""
    extra = f", multiple_of = {step}" if step > 1 else ""
    return f"dims.{name} = {{ min = {low}, max = {high}{extra} }}"


def _dim_at(graph: Graph, input_name: str, axis: int) -> str | None:
    for inp in graph.inputs:
        if inp.name == input_name and axis < len(inp.shape) and isinstance(inp.shape[axis], str):
            return str(inp.shape[axis])
    return None


def _suggested_fix(text: str, name: str, graph: Graph) -> str:
    """torch's 'Suggested fixes' for `name`, as the spec line that says the same."""
    fixes = text.partition("Suggested fixes:")[2]
    dim = graph.dims[name]
    bounds = {m[0]: dict(kv.split("=") for kv in m[1].strip(", ").split(", ") if kv) for m in _DIM_FIX.findall(fixes)}
    for target, factor, base in _MULTIPLE_FIX.findall(fixes):
        if target == name:
            k = int(factor) * dim.multiple_of
            low, high = bounds.get(base, {}).get("min"), bounds.get(base, {}).get("max")
            new_min = int(low) * int(factor) if low else -(-dim.min // k) * k
            new_max = int(high) * int(factor) if high else dim.max // k * k
            return f"dims.{name} = {{ min = {max(new_min, k)}, max = {new_max}, multiple_of = {k} }}"
    if name in bounds:
        new_min = int(bounds[name].get("min", dim.min))
        new_max = int(bounds[name].get("max", dim.max))
        if (new_min, new_max) == (dim.min, dim.max):  # torch leaves out a min of 2, its own default
            return ""
        extra = f", multiple_of = {dim.multiple_of}" if dim.multiple_of > 1 else ""
        return f"dims.{name} = {{ min = {new_min}, max = {new_max}{extra} }}"
    for target, other in _EQUAL_FIX.findall(fixes):
        if target == name and other in graph.dims:
            return f"one dim for both: '{name}' and '{other}' must always be equal"
    return ""


def _readable(guard: str, graph: Graph) -> str:
    """Torch's `L['tensors'][0].size()[1]` as `x.shape[1]`, the spec's input name, and a bound with the size first
    (`1 != x.shape[0]` as `x.shape[0] != 1`)."""
    readable = _SIZE.sub(lambda m: f"{graph.inputs[int(m[1])].name}.shape[{m[2]}]", guard.strip())
    reversed_bound = _REVERSED_BOUND.match(readable)
    if reversed_bound:
        return f"{reversed_bound[3]} {_MIRRORED[reversed_bound[2]]} {reversed_bound[1]}"
    return readable


def _first_lines(exc: Exception, graph: Graph) -> str:
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    useful = [
        _readable(line, graph)
        for line in lines
        if not line.startswith(("For more information", "The error above occurred"))
    ]
    text = "\n  ".join(useful[:8])
    return f"{type(exc).__name__}: {text}" + ("\n  ..." if len(useful) > 8 else "")


def check_against_eager(
    program: Any,
    model: Any,
    graph: Graph,
    where: str,
    device: str,
    model_initial: Any,
    program_initial: Any,
    mutated: tuple[str, ...],
) -> None:
    """Run the exported program with every dim at its min (a graph without dims: at its sizes) and compare with eager,
    both from their initial state (`*_initial`: trace.Saved), outputs and the `mutated` state alike.

    Sizes 0 and 1 are where tracing has to assume the most (broadcasting, squeezes); a model that computes something
    else there must fail the build, not answer wrongly at run time. A model can also compute otherwise whenever it is
    traced (code that asks whether it is being exported, as transformers 5.17's UMT5 decoder, causal only then): the
    package would then differ from eager at every size."""

    sizes = {name: d.min for name, d in graph.dims.items()}
    label = ", ".join(f"{name}={size}" for name, size in sizes.items())
    try:
        found = _differs(program, model, graph, sizes, device, model_initial, program_initial, mutated)
    except _ProgramFailed as failed:
        exc = failed.error
        if not graph.dims:
            raise SpecError("", where, f"the traced model fails where eager runs: {_first_lines(exc, graph)}") from None
        guard = _GUARD_FAILED.search(str(exc))
        condition = _readable(guard[1], graph) if guard else ""
        bound = _BOUND.match(condition)
        name = _dim_at(graph, bound[1], int(bound[2])) if bound else None
        if name is not None:
            raise range_error(graph, where, name, condition, _bound_fix(condition, graph)) from None
        raise SpecError(
            "",
            f"{where}.dims",
            f"the traced model fails at the smallest sizes ({label}): {_first_lines(exc, graph)}; raise the dims' min",
        ) from None
    if found is None:
        return
    unsteady = _eager_unsteady(model, graph, sizes, device, model_initial)
    if unsteady is not None:
        raise SpecError(
            "",
            where,
            f"the model's output {unsteady} differs between two eager calls on the same inputs and state (a random op "
            "in its forward?): a build checks its package against the model, which must compute the same at each call",
        )
    if graph.dims and _agrees(
        program, model, graph, example_sizes(graph), device, model_initial, program_initial, mutated
    ):
        raise SpecError(
            "",
            f"{where}.dims",
            f"at the smallest sizes ({label}) {found}: the model behaves differently there than at the example sizes; "
            "raise the dims' min (or atol and rtol, where the difference is rounding)",
        )
    raise SpecError(
        "",
        where,
        f"{'at the example sizes ' if graph.dims else ''}{found}: the model computes otherwise when torch.export "
        "traces it than when it runs (code that asks whether it is being traced or exported takes another path), so "
        "a package would differ from eager at every size; raise atol and rtol where the difference is rounding",
    )


def _eager_unsteady(model: Any, graph: Graph, sizes: dict[str, int], device: str, model_initial: Any) -> int | None:
    """The first output that two eager calls from the initial state give differently at `sizes`; None."""
    import torch

    inputs = [t.to(device) for t in make_inputs(graph, sizes, graph.seed)]
    calls = []
    with torch.no_grad():
        for _ in range(2):
            model_initial.restore()
            calls.append(internals.tensor_leaves(call_model(model, graph, inputs)))
    first, second = calls
    if len(first) != len(second):
        return min(len(first), len(second))
    pairs = enumerate(zip(first, second, strict=True))
    return next((k for k, (a, b) in pairs if a.shape != b.shape or difference(graph, a, b)), None)


def _agrees(
    program: Any,
    model: Any,
    graph: Graph,
    sizes: dict[str, int],
    device: str,
    model_initial: Any,
    program_initial: Any,
    mutated: tuple[str, ...],
) -> bool:
    try:
        return _differs(program, model, graph, sizes, device, model_initial, program_initial, mutated) is None
    except _ProgramFailed:
        return False


class _ProgramFailed(Exception):
    """The exported program raised `error` where eager ran."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


def _differs(
    program: Any,
    model: Any,
    graph: Graph,
    sizes: dict[str, int],
    device: str,
    model_initial: Any,
    program_initial: Any,
    mutated: tuple[str, ...],
) -> str | None:
    """How the program's outputs (or the `mutated` state it leaves) differ from eager's at `sizes`, both run from
    their initial state: "the traced model's output 0 differs from eager (...)"; None where they agree."""
    import torch

    inputs = [t.to(device) for t in make_inputs(graph, sizes, graph.seed)]
    with torch.no_grad():
        model_initial.restore()
        want = internals.tensor_leaves(call_model(model, graph, inputs))
        program_initial.restore()
        try:
            got = internals.tree_leaves(program.module()(*inputs))
        except Exception as exc:
            raise _ProgramFailed(exc) from exc
    if len(want) != len(got):
        return f"the traced model returns {len(got)} tensors, eager {len(want)}"
    for k, (w, g) in enumerate(zip(want, got, strict=True)):
        how = f"shape {list(g.shape)}, eager's {list(w.shape)}" if w.shape != g.shape else difference(graph, w, g)
        if how:
            return f"the traced model's output {k} differs from eager ({how})"
    eager_state = model_initial.tensors
    for name in mutated:
        fqn = name.removeprefix(WEIGHT_PREFIX)
        have, expected = program_initial.tensors.get(name), eager_state.get(fqn)
        if have is None or expected is None:
            continue
        if have.shape != expected.shape or difference(graph, expected, have):
            return f"the state '{fqn}' the traced model leaves differs from eager's"
    return None
