"""embedding_bag (sum / mean / max, offsets or 2-d input, per_sample_weights,
padding_idx, include_last_offset) and its gradients.

Each index's bag is found by compare-and-count against the offsets (static shapes, no
host sync); bags are reduced with index_add / scatter_reduce. The auxiliary outputs
(offset2bag, bag_size, max_indices) have the shapes PyTorch's meta kernel promises and
are consumed only by our own backward rules. embedding_renorm (``max_norm``) too.
"""

from __future__ import annotations

import math

import torch

from ...stablehlo.builder import Value
from ..context import NodeLowering
from ..registry import register
from .reduction import acc_dtype

aten = torch.ops.aten

MODE_SUM, MODE_MEAN, MODE_MAX = 0, 1, 2


def _count(L: NodeLowering, pred: Value, dim: int) -> Value:
    b = L.b
    ones = b.convert(pred, torch.int64)
    return b.reduce([ones], [b.constant(0, torch.int64)], [dim], lambda a, c: [b.binary("add", a, c)])[0]


def _bags(L: NodeLowering, indices: Value, offsets: Value, n_bags: int) -> Value:
    """offset2bag: for index position i, the last bag whose offset is <= i."""
    b = L.b
    n = indices.shape[0]
    offs = L.b.slice(L.to(offsets, torch.int64), [0], [n_bags])
    pos = b.iota((n, n_bags), 0, torch.int64)
    starts = b.broadcast_in_dim(offs, (n, n_bags), [1])
    bag = b.binary("subtract", _count(L, b.compare(starts, pos, "LE"), 1), L.full(1, (n,), torch.int64))
    return b.binary("maximum", bag, L.zeros((n,), torch.int64))


def _valid(L: NodeLowering, indices: Value, padding_idx: int) -> Value:
    """Positions that count: below the indices' true length (:func:`_live`), not padding_idx."""
    live = _live(L, indices)
    if padding_idx is None or padding_idx < 0:
        return live
    return L.b.binary("and", live, L.b.compare(indices, L.full(padding_idx, indices.shape, indices.dtype), "NE"))


def _live(L: NodeLowering, indices: Value) -> Value:
    """Positions below the true length of ``indices``: a bucketed program (bounded
    dynamism) gets the ids padded to the bucket with their length marked
    (``set_dimension_size``), and the padding must join no bag; in a static program every
    position is live. The length is a count of the ids, a reduction XLA masks to the marked
    length (``get_dimension_size`` was folded to the static size before XLA saw it)."""
    b = L.b
    n = indices.shape[0]
    zero = L.zeros(indices.shape, indices.dtype)
    every = b.binary("or", b.compare(indices, zero, "LT"), b.compare(indices, zero, "GE"))  # true, but not foldable
    count = b.reduce([b.convert(every, torch.int32)], [b.constant(0, torch.int32)], [0], lambda x, y: [b.binary("add", x, y)])[0]
    return b.compare(b.iota((n,), 0, torch.int32), b.broadcast_in_dim(count, (n,), []), "LT")


def _expand(L: NodeLowering, v: Value, d: int) -> Value:
    return L.b.broadcast_in_dim(v, (v.shape[0], d), [0])


def _fit(L: NodeLowering, v: Value, k: int) -> Value:
    """Pad/convert ``v`` to the k-th promised output (bag_size has one entry per offset)."""
    spec = L.out[k]
    v = L.to(v, spec.dtype)
    if v.shape != spec.shape and v.rank == 1 and len(spec.shape) == 1:
        extra = spec.shape[0] - v.shape[0]
        v = L.b.pad(v, L.b.constant(0, v.dtype), [0], [extra]) if extra > 0 else L.b.slice(v, [0], [spec.shape[0]])
    return L.b.reshape(v, spec.shape) if v.shape != spec.shape else v


