"""Shape and view ops as functional lowerings (reshape, permute, slice, select, expand,
as_strided, diagonal, unfold, split, cat, stack, flip, roll, pad, tril/triu, repeat, the
``*_copy`` variants and the ``*_scatter`` inverses), plus the shape prims that
PyTorch's reference decompositions emit.

Inside a program a view is just a new Value: rules see functional semantics. Views of
device tensors in eager mode are metadata-only kernels (see eager/minimal.py); these
rules are what decomposition graphs and compiled graphs use.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ...stablehlo.builder import Value, prod
from ..context import NodeLowering
from ..registry import register
from ..strided import bitcast, contiguous_strides, read_view

aten = torch.ops.aten
prims = torch.ops.prims


def wrap_dim(d: int, rank: int) -> int:
    r = max(rank, 1)
    return d + r if d < 0 else d


def _out_shape(L: NodeLowering, i: int = 0) -> tuple[int, ...]:
    return L.out[i].shape


def _reshape_to_out(L: NodeLowering, x: Value, *args: Any, **kwargs: Any) -> Value:
    return L.b.reshape(x, _out_shape(L))


def strided(L: NodeLowering, x: Value, sizes: Sequence[int], strides: Sequence[int], offset: int) -> Value:
    """The view (sizes, strides, offset) of ``x``'s contiguous (row-major) storage."""
    flat = L.b.reshape(x, (prod(x.shape),))
    return read_view(L.b, flat, tuple(int(s) for s in sizes), tuple(int(s) for s in strides), int(offset), x.dtype)


# -- reshapes -------------------------------------------------------------------------------------
for _op in (
    aten.view.default,
    aten._unsafe_view.default,
    aten.reshape.default,
    aten._reshape_alias.default,
    aten.view_copy.default,
    aten._reshape_alias_copy.default,
    aten.squeeze.default,
    aten.squeeze.dim,
    aten.squeeze.dims,
    aten.squeeze_copy.default,
    aten.squeeze_copy.dim,
    aten.squeeze_copy.dims,
    aten.unsqueeze.default,
    aten.unsqueeze_copy.default,
    aten.flatten.using_ints,
    aten.unflatten.int,
    aten.view_as.default,
    aten.reshape_as.default,
    prims.reshape.default,
    prims.squeeze.default,
    prims.split_dim.default,
    prims.collapse.default,
    prims.collapse_view.default,
):
    register(_op)(_reshape_to_out)


@register(
    aten.alias_copy.default,
    aten.lift_fresh.default,
    aten.detach_copy.default,
    prims.view_of.default,
)
def alias(L: NodeLowering, x: Value) -> Value:
    return x


@register(aten.view.dtype, aten.view_copy.dtype)
def view_dtype(L: NodeLowering, x: Value, dtype: torch.dtype) -> Value:
    return bitcast(L.b, x, dtype)  # along the last dimension, as the CPU's view(dtype)


# -- permutations ----------------------------------------------------------------------------------
@register(aten.permute.default, aten.permute_copy.default, prims.transpose.default)
def permute(L: NodeLowering, x: Value, dims: Sequence[int]) -> Value:
    return L.b.transpose(x, [wrap_dim(d, x.rank) for d in dims])


@register(aten.transpose.int, aten.transpose_copy.int, aten.swapaxes.default, aten.swapdims.default)
def transpose(L: NodeLowering, x: Value, d0: int, d1: int) -> Value:
    if x.rank < 2:
        return x
    perm = list(range(x.rank))
    d0, d1 = wrap_dim(d0, x.rank), wrap_dim(d1, x.rank)
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return L.b.transpose(x, perm)


@register(aten.t.default, aten.t_copy.default, aten.numpy_T.default)
def t(L: NodeLowering, x: Value) -> Value:
    return L.b.transpose(x, list(reversed(range(x.rank))))


@register(aten.movedim.int)
def movedim(L: NodeLowering, x: Value, src: int, dst: int) -> Value:
    src, dst = wrap_dim(src, x.rank), wrap_dim(dst, x.rank)
    perm = [d for d in range(x.rank) if d != src]
    perm.insert(dst, src)
    return L.b.transpose(x, perm)


# -- expand -------------------------------------------------------------------------------------------
@register(aten.expand.default, aten.expand_copy.default, aten.expand_as.default, aten.broadcast_to.default)
def expand(L: NodeLowering, x: Value, *args: Any, **kwargs: Any) -> Value:
    return L.broadcast_to(x, _out_shape(L))


@register(prims.broadcast_in_dim.default)
def prims_broadcast_in_dim(L: NodeLowering, x: Value, shape: Sequence[int], dims: Sequence[int]) -> Value:
    return L.b.broadcast_in_dim(x, tuple(shape), list(dims))


