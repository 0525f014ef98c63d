"""Gather, scatter and indexing: index_select, gather, scatter(_add/_reduce), advanced
indexing (index.Tensor, index_put), index_add/fill/copy, masked_scatter, embedding and
its backward, index_reduce.

Every rule is a static program. Data-dependent shapes (bool-mask indexing, nonzero,
masked_select) are handled by eager kernels in eager/host_ops.py that sync the size to
the host first; the one bool-mask case with a static result (``x[mask] = v``) is lowered
here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from ...stablehlo.builder import Value, prod
from ...stablehlo.types import is_complex, is_float
from ..context import NodeLowering
from ..registry import register, register_meta
from .view import wrap_dim

aten = torch.ops.aten

Combine = Callable[[Value, Value], Value] | None


# -- helpers ---------------------------------------------------------------------------------------------
def _i64(L: NodeLowering, idx: Value) -> Value:
    return L.to(idx, torch.int64)


# The CPU's words and exception for an index out of range, per op: ``{}`` is the first bad
# index, ``{dim}`` and ``{size}`` the indexed dim and its size.
OUT_OF_BOUNDS = "index {{}} is out of bounds for dimension {dim} with size {size}"  # gather, scatter, index_add
OUT_OF_RANGE_IN_SELF = "index out of range in self"  # index_select, embedding
OUT_OF_RANGE_FLAT = "out of range: tried to access index {{}} on a tensor of {size} elements."  # take, put


def _check_bounds(
    L: NodeLowering,
    idx: Value,
    size: int,
    dim: int,
    negative_ok: bool,
    exc: type[Exception] = RuntimeError,
    message: str = OUT_OF_BOUNDS,
) -> None:
    """XLA clamps out-of-range indices silently; report them (asynchronously, like a CUDA
    device-side assert) instead of returning a wrong answer, as the CPU's ``exc`` with its
    ``message``."""
    idx = _i64(L, idx)
    lo = L.full(-size if negative_ok else 0, idx.shape, torch.int64)
    hi = L.full(size, idx.shape, torch.int64)
    bad = L.b.binary("or", L.b.compare(idx, lo, "LT"), L.b.compare(idx, hi, "GE"))
    text = message.format(dim=dim, size=size)
    L.check(bad, text, exc=exc, values=[idx] if "{}" in text else [])


def _wrap_negative(
    L: NodeLowering,
    idx: Value,
    size: int,
    dim: int = 0,
    exc: type[Exception] = IndexError,
    message: str = OUT_OF_BOUNDS,
) -> Value:
    """Python-style negative indices (``i + size`` where ``i < 0``), bounds-checked."""
    _check_bounds(L, idx, size, dim, negative_ok=True, exc=exc, message=message)
    idx = _i64(L, idx)
    zero = L.zeros(idx.shape, torch.int64)
    return L.b.select(L.b.compare(idx, zero, "LT"), L.b.binary("add", idx, L.full(size, idx.shape, torch.int64)), idx)


def _combiner(L: NodeLowering, kind: str | None, dtype: torch.dtype) -> Combine:
    b = L.b
    if kind is None:
        return None
    if kind in ("add", "sum", "mean"):
        if dtype is torch.bool:
            return lambda o, n: b.binary("or", o, n)

        def add(o: Value, n: Value) -> Value:
            return b.binary("add", o, n)

        add.sums = True  # type: ignore[attr-defined]
        return add
    if kind in ("multiply", "prod"):
        if dtype is torch.bool:
            return lambda o, n: b.binary("and", o, n)
        return lambda o, n: b.binary("multiply", o, n)
    if kind == "amax":
        return lambda o, n: _nan_prop(L, o, n, "maximum")
    if kind == "amin":
        return lambda o, n: _nan_prop(L, o, n, "minimum")
    raise NotImplementedError(f"torchtpu: scatter reduce={kind!r} is not supported")


def _nan_prop(L: NodeLowering, o: Value, n: Value, name: str) -> Value:
    # stablehlo.maximum/minimum propagate NaN (as PyTorch's scatter amax/amin do)
    if o.dtype is torch.bool:
        return L.b.binary("or" if name == "maximum" else "and", o, n)
    return L.b.binary(name, o, n)


def _full_index(L: NodeLowering, index: Value, dim: int) -> Value:
    """``index.shape + (rank,)`` i64 coordinates: iota everywhere, ``index`` along ``dim``."""
    b = L.b
    shape = index.shape
    cols = []
    for d in range(index.rank):
        c = _i64(L, index) if d == dim else b.iota(shape, d, torch.int64)
        cols.append(b.reshape(c, shape + (1,)))
    return b.concatenate(cols, index.rank)


def _summing_16bit(x: Value, combine: Combine) -> bool:
    """A scatter that adds into a 16-bit float tensor: several updates may land on one
    element, and adding them in 16 bits rounds after every add (in an order XLA picks);
    the sums are taken in float32 and rounded once instead (at least as close to float64
    as the CPU's sequential 16-bit adds)."""
    return getattr(combine, "sums", False) and x.dtype in (torch.float16, torch.bfloat16)


def _scatter_elements(L: NodeLowering, x: Value, dim: int, index: Value, src: Value, combine: Combine) -> Value:
    """scatter along ``dim`` (torch.scatter semantics): x[..., index[i], ...] op= src[i]."""
    if _summing_16bit(x, combine):
        wide = _scatter_elements(L, L.to(x, torch.float32), dim, index, L.to(src, torch.float32), combine)
        return L.to(wide, x.dtype)
    if index.rank == 0:
        index = L.b.reshape(index, (1,) * max(x.rank, 1))
        src = L.b.reshape(src, (1,) * max(x.rank, 1)) if src.rank == 0 else src
    if prod(index.shape) == 0:
        return x
    x0 = x
    if x.rank == 0:
        x = L.b.reshape(x, (1,))
    if src.shape != index.shape:
        src = L.b.slice(src, [0] * src.rank, list(index.shape))
    _check_bounds(L, index, x.shape[dim], dim, negative_ok=False)
    full = _full_index(L, index, dim)
    out = L.b.scatter(x, full, L.to(src, x.dtype), [], list(range(x.rank)), list(range(x.rank)), index.rank, combine)
    return L.b.reshape(out, x0.shape)


def _scatter_rows(L: NodeLowering, x: Value, dim: int, index: Value, updates: Value, combine: Combine) -> Value:
    """x.index_*(dim, index, updates): ``updates`` is x's shape with ``dim`` of len(index)."""
    if _summing_16bit(x, combine):
        wide = _scatter_rows(L, L.to(x, torch.float32), dim, index, L.to(updates, torch.float32), combine)
        return L.to(wide, x.dtype)
    b = L.b
    x0 = x
    if x.rank == 0:
        x = b.reshape(x, (1,))
        dim = 0
    index = b.reshape(_i64(L, index), (prod(index.shape),))
    n = index.shape[0]
    if n == 0:
        return x0
    shape = list(x.shape)
    shape[dim] = n
    updates = L.broadcast_to(b.reshape(L.to(updates, x.dtype), shape) if prod(updates.shape) == prod(shape) else L.to(updates, x.dtype), tuple(shape))
    idx = b.reshape(index, (n, 1))
    window = [d for d in range(x.rank) if d != dim]
    out = b.scatter(x, idx, updates, window, [dim], [dim], 1, combine)
    return b.reshape(out, x0.shape)


def _gather_rows(L: NodeLowering, x: Value, dim: int, index: Value) -> Value:
    """x.index_select(dim, index) for a 1-D index; output dims in x's order."""
    b = L.b
    n = index.shape[0]
    idx = b.reshape(_i64(L, index), (n, 1))
    slice_sizes = list(x.shape)
    slice_sizes[dim] = 1
    out_shape = list(x.shape)
    out_shape[dim] = n
    offset = [d for d in range(x.rank) if d != dim]
    return b.gather(x, idx, offset, [dim], [dim], 1, slice_sizes, out_shape)


# -- index_select / gather / take --------------------------------------------------------------------------
@register(aten.index_select.default)
def index_select(L: NodeLowering, x: Value, dim: int, index: Value) -> Value:
    out = L.out[0].shape
    if x.rank == 0:
        return L.b.reshape(x, out)
    dim = wrap_dim(dim, x.rank)
    index = L.b.reshape(index, (prod(index.shape),))
    if prod(out) == 0:
        return L.zeros(out, x.dtype)
    _check_bounds(L, index, x.shape[dim], dim, negative_ok=False, exc=IndexError, message=OUT_OF_RANGE_IN_SELF)
    return L.b.reshape(_gather_rows(L, x, dim, index), out)


@register(aten.gather.default)
def gather(L: NodeLowering, x: Value, dim: int, index: Value, sparse_grad: bool = False) -> Value:
    out = L.out[0].shape
    if prod(out) == 0:
        return L.zeros(out, x.dtype)
    if x.rank == 0:
        return L.broadcast_to(x, out)
    dim = wrap_dim(dim, x.rank)
    if index.rank == 0:
        index = L.b.reshape(index, (1,) * x.rank)
    _check_bounds(L, index, x.shape[dim], dim, negative_ok=False)
    full = _full_index(L, index, dim)
    r = L.b.gather(x, full, [], list(range(x.rank)), list(range(x.rank)), index.rank, [1] * x.rank, index.shape)
    return L.b.reshape(r, out)


@register(aten.take.default)
def take(L: NodeLowering, x: Value, index: Value) -> Value:
    flat = L.b.reshape(x, (prod(x.shape),))
    idx = _wrap_negative(L, index, prod(x.shape), message=OUT_OF_RANGE_FLAT)
    n = prod(index.shape)
    if n == 0:
        return L.zeros(index.shape, x.dtype)
    r = _gather_rows(L, flat, 0, L.b.reshape(idx, (n,)))
    return L.b.reshape(r, index.shape)


@register(aten.put.default)
def put(L: NodeLowering, x: Value, index: Value, source: Value, accumulate: bool = False) -> Value:
    n = prod(x.shape)
    flat = L.b.reshape(x, (n,))
    idx = _wrap_negative(L, index, n, message=OUT_OF_RANGE_FLAT)
    src = L.b.reshape(L.to(source, x.dtype), (prod(source.shape),))
    combine = _combiner(L, "add", x.dtype) if accumulate else None
    return L.b.reshape(_scatter_rows(L, flat, 0, idx, src, combine), x.shape)


# -- scatter family ---------------------------------------------------------------------------------------------
@register(aten.scatter.src, aten.scatter.value)
def scatter(L: NodeLowering, x: Value, dim: int, index: Value, src: Any) -> Value:
    dim = wrap_dim(dim, x.rank)
    if not isinstance(src, Value) or src.rank == 0 and L.op is aten.scatter.value:
        src = L.full(src, index.shape, x.dtype)
    return _scatter_elements(L, x, dim, index, src, None)


@register(aten.scatter.reduce, aten.scatter.value_reduce)
def scatter_reduce_legacy(L: NodeLowering, x: Value, dim: int, index: Value, src: Any, reduce: str) -> Value:
    dim = wrap_dim(dim, x.rank)
    if L.op is aten.scatter.value_reduce:
        src = L.full(src, index.shape, x.dtype)
    return _scatter_elements(L, x, dim, index, src, _combiner(L, reduce, x.dtype))


@register(aten.scatter_add.default)
def scatter_add(L: NodeLowering, x: Value, dim: int, index: Value, src: Value) -> Value:
    return _scatter_elements(L, x, wrap_dim(dim, x.rank), index, src, _combiner(L, "add", x.dtype))


def _identity(kind: str, dtype: torch.dtype) -> Any:
    if kind in ("sum", "mean"):
        return 0
    if kind == "prod":
        return 1
    if dtype is torch.bool:
        return kind == "amin"
    if is_float(dtype):
        return float("-inf") if kind == "amax" else float("inf")
    info = torch.iinfo(dtype)
    return info.min if kind == "amax" else info.max


@register(aten.scatter_reduce.two)
def scatter_reduce(L: NodeLowering, x: Value, dim: int, index: Value, src: Value, reduce: str, include_self: bool = True) -> Value:
    b = L.b
    dim = wrap_dim(dim, x.rank)
    if prod(index.shape) == 0:
        return x
    src = L.to(src, x.dtype)
    base = x
    if not include_self:
        hit = _scatter_elements(L, L.zeros(x.shape, torch.bool), dim, index, L.full(True, index.shape, torch.bool), None)
        base = b.select(hit, L.full(_identity(reduce, x.dtype), x.shape, x.dtype), x)
    out = _scatter_elements(L, base, dim, index, src, _combiner(L, reduce, x.dtype))
    if reduce != "mean":
        return out
    count = _scatter_elements(L, L.zeros(x.shape, x.dtype), dim, index, L.full(1, index.shape, x.dtype), _combiner(L, "add", x.dtype))
    if include_self:
        count = b.binary("add", count, L.full(1, x.shape, x.dtype))
    safe = b.select(b.compare(count, L.zeros(x.shape, x.dtype), "EQ"), L.full(1, x.shape, x.dtype), count)
    if is_float(x.dtype) or is_complex(x.dtype):
        return b.binary("divide", out, safe)
    return _floor_div(L, out, safe)


def _floor_div(L: NodeLowering, a: Value, d: Value) -> Value:
    b = L.b
    q = b.binary("divide", a, d)  # truncates toward zero
    r = b.binary("remainder", a, d)
    zero = L.zeros(a.shape, a.dtype)
    fix = b.binary(
        "and",
        b.compare(r, zero, "NE"),
        b.compare(b.compare(r, zero, "LT"), b.compare(d, zero, "LT"), "NE"),
    )
    return b.select(fix, b.binary("subtract", q, L.full(1, a.shape, a.dtype)), q)


# -- index_add / index_copy / index_fill ---------------------------------------------------------------------------
def _check_index_source(x: Value, dim: int, index: Value, source: Value) -> None:
    """index_add's shape rule (the CPU's index_add_cpu_ checks, with its messages)."""
    if index.rank > 1:
        raise IndexError("index_add_(): Index is supposed to be a vector")
    rows = prod(index.shape)
    if source.rank and source.shape[dim if source.rank > dim else 0] != rows:
        raise IndexError("index_add_(): Number of indices should be equal to source.size(dim)")
    same = source.rank == x.rank and all(s == t for k, (s, t) in enumerate(zip(source.shape, x.shape)) if k != dim)
    if x.rank and source.rank and not same:
        raise RuntimeError(
            "source tensor shape must match self tensor shape, excluding the specified dimension. "
            f"Got self.shape = {list(x.shape)} source.shape = {list(source.shape)}"
        )


@register(aten.index_add.default)
def index_add(L: NodeLowering, x: Value, dim: int, index: Value, source: Value, alpha: Any = 1) -> Value:
    dim = wrap_dim(dim, x.rank)
    _check_index_source(x, dim, index, source)
    source = L.to(source, x.dtype)
    if isinstance(alpha, Value) or alpha != 1:
        source = L.b.binary("multiply", source, L.full(alpha, source.shape, x.dtype))
    _check_bounds(L, index, x.shape[dim] if x.rank else 1, dim, negative_ok=False)
    return _scatter_rows(L, x, dim, index, source, _combiner(L, "add", x.dtype))


@register(aten.index_reduce.default)
def index_reduce(
    L: NodeLowering, x: Value, dim: int, index: Value, source: Value, reduce: str, *, include_self: bool = True
) -> Value:
    """x[..., index[i], ...] reduced with source[..., i, ...] (prod/mean/amax/amin), as
    the CPU: without include_self the indexed rows start from the reduction's identity
    (-inf/+inf, the integer bounds); mean divides by the count of contributions (plus
    one for self), floor division for integers; rows never indexed keep x."""
    b = L.b
    dim = wrap_dim(dim, x.rank)
    size = x.shape[dim] if x.rank else 1
    if prod(index.shape) == 0:
        return x
    _check_bounds(L, index, size, dim, negative_ok=False)
    source = L.to(source, x.dtype)
    rows = list(x.shape) if x.rank else [1]
    rows[dim] = prod(index.shape)
    base = x
    if not include_self:
        hit = _scatter_rows(L, L.zeros(x.shape, torch.bool), dim, index, L.full(True, rows, torch.bool), None)
        base = b.select(hit, L.full(_identity(reduce, x.dtype), x.shape, x.dtype), x)
    out = _scatter_rows(L, base, dim, index, source, _combiner(L, reduce, x.dtype))
    if reduce != "mean":
        return out
    count = _scatter_rows(L, L.full(1 if include_self else 0, x.shape, x.dtype), dim, index, L.full(1, rows, x.dtype), _combiner(L, "add", x.dtype))
    safe = b.select(b.compare(count, L.zeros(x.shape, x.dtype), "EQ"), L.full(1, x.shape, x.dtype), count)
    if is_float(x.dtype) or is_complex(x.dtype):
        return b.binary("divide", out, safe)
    return _floor_div(L, out, safe)


@register(aten.index_copy.default)
def index_copy(L: NodeLowering, x: Value, dim: int, index: Value, source: Value) -> Value:
    dim = wrap_dim(dim, x.rank)
    size = x.shape[dim] if x.rank else 1
    _check_bounds(L, index, size, dim, negative_ok=False, exc=IndexError, message="index_copy_(): " + OUT_OF_BOUNDS)
    return _scatter_rows(L, x, dim, index, source, None)


@register(aten.index_fill.int_Scalar, aten.index_fill.int_Tensor)
def index_fill(L: NodeLowering, x: Value, dim: int, index: Value, value: Any) -> Value:
    dim = wrap_dim(dim, x.rank)
    if isinstance(value, Value) and value.rank:
        value = L.b.reshape(value, ())
    n = prod(index.shape)
    shape = list(x.shape) if x.rank else [1]
    shape[dim] = n
    index = _wrap_negative(L, index, x.shape[dim] if x.rank else 1)
    return _scatter_rows(L, x, dim, index, L.full(value, shape, x.dtype), None)


# -- advanced indexing --------------------------------------------------------------------------------------------------
def _index_plan(x: Value, indices: Sequence[Value | None]) -> tuple[list[int], bool]:
    """The indexed dims, and whether they are adjacent (result dims then go in place)."""
    dims = [d for d, i in enumerate(indices) if i is not None]
    adjacent = dims == list(range(dims[0], dims[0] + len(dims))) if dims else True
    return dims, adjacent


def _index_coords(L: NodeLowering, x: Value, indices: Sequence[Value | None], dims: Sequence[int]) -> tuple[Value, tuple[int, ...]]:
    """Broadcast index tensors, stacked to ``B + (k,)`` i64 coordinates."""
    idx = [indices[d] for d in dims]
    for i in idx:
        if i.dtype in (torch.bool, torch.uint8):
            raise NotImplementedError("torchtpu: boolean mask indices have a data-dependent shape inside a program")
    bshape = tuple(torch.broadcast_shapes(*[i.shape for i in idx]))
    cols = []
    for d, i in zip(dims, idx, strict=True):
        i = L.broadcast_to(_wrap_negative(L, i, x.shape[d], d), bshape)
        cols.append(L.b.reshape(i, bshape + (1,)))
    return L.b.concatenate(cols, len(bshape)), bshape


@register(aten.index.Tensor, aten._unsafe_index.Tensor)
def index(L: NodeLowering, x: Value, indices: Sequence[Value | None]) -> Value:
    b = L.b
    out = L.out[0].shape
    indices = list(indices) + [None] * (x.rank - len(indices))
    dims, adjacent = _index_plan(x, indices)
    if not dims:
        return x
    if prod(out) == 0:
        return L.zeros(out, x.dtype)
    rest = [d for d in range(x.rank) if d not in dims]
    xt = b.transpose(x, list(dims) + rest)
    coords, bshape = _index_coords(L, x, indices, dims)
    k, nb = len(dims), len(bshape)
    slice_sizes = [1] * k + [x.shape[d] for d in rest]
    gshape = list(bshape) + [x.shape[d] for d in rest]
    r = b.gather(xt, coords, list(range(nb, nb + len(rest))), list(range(k)), list(range(k)), nb, slice_sizes, gshape)
    if adjacent and dims[0] > 0:
        # result dims go where the indexed dims were: rest[:p] + B + rest[p:]
        p = dims[0]
        perm = list(range(nb, nb + p)) + list(range(nb)) + list(range(nb + p, nb + len(rest)))
        r = b.transpose(r, perm)
    return b.reshape(r, out)


def _index_result_perm(nb: int, n_rest: int, dims: Sequence[int], adjacent: bool) -> list[int]:
    """Permutation taking index()'s result layout to ``B + rest``."""
    if adjacent and dims[0] > 0:
        p = dims[0]
        # result layout: rest[:p] + B + rest[p:]; want B + rest
        return list(range(p, p + nb)) + list(range(p)) + list(range(p + nb, p + nb + n_rest - p))
    return list(range(nb + n_rest))


@register(aten.index_put.default, aten._index_put_impl.default, aten._unsafe_index_put.default)
def index_put(L: NodeLowering, x: Value, indices: Sequence[Value | None], values: Value, accumulate: bool = False, unsafe: bool = False) -> Value:
    b = L.b
    indices = list(indices) + [None] * (x.rank - len(indices))
    dims, adjacent = _index_plan(x, indices)
    if not isinstance(values, Value):
        values = L.scalar(values, x.dtype)
    values = L.to(values, x.dtype)
    if not dims:
        values = L.broadcast_to(values, x.shape)
        return b.binary("add", x, values) if accumulate else values
    masks = [i for i in indices if i is not None and i.dtype in (torch.bool, torch.uint8)]
    if masks:
        return _index_put_mask(L, x, indices, values, accumulate)
    rest = [d for d in range(x.rank) if d not in dims]
    coords, bshape = _index_coords(L, x, indices, dims)
    nb, k = len(bshape), len(dims)
    if prod(bshape) == 0:
        return x
    # values broadcast to index()'s result shape, then to B + rest
    if adjacent and dims[0] > 0:
        p = dims[0]
        res_shape = tuple(x.shape[d] for d in rest[:p]) + bshape + tuple(x.shape[d] for d in rest[p:])
    else:
        res_shape = bshape + tuple(x.shape[d] for d in rest)
    upd = b.transpose(L.broadcast_to(values, res_shape), _index_result_perm(nb, len(rest), dims, adjacent))
    xt = b.transpose(x, list(dims) + rest)
    combine = _combiner(L, "add", x.dtype) if accumulate else None
    r = b.scatter(xt, coords, upd, list(range(nb, nb + len(rest))), list(range(k)), list(range(k)), nb, combine)
    inv = [0] * x.rank
    for pos, d in enumerate(list(dims) + rest):
        inv[d] = pos
    return b.transpose(r, inv)


def _index_put_mask(L: NodeLowering, x: Value, indices: Sequence[Value | None], values: Value, accumulate: bool) -> Value:
    """``x[mask] = values`` with one bool mask over leading dims (static: where/masked_scatter)."""
    b = L.b
    nonnull = [d for d, i in enumerate(indices) if i is not None]
    mask = indices[nonnull[0]]
    if len(nonnull) != 1 or nonnull[0] != 0:
        raise NotImplementedError("torchtpu: bool mask index mixed with other indices inside a program")
    m = L.to(mask, torch.bool)
    mshape = m.shape
    tail = x.shape[m.rank :]
    full_mask = b.broadcast_in_dim(m, x.shape, list(range(m.rank)))
    lead = values.shape[: values.rank - len(tail)] if values.rank > len(tail) else ()
    if prod(lead) != 1:
        _check_one_row_per_true(L, m, values.shape, tail)
    if prod(lead) == 0:
        return x
    if prod(lead) == 1:
        # one value row for every selected position
        vals = L.broadcast_to(b.reshape(values, tuple(values.shape[len(lead) :])) if lead else values, tail)
        vals = b.broadcast_in_dim(vals, x.shape, list(range(m.rank, x.rank))) if tail else L.broadcast_to(vals, x.shape)
    else:
        # values has one row per True element, in row-major order: masked_scatter
        flat_vals = b.reshape(L.broadcast_to(values, (lead[-1],) + tuple(tail)), (lead[-1],) + tuple(tail))
        pos = _exclusive_cumsum(L, b.reshape(m, (prod(mshape),)))
        rows = _gather_rows(L, flat_vals, 0, _clamp(L, pos, lead[-1] - 1))
        vals = b.reshape(rows, x.shape)
    if accumulate:
        return b.select(full_mask, b.binary("or" if x.dtype is torch.bool else "add", x, vals), x)
    return b.select(full_mask, vals, x)


def _count_true(L: NodeLowering, m: Value) -> Value:
    b = L.b
    ones = L.to(m, torch.int64)
    (n,) = b.reduce([ones], [L.zeros((), torch.int64)], list(range(m.rank)), lambda a, c: [b.binary("add", a, c)])
    return n


def _check_one_row_per_true(L: NodeLowering, m: Value, values_shape: Sequence[int], tail: Sequence[int]) -> None:
    """``x[mask] = values`` with more than one value row needs exactly one row per True
    element, which is only known on the device: checked there, as the CPU checks it (its
    message names the count); without it, rows would be repeated or dropped silently."""
    rows = values_shape[len(values_shape) - len(tail) - 1]
    count = _count_true(L, m)
    shape = ", ".join(["{}", *map(str, tail)])
    message = f"shape mismatch: value tensor of shape {list(values_shape)} cannot be broadcast to indexing result of shape [{shape}]"
    L.check(L.b.compare(count, L.full(rows, (), torch.int64), "NE"), message, values=[count])


def _clamp(L: NodeLowering, i: Value, hi: int) -> Value:
    return L.b.clamp(L.zeros((), torch.int64), i, L.full(max(hi, 0), (), torch.int64))


def _exclusive_cumsum(L: NodeLowering, m: Value) -> Value:
    """For a 1-D bool ``m``: i64 count of True entries before each position."""
    b = L.b
    n = m.shape[0]
    ones = L.to(m, torch.int64)
    (inc,) = b.reduce_window(
        [ones], [L.zeros((), torch.int64)], [n], [1], [(n - 1, 0)], lambda a, c: [b.binary("add", a, c)]
    )
    return b.binary("subtract", inc, ones)


@register(aten.masked_scatter.default)
def masked_scatter(L: NodeLowering, x: Value, mask: Value, source: Value) -> Value:
    b = L.b
    out = L.out[0].shape
    x = L.broadcast_to(x, out)
    m = L.broadcast_to(L.to(mask, torch.bool), out)
    n = prod(out)
    ns = prod(source.shape)
    if n == 0:
        return x
    # the CPU refuses a source shorter than the mask's True count; without the check the
    # last source element would fill the rest
    too_few = b.compare(_count_true(L, m), L.full(ns, (), torch.int64), "GT")
    L.check(too_few, "Number of elements of source < number of ones in mask")
    if ns == 0:
        return x
    flat_src = b.reshape(L.to(source, x.dtype), (ns,))
    pos = _exclusive_cumsum(L, b.reshape(m, (n,)))
    vals = b.reshape(_gather_rows(L, flat_src, 0, _clamp(L, pos, ns - 1)), out)
    return b.select(m, vals, x)


@register_meta(aten.masked_scatter_backward.default)
def masked_scatter_backward_meta(grad: torch.Tensor, mask: torch.Tensor, sizes: Sequence[int]) -> torch.Tensor:
    """The source's gradient has the source's shape. PyTorch's kernel finds it through
    ``masked_select``, whose size depends on the mask's values, so it cannot run on meta
    or fake tensors (a compiled backward's lowering failed there)."""
    return grad.new_empty(sizes)


@register(aten.masked_scatter_backward.default)
def masked_scatter_backward(L: NodeLowering, grad: Value, mask: Value, sizes: Sequence[int]) -> Value:
    """``masked_scatter``'s gradient for its source: the gradient's elements where the mask
    is True, in row-major order, then zeros up to the source's size. The CPU selects them
    (``masked_select``: a size that depends on the mask) and pads; here each one is
    scattered to its rank among the True elements, a static shape, so a compiled backward
    holds it (a vision-language model's ``inputs_embeds.masked_scatter(image_mask, features)``)."""
    b = L.b
    out = L.out[0]
    n_out = prod(out.shape)
    result = L.zeros((n_out,), out.dtype)
    common = tuple(torch.broadcast_shapes(grad.shape, mask.shape))
    n = prod(common)
    if n == 0 or n_out == 0:
        return b.reshape(result, out.shape)
    g = b.reshape(L.broadcast_to(L.to(grad, out.dtype), common), (n,))
    m = b.reshape(L.broadcast_to(L.to(mask, torch.bool), common), (n,))
    # a False element goes out of bounds, which XLA's scatter drops
    pos = b.select(m, _exclusive_cumsum(L, m), L.full(n_out, (n,), torch.int64))
    scattered = b.scatter(result, b.reshape(pos, (n, 1)), g, [], [0], [0], 1, None)
    return b.reshape(scattered, out.shape)


# -- embedding ---------------------------------------------------------------------------------------------------------------
@register(aten.embedding.default)
def embedding(L: NodeLowering, weight: Value, indices: Value, padding_idx: int = -1, scale_grad_by_freq: bool = False, sparse: bool = False) -> Value:
    b = L.b
    out = L.out[0].shape
    if prod(out) == 0:
        return L.zeros(out, weight.dtype)
    _check_bounds(L, indices, weight.shape[0], 0, negative_ok=False, exc=IndexError, message=OUT_OF_RANGE_IN_SELF)
    idx = b.reshape(_i64(L, indices), indices.shape + (1,))
    slice_sizes = [1] + list(weight.shape[1:])
    offset = list(range(indices.rank, indices.rank + weight.rank - 1))
    return b.gather(weight, idx, offset, [0], [0], indices.rank, slice_sizes, out)


@register(aten.embedding_dense_backward.default)
def embedding_dense_backward(L: NodeLowering, grad: Value, indices: Value, num_weights: int, padding_idx: int, scale_grad_by_freq: bool) -> Value:
    b = L.b
    out = L.out[0]
    n = prod(indices.shape)
    d = out.shape[1:]
    zeros = L.zeros(out.shape, out.dtype)
    if n == 0:
        return zeros
    idx = b.reshape(_i64(L, indices), (n,))
    g = b.reshape(L.to(grad, out.dtype), (n,) + tuple(d))
    if scale_grad_by_freq:
        counts = _scatter_rows(L, L.zeros((num_weights,), out.dtype), 0, idx, L.full(1, (n,), out.dtype), _combiner(L, "add", out.dtype))
        per = _gather_rows(L, counts, 0, idx)
        g = b.binary("divide", g, b.broadcast_in_dim(per, g.shape, [0]))
    if padding_idx is not None and padding_idx >= 0:
        keep = b.compare(idx, L.full(padding_idx, (n,), torch.int64), "NE")
        g = b.select(b.broadcast_in_dim(keep, g.shape, [0]), g, L.zeros(g.shape, g.dtype))
    return _scatter_rows(L, zeros, 0, idx, g, _combiner(L, "add", out.dtype))


# -- nonzero with a static size ------------------------------------------------------------------------------------------------
@register(aten.nonzero_static.default)
def nonzero_static(L: NodeLowering, x: Value, *, size: int, fill_value: int = -1) -> Value:
    """The first ``size`` nonzero coordinates (row-major), padded with ``fill_value``."""
    b = L.b
    out = L.out[0].shape  # (size, rank)
    rank = x.rank
    n = prod(x.shape)
    result = L.full(fill_value, out, torch.int64)
    if n == 0 or size == 0 or rank == 0:
        return result
    shape = x.shape if rank else (1,)
    m = b.reshape(L.to(x, torch.bool), (n,))
    pos = _exclusive_cumsum(L, m)
    # rows past ``size`` and zero elements go out of bounds: XLA's scatter drops them
    pos = b.select(m, pos, L.full(size, (n,), torch.int64))
    cols = [b.reshape(b.iota(shape, d, torch.int64), (n, 1)) for d in range(len(shape))]
    coords = b.concatenate(cols, 1)
    return b.scatter(result, b.reshape(pos, (n, 1)), coords, [1], [0], [0], 1, None)
