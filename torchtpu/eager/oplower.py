"""Lowering one recorded ATen call into a builder: shared by the eager program of a single
op and by DeferAndFuse's fused graph program.

The caller owns the program: it supplies the current flat Value of every storage the op
touches (``bases``, one per call slot) and the Python-number operands. ``lower_op``
materialises the op's input views from those bases, lowers the op's functional variant
through the registry and returns its new results (flattened to storages with the strides
PyTorch's meta kernels chose) and the new value of every storage it writes in place.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
from torch.utils._pytree import TreeSpec, tree_flatten, tree_unflatten

from ..lowering.context import ProgramContext, ScalarValue, conform, lower_call
from ..lowering.strided import apply_math_bits, flatten_for_strides, read_view, write_view
from ..runner.program import OutputSpec, ProgramBuilder, scalar_dtype
from ..stablehlo.builder import Builder, Value
from ..tensor.storage import cell_of
from .buckets import padded_view_meta
from .plan import KIND_SCALAR, KIND_SCALAR_LIST, KIND_TENSOR, KIND_TENSOR_LIST, OpPlan

_SPECIAL_SCALARS = (0, 1, -1)

RUNTIME_OFFSET = "offset"  # scalar_types entry of a view's storage offset passed at run time (int64)



def lifted(v: Any, lift: bool) -> bool:
    """Is this Python number passed as a device operand (not baked into the program)?
    A bool always is (an int64 operand that promotes as a bool): both of its values are
    "special", and a flag computed on the host each step, as generate()'s
    ``torch.full((batch,), cur_len >= max_length)``, would otherwise make a program per value."""
    tp = type(v)
    return lift and (tp is bool or ((tp is float or tp is int or tp is complex) and v not in _SPECIAL_SCALARS))


def scalar_list_dtype(types: tuple[type, ...]) -> torch.dtype:
    """The dtype a Scalar[] list is passed in: int64 when every number is an int or a bool
    (exact, as the CPU computes ``_foreach_pow(int64 tensors, [8, 10])``), else the float
    dtype (its ints are converted back to int64 in the program, ``_scalar_list``)."""
    return torch.int64 if all(tp is int or tp is bool for tp in types) else scalar_dtype(float)


def scalar_params(b: Builder, scalar_types: list[Any]) -> list[Any]:
    """Parameters for the Python numbers of one call (a tuple of types is a Scalar[] list's)."""
    params: list[Any] = []
    for tp in scalar_types:
        if tp is RUNTIME_OFFSET:
            params.append(b.param((), torch.int64))
        elif isinstance(tp, tuple):
            params.append(b.param((len(tp),), scalar_list_dtype(tp)))
        else:
            p = b.param((), scalar_dtype(tp))
            params.append(ScalarValue(p.name, p.dtype, tp))
    return params


class Lowered:
    """What ``lower_op`` produced: new flat outputs, their specs, rewritten storages."""

    __slots__ = ("outputs", "specs", "out_tree", "simple", "updates")

    def __init__(self) -> None:
        self.outputs: list[Value] = []  # flat storages of the new (non-mutated) results
        self.specs: list[OutputSpec | None] = []  # per flattened result; None for an absent one
        self.out_tree: Any = None
        self.simple = True  # a flat list of plain tensors (no pytree rebuild needed)
        self.updates: dict[int, Value] = {}  # call slot -> new flat storage value, in order

    def rebuild(self) -> Callable[[list[Any]], Any] | None:
        """How the op's new result tensors (flat) become its plain returns: None for a flat
        list, else ``unflattener(out_tree)``."""
        return None if self.simple else unflattener(self.out_tree)


def unflattener(tree: TreeSpec) -> Callable[[list[Any]], Any]:
    """``tree_unflatten(·, tree)`` for every call of an op, prepared once: the returns of
    foreach ops (lists of tensors) and of ops with optional results are rebuilt by
    slicing, where walking the spec cost a function call per tensor."""
    children = tree.children()
    if tree.type is not list or not all(c.is_leaf() or (c.type is list and all(g.is_leaf() for g in c.children())) for c in children):
        return lambda flat: tree_unflatten(flat, tree)
    sizes = [None if c.is_leaf() else c.num_children for c in children]

    def rebuild(flat: list[Any]) -> list[Any]:
        out, i = [], 0
        for n in sizes:
            if n is None:
                out.append(flat[i])
                i += 1
            else:
                out.append(flat[i : i + n])
                i += n
        return out

    return rebuild


class Dynamic(NamedTuple):
    """A call run padded (buckets.py) as its lowering sees it: the views read padded to the
    bucket (by position among the call's tensors), the new results' dims of the true
    length, and that length (an int64 operand, the call's last)."""

    in_dims: dict[int, int]  # tensor ordinal -> dim
    out_dims: tuple[int | None, ...]  # per flattened new result
    length: Value


def dynamic(b: Builder, padded_key: tuple | None, scalars: list[Any]) -> Dynamic | None:
    """The ``Dynamic`` of a call run padded (``padded_key``: ``buckets.Padded.key``, None:
    not padded), taking its length operand off the end of ``scalars``."""
    if padded_key is None:
        return None
    _, _, in_dims, out_dims = padded_key
    return Dynamic(dict(in_dims), out_dims, b.convert(scalars.pop(), torch.int32))


def _mark_length(b: Builder, x: Value, n: Value, d: int) -> Value:
    """From here on XLA treats rows ``n:`` of dim ``d`` as padding and masks them."""
    return b.op1("stablehlo.set_dimension_size", [x, n], x.shape, x.dtype, f"dimension = {d} : i64")


def _static_dim(b: Builder, v: Value, d: int) -> Value:
    """``v`` with dim ``d`` static again (a gather with static indices): a program cannot
    return a bounded-dynamic buffer, and flattening it would fold the padded dim (a reshape
    XLA's masks get wrong)."""
    idx = b.iota((v.shape[d], 1), 0, torch.int32)
    offset = [k for k in range(v.rank) if k != d]
    sizes = [1 if k == d else n for k, n in enumerate(v.shape)]
    return b.gather(v, idx, offset, [d], [d], 1, sizes, v.shape)


def lower_op(
    ctx: ProgramContext,
    plan: OpPlan,
    values: list[Any],
    slot_of: Callable[[torch.Tensor], int],
    bases: list[Value],
    scalars: list[Any],
    dyn: Dynamic | None = None,
    out_strides: Sequence[Sequence[int] | None] | None = None,
) -> Lowered:
    """Lower ``plan.op(*values)``; tensors in ``values`` may be real or meta tensors. A view
    with a nonzero storage offset takes its offset from ``scalars`` (an int64 operand, in
    argument order, where ``dispatch._Call`` put it). ``dyn``: the call runs padded.
    ``out_strides``: per new result, the strides to lay it out in (those its tensor already
    has); by default the meta kernel's for ``values``."""
    b = ctx.b
    geometry: dict[int, tuple] = {}
    scalar_iter = iter(scalars)
    lowered: list[Any] = []
    ordinal = iter(range(1 << 30))

    def view(t: torch.Tensor) -> Value:
        slot = slot_of(t)
        sizes, strides, offset = tuple(t.shape), t.stride(), t.storage_offset()
        if offset:
            offset = next(scalar_iter)
        d = None if dyn is None else dyn.in_dims.get(next(ordinal))
        geometry[id(t)] = (slot, sizes, strides, offset, d)
        x = read_view(b, bases[slot], sizes, strides, offset, t.dtype)
        if t.is_conj() or t.is_neg():  # lazy conj/neg views store conj/neg of their values
            x = apply_math_bits(b, x, t.is_conj(), t.is_neg())
        return x if d is None else _mark_length(b, x, dyn.length, d)

    for kind, v in zip(plan.kinds, values):
        if kind == KIND_TENSOR and v is not None and not isinstance(v, torch.Tensor):
            lowered.append(next(scalar_iter) if lifted(v, plan.lift_scalars) else v)
        elif kind == KIND_TENSOR:
            lowered.append(None if v is None else view(v))
        elif kind == KIND_TENSOR_LIST:
            lowered.append([None if t is None else view(t) for t in v])
        elif kind == KIND_SCALAR and lifted(v, plan.lift_scalars):
            lowered.append(next(scalar_iter))
        elif kind == KIND_SCALAR_LIST and plan.lift_scalars and v:
            lowered.append(_scalar_list(b, next(scalar_iter), tuple(map(type, v))))
        else:
            lowered.append(v)

    fargs, fkwargs = plan.functional_args(lowered)
    out_meta = plan.functional_meta(values)
    want = out_meta if len(out_meta) != 1 or plan.functional_returns_tuple else out_meta[0]
    result = lower_call(ctx, plan.functional, fargs, fkwargs, want)
    results = list(result) if isinstance(result, (tuple, list)) and plan.functional_returns_tuple else [result]

    out = Lowered()
    flat_new, out.out_tree = tree_flatten(results[: plan.n_plain])
    flat_new_meta, _ = tree_flatten(list(out_meta[: plan.n_plain]))
    out_dims = dyn.out_dims if dyn is not None else [None] * len(flat_new)
    layouts = out_strides if out_strides is not None else [None if m is None else m.stride() for m in flat_new_meta]
    for v, m, d, layout in zip(flat_new, flat_new_meta, out_dims, layouts):
        if v is None or m is None:  # an optional output PyTorch also leaves out (e.g. no weight grad)
            out.specs.append(None)
            continue
        if d is not None:
            v = _static_dim(b, v, d)
        flat, strides = flatten_for_strides(b, conform(ctx, v, m.dtype, tuple(m.shape)), layout)
        out.outputs.append(flat)
        out.specs.append(OutputSpec(tuple(m.shape), strides, m.dtype, flat.shape[0]))

    flat_mut, _ = tree_flatten(results[plan.n_plain :])
    for v, t in zip(flat_mut, plan.mutated_tensors(values)):
        if t is None or v is None:
            continue
        slot, sizes, strides, offset, d = geometry[id(t)]
        v = conform(ctx, v, t.dtype, tuple(t.shape))
        if d is not None:
            v = _static_dim(b, v, d)
        if t.is_conj() or t.is_neg():
            v = apply_math_bits(b, v, t.is_conj(), t.is_neg())
        base = out.updates.get(slot, bases[slot])
        out.updates[slot] = write_view(b, base, sizes, strides, offset, v)
    out.simple = all(isinstance(r, Value) for r in results[: plan.n_plain]) and None not in out.specs
    return out


def _scalar_list(b: Builder, param: Any, types: tuple[type, ...]) -> list[ScalarValue]:
    """The numbers of a Scalar[] list, each with its own Python type, as PyTorch applies
    them one by one: an int (or bool) promotes as an int, a float as a float. (All of them
    as floats computed ``_foreach_add(int64 tensors, [3])`` in float32.)"""
    out = []
    for i, tp in enumerate(types):
        s = b.reshape(b.slice(param, [i], [i + 1]), ())
        if tp is not float and tp is not complex and s.dtype != torch.int64:
            s = b.convert(s, torch.int64)
        out.append(ScalarValue(s.name, s.dtype, tp))
    return out


def lower_single(plan: OpPlan, values: list[Any], call: Any) -> tuple[ProgramBuilder, Any]:
    """Lower one call into a fresh program whose parameters are its storages and numbers."""
    pb = ProgramBuilder()
    bases = [pb.storage(slot, c.shape, c.numel, c.dtype, c.initialized) for slot, c in enumerate(call.cells)]
    scalars = scalar_params(pb.b, call.scalar_types)
    if plan.random:
        pb.ctx.new_rng_param()
    slots = {id(t): call.slot_of[id(cell_of(t))] for t in call.tensors}
    padded = call.padded
    if padded is not None:  # read the views by their padded geometry (buckets.py)
        metas = {id(t): padded_view_meta(t, padded) for t in call.tensors}
        slots = {id(metas[k]): s for k, s in slots.items()}
        values = [_swap(v, metas) for v in values]
    dyn = dynamic(pb.b, None if padded is None else padded.key, scalars)
    return pb, lower_op(pb.ctx, plan, values, lambda t: slots[id(t)], bases, scalars, dyn)


def _swap(v: Any, metas: dict[int, torch.Tensor]) -> Any:
    if isinstance(v, torch.Tensor):
        return metas.get(id(v), v)
    if isinstance(v, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in v):
        return type(v)(_swap(x, metas) for x in v)
    return v