# -- slicing ---------------------------------------------------------------------------------------------
def _slice_range(n: int, start: Any, end: Any, step: int) -> tuple[int, int, int]:
    """ATen's clamping of slice bounds (start/end may be None or out of range)."""
    start = 0 if start is None else int(start)
    end = n if end is None else int(end)
    if start < 0:
        start += n
    if end < 0:
        end += n
    start = min(max(start, 0), n)
    end = min(max(end, start), n)
    return start, end, int(step)


def slice_dim(L: NodeLowering, x: Value, dim: int, start: int, end: int, step: int = 1) -> Value:
    lo = [0] * x.rank
    hi = list(x.shape)
    st = [1] * x.rank
    lo[dim], hi[dim], st[dim] = start, end, step
    return L.b.slice(x, lo, hi, st)


@register(aten.slice.Tensor, aten.slice_copy.Tensor)
def slice_(L: NodeLowering, x: Value, dim: int = 0, start: Any = None, end: Any = None, step: int = 1) -> Value:
    dim = wrap_dim(dim, x.rank)
    s, e, st = _slice_range(x.shape[dim], start, end, step)
    return slice_dim(L, x, dim, s, e, st)


@register(aten.narrow.default, aten.narrow_copy.default)
def narrow(L: NodeLowering, x: Value, dim: int, start: Any, length: int) -> Value:
    dim = wrap_dim(dim, x.rank)
    start = int(start)
    if start < 0:
        start += x.shape[dim]
    return slice_dim(L, x, dim, start, start + int(length))


@register(aten.select.int, aten.select_copy.int)
def select(L: NodeLowering, x: Value, dim: int, index: int) -> Value:
    dim = wrap_dim(dim, x.rank)
    index = int(index)
    if index < 0:
        index += x.shape[dim]
    return L.b.reshape(slice_dim(L, x, dim, index, index + 1), _out_shape(L))


def _split_by_sizes(L: NodeLowering, x: Value, sizes: Sequence[int], dim: int) -> list[Value]:
    dim = wrap_dim(dim, x.rank)
    out, start = [], 0
    for s in sizes:
        out.append(slice_dim(L, x, dim, start, start + int(s)))
        start += int(s)
    return out


@register(aten.split.Tensor, aten.unsafe_split.Tensor, aten.split_copy.Tensor)
def split(L: NodeLowering, x: Value, split_size: int, dim: int = 0) -> list[Value]:
    return _split_by_sizes(L, x, [spec.shape[wrap_dim(dim, x.rank)] for spec in L.out], dim)


@register(
    aten.split_with_sizes.default,
    aten.unsafe_split_with_sizes.default,
    aten.split_with_sizes_copy.default,
    aten.split.sizes,
)
def split_with_sizes(L: NodeLowering, x: Value, sizes: Sequence[int], dim: int = 0) -> list[Value]:
    return _split_by_sizes(L, x, sizes, dim)


@register(aten.chunk.default, aten.unsafe_chunk.default, aten.tensor_split.sections, aten.tensor_split.indices)
def chunk(L: NodeLowering, x: Value, _n: Any, dim: int = 0) -> list[Value]:
    return _split_by_sizes(L, x, [spec.shape[wrap_dim(dim, x.rank)] for spec in L.out], dim)


@register(aten.unbind.int, aten.unbind_copy.int)
def unbind(L: NodeLowering, x: Value, dim: int = 0) -> list[Value]:
    dim = wrap_dim(dim, x.rank)
    shape = tuple(d for i, d in enumerate(x.shape) if i != dim)
    return [L.b.reshape(slice_dim(L, x, dim, i, i + 1), shape) for i in range(x.shape[dim])]


# -- general strided views ---------------------------------------------------------------------------------
@register(aten.as_strided.default, aten.as_strided_copy.default, prims.as_strided.default)
def as_strided(L: NodeLowering, x: Value, size: Sequence[int], stride: Sequence[int], storage_offset: Any = None) -> Value:
    return strided(L, x, size, stride, int(storage_offset or 0))


def _diagonal_geometry(shape: Sequence[int], offset: int, d1: int, d2: int) -> tuple[list[int], list[int], int]:
    rank = len(shape)
    d1, d2 = wrap_dim(d1, rank), wrap_dim(d2, rank)
    cs = contiguous_strides(shape)
    if offset >= 0:
        n = max(0, min(shape[d1], shape[d2] - offset))
        start = offset * cs[d2]
    else:
        n = max(0, min(shape[d1] + offset, shape[d2]))
        start = -offset * cs[d1]
    if n == 0:
        start = 0
    sizes = [s for i, s in enumerate(shape) if i not in (d1, d2)] + [n]
    strides = [s for i, s in enumerate(cs) if i not in (d1, d2)] + [cs[d1] + cs[d2]]
    return sizes, strides, start


