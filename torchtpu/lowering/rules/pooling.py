"""Pooling and resampling: max/avg pooling (1-3 spatial dims, with indices and backward),
adaptive avg/max pooling, nearest/linear/cubic and anti-aliased upsampling (and backward).

Windowed reductions are ``stablehlo.reduce_window``; max pooling carries the flat input
index (per plane, as PyTorch's CPU kernels number it) through a variadic reduce_window,
and its backward scatter-adds the gradient at those indices. Average pooling's backward
is the transpose of a window sum (interior-padded cotangent, then a window sum). Adaptive
pooling with uneven windows and interpolation are separable: one small constant matrix
per spatial dim, applied with dot_general (exact for 0/1 matrices on finite inputs).
16-bit inputs are summed in f32.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ...stablehlo.builder import Value
from ...stablehlo.types import is_float
from ..context import NodeLowering
from ..registry import register, register_meta

aten = torch.ops.aten

_LOW_PRECISION = (torch.bfloat16, torch.float16)


def _acc(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in _LOW_PRECISION else dtype


def _expand(v: Any, n: int, default: Sequence[int] | None = None) -> list[int]:
    if v is None or (isinstance(v, (list, tuple)) and len(v) == 0):
        return list(default) if default is not None else [0] * n
    if isinstance(v, int):
        return [v] * n
    v = [int(a) for a in v]
    return v * n if len(v) == 1 else v


def _dil(size: int, d: int) -> int:
    return 0 if size == 0 else 1 + d * (size - 1)


def _add(L: NodeLowering) -> Any:
    return lambda a, b: [L.b.binary("add", a, b)]


def _flat_index(L: NodeLowering, shape: Sequence[int], nsp: int) -> Value:
    """int64 tensor of ``shape`` holding each element's flat index within its plane
    (the last ``nsp`` dims)."""
    b = L.b
    sp = shape[-nsp:]
    lead = len(shape) - nsp
    idx = None
    stride = 1
    for i in reversed(range(nsp)):
        term = b.iota(shape, lead + i, torch.int64)
        if stride != 1:
            term = b.binary("multiply", term, L.full(stride, shape, torch.int64))
        idx = term if idx is None else b.binary("add", idx, term)
        stride *= sp[i]
    return idx


def _argmax_body(L: NodeLowering) -> Any:
    """Combiner of (value, index) pairs: the larger value, the smaller index on ties (the
    first maximum in scan order), NaN wins (the last NaN, like PyTorch's CPU kernels)."""
    b = L.b

    def body(av: Value, ai: Value, bv: Value, bi: Value) -> list[Value]:
        if is_float(av.dtype):
            a_nan = b.compare(av, av, "NE")
            b_nan = b.compare(bv, bv, "NE")
            nan_pick = b.binary("and", b_nan, b.unary("not", a_nan))
            both_nan = b.binary("and", a_nan, b_nan)
            nan_pick = b.binary("or", nan_pick, b.binary("and", both_nan, b.compare(bi, ai, "GT")))
        else:
            nan_pick = None
        gt = b.compare(bv, av, "GT")
        tie = b.binary("and", b.compare(bv, av, "EQ"), b.compare(bi, ai, "LT"))
        take = b.binary("or", gt, tie)
        if nan_pick is not None:
            take = b.binary("or", take, nan_pick)
        return [b.select(take, bv, av), b.select(take, bi, ai)]

    return body


def _lowest(dtype: torch.dtype) -> float | int:
    if is_float(dtype):
        return -math.inf
    if dtype is torch.bool:
        return False
    return int(torch.iinfo(dtype).min)


def _crop(L: NodeLowering, x: Value, shape: Sequence[int]) -> Value:
    if tuple(x.shape) == tuple(shape):
        return x
    return L.b.slice(x, [0] * x.rank, list(shape))


# -- max pooling ---------------------------------------------------------------------------------
def _window_pads(n: Sequence[int], o: Sequence[int], k: Sequence[int], s: Sequence[int], p: Sequence[int], d: Sequence[int]) -> list[tuple[int, int]]:
    """(low, high) padding so that a window reduction yields at least ``o`` outputs."""
    return [(p[i], max(0, (o[i] - 1) * s[i] + _dil(k[i], d[i]) - n[i] - p[i])) for i in range(len(n))]


def _max_pool(L: NodeLowering, x: Value, nsp: int, kernel: Any, stride: Any, padding: Any, dilation: Any) -> tuple[Value, Value]:
    out = L.out[0]
    k = _expand(kernel, nsp)
    s = _expand(stride, nsp, default=k)
    p = _expand(padding, nsp)
    d = _expand(dilation, nsp, default=[1] * nsp)
    lead = x.rank - nsp
    n = x.shape[lead:]
    o = out.shape[lead:]
    pads = [(0, 0)] * lead + _window_pads(n, o, k, s, p, d)
    idx = _flat_index(L, x.shape, nsp)
    init_v = L.b.constant(_lowest(x.dtype), x.dtype)
    init_i = L.b.constant(torch.iinfo(torch.int64).max, torch.int64)
    v, i = L.b.reduce_window(
        [x, idx], [init_v, init_i], [1] * lead + k, [1] * lead + s, pads, _argmax_body(L),
        window_dilations=[1] * lead + d,
    )
    return _crop(L, v, out.shape), _crop(L, i, out.shape)


def _scatter_by_index(L: NodeLowering, grad: Value, indices: Value, in_shape: Sequence[int], nsp: int) -> Value:
    """Sum ``grad`` into a zero tensor of ``in_shape`` at the per-plane flat ``indices``."""
    b = L.b
    lead = len(in_shape) - nsp
    plane = math.prod(in_shape[lead:])
    planes = math.prod(in_shape[:lead])
    acc = _acc(grad.dtype)
    g = L.to(grad, acc)
    idx = L.to(indices, torch.int64)
    if planes > 1:
        # global index = plane number * plane size + index within the plane
        pshape = idx.shape
        pnum = None
        stride = 1
        for dim in reversed(range(lead)):
            term = b.iota(pshape, dim, torch.int64)
            if stride != 1:
                term = b.binary("multiply", term, L.full(stride, pshape, torch.int64))
            pnum = term if pnum is None else b.binary("add", pnum, term)
            stride *= pshape[dim]
        idx = b.binary("add", idx, b.binary("multiply", pnum, L.full(plane, pshape, torch.int64)))
    m = math.prod(idx.shape)
    idx = b.reshape(idx, (m, 1))
    g = b.reshape(g, (m,))
    zeros = L.zeros((planes * plane,), acc)
    r = b.scatter(zeros, idx, g, [], [0], [0], 1, combine=lambda old, new: b.binary("add", old, new))
    return L.to(b.reshape(r, in_shape), grad.dtype)


def _max_pool_rule(nsp: int) -> Any:
    def rule(L: NodeLowering, x: Value, kernel_size: Any, stride: Any = (), padding: Any = 0, dilation: Any = 1, ceil_mode: bool = False) -> tuple[Value, Value]:
        return _max_pool(L, x, nsp, kernel_size, stride, padding, dilation)

    return rule


def _max_pool_backward_rule(nsp: int) -> Any:
    def rule(L: NodeLowering, grad: Value, x: Value, kernel_size: Any, stride: Any, padding: Any, dilation: Any, ceil_mode: bool, indices: Value) -> Value:
        return _scatter_by_index(L, grad, indices, x.shape, nsp)

    return rule


register(aten.max_pool2d_with_indices.default)(_max_pool_rule(2))
register(aten.max_pool3d_with_indices.default)(_max_pool_rule(3))
register(aten.max_pool2d_with_indices_backward.default)(_max_pool_backward_rule(2))
register(aten.max_pool3d_with_indices_backward.default)(_max_pool_backward_rule(3))


@register(aten.max_pool2d.default, aten.max_pool3d.default)
def max_pool(L: NodeLowering, x: Value, kernel_size: Any, stride: Any = (), padding: Any = 0, dilation: Any = 1, ceil_mode: bool = False) -> Value:
    nsp = 2 if L.op is aten.max_pool2d.default else 3
    return _max_pool(L, x, nsp, kernel_size, stride, padding, dilation)[0]


@register(aten.max_pool1d.default)
def max_pool1d(L: NodeLowering, x: Value, kernel_size: Any, stride: Any = (), padding: Any = 0, dilation: Any = 1, ceil_mode: bool = False) -> Value:
    return _max_pool(L, x, 1, kernel_size, stride, padding, dilation)[0]


# -- average pooling -----------------------------------------------------------------------------
def _avg_divisor(n: int, o: int, k: int, s: int, p: int, count_include_pad: bool) -> np.ndarray:
    out = np.zeros(o, dtype=np.float64)
    for i in range(o):
        start = i * s - p
        end = min(start + k, n + p)
        size = end - start
        start, end = max(start, 0), min(end, n)
        out[i] = size if count_include_pad else max(end - start, 1)
    return out


def _divisor(L: NodeLowering, n, o, k, s, p, count_include_pad, divisor_override, shape, dtype) -> Value:
    lead = len(shape) - len(n)
    if divisor_override:
        return L.full(divisor_override, shape, dtype)
    div = np.ones((), dtype=np.float64)
    for i in range(len(n)):
        div = np.multiply.outer(div, _avg_divisor(n[i], o[i], k[i], s[i], p[i], count_include_pad))
    if np.all(div == div.flat[0]):
        return L.full(float(div.flat[0]), shape, dtype)
    c = L.b.constant_array(div, dtype)
    return L.b.broadcast_in_dim(c, shape, list(range(lead, len(shape))))


def _avg_params(nsp, x_rank, kernel_size, stride, padding):
    k = _expand(kernel_size, nsp)
    s = _expand(stride, nsp, default=k)
    p = _expand(padding, nsp)
    return k, s, p, x_rank - nsp


def _avg_pool_rule(nsp: int) -> Any:
    def rule(L: NodeLowering, x: Value, kernel_size: Any, stride: Any = (), padding: Any = 0, ceil_mode: bool = False,
             count_include_pad: bool = True, divisor_override: Any = None) -> Value:
        out = L.out[0]
        k, s, p, lead = _avg_params(nsp, x.rank, kernel_size, stride, padding)
        n, o = x.shape[lead:], out.shape[lead:]
        acc = _acc(x.dtype)
        xa = L.to(x, acc)
        pads = [(0, 0)] * lead + _window_pads(n, o, k, s, p, [1] * nsp)
        (tot,) = L.b.reduce_window([xa], [L.b.constant(0, acc)], [1] * lead + k, [1] * lead + s, pads, _add(L))
        tot = _crop(L, tot, out.shape)
        div = _divisor(L, n, o, k, s, p, count_include_pad, divisor_override, out.shape, acc)
        return L.to(L.b.binary("divide", tot, div), out.dtype)

    return rule


def _window_sum_transpose(L: NodeLowering, g: Value, in_shape: Sequence[int], k: Sequence[int], s: Sequence[int], p: Sequence[int], nsp: int) -> Value:
    """Transpose of a (strided, low-padded by ``p``) window sum: each output's cotangent
    added to every input of its window."""
    lead = g.rank - nsp
    lo, hi, interior = [0] * lead, [0] * lead, [0] * lead
    for i in range(nsp):
        n, o = in_shape[lead + i], g.shape[lead + i]
        before = k[i] - p[i] - 1
        after = n + k[i] - 1 - _dil(o, s[i]) - before
        lo.append(before)
        hi.append(after)
        interior.append(s[i] - 1)
    padded = L.b.pad(g, L.b.constant(0, g.dtype), lo, hi, interior)
    (r,) = L.b.reduce_window([padded], [L.b.constant(0, g.dtype)], [1] * lead + list(k), [1] * g.rank, [(0, 0)] * g.rank, _add(L))
    return r


def _avg_pool_backward_rule(nsp: int) -> Any:
    def rule(L: NodeLowering, grad: Value, x: Value, kernel_size: Any, stride: Any, padding: Any, ceil_mode: bool,
             count_include_pad: bool, divisor_override: Any) -> Value:
        k, s, p, lead = _avg_params(nsp, x.rank, kernel_size, stride, padding)
        n, o = x.shape[lead:], grad.shape[lead:]
        acc = _acc(grad.dtype)
        g = L.to(grad, acc)
        div = _divisor(L, n, o, k, s, p, count_include_pad, divisor_override, g.shape, acc)
        g = L.b.binary("divide", g, div)
        r = _window_sum_transpose(L, g, x.shape, k, s, p, nsp)
        return L.to(r, x.dtype)

    return rule


register(aten.avg_pool2d.default)(_avg_pool_rule(2))
register(aten.avg_pool3d.default)(_avg_pool_rule(3))
register(aten.avg_pool2d_backward.default)(_avg_pool_backward_rule(2))
register(aten.avg_pool3d_backward.default)(_avg_pool_backward_rule(3))


# -- separable matrices ------------------------------------------------------------------------
def _apply_matrices(L: NodeLowering, x: Value, mats: Sequence[np.ndarray | None], nsp: int, out_dtype: torch.dtype) -> Value:
    """For each spatial dim i, contract it with ``mats[i]`` (shape ``[new, old]``); None
    keeps the dim. Computes in f32 for 16-bit inputs."""
    if not x.dtype.is_floating_point:
        return _apply_matrices_integer(L, x, mats, nsp, out_dtype)
    acc = _acc(x.dtype)
    y = L.to(x, acc)
    lead = x.rank - nsp
    for m in mats:
        if m is None or (m.shape[0] == m.shape[1] and np.array_equal(m, np.eye(m.shape[0]))):
            # identity: rotate the dim to the end like the contraction would
            perm = [d for d in range(y.rank) if d != lead] + [lead]
            y = L.b.transpose(y, perm)
            continue
        c = L.b.constant_array(m, acc)
        y = L.b.dot_general(y, c, [lead], [1], out_dtype=acc, precision="HIGHEST")
    return L.to(y, out_dtype)


def _int16_weights(m: np.ndarray) -> tuple[np.ndarray, int]:
    """The CPU's uint8 resampling weights: fixed point in int16 with as many fractional
    bits as the largest weight allows (_compute_index_ranges_int16_weights)."""
    w_max = float(np.abs(m).max())
    precision = 0
    while precision < 22 and int(0.5 + w_max * (1 << (precision + 1))) < (1 << 15):
        precision += 1
    scaled = m * (1 << precision)
    return np.trunc(np.where(m < 0, scaled - 0.5, scaled + 0.5)).astype(np.int32), precision


def _apply_matrices_integer(L: NodeLowering, x: Value, mats: Sequence[np.ndarray | None], nsp: int, out_dtype: torch.dtype) -> Value:
    """uint8 resampling as the CPU's separable kernel does it: one dim at a time, the
    last (horizontal) dim first, each pass an exact integer sum with int16 fixed-point
    weights, rounded half up and clamped to the dtype's range before the next pass."""
    b = L.b
    info = torch.iinfo(x.dtype)
    lead = x.rank - nsp
    y = x
    for d in reversed(range(nsp)):
        m = mats[d]
        if m is None or (m.shape[0] == m.shape[1] and np.array_equal(m, np.eye(m.shape[0]))):
            continue
        weights, precision = _int16_weights(m)
        axis = lead + d
        acc = b.dot_general(L.to(y, torch.int32), b.constant_array(weights, torch.int32), [axis], [1], out_dtype=torch.int32)
        # the contracted dim comes back last: move it home
        acc = b.transpose(acc, list(range(axis)) + [acc.rank - 1] + list(range(axis, acc.rank - 1)))
        if precision:
            half = L.full(1 << (precision - 1), acc.shape, torch.int32)
            acc = b.binary("shift_right_arithmetic", b.binary("add", acc, half), L.full(precision, acc.shape, torch.int32))
        low, high = L.full(info.min, acc.shape, torch.int32), L.full(info.max, acc.shape, torch.int32)
        y = L.to(b.binary("minimum", b.binary("maximum", acc, low), high), x.dtype)
    return L.to(y, out_dtype)


# -- adaptive pooling ----------------------------------------------------------------------------
def _adaptive_bounds(n: int, o: int) -> list[tuple[int, int]]:
    return [((i * n) // o, -((-(i + 1) * n) // o)) for i in range(o)]


def _adaptive_matrix(n: int, o: int) -> np.ndarray:
    m = np.zeros((o, n), dtype=np.float64)
    for i, (a, b) in enumerate(_adaptive_bounds(n, o)):
        m[i, a:b] = 1.0
    return m


def _adaptive_counts(n: Sequence[int], o: Sequence[int]) -> np.ndarray:
    c = np.ones((), dtype=np.float64)
    for ni, oi in zip(n, o, strict=True):
        c = np.multiply.outer(c, np.array([b - a for a, b in _adaptive_bounds(ni, oi)], dtype=np.float64))
    return c


def _adaptive_avg_rule(nsp: int) -> Any:
    def rule(L: NodeLowering, x: Value, output_size: Sequence[int]) -> Value:
        out = L.out[0]
        lead = x.rank - nsp
        n, o = x.shape[lead:], out.shape[lead:]
        if any(v == 0 for v in x.shape):
            return L.zeros(out.shape, out.dtype)
        if all(ni % oi == 0 for ni, oi in zip(n, o, strict=True)):
            k = [ni // oi for ni, oi in zip(n, o, strict=True)]
            pool = aten.avg_pool2d.default if nsp == 2 else aten.avg_pool3d.default
            return L.lower(pool, x, k, k, [0] * nsp, False, True, None)
        return _uneven(L, x, n, o, out)

    def _uneven(L, x, n, o, out):
        acc = _acc(x.dtype)
        tot = _apply_matrices(L, x, [_adaptive_matrix(ni, oi) for ni, oi in zip(n, o, strict=True)], nsp, acc)
        cnt = _adaptive_counts(n, o)
        div = L.b.broadcast_in_dim(L.b.constant_array(cnt, acc), tot.shape, list(range(x.rank - nsp, x.rank)))
        return L.to(L.b.binary("divide", tot, div), out.dtype)

    return rule


def _adaptive_avg_backward_rule(nsp: int) -> Any:
    def rule(L: NodeLowering, grad: Value, x: Value) -> Value:
        lead = x.rank - nsp
        n, o = x.shape[lead:], grad.shape[lead:]
        acc = _acc(grad.dtype)
        cnt = _adaptive_counts(n, o)
        g = L.to(grad, acc)
        div = L.b.broadcast_in_dim(L.b.constant_array(cnt, acc), g.shape, list(range(lead, g.rank)))
        g = L.b.binary("divide", g, div)
        return _apply_matrices(L, g, [_adaptive_matrix(ni, oi).T.copy() for ni, oi in zip(n, o, strict=True)], nsp, x.dtype)

    return rule


register(aten._adaptive_avg_pool2d.default)(_adaptive_avg_rule(2))
register(aten._adaptive_avg_pool3d.default)(_adaptive_avg_rule(3))
register(aten._adaptive_avg_pool2d_backward.default)(_adaptive_avg_backward_rule(2))
register(aten._adaptive_avg_pool3d_backward.default)(_adaptive_avg_backward_rule(3))


def _gather_dim(L: NodeLowering, x: Value, dim: int, index: np.ndarray) -> Value:
    """``x`` indexed along ``dim`` by the constant 1-d ``index``."""
    m = int(index.size)
    idx = L.b.constant_array(index.astype(np.int32).reshape(m, 1), torch.int32)
    offset = [d for d in range(x.rank) if d != dim]
    sizes = [1 if d == dim else x.shape[d] for d in range(x.rank)]
    shape = [m if d == dim else x.shape[d] for d in range(x.rank)]
    return L.b.gather(x, idx, offset, [dim], [dim], 1, sizes, shape)


def _adaptive_max_rule(nsp: int) -> Any:
    def rule(L: NodeLowering, x: Value, output_size: Sequence[int]) -> tuple[Value, Value]:
        out = L.out[0]
        lead = x.rank - nsp
        n, o = x.shape[lead:], out.shape[lead:]
        if all(ni % oi == 0 for ni, oi in zip(n, o, strict=True)):
            k = [ni // oi for ni, oi in zip(n, o, strict=True)]
            return _max_pool(L, x, nsp, k, k, 0, 1)
        # uneven windows: gather each window padded to the largest (repeating its last
        # element, harmless for a max with first-index ties), then reduce
        y = x
        idx_per_dim = []
        kmax = []
        for i in range(nsp):
            bounds = _adaptive_bounds(n[i], o[i])
            km = max(b - a for a, b in bounds)
            ix = np.array([[min(a + j, b - 1) for j in range(km)] for a, b in bounds], dtype=np.int64)
            idx_per_dim.append(ix)
            kmax.append(km)
            y = _gather_dim(L, y, lead + i, ix.reshape(-1))
        win_shape = list(x.shape[:lead])
        for i in range(nsp):
            win_shape += [o[i], kmax[i]]
        y = L.b.reshape(y, win_shape)
        flat = np.zeros((), dtype=np.int64)
        stride = 1
        strides = []
        for i in reversed(range(nsp)):
            strides.insert(0, stride)
            stride *= n[i]
        for i in range(nsp):
            flat = np.add.outer(flat, idx_per_dim[i] * strides[i])  # dims (..., o_i, k_i)
        fidx = L.b.broadcast_in_dim(L.b.constant_array(flat, torch.int64), win_shape, list(range(lead, len(win_shape))))
        init_v = L.b.constant(_lowest(x.dtype), x.dtype)
        init_i = L.b.constant(torch.iinfo(torch.int64).max, torch.int64)
        v, ind = L.b.reduce([y, fidx], [init_v, init_i], [lead + 2 * i + 1 for i in range(nsp)], _argmax_body(L))
        return v, ind

    return rule


def _adaptive_max_backward_rule(nsp: int) -> Any:
    def rule(L: NodeLowering, grad: Value, x: Value, indices: Value) -> Value:
        return _scatter_by_index(L, grad, indices, x.shape, nsp)

    return rule


register(aten.adaptive_max_pool2d.default)(_adaptive_max_rule(2))
register(aten.adaptive_max_pool3d.default)(_adaptive_max_rule(3))
register(aten.adaptive_max_pool2d_backward.default)(_adaptive_max_backward_rule(2))
register(aten.adaptive_max_pool3d_backward.default)(_adaptive_max_backward_rule(3))


# -- upsampling ----------------------------------------------------------------------------------
def _scale(n: int, o: int, scale: float | None) -> np.float32:
    """PyTorch's compute_scales_value (in float)."""
    if scale is not None and scale > 0:
        return np.float32(1.0 / scale)
    return np.float32(n) / np.float32(o)


def _nearest_index(n: int, o: int, scale: float | None, exact: bool) -> np.ndarray:
    if o == n and not exact:
        return np.arange(o)
    if o == 2 * n and not exact:
        return np.arange(o) >> 1
    s = _scale(n, o, scale)
    dst = np.arange(o, dtype=np.float32)
    if exact:
        src = np.floor((dst + np.float32(0.5)) * s)
    else:
        src = np.floor(dst * s)
    return np.minimum(src.astype(np.int64), n - 1)


def _linear_matrix(n: int, o: int, align_corners: bool, scale: float | None, ft: type = np.float32) -> np.ndarray:
    """Linear interpolation along one dim, weights computed in the kernel's float type ``ft``."""
    if align_corners:
        s = ft(n - 1) / ft(o - 1) if o > 1 else ft(0)
    else:
        s = ft(1.0 / scale) if scale is not None and scale > 0 else ft(n) / ft(o)
    m = np.zeros((o, n), dtype=np.float64)
    for i in range(o):
        if align_corners:
            src = ft(s * ft(i))
        else:
            src = ft(s * ft(i + ft(0.5)) - ft(0.5))
            src = max(src, ft(0))
        i0 = int(src)
        step = 1 if i0 < n - 1 else 0
        l1 = ft(src - ft(i0))
        l0 = ft(ft(1) - l1)
        m[i, i0] += l0
        m[i, i0 + step] += l1
    return m


def _source_scale(n: int, o: int, align_corners: bool, scale: float | None, ft: type) -> Any:
    """PyTorch's area_pixel_compute_scale, in the kernel's float type ``ft``."""
    if align_corners:
        return ft(n - 1) / ft(o - 1) if o > 1 else ft(0)
    if scale is not None and scale > 0:
        return ft(1.0 / scale)
    return ft(n) / ft(o)


def _cubic_near(x: Any, a: Any, ft: type) -> Any:
    """Keys' cubic convolution kernel for |x| <= 1 (PyTorch's cubic_convolution1)."""
    return ((a + ft(2)) * x - (a + ft(3))) * x * x + ft(1)


def _cubic_far(x: Any, a: Any, ft: type) -> Any:
    """... and for 1 < |x| < 2 (cubic_convolution2)."""
    return ((a * x - ft(5) * a) * x + ft(8) * a) * x - ft(4) * a


def _cubic_coefficients(t: Any, ft: type, a: float) -> list[Any]:
    """PyTorch's get_cubic_upsample_coefficients for the 4 taps around ``t``."""
    a = ft(a)
    return [_cubic_far(t + ft(1), a, ft), _cubic_near(t, a, ft), _cubic_near(ft(1) - t, a, ft), _cubic_far(ft(1) - t + ft(1), a, ft)]


def _cubic_matrix(n: int, o: int, align_corners: bool, scale: float | None, ft: type, rnd: Any = float) -> np.ndarray:
    """upsample_bicubic2d along one dim: 4 taps at clamped indices around the source
    point (A = -0.75), weights computed as the CPU kernel does, in its float type, and
    rounded (``rnd``) to the dtype it stores them in."""
    s = _source_scale(n, o, align_corners, scale, ft)
    m = np.zeros((o, n), dtype=np.float64)
    for i in range(o):
        real = s * ft(i) if align_corners else s * (ft(i) + ft(0.5)) - ft(0.5)
        i0 = min(int(np.floor(real)), n - 1)  # guard_index_and_lambda
        t = min(max(real - ft(i0), ft(0)), ft(1))
        for j, w in enumerate(_cubic_coefficients(t, ft, -0.75)):
            m[i, min(max(i0 - 1 + j, 0), n - 1)] += rnd(w)
    return m


def _aa_filter(x: Any, cubic: bool, ft: type) -> Any:
    x = abs(x)
    if not cubic:
        return ft(1) - x if x < 1 else ft(0)
    if x < 1:  # the anti-aliasing cubic filter uses a = -0.5 (PIL's), not -0.75
        return _cubic_near(x, ft(-0.5), ft)
    if x < 2:
        return _cubic_far(x, ft(-0.5), ft)
    return ft(0)


def _aa_matrix(n: int, o: int, align_corners: bool, scale: float | None, cubic: bool, ft: type) -> np.ndarray:
    """Anti-aliased (PIL-style) resampling along one dim, as the CPU's
    _compute_indices_min_size_weights_aa: when downsampling the filter widens by the
    scale, and each output's weights are normalised to sum to one."""
    interp = 4 if cubic else 2
    s = _source_scale(n, o, align_corners, scale, ft)
    support = ft(interp * 0.5) * s if s >= 1 else ft(interp * 0.5)
    max_size = int(np.ceil(support)) * 2 + 1
    invscale = ft(1) / s if s >= 1 else ft(1)
    m = np.zeros((o, n), dtype=np.float64)
    for i in range(o):
        center = s * (ft(i) + ft(0.5))
        xmin = max(int(center - support + ft(0.5)), 0)  # int(): truncation, as static_cast
        xsize = min(max(min(int(center + support + ft(0.5)), n) - xmin, 0), max_size)
        ws = [_aa_filter((ft(j + xmin) - center + ft(0.5)) * invscale, cubic, ft) for j in range(xsize)]
        total = ft(0)
        for w in ws:
            total = ft(total + w)
        for j, w in enumerate(ws):
            m[i, xmin + j] = w / total if total != 0 else w
    return m


# (op, number of spatial dims, kind) -> argument layout
_UPSAMPLE = {
    aten.upsample_nearest1d.default: (1, "nearest"),
    aten.upsample_nearest2d.default: (2, "nearest"),
    aten.upsample_nearest3d.default: (3, "nearest"),
    aten._upsample_nearest_exact1d.default: (1, "exact"),
    aten._upsample_nearest_exact2d.default: (2, "exact"),
    aten._upsample_nearest_exact3d.default: (3, "exact"),
    aten.upsample_linear1d.default: (1, "linear"),
    aten.upsample_bilinear2d.default: (2, "linear"),
    aten.upsample_trilinear3d.default: (3, "linear"),
    aten.upsample_bicubic2d.default: (2, "cubic"),
    aten._upsample_bilinear2d_aa.default: (2, "aa_linear"),
    aten._upsample_bicubic2d_aa.default: (2, "aa_cubic"),
}
_UPSAMPLE_BACKWARD = {
    aten.upsample_nearest1d_backward.default: (1, "nearest"),
    aten.upsample_nearest2d_backward.default: (2, "nearest"),
    aten.upsample_nearest3d_backward.default: (3, "nearest"),
    aten._upsample_nearest_exact1d_backward.default: (1, "exact"),
    aten._upsample_nearest_exact2d_backward.default: (2, "exact"),
    aten._upsample_nearest_exact3d_backward.default: (3, "exact"),
    aten.upsample_linear1d_backward.default: (1, "linear"),
    aten.upsample_bilinear2d_backward.default: (2, "linear"),
    aten.upsample_trilinear3d_backward.default: (3, "linear"),
    aten.upsample_bicubic2d_backward.default: (2, "cubic"),
    aten._upsample_bilinear2d_aa_backward.default: (2, "aa_linear"),
    aten._upsample_bicubic2d_aa_backward.default: (2, "aa_cubic"),
}
_INTERPOLATING = ("linear", "cubic", "aa_linear", "aa_cubic")  # kinds with align_corners


def _weight_rounding(dtype: torch.dtype) -> Any:
    """A weight as stored in ``dtype`` (16-bit floats round it), back as a Python float."""
    if dtype not in (torch.float16, torch.bfloat16):
        return float
    return lambda w: torch.tensor(float(w), dtype=dtype).item()


def _upsample_mats(
    kind: str,
    n: Sequence[int],
    o: Sequence[int],
    align_corners: bool,
    scales: Sequence[Any],
    dtype: torch.dtype = torch.float32,
    backward: bool = False,
) -> list[np.ndarray]:
    # the CPU computes the interpolation weights in the input's opmath type (double for
    # float64, else float); its forward cubic kernel stores them in the input's dtype
    # (16-bit inputs: rounded; matches the CPU bit for bit), the linear and backward
    # kernels keep them in opmath
    # (uint8 resampling computes its fixed-point weights from double-precision ones)
    ft = np.float64 if dtype is torch.float64 or not dtype.is_floating_point else np.float32
    rnd = float if backward else _weight_rounding(dtype)
    mats = []
    for i in range(len(n)):
        sc = scales[i] if i < len(scales) else None
        if kind == "linear":
            mats.append(_linear_matrix(n[i], o[i], align_corners, sc, ft))
        elif kind == "cubic":
            mats.append(_cubic_matrix(n[i], o[i], align_corners, sc, ft, rnd))
        elif kind in ("aa_linear", "aa_cubic"):
            mats.append(_aa_matrix(n[i], o[i], align_corners, sc, kind == "aa_cubic", ft))
        else:
            m = np.zeros((o[i], n[i]), dtype=np.float64)
            m[np.arange(o[i]), _nearest_index(n[i], o[i], sc, kind == "exact")] = 1.0
            mats.append(m)
    return mats


def _split_upsample_args(kind: str, nsp: int, rest: Sequence[Any]) -> tuple[bool, list[Any]]:
    rest = list(rest)
    align = False
    if kind in _INTERPOLATING:
        align = bool(rest.pop(0)) if rest else False
    scales = (rest + [None] * nsp)[:nsp]
    return align, scales


def _rest(op: Any, skip: int, rest: Sequence[Any], kwargs: dict[str, Any]) -> list[Any]:
    """The arguments after the first ``skip``, positionally, defaults filled in."""
    out = list(rest)
    for a in op._schema.arguments[skip + len(rest):]:
        out.append(kwargs.get(a.name, a.default_value if a.has_default_value() else None))
    return out


def _upsample(L: NodeLowering, x: Value, output_size: Sequence[int], *rest: Any, **kwargs: Any) -> Value:
    nsp, kind = _UPSAMPLE[L.op]
    rest = _rest(L.op, 2, rest, kwargs)
    out = L.out[0]
    lead = x.rank - nsp
    n, o = x.shape[lead:], out.shape[lead:]
    align, scales = _split_upsample_args(kind, nsp, rest)
    if kind in _INTERPOLATING:
        return _apply_matrices(L, x, _upsample_mats(kind, n, o, align, scales, x.dtype), nsp, out.dtype)
    # nearest: an exact gather per dim
    y = x
    for i in range(nsp):
        idx = _nearest_index(n[i], o[i], scales[i], kind == "exact")
        if not (o[i] == n[i] and np.array_equal(idx, np.arange(n[i]))):
            y = _gather_dim(L, y, lead + i, idx)
    return y


def _upsample_backward(L: NodeLowering, grad: Value, output_size: Sequence[int], input_size: Sequence[int], *rest: Any, **kwargs: Any) -> Value:
    nsp, kind = _UPSAMPLE_BACKWARD[L.op]
    rest = _rest(L.op, 3, rest, kwargs)
    out = L.out[0]
    lead = grad.rank - nsp
    n, o = list(input_size)[-nsp:], grad.shape[lead:]
    align, scales = _split_upsample_args(kind, nsp, rest)
    mats = [m.T.copy() for m in _upsample_mats(kind, n, o, align, scales, grad.dtype, backward=True)]
    return _apply_matrices(L, grad, mats, nsp, out.dtype)


# the scale factors decide the interpolation matrices: keep them compile-time constants
register(*_UPSAMPLE, static_scalars=True)(_upsample)
register(*_UPSAMPLE_BACKWARD, static_scalars=True)(_upsample_backward)


@register_meta(*(op for op, (_, kind) in _UPSAMPLE.items() if kind in ("nearest", "exact")))
def _upsample_nearest_meta(x: torch.Tensor, output_size: Sequence[int], *scales: Any) -> torch.Tensor:
    """PyTorch's meta function for nearest upsampling hands ``torch._check`` an int for an
    empty input (``numel() != 0 or prod(sizes[1:])``) and raises TypeError on an empty
    batch, which the CPU kernel upsamples to an empty result. Its checks, as booleans."""
    nsp = len(output_size)
    torch._check(
        x.numel() != 0 or math.prod(x.shape[1:]) != 0,
        lambda: f"Non-empty {nsp + 2}D data tensor expected but got a tensor with sizes {list(x.shape)}",
    )
    torch._check(x.dim() == nsp + 2, lambda: f"It is expected input_size equals to {nsp + 2}, but got size {x.dim()}")
    torch._check(
        all(d > 0 for d in x.shape[2:]) and all(d > 0 for d in output_size),
        lambda: f"Input and output sizes should be greater than 0, but got input size {list(x.shape)} and output size {list(output_size)}",
    )
    from torch._prims_common import suggest_memory_format

    return x.new_empty((*x.shape[:2], *output_size)).to(memory_format=suggest_memory_format(x))