@register(aten._embedding_bag.default, aten._embedding_bag_forward_only.default)
def embedding_bag(
    L: NodeLowering,
    weight: Value,
    indices: Value,
    offsets: Value,
    scale_grad_by_freq: bool = False,
    mode: int = 0,
    sparse: bool = False,
    per_sample_weights: Value | None = None,
    include_last_offset: bool = False,
    padding_idx: int = -1,
) -> tuple[Value, Value, Value, Value]:
    b = L.b
    n, d = indices.shape[0], weight.shape[1]
    n_bags = offsets.shape[0] - (1 if include_last_offset else 0)
    bag = _bags(L, indices, offsets, n_bags)
    valid = _valid(L, indices, padding_idx)
    # include_last_offset: the last offset only ends the offsets (CSR); the last bag runs to
    # the end of the indices whatever its value, in PyTorch's CPU and CUDA kernels alike
    rows = L.lower(aten.index_select.default, weight, 0, indices)  # (n, D)
    size = L.lower(aten.index_add.default, L.zeros((n_bags,), torch.int64), 0, bag, b.convert(valid, torch.int64))
    vmask = _expand(L, valid, d)
    if mode == MODE_MAX:
        neg = L.full(-math.inf, (n, d), weight.dtype)
        src = b.select(vmask, rows, neg)
        out = L.lower(aten.scatter_reduce.two, L.zeros((n_bags, d), weight.dtype), 0, _expand(L, bag, d), src, "amax", include_self=False)
        empty = _expand(L, b.compare(size, L.zeros((n_bags,), torch.int64), "EQ"), d)
        out = b.select(empty, L.zeros((n_bags, d), weight.dtype), out)
        # first position (in index order) attaining the bag's max, as PyTorch's CPU loop
        hit = b.binary("and", vmask, b.compare(rows, L.lower(aten.index_select.default, out, 0, bag), "EQ"))
        posn = b.select(hit, b.iota((n, d), 0, torch.int64), L.full(n, (n, d), torch.int64))
        first = L.lower(aten.scatter_reduce.two, L.full(n, (n_bags, d), torch.int64), 0, _expand(L, bag, d), posn, "amin", include_self=True)
        first = b.select(empty, L.zeros((n_bags, d), torch.int64), first)
        idx_of = L.lower(aten.gather.default, _expand(L, L.to(indices, torch.int64), d), 0, b.binary("minimum", first, L.full(n - 1, (n_bags, d), torch.int64)))
        max_idx = b.select(empty, L.zeros((n_bags, d), torch.int64), idx_of)
    else:
        # sum/mean accumulate in float32 for 16-bit weights and round once, as the CPU
        # kernel does (bf16 sums rounded per row were 3x farther from float64)
        acc = acc_dtype(weight.dtype)
        src = L.to(rows, acc)
        if per_sample_weights is not None:
            src = b.binary("multiply", src, _expand(L, L.to(per_sample_weights, acc), d))
        src = b.select(vmask, src, L.zeros((n, d), acc))
        out = L.lower(aten.index_add.default, L.zeros((n_bags, d), acc), 0, bag, src)
        if mode == MODE_MEAN:
            denom = L.to(b.binary("maximum", size, L.full(1, size.shape, torch.int64)), acc)
            out = b.binary("divide", out, _expand(L, denom, d))
        out = L.to(out, weight.dtype)
        max_idx = L.zeros(L.out[3].shape, torch.int64)
    return _fit(L, out, 0), _fit(L, bag, 1), _fit(L, size, 2), _fit(L, max_idx, 3)


def _freq_scale(L: NodeLowering, indices: Value, num_weights: int) -> Value:
    """How often each position's index occurs among the live ids, for scale_grad_by_freq:
    a count per row, read back per position (an n x n comparison of the ids would give a
    tensor with their padded length twice, which XLA's dynamic padder refuses)."""
    ones = L.b.convert(_live(L, indices), torch.int64)
    counts = L.lower(aten.index_add.default, L.zeros((int(num_weights),), torch.int64), 0, indices, ones)
    return L.lower(aten.index_select.default, counts, 0, indices)


@register(aten._embedding_bag_dense_backward.default)
def embedding_bag_dense_backward(
    L: NodeLowering,
    grad: Value,
    indices: Value,
    offset2bag: Value,
    bag_size: Value,
    maximum_indices: Value,
    num_weights: int,
    scale_grad_by_freq: bool,
    mode: int,
    per_sample_weights: Value | None,
    padding_idx: int = -1,
) -> Value:
    b = L.b
    n, d = indices.shape[0], grad.shape[1]
    n_bags = grad.shape[0]
    out_dtype = L.out[0].dtype
    zeros = L.zeros((int(num_weights), d), grad.dtype)
    if mode == MODE_MAX:
        size = b.slice(bag_size, [0], [n_bags])
        live = _expand(L, b.compare(size, L.zeros((n_bags,), size.dtype), "GT"), d)
        g = b.select(live, grad, L.zeros(grad.shape, grad.dtype))
        return L.to(L.lower(aten.scatter_add.default, zeros, 0, maximum_indices, g), out_dtype)
    g = L.lower(aten.index_select.default, grad, 0, offset2bag)  # (n, D)
    if mode == MODE_MEAN:
        size = L.lower(aten.index_select.default, bag_size, 0, offset2bag)
        size = b.binary("maximum", L.to(size, torch.int64), L.full(1, (n,), torch.int64))
        g = b.binary("divide", g, _expand(L, L.to(size, g.dtype), d))
    if per_sample_weights is not None:
        g = b.binary("multiply", g, _expand(L, L.to(per_sample_weights, g.dtype), d))
    if scale_grad_by_freq:
        g = b.binary("divide", g, _expand(L, L.to(_freq_scale(L, indices, num_weights), g.dtype), d))
    g = b.select(_expand(L, _valid(L, indices, padding_idx), d), g, L.zeros(g.shape, g.dtype))
    return L.to(L.lower(aten.index_add.default, zeros, 0, indices, g), out_dtype)