@register(aten.diagonal.default, aten.diagonal_copy.default)
def diagonal(L: NodeLowering, x: Value, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Value:
    sizes, strides, start = _diagonal_geometry(x.shape, offset, dim1, dim2)
    return strided(L, x, sizes, strides, start)


@register(aten.unfold.default, aten.unfold_copy.default)
def unfold(L: NodeLowering, x: Value, dim: int, size: int, step: int) -> Value:
    if x.rank == 0:
        return L.b.reshape(x, (1,))
    dim = wrap_dim(dim, x.rank)
    cs = list(contiguous_strides(x.shape))
    sizes = list(_out_shape(L))
    strides = cs[:dim] + [cs[dim] * step] + cs[dim + 1 :] + [cs[dim]]
    return strided(L, x, sizes, strides, 0)


# -- scatter inverses of views ---------------------------------------------------------------------------------
def _write_strided(L: NodeLowering, x: Value, src: Value, sizes: Sequence[int], strides: Sequence[int], offset: int) -> Value:
    from ..strided import write_view

    flat = L.b.reshape(x, (prod(x.shape),))
    src = L.to(src, x.dtype)
    src = L.broadcast_to(src, tuple(sizes))
    return L.b.reshape(write_view(L.b, flat, tuple(sizes), tuple(strides), int(offset), src), x.shape)


@register(aten.slice_scatter.default)
def slice_scatter(L: NodeLowering, x: Value, src: Value, dim: int = 0, start: Any = None, end: Any = None, step: int = 1) -> Value:
    dim = wrap_dim(dim, x.rank)
    s, e, st = _slice_range(x.shape[dim], start, end, step)
    src = L.to(src, x.dtype)
    n = max(0, -(-(e - s) // st))
    if n == 0:
        return x
    if st == 1:
        starts = [L.b.constant(s if i == dim else 0, torch.int64) for i in range(x.rank)]
        return L.b.dynamic_update_slice(x, src, starts)
    cs = list(contiguous_strides(x.shape))
    sizes = list(x.shape)
    sizes[dim] = n
    strides = list(cs)
    strides[dim] = cs[dim] * st
    return _write_strided(L, x, src, sizes, strides, s * cs[dim])


@register(aten.select_scatter.default)
def select_scatter(L: NodeLowering, x: Value, src: Value, dim: int, index: int) -> Value:
    dim = wrap_dim(dim, x.rank)
    index = int(index)
    if index < 0:
        index += x.shape[dim]
    shape = list(x.shape)
    shape[dim] = 1
    src = L.b.reshape(L.to(src, x.dtype), shape)
    starts = [L.b.constant(index if i == dim else 0, torch.int64) for i in range(x.rank)]
    return L.b.dynamic_update_slice(x, src, starts)


@register(aten.diagonal_scatter.default)
def diagonal_scatter(L: NodeLowering, x: Value, src: Value, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Value:
    sizes, strides, start = _diagonal_geometry(x.shape, offset, dim1, dim2)
    if prod(sizes) == 0:
        return x
    return _write_strided(L, x, src, sizes, strides, start)


@register(aten.as_strided_scatter.default, prims.as_strided_scatter.default)
def as_strided_scatter(L: NodeLowering, x: Value, src: Value, size: Sequence[int], stride: Sequence[int], storage_offset: Any = None) -> Value:
    if prod(size) == 0:
        return x
    offset = int(storage_offset or 0)
    needed = offset + 1 + sum((n - 1) * s for n, s in zip(size, stride))
    if needed > prod(x.shape):  # the CPU's setStorage bounds check (as_strided_scatter's view of x)
        item = x.dtype.itemsize
        raise RuntimeError(
            f"setStorage: sizes {list(size)}, strides {list(stride)}, storage offset {offset}, and itemsize {item} "
            f"requiring a storage size of {needed * item} are out of bounds for storage of size {prod(x.shape) * item}"
        )
    return _write_strided(L, x, src, size, stride, offset)


# -- joining -------------------------------------------------------------------------------------------------------
@register(aten.cat.default, prims.cat.default)
def cat(L: NodeLowering, xs: Sequence[Value], dim: int = 0) -> Value:
    out = L.out[0]
    rank = len(out.shape)
    dim = wrap_dim(dim, rank)
    # legacy: 1-D empty tensors are skipped
    parts = [L.to(x, out.dtype) for x in xs if not (x.rank == 1 and x.shape[0] == 0 and rank != 1)]
    parts = [p for p in parts if p.shape[dim] != 0] or parts[:1]
    if not parts or prod(out.shape) == 0:
        return L.zeros(out.shape, out.dtype)
    return L.b.concatenate(parts, dim)


@register(aten.stack.default)
def stack(L: NodeLowering, xs: Sequence[Value], dim: int = 0) -> Value:
    out = L.out[0]
    dim = wrap_dim(dim, len(out.shape))
    shape = list(out.shape)
    shape[dim] = 1
    parts = [L.b.reshape(L.to(x, out.dtype), shape) for x in xs]
    return L.b.concatenate(parts, dim)


# -- reordering ----------------------------------------------------------------------------------------------
@register(aten.flip.default, prims.rev.default)
def flip(L: NodeLowering, x: Value, dims: Sequence[int]) -> Value:
    dims = sorted({wrap_dim(d, x.rank) for d in dims})
    dims = [d for d in dims if x.rank and x.shape[d] > 1]
    if not dims:
        return x
    return L.b.op1("stablehlo.reverse", [x], x.shape, x.dtype, f"dimensions = array<i64: {', '.join(map(str, dims))}>")


@register(aten.roll.default)
def roll(L: NodeLowering, x: Value, shifts: Sequence[int], dims: Sequence[int] = ()) -> Value:
    shifts = [int(s) for s in shifts]
    dims = [int(d) for d in dims]
    if not dims:
        flat = L.b.reshape(x, (prod(x.shape),))
        return L.b.reshape(_roll1(L, flat, shifts[0], 0), x.shape)
    for s, d in zip(shifts, dims, strict=True):
        x = _roll1(L, x, s, wrap_dim(d, x.rank))
    return x


def _roll1(L: NodeLowering, x: Value, shift: int, dim: int) -> Value:
    n = x.shape[dim]
    if n == 0:
        return x
    shift %= n
    if shift == 0:
        return x
    return L.b.concatenate([slice_dim(L, x, dim, n - shift, n), slice_dim(L, x, dim, 0, n - shift)], dim)


@register(aten.constant_pad_nd.default)
def constant_pad_nd(L: NodeLowering, x: Value, pad: Sequence[int], value: Any = 0) -> Value:
    pad = [int(p) for p in pad]
    low, high = [0] * x.rank, [0] * x.rank
    for i in range(len(pad) // 2):
        d = x.rank - 1 - i
        low[d], high[d] = pad[2 * i], pad[2 * i + 1]
    # negative padding crops
    lo_crop = [max(0, -p) for p in low]
    hi_crop = [x.shape[d] - max(0, -high[d]) for d in range(x.rank)]
    if any(lo_crop) or any(h != s for h, s in zip(hi_crop, x.shape, strict=True)):
        x = L.b.slice(x, lo_crop, [max(lo, h) for lo, h in zip(lo_crop, hi_crop, strict=True)])
    low = [max(0, p) for p in low]
    high = [max(0, p) for p in high]
    if not any(low) and not any(high):
        return x
    return L.b.pad(x, L.scalar(value, x.dtype), low, high)


def _tri(L: NodeLowering, x: Value, diagonal: int, lower: bool) -> Value:
    if x.rank < 2:
        return x
    shape = x.shape
    r = L.b.iota(shape, x.rank - 2, torch.int64)
    c = L.b.iota(shape, x.rank - 1, torch.int64)
    diff = L.b.binary("subtract", c, r)  # col - row
    k = L.full(int(diagonal), shape, torch.int64)
    keep = L.b.compare(diff, k, "LE" if lower else "GE")
    return L.b.select(keep, x, L.zeros(shape, x.dtype))


@register(aten.tril.default)
def tril(L: NodeLowering, x: Value, diagonal: int = 0) -> Value:
    return _tri(L, x, diagonal, True)


@register(aten.triu.default)
def triu(L: NodeLowering, x: Value, diagonal: int = 0) -> Value:
    return _tri(L, x, diagonal, False)


@register(aten.repeat.default)
def repeat(L: NodeLowering, x: Value, repeats: Sequence[int]) -> Value:
    repeats = [int(r) for r in repeats]
    out = _out_shape(L)
    lead = len(repeats) - x.rank
    xs = (1,) * lead + x.shape
    if prod(out) == 0:
        return L.zeros(out, x.dtype)
    x = L.b.reshape(x, xs)
    # broadcast to (r0, s0, r1, s1, ...) and merge pairs
    inter = []
    dims = []
    for i, (r, s) in enumerate(zip(repeats, xs, strict=True)):
        inter += [r, s]
        dims.append(2 * i + 1)
    y = L.b.broadcast_in_dim(x, inter, dims)
    return L.b.reshape(y, out)
