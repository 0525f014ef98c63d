"""Sorting and searching: sort (stable), topk, searchsorted, median, mode.

``argsort``, ``msort``, ``kthvalue`` and ``bucketize`` reach these rules through
PyTorch's decompositions. Every sort is one ``stablehlo.sort`` of (values, iota) with a
comparator that orders NaN as the largest value, as PyTorch does, and always stable
(PyTorch's CPU sort is stable too, so tie order matches CPU even for ``stable=False``).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ...stablehlo.builder import Value
from ...stablehlo.types import is_float
from ..context import NodeLowering
from ..registry import register
from .gather_scatter import _gather_rows

aten = torch.ops.aten


def _comparator(L: NodeLowering, descending: bool, dtype: torch.dtype) -> Any:
    """``comp(a, b, ia, ib)``: does ``a`` go before ``b``? NaN counts as the largest."""
    b = L.b
    fl = is_float(dtype)

    def comp(x: Value, y: Value, *_indices: Value) -> list[Value]:
        if descending:
            x, y = y, x  # "x before y" in descending order is "y < x"
        less = b.compare(x, y, "LT")
        if fl:
            # x < y, or y is NaN while x is not (NaN is the largest value)
            y_nan = b.compare(y, y, "NE")
            x_num = b.compare(x, x, "EQ")
            less = b.binary("or", less, b.binary("and", y_nan, x_num))
        return [less]

    return comp


def sort_with_indices(L: NodeLowering, x: Value, dim: int, descending: bool) -> tuple[Value, Value]:
    """(sorted values, int64 source indices) along ``dim``; stable."""
    if x.rank == 0:
        return x, L.zeros((), torch.int64)
    dim %= x.rank
    idx = L.b.iota(x.shape, dim, torch.int64)
    values, indices = L.b.sort([x, idx], dim, _comparator(L, descending, x.dtype), stable=True)
    return values, indices


@register(aten.sort.default)
def sort(L: NodeLowering, x: Value, dim: int = -1, descending: bool = False) -> tuple[Value, Value]:
    return sort_with_indices(L, x, dim, descending)


@register(aten.sort.stable)
def sort_stable(
    L: NodeLowering, x: Value, *, stable: bool | None = None, dim: int = -1, descending: bool = False
) -> tuple[Value, Value]:
    return sort_with_indices(L, x, dim, descending)


@register(aten.topk.default, static_scalars=True)
def topk(L: NodeLowering, x: Value, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> tuple[Value, Value]:  # noqa: A002
    # Sort then slice: XLA's CPU backend has no faster TopK, and the order of ties then
    # matches a stable sort (sorted=False may return any order in PyTorch, so this is fine).
    values, indices = sort_with_indices(L, x, dim, descending=largest)
    if x.rank == 0:
        return values, indices
    dim %= x.rank
    limit = list(x.shape)
    limit[dim] = int(k)
    zeros = [0] * x.rank
    return L.b.slice(values, zeros, limit), L.b.slice(indices, zeros, limit)


# -- searchsorted ----------------------------------------------------------------------------
def _binary_search(L: NodeLowering, seq: Value, values: Value, right: bool, sorter: Value | None) -> Value:
    """For each value, the CPU's (and CUDA's) binary search over its row of ``seq``, step
    for step: ``seq`` is (*B, N) and ``values`` (*B, M), or ``seq`` is (N,) and ``values``
    any shape; through ``sorter`` where given. Each of the ceil(log2(N + 1)) steps gathers
    every value's middle boundary. Counting the boundaries below each value instead gives
    the same for a sorted ``seq`` without NaN, but a NaN boundary (sorted last) counted as
    below every value, where the search mostly never reaches it (searchsorted of 0.5 in
    [1, 2, 3, nan] was 1, not 0); and it compared every value with every boundary."""
    b = L.b
    i64 = torch.int64
    n, shape = seq.shape[-1], values.shape
    m = math.prod(shape)
    vals = b.reshape(values, (m,))
    flat_seq = b.reshape(seq, (math.prod(seq.shape),))
    flat_sorter = None if sorter is None else b.reshape(L.to(sorter, i64), (math.prod(sorter.shape),))
    base = L.zeros((m,), i64)  # where each value's row of seq starts in flat_seq
    if seq.rank > 1:
        row = b.binary("divide", b.iota((m,), 0, i64), L.full(shape[-1], (m,), i64))
        base = b.binary("multiply", row, L.full(n, (m,), i64))

    one = L.full(1, (m,), i64)
    lo, hi = L.zeros((m,), i64), L.full(n, (m,), i64)
    for _ in range(n.bit_length()):  # while lo < hi: the interval at least halves each step
        active = b.compare(lo, hi, "LT")
        mid = b.binary("add", lo, b.binary("shift_right_logical", b.binary("subtract", hi, lo), one))
        position = b.binary("add", base, b.clamp(L.zeros((), i64), mid, L.full(max(n - 1, 0), (), i64)))
        if flat_sorter is not None:
            position = b.binary("add", base, _gather_rows(L, flat_sorter, 0, position))
        # left: go right unless mid >= value (NaN: compares false either way, as in the CPU's loop)
        go_right = b.unary("not", b.compare(_gather_rows(L, flat_seq, 0, position), vals, "GT" if right else "GE"))
        lo = b.select(b.binary("and", active, go_right), b.binary("add", mid, one), lo)
        hi = b.select(b.binary("and", active, b.unary("not", go_right)), mid, hi)
    return b.reshape(lo, shape)


def _searchsorted(
    L: NodeLowering, seq: Value, values: Any, out_int32: bool, right: bool, side: str | None, sorter: Value | None = None
) -> Value:
    if side is not None:
        right = side == "right"
    dtype = L.result_type(seq, values)
    seq = L.to(seq, dtype)
    vals = L.to(values, dtype) if isinstance(values, Value) else L.b.constant(values, dtype)
    if vals.rank == 0 and seq.rank > 1:
        raise ValueError("searchsorted: a scalar value needs a 1-d boundaries tensor")
    spec = L.out[0]
    if math.prod(spec.shape) == 0:
        return L.zeros(spec.shape, spec.dtype)
    return L.b.reshape(L.to(_binary_search(L, seq, vals, right, sorter), spec.dtype), spec.shape)


@register(aten.searchsorted.Tensor)
def searchsorted(
    L: NodeLowering,
    seq: Value,
    values: Value,
    *,
    out_int32: bool = False,
    right: bool = False,
    side: str | None = None,
    sorter: Value | None = None,
) -> Value:
    return _searchsorted(L, seq, values, out_int32, right, side, sorter)


@register(aten.searchsorted.Scalar, static_scalars=True)
def searchsorted_scalar(
    L: NodeLowering,
    seq: Value,
    value: Any,
    *,
    out_int32: bool = False,
    right: bool = False,
    side: str | None = None,
    sorter: Value | None = None,
) -> Value:
    return _searchsorted(L, seq, value, out_int32, right, side, sorter)


@register(aten.bucketize.Tensor)
def bucketize(L: NodeLowering, x: Value, boundaries: Value, *, out_int32: bool = False, right: bool = False) -> Value:
    return _searchsorted(L, boundaries, x, out_int32, right, None)


@register(aten.bucketize.Scalar, static_scalars=True)
def bucketize_scalar(L: NodeLowering, x: Any, boundaries: Value, *, out_int32: bool = False, right: bool = False) -> Value:
    return _searchsorted(L, boundaries, x, out_int32, right, None)


@register(aten.kthvalue.default, static_scalars=True)
def kthvalue(L: NodeLowering, x: Value, k: int, dim: int = -1, keepdim: bool = False) -> tuple[Value, Value]:
    values, indices = sort_with_indices(L, x, dim, descending=False)
    if x.rank == 0:
        return values, indices
    dim %= x.rank
    start = [0] * x.rank
    start[dim] = int(k) - 1
    limit = list(x.shape)
    limit[dim] = int(k)
    v, i = L.b.slice(values, start, limit), L.b.slice(indices, start, limit)
    return L.b.reshape(v, L.out[0].shape), L.b.reshape(i, L.out[1].shape)


def _pick(L: NodeLowering, x: Value, dim: int, pos: Value) -> Value:
    """``x`` at index ``pos`` (int64, x's shape without ``dim``) along ``dim``."""
    b = L.b
    keep = [d for d in range(x.rank) if d != dim]
    hit = b.compare(b.iota(x.shape, dim, torch.int64), b.broadcast_in_dim(pos, x.shape, keep), "EQ")
    zero = L.zeros(x.shape, x.dtype)
    if x.dtype is torch.bool:
        return b.reduce([b.select(hit, x, zero)], [b.constant(False, x.dtype)], [dim], lambda a, c: [b.binary("or", a, c)])[0]
    return b.reduce([b.select(hit, x, zero)], [b.constant(0, x.dtype)], [dim], lambda a, c: [b.binary("add", a, c)])[0]


def _median(L: NodeLowering, x: Value, dim: int, ignore_nan: bool) -> tuple[Value, Value]:
    """PyTorch's lower median along ``dim``: median propagates NaN (returns the first
    NaN), nanmedian takes the median of the non-NaN values."""
    b = L.b
    values, indices = sort_with_indices(L, x, dim, descending=False)
    n = x.shape[dim]
    out_shape = [d for i, d in enumerate(x.shape) if i != dim]
    if is_float(x.dtype):
        nan = b.convert(b.compare(x, x, "NE"), torch.int64)
        n_nan = b.reduce([nan], [b.constant(0, torch.int64)], [dim], lambda a, c: [b.binary("add", a, c)])[0]
        n_num = b.binary("subtract", L.full(n, out_shape, torch.int64), n_nan)
        if ignore_nan:
            # (valid - 1) // 2; an all-NaN row behaves like median over its NaNs
            half = b.binary("divide", b.binary("subtract", n_num, L.full(1, out_shape, torch.int64)), L.full(2, out_shape, torch.int64))
            none = b.compare(n_num, L.zeros(out_shape, torch.int64), "EQ")
            pos = b.select(none, L.full((n - 1) // 2, out_shape, torch.int64), half)
        else:
            pos = b.select(b.compare(n_nan, L.zeros(out_shape, torch.int64), "GT"), n_num, L.full((n - 1) // 2, out_shape, torch.int64))
    else:
        pos = L.full((n - 1) // 2, out_shape, torch.int64)
    return _pick(L, values, dim, pos), _pick(L, indices, dim, pos)


@register(aten.median.dim, aten.nanmedian.dim)
def median_dim(L: NodeLowering, x: Value, dim: int = -1, keepdim: bool = False) -> tuple[Value, Value]:
    if x.rank == 0:
        return x, L.zeros((), torch.int64)
    v, i = _median(L, x, dim % x.rank, L.op is aten.nanmedian.dim)
    return L.b.reshape(v, L.out[0].shape), L.b.reshape(i, L.out[1].shape)


@register(aten.median.default, aten.nanmedian.default)
def median_all(L: NodeLowering, x: Value) -> Value:
    if _numel(x.shape) == 0:  # the CPU's median of nothing is NaN
        return L.full(math.nan, (), x.dtype)
    flat = L.b.reshape(x, (_numel(x.shape),))
    v, _ = _median(L, flat, 0, L.op is aten.nanmedian.default)
    return L.b.reshape(v, ())


# -- mode ------------------------------------------------------------------------------------
def _mode(L: NodeLowering, x: Value, dim: int) -> tuple[Value, Value]:
    """The CPU's mode along ``dim``: sort, then the longest run of equal values; on equal
    run lengths the first run (the smallest value) wins. The index is that of the run's
    last element in a stable sort, i.e. the value's last occurrence: what the CPU's
    std::sort gives for up to 16 elements (its insertion-sort range, stable); beyond
    that the CPU's sort is unstable and may report another occurrence of the same value.
    NaN never equals itself, so (as on the CPU) every NaN is a run of its own."""
    from .reduction import reduce_arg, scan

    b = L.b
    n = x.shape[dim]
    values, indices = sort_with_indices(L, x, dim, descending=False)
    pos = b.iota(values.shape, dim, torch.int64)
    zero = [0] * x.rank
    limit = list(x.shape)
    limit[dim] = n - 1
    one_before = list(zero)
    one_before[dim] = 1
    # neighbours along dim (the slot shifted in is never looked at: first/last are forced)
    prev = b.pad(b.slice(values, zero, limit), b.constant(0, x.dtype), one_before, zero)
    nxt = b.pad(b.slice(values, one_before, list(x.shape)), b.constant(0, x.dtype), zero, one_before)
    first = b.compare(pos, L.zeros(pos.shape, torch.int64), "EQ")
    last = b.compare(pos, L.full(n - 1, pos.shape, torch.int64), "EQ")
    starts = b.binary("or", first, b.compare(values, prev, "NE"))
    ends = b.binary("or", last, b.compare(values, nxt, "NE"))
    run_start = scan(L, b.select(starts, pos, L.zeros(pos.shape, torch.int64)), dim, "maximum", 0)
    run_len = b.binary("add", b.binary("subtract", pos, run_start), L.full(1, pos.shape, torch.int64))
    # a run's length counts at its last element only; argmax picks the first longest run
    freq = b.select(ends, run_len, L.zeros(pos.shape, torch.int64))
    _, best = reduce_arg(L, freq, dim, is_max=True)
    return _pick(L, values, dim, best), _pick(L, indices, dim, best)


@register(aten.mode.default)
def mode(L: NodeLowering, x: Value, dim: int = -1, keepdim: bool = False) -> tuple[Value, Value]:
    if x.rank == 0:
        return x, L.zeros((), torch.int64)
    v, i = _mode(L, x, dim % x.rank)
    return L.b.reshape(v, L.out[0].shape), L.b.reshape(i, L.out[1].shape)


def _numel(shape: tuple[int, ...]) -> int:
    out = 1
    for d in shape:
        out *= d
    return out