@register(aten._embedding_bag_backward.default)
def embedding_bag_backward(
    L: NodeLowering,
    grad: Value,
    indices: Value,
    offsets: Value,
    offset2bag: Value,
    bag_size: Value,
    maximum_indices: Value,
    num_weights: int,
    scale_grad_by_freq: bool,
    mode: int,
    sparse: bool,
    per_sample_weights: Value | None,
    padding_idx: int = -1,
) -> Value:
    if sparse:
        raise NotImplementedError("torchtpu: embedding_bag(sparse=True) gradients are not supported; use sparse=False")
    return embedding_bag_dense_backward(
        L, grad, indices, offset2bag, bag_size, maximum_indices, num_weights, scale_grad_by_freq, mode, per_sample_weights, padding_idx
    )


@register(aten._embedding_bag_per_sample_weights_backward.default)
def per_sample_weights_backward(
    L: NodeLowering, grad: Value, weight: Value, indices: Value, offsets: Value, offset2bag: Value, mode: int, padding_idx: int = -1
) -> Value:
    b = L.b
    if mode != MODE_SUM:
        raise NotImplementedError("embedding_bag: per_sample_weights are only supported with mode='sum'")
    g = L.lower(aten.index_select.default, grad, 0, offset2bag)
    rows = L.lower(aten.index_select.default, weight, 0, indices)
    acc = torch.float32 if g.dtype in (torch.float16, torch.bfloat16) else g.dtype
    prod = b.binary("multiply", L.to(g, acc), L.to(rows, acc))
    dot = b.reduce([prod], [b.constant(0, prod.dtype)], [1], lambda a, c: [b.binary("add", a, c)])[0]
    dot = b.select(_valid(L, indices, padding_idx), dot, L.zeros(dot.shape, dot.dtype))
    return L.to(dot, L.out[0].dtype)



@register(aten.embedding_renorm.default, static_scalars=True)
def embedding_renorm(L: NodeLowering, weight: Value, indices: Value, max_norm: float, norm_type: float) -> Value:
    """``embedding(..., max_norm=)``: rows that ``indices`` reference and whose p-norm
    exceeds max_norm are scaled by max_norm / (norm + 1e-7), as the CPU kernel does."""
    b = L.b
    rows, acc = weight.shape[0], torch.float64 if weight.dtype is torch.float64 else torch.float32
    flat = b.reshape(L.to(indices, torch.int64), (math.prod(indices.shape), 1))
    touched = b.scatter(
        L.zeros((rows,), torch.int32), flat, L.full(1, (flat.shape[0],), torch.int32), [], [0], [0], 1
    )
    w = L.to(weight, acc)
    norm = _row_norm(L, w, norm_type)
    over = b.binary("and", b.compare(touched, L.zeros((rows,), torch.int32), "NE"), b.compare(norm, L.full(max_norm, (rows,), acc), "GT"))
    scale = b.binary("divide", L.full(max_norm, (rows,), acc), b.binary("add", norm, L.full(1e-7, (rows,), acc)))
    scale = b.select(over, scale, L.full(1, (rows,), acc))
    return L.to(b.binary("multiply", w, b.broadcast_in_dim(scale, w.shape, [0])), weight.dtype)


def _row_norm(L: NodeLowering, w: Value, p: float) -> Value:
    b = L.b
    a = b.unary("abs", w)
    add = lambda x, y: [b.binary("add", x, y)]  # noqa: E731
    if math.isinf(p):
        return b.reduce([a], [b.constant(0, w.dtype)], [1], lambda x, y: [b.binary("maximum", x, y)])[0]
    if p == 0:
        return b.reduce([b.convert(b.compare(a, L.zeros(a.shape, a.dtype), "NE"), w.dtype)], [b.constant(0, w.dtype)], [1], add)[0]
    if p == 1:
        return b.reduce([a], [b.constant(0, w.dtype)], [1], add)[0]
    powed = b.binary("power", a, L.full(p, a.shape, a.dtype))
    s = b.reduce([powed], [b.constant(0, w.dtype)], [1], add)[0]
    return b.binary("power", s, L.full(1.0 / p, s.shape, s.dtype))
