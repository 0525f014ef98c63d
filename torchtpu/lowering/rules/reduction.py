"""Reductions: sum/mean/prod, amax/amin, max/min with indices, argmax/argmin, var/std,
cumulative sums, products and max/min (cummax/cummin), logsumexp, any/all, vector norms, softmax.

16-bit floats accumulate in float32 (PyTorch's opmath), then round to the output dtype.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from ...stablehlo.builder import Value
from ...stablehlo.types import is_complex, is_float
from ..context import NodeLowering
from ..registry import register
from .complex import modulus

aten = torch.ops.aten
prims = torch.ops.prims

LOW_PRECISION = (torch.float16, torch.bfloat16)


# -- helpers (also used by the normalization and loss families) -----------------------------
def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in LOW_PRECISION else dtype


def norm_dims(dims: Any, rank: int) -> list[int]:
    """Reduction dims, wrapped and sorted; None or [] means every dim (0-d: none)."""
    if dims is None:
        return list(range(rank))
    if isinstance(dims, int):
        dims = [dims]
    dims = list(dims)
    if not dims:
        return list(range(rank))
    if rank == 0:
        return []
    return sorted({d % rank for d in dims})


def keep_shape(shape: Sequence[int], dims: Sequence[int]) -> tuple[int, ...]:
    return tuple(1 if i in dims else d for i, d in enumerate(shape))


def numel(shape: Sequence[int], dims: Sequence[int] | None = None) -> int:
    if dims is None:
        dims = range(len(shape))
    return math.prod(int(shape[d]) for d in dims)


def _binop(L: NodeLowering, name: str) -> Any:
    def body(a: Value, b: Value) -> list[Value]:
        return [L.b.binary(name, a, b)]

    return body


def reduce_sum(L: NodeLowering, x: Value, dims: Sequence[int], dtype: torch.dtype | None = None) -> Value:
    """Sum over ``dims`` (no keepdim), computed in ``dtype`` (default: x's accumulation dtype)."""
    dtype = dtype or acc_dtype(x.dtype)
    if dtype is torch.bool:
        dtype = torch.int64
    x = L.to(x, dtype)
    if not dims:
        return x
    return L.b.reduce([x], [L.b.constant(0, dtype)], dims, _binop(L, "add"))[0]


def sum_keep(L: NodeLowering, x: Value, dims: Sequence[int], dtype: torch.dtype | None = None) -> Value:
    """Sum with keepdim=True."""
    return L.b.reshape(reduce_sum(L, x, dims, dtype), keep_shape(x.shape, dims))


def mean_keep(L: NodeLowering, x: Value, dims: Sequence[int]) -> Value:
    s = sum_keep(L, x, dims)
    return L.b.binary("divide", s, L.full(numel(x.shape, dims), s.shape, s.dtype))


def _extreme(dtype: torch.dtype, is_max: bool) -> Any:
    """Identity of max (is_max) or min: -inf/+inf, the integer bounds, False/True."""
    if dtype is torch.bool:
        return not is_max
    if is_float(dtype):
        return -math.inf if is_max else math.inf
    info = torch.iinfo(dtype)
    return info.min if is_max else info.max


def reduce_extreme(L: NodeLowering, x: Value, dims: Sequence[int], is_max: bool) -> Value:
    """amax/amin over ``dims`` (no keepdim), propagating NaN as PyTorch does."""
    if not dims:
        return x
    b = L.b
    if x.dtype is torch.bool:
        return b.reduce([x], [b.constant(not is_max, x.dtype)], dims, _binop(L, "or" if is_max else "and"))[0]
    r = _reduce_plain_extreme(L, x, dims, is_max)
    if not is_float(x.dtype):
        return r
    # XLA's CPU code for a max/min reduction drops NaN once it vectorizes the loop, and a
    # reducer that tests for NaN itself is not vectorized (about 10x slower): so the NaN
    # test is a reduction of its own, which XLA fuses with the max into one pass.
    has_nan = b.reduce([b.compare(x, x, "NE")], [b.constant(False, torch.bool)], dims, _binop(L, "or"))[0]
    return b.select(has_nan, L.full(math.nan, r.shape, r.dtype), r)


def reduce_shift_max(L: NodeLowering, x: Value, dims: Sequence[int]) -> Value:
    """The max over ``dims`` (no keepdim) that softmax and logsumexp subtract for stability:
    NaN may or may not win here, since a NaN input makes the row NaN through the exp-sum
    anyway, so the cheaper reduction without the NaN test serves."""
    return _reduce_plain_extreme(L, x, dims, is_max=True)


def _reduce_plain_extreme(L: NodeLowering, x: Value, dims: Sequence[int], is_max: bool) -> Value:
    """max/min reduction with stablehlo.maximum/minimum alone (NaN not guaranteed to win)."""
    name = "maximum" if is_max else "minimum"
    return L.b.reduce([x], [L.b.constant(_extreme(x.dtype, is_max), x.dtype)], dims, _binop(L, name))[0]


def reduce_arg(L: NodeLowering, x: Value, dim: int, is_max: bool) -> tuple[Value, Value]:
    """(values, int64 indices) of max/min along ``dim``: first index on ties, NaN wins."""
    b = L.b
    idx = b.iota(x.shape, dim, torch.int64)
    direction = "GT" if is_max else "LT"
    fl = is_float(x.dtype)

    def body(av: Value, ai: Value, cv: Value, ci: Value) -> list[Value]:
        better = b.compare(av, cv, direction)
        tie = b.compare(av, cv, "EQ")
        if fl:
            a_nan = b.compare(av, av, "NE")
            c_nan = b.compare(cv, cv, "NE")
            better = b.binary("or", b.binary("and", a_nan, b.unary("not", c_nan)), b.binary("and", better, b.unary("not", c_nan)))
            tie = b.binary("or", tie, b.binary("and", a_nan, c_nan))
        first = b.binary("and", tie, b.compare(ai, ci, "LT"))
        take_a = b.binary("or", better, first)
        return [b.select(take_a, av, cv), b.select(take_a, ai, ci)]

    init_v = b.constant(_extreme(x.dtype, is_max), x.dtype)
    # the init must lose every tie (an all -inf row keeps a real index)
    init_i = b.constant(torch.iinfo(torch.int64).max, torch.int64)
    v, i = b.reduce([x, idx], [init_v, init_i], [dim], body)
    return v, i


def _out(L: NodeLowering, v: Value, k: int = 0) -> Value:
    """Reshape/convert a result to PyTorch's promised output ``k``."""
    spec = L.out[k]
    return L.b.reshape(L.to(v, spec.dtype), spec.shape)


# -- sum, mean, prod --------------------------------------------------------------------------
@register(aten.sum.dim_IntList, aten.sum.default, prims.sum.default, aten.nansum.default)
def sum_(L: NodeLowering, x: Value, dim: Any = None, keepdim: bool = False, dtype: Any = None, output_dtype: Any = None) -> Value:
    out = L.out[0].dtype
    if L.op is aten.nansum.default and is_float(x.dtype):
        x = L.b.select(L.b.compare(x, x, "NE"), L.zeros(x.shape, x.dtype), x)
    if L.op is prims.sum.default and dim is not None and len(dim) == 0:
        return _out(L, x)
    return _out(L, reduce_sum(L, x, norm_dims(dim, x.rank), acc_dtype(out)))


@register(aten.mean.dim, aten.mean.default)
def mean(L: NodeLowering, x: Value, dim: Any = None, keepdim: bool = False, dtype: Any = None) -> Value:
    out = L.out[0].dtype
    dims = norm_dims(dim, x.rank)
    s = reduce_sum(L, x, dims, acc_dtype(out))
    s = L.b.binary("divide", s, L.full(numel(x.shape, dims), s.shape, s.dtype))
    return _out(L, s)


@register(aten.prod.default, aten.prod.dim_int, prims.prod.default)
def prod(L: NodeLowering, x: Value, dim: Any = None, keepdim: bool = False, dtype: Any = None, output_dtype: Any = None) -> Value:
    out = L.out[0].dtype
    acc = acc_dtype(out)
    dims = norm_dims(dim, x.rank)
    if L.op is prims.prod.default and dim is not None and len(dim) == 0:
        dims = []
    x = L.to(x, acc)
    if dims:
        x = L.b.reduce([x], [L.b.constant(1, acc)], dims, _binop(L, "multiply"))[0]
    return _out(L, x)


# -- amax/amin, max/min, argmax/argmin ----------------------------------------------------------
@register(aten.amax.default, aten.amin.default, prims.amax.default, prims.amin.default)
def amax(L: NodeLowering, x: Value, dim: Any = (), keepdim: bool = False, output_dtype: Any = None) -> Value:
    is_max = L.op in (aten.amax.default, prims.amax.default)
    if L.op in (prims.amax.default, prims.amin.default) and dim is not None and len(dim) == 0:
        return _out(L, x)
    return _out(L, reduce_extreme(L, x, norm_dims(dim, x.rank), is_max))


@register(aten.max.default, aten.min.default)
def max_full(L: NodeLowering, x: Value) -> Value:
    return _out(L, reduce_extreme(L, x, list(range(x.rank)), L.op is aten.max.default))


@register(aten.max.dim, aten.min.dim)
def max_dim(L: NodeLowering, x: Value, dim: int, keepdim: bool = False) -> tuple[Value, Value]:
    is_max = L.op is aten.max.dim
    if x.rank == 0:
        return x, L.zeros((), torch.int64)
    v, i = reduce_arg(L, x, dim % x.rank, is_max)
    return _out(L, v, 0), _out(L, i, 1)


@register(aten.argmax.default, aten.argmin.default)
def argmax(L: NodeLowering, x: Value, dim: int | None = None, keepdim: bool = False) -> Value:
    is_max = L.op is aten.argmax.default
    if x.rank == 0:
        return L.zeros(L.out[0].shape, torch.int64)
    if dim is None:
        x = L.b.reshape(x, (numel(x.shape),))
        dim = 0
    _, i = reduce_arg(L, x, dim % x.rank, is_max)
    return _out(L, i)


# -- var/std -----------------------------------------------------------------------------------
def var_keep(L: NodeLowering, x: Value, dims: Sequence[int], correction: Any = 1) -> tuple[Value, Value, Value | None]:
    """(var / scale^2, mean, scale) with keepdim, in x's accumulation dtype (two-pass).

    The CPU accumulates float32 var/std in double, so a slice holding values near
    float32's max still gets a finite std (and mean) where the true one is finite; float32
    squares would overflow. Each slice is scaled by a power of two near its largest
    magnitude first (exact, so ordinary inputs round as before) and scaled back at the end.
    The CPU's complex var is the real part's var plus the imaginary part's."""
    if is_complex(x.dtype):
        real = torch.float32 if x.dtype is torch.complex64 else torch.float64
        re = L.b.op1("stablehlo.real", [x], x.shape, real)
        im = L.b.op1("stablehlo.imag", [x], x.shape, real)
        scale = _pow2_scale(L, L.b.binary("maximum", L.b.unary("abs", re), L.b.unary("abs", im)), dims)
        (vr, mr), (vi, mi) = (_scaled_var(L, part, dims, correction, scale) for part in (re, im))
        v = L.b.binary("add", vr, vi)
        return v, L.b.op1("stablehlo.complex", [mr, mi], mr.shape, x.dtype), scale
    scale = _pow2_scale(L, L.b.unary("abs", x), dims)
    x = L.to(x, acc_dtype(x.dtype))
    return (*_scaled_var(L, x, dims, correction, scale), scale)


def _scaled_var(L: NodeLowering, x: Value, dims: Sequence[int], correction: Any, scale: Value | None) -> tuple[Value, Value]:
    """(var / scale^2, mean) of real ``x`` with keepdim; ``scale`` None means 1."""
    b = L.b
    if scale is not None:
        x = b.binary("divide", x, L.broadcast_to(scale, x.shape))
    m = mean_keep(L, x, dims)
    d = b.binary("subtract", x, L.broadcast_to(m, x.shape))
    ss = sum_keep(L, b.binary("multiply", d, d), dims)
    n = numel(x.shape, dims)
    if n > 0 and is_float(x.dtype) and x.dtype is not torch.float64:
        # The corrected two-pass algorithm (Chan, Golub & LeVeque): the rounded mean is off
        # by some delta, which adds n * delta^2 to the sum of squares; sum(d) = -n * delta
        # takes it out again. The CPU accumulates float32 in double: without this, a slice
        # far from zero (mean/std ~ 1e5) lost ~4e-4 of its variance relative to the CPU's,
        # and a constant slice had a tiny positive variance where the CPU has 0.
        sd = sum_keep(L, d, dims)
        inv_n = L.full(1.0 / n, sd.shape, sd.dtype)
        ss = b.binary("subtract", ss, b.binary("multiply", b.binary("multiply", sd, sd), inv_n))
        ss = b.binary("maximum", ss, L.zeros(ss.shape, ss.dtype))  # never below 0 from rounding (NaN stays NaN)
    denom = max(0.0, n - (1 if correction is None else float(correction)))
    v = b.binary("divide", ss, L.full(denom, ss.shape, ss.dtype))
    return v, m if scale is None else b.binary("multiply", m, scale)


def _pow2_scale(L: NodeLowering, magnitude: Value, dims: Sequence[int]) -> Value | None:
    """Per slice (keepdim): 2^floor(log2(max |x|)) (at most 2^126) for float32 and bfloat16
    (a float32 result), 1 where that max is 0, inf or NaN (those rows keep the CPU's inf/NaN
    arithmetic); None for the other dtypes: the CPU's float64 Welford overflows where the
    two-pass does, and float32 holds the squares of float16."""
    if magnitude.dtype not in (torch.float32, torch.bfloat16) or not dims:
        return None
    b = L.b
    magnitude = L.to(magnitude, torch.float32)
    top = b.reshape(reduce_extreme(L, magnitude, dims, True), keep_shape(magnitude.shape, dims))
    bits = b.bitcast_convert(top, top.shape, torch.int32)
    exponent = b.binary("and", bits, L.full(0x7F800000, top.shape, torch.int32))
    # at most 2^126: XLA may divide by multiplying with the reciprocal, and 2^-127 is
    # subnormal (flushed to zero)
    exponent = b.binary("minimum", exponent, L.full(0x7E800000, top.shape, torch.int32))
    scale = b.bitcast_convert(exponent, top.shape, torch.float32)
    usable = b.binary("and", b.compare(scale, L.zeros(top.shape, torch.float32), "GT"), b.unary("is_finite", top, torch.bool))
    return b.select(usable, scale, L.full(1.0, top.shape, torch.float32))


def _var_common(L: NodeLowering, x: Value, dim: Any, correction: Any, take_sqrt: bool = False) -> tuple[Value, Value]:
    """(var or std, mean) with keepdim, scaled back to x's range."""
    b = L.b
    v, m, scale = var_keep(L, x, norm_dims(dim, x.rank), correction)
    if scale is not None and (not take_sqrt or is_complex(x.dtype)):
        # var * scale * scale: the square of a float32 scale may overflow. The CPU's complex
        # std is the root of a float32 var (the parts' vars added), which overflows first.
        v, scale = b.binary("multiply", b.binary("multiply", v, scale), scale), None
    if take_sqrt:
        v = b.unary("sqrt", v)
    if scale is not None:
        v = b.binary("multiply", v, scale)
    return v, m


@register(aten.var.correction, aten.std.correction, aten.var_mean.correction, aten.std_mean.correction, static_scalars=True)
def var(L: NodeLowering, x: Value, dim: Any = None, correction: Any = None, keepdim: bool = False) -> Any:
    take_sqrt = L.op in (aten.std.correction, aten.std_mean.correction)
    v, m = _var_common(L, x, dim, correction, take_sqrt)
    if L.op in (aten.var_mean.correction, aten.std_mean.correction):
        return _out(L, v, 0), _out(L, m, 1)
    return _out(L, v)


@register(prims.var.default)
def prims_var(L: NodeLowering, x: Value, dims: Any, correction: Any = 1, output_dtype: Any = None) -> Value:
    if dims is not None and len(dims) == 0:
        return L.zeros(L.out[0].shape, L.out[0].dtype)
    v, _ = _var_common(L, x, dims, correction)
    return _out(L, v)


# -- cumulative ops -------------------------------------------------------------------------------
def scan(L: NodeLowering, x: Value, dim: int, name: str, init: Any) -> Value:
    """Inclusive scan along ``dim`` (Hillis-Steele: log2(n) shifted combines)."""
    b = L.b
    n = x.shape[dim]
    k = 1
    while k < n:
        low = [0] * x.rank
        high = [0] * x.rank
        low[dim] = k
        limit = list(x.shape)
        limit[dim] = n - k
        shifted = b.pad(b.slice(x, [0] * x.rank, limit), b.constant(init, x.dtype), low, high)
        x = b.binary(name, x, shifted)
        k *= 2
    return x


@register(aten.cumsum.default, aten.cumprod.default)
def cumsum(L: NodeLowering, x: Value, dim: int, dtype: Any = None) -> Value:
    out = L.out[0].dtype
    acc = acc_dtype(out)
    x = L.to(x, acc)
    if x.rank == 0:
        return _out(L, x)
    is_sum = L.op is aten.cumsum.default
    if acc is torch.bool:
        acc = torch.int64
        x = L.to(x, acc)
    return _out(L, scan(L, x, dim % x.rank, "add" if is_sum else "multiply", 0 if is_sum else 1))


def _shift_in(L: NodeLowering, x: Value, dim: int, k: int, fill: Any) -> Value:
    """``x`` moved ``k`` places forward along ``dim``; the first ``k`` slots hold ``fill``."""
    low = [0] * x.rank
    low[dim] = k
    limit = list(x.shape)
    limit[dim] = x.shape[dim] - k
    return L.b.pad(L.b.slice(x, [0] * x.rank, limit), L.b.constant(fill, x.dtype), low, [0] * x.rank)


def scan_extreme(L: NodeLowering, x: Value, dim: int, is_max: bool) -> tuple[Value, Value]:
    """(running max/min, int64 index of it) along ``dim``, as the CPU's cummax/cummin:
    a later element takes over when it is NaN, or when it ties or beats a non-NaN
    running value (so ties pick the LAST index and NaN sticks). "Later wins unless the
    earlier one is strictly better" is a max under a total order, hence associative: a
    Hillis-Steele scan of (value, index) pairs gives the same answer as the CPU loop."""
    b = L.b
    values, indices = x, b.iota(x.shape, dim, torch.int64)
    fl = is_float(x.dtype)
    n = x.shape[dim]
    k = 1
    while k < n:
        # the fill never takes over: -inf/+inf (int bounds, False/True) loses every tie
        # against a real element, which comes later
        early_v = _shift_in(L, values, dim, k, _extreme(x.dtype, is_max))
        early_i = _shift_in(L, indices, dim, k, 0)
        later_wins = b.compare(values, early_v, "GE" if is_max else "LE")
        if fl:
            later_nan = b.compare(values, values, "NE")
            early_num = b.compare(early_v, early_v, "EQ")
            later_wins = b.binary("or", later_nan, b.binary("and", early_num, later_wins))
        values = b.select(later_wins, values, early_v)
        indices = b.select(later_wins, indices, early_i)
        k *= 2
    return values, indices


@register(aten.cummax.default, aten.cummin.default)
def cummax(L: NodeLowering, x: Value, dim: int) -> tuple[Value, Value]:
    if x.rank == 0:
        return x, L.zeros((), torch.int64)
    return scan_extreme(L, x, dim % x.rank, L.op is aten.cummax.default)


def _no_complex(L: NodeLowering, x: Value) -> None:
    if is_complex(x.dtype):
        raise NotImplementedError(
            f"torchtpu: {L.op} on complex tensors is not lowered yet; run it on the CPU "
            "(.cpu(), or set TORCHTPU_CPU_FALLBACK=1 to do that automatically)"
        )


@register(aten.logcumsumexp.default)
def logcumsumexp(L: NodeLowering, x: Value, dim: int) -> Value:
    _no_complex(L, x)
    x = L.to(x, acc_dtype(L.out[0].dtype))
    if x.rank == 0:
        return _out(L, x)
    b = L.b

    def logaddexp(u: Value, v: Value) -> Value:
        m = b.binary("maximum", u, v)
        safe = b.select(b.compare(b.unary("abs", m), L.full(math.inf, m.shape, m.dtype), "EQ"), L.zeros(m.shape, m.dtype), m)
        s = b.binary("add", b.unary("exponential", b.binary("subtract", u, safe)), b.unary("exponential", b.binary("subtract", v, safe)))
        return b.binary("add", b.unary("log", s), safe)

    dim = dim % x.rank
    n = x.shape[dim]
    k = 1
    while k < n:
        low = [0] * x.rank
        low[dim] = k
        limit = list(x.shape)
        limit[dim] = n - k
        shifted = b.pad(b.slice(x, [0] * x.rank, limit), b.constant(-math.inf, x.dtype), low, [0] * x.rank)
        x = logaddexp(x, shifted)
        k *= 2
    return _out(L, x)


# -- logsumexp, any/all, norms ---------------------------------------------------------------------
def logsumexp_keep(L: NodeLowering, x: Value, dims: Sequence[int]) -> Value:
    """logsumexp with keepdim, in x's dtype (pass f32 for 16-bit inputs)."""
    b = L.b
    if not dims:
        return x
    m = b.reshape(reduce_shift_max(L, x, dims), keep_shape(x.shape, dims))
    safe = b.select(b.compare(b.unary("abs", m), L.full(math.inf, m.shape, m.dtype), "EQ"), L.zeros(m.shape, m.dtype), m)
    e = b.unary("exponential", b.binary("subtract", x, L.broadcast_to(safe, x.shape)))
    return b.binary("add", b.unary("log", sum_keep(L, e, dims)), safe)


@register(aten.logsumexp.default)
def logsumexp(L: NodeLowering, x: Value, dim: Any, keepdim: bool = False) -> Value:
    _no_complex(L, x)
    x = L.to(x, acc_dtype(L.out[0].dtype))
    return _out(L, logsumexp_keep(L, x, norm_dims(dim, x.rank)))


@register(aten.any.default, aten.any.dim, aten.any.dims, aten.all.default, aten.all.dim, aten.all.dims)
def any_all(L: NodeLowering, x: Value, dim: Any = None, keepdim: bool = False) -> Value:
    is_any = L.op in (aten.any.default, aten.any.dim, aten.any.dims)
    x = L.to(x, torch.bool)
    dims = norm_dims(dim, x.rank)
    if dims:
        x = L.b.reduce([x], [L.b.constant(not is_any, torch.bool)], dims, _binop(L, "or" if is_any else "and"))[0]
    return _out(L, x)


def _real_abs(L: NodeLowering, x: Value) -> Value:
    if is_complex(x.dtype):
        return modulus(L, x)
    return L.b.unary("abs", x)


@register(aten.linalg_vector_norm.default, static_scalars=True)
def linalg_vector_norm(L: NodeLowering, x: Value, ord: Any = 2, dim: Any = None, keepdim: bool = False, dtype: Any = None) -> Value:  # noqa: A002
    b = L.b
    out = L.out[0].dtype
    if dtype is not None:
        x = L.to(x, dtype)
    if not is_complex(x.dtype):
        x = L.to(x, acc_dtype(out))
    a = _real_abs(L, x)
    a = L.to(a, acc_dtype(out))
    dims = norm_dims(dim, x.rank)
    p = float(ord)
    if all(x.shape[d] == 1 for d in dims):
        # The CPU returns |x| (ord 0: x != 0) when every reduced dim has size 1, without
        # the power and root that overflow for |x|^p beyond the dtype's range.
        r = L.to(b.compare(a, L.zeros(a.shape, a.dtype), "NE"), a.dtype) if p == 0 else a
    elif p == math.inf:
        r = reduce_extreme(L, a, dims, True)
    elif p == -math.inf:
        r = reduce_extreme(L, a, dims, False)
    elif p == 0:
        r = reduce_sum(L, L.to(b.compare(a, L.zeros(a.shape, a.dtype), "NE"), a.dtype), dims)
    elif p == 1:
        r = reduce_sum(L, a, dims)
    elif p == 2:
        r = b.unary("sqrt", reduce_sum(L, b.binary("multiply", a, a), dims))
    else:
        s = reduce_sum(L, b.binary("power", a, L.full(p, a.shape, a.dtype)), dims)
        r = b.binary("power", s, L.full(1.0 / p, s.shape, s.dtype))
    return _out(L, r)


# -- softmax ---------------------------------------------------------------------------------------
def _softmax_dims(x: Value, dim: int) -> list[int]:
    return [dim % x.rank] if x.rank else []


def softmax_f(L: NodeLowering, x: Value, dim: int, log: bool) -> Value:
    """(log_)softmax of x along ``dim`` in x's dtype."""
    b = L.b
    dims = _softmax_dims(x, dim)
    if not dims:
        return L.zeros(x.shape, x.dtype) if log else L.full(1, x.shape, x.dtype)
    m = b.reshape(reduce_shift_max(L, x, dims), keep_shape(x.shape, dims))
    # an all -inf row gives NaN, like PyTorch
    shifted = b.binary("subtract", x, L.broadcast_to(m, x.shape))
    e = b.unary("exponential", shifted)
    s = sum_keep(L, e, dims)
    if log:
        return b.binary("subtract", shifted, L.broadcast_to(b.unary("log", s), x.shape))
    return b.binary("divide", e, L.broadcast_to(s, x.shape))


@register(aten._softmax.default, aten._log_softmax.default)
def softmax(L: NodeLowering, x: Value, dim: int, half_to_float: bool = False) -> Value:
    x = L.to(x, acc_dtype(x.dtype))
    return _out(L, softmax_f(L, x, dim, L.op is aten._log_softmax.default))


@register(aten._softmax_backward_data.default)
def softmax_backward(L: NodeLowering, grad: Value, y: Value, dim: int, input_dtype: Any) -> Value:
    b = L.b
    acc = acc_dtype(grad.dtype)
    g, y = L.to(grad, acc), L.to(y, acc)
    dims = _softmax_dims(y, dim)
    # y * (g - sum(g * y)), the CPU kernel's form: where g is close to the sum (a saturated
    # row), the difference is exact and one rounding follows; g * y - y * sum rounds both
    # products first and then cancels them (an attention layer's gradients lost digits)
    total = L.broadcast_to(sum_keep(L, b.binary("multiply", g, y), dims), y.shape)
    return _out(L, b.binary("multiply", y, b.binary("subtract", g, total)))


@register(aten._log_softmax_backward_data.default)
def log_softmax_backward(L: NodeLowering, grad: Value, y: Value, dim: int, input_dtype: Any) -> Value:
    b = L.b
    acc = acc_dtype(grad.dtype)
    g, y = L.to(grad, acc), L.to(y, acc)
    dims = _softmax_dims(y, dim)
    r = b.binary("subtract", g, b.binary("multiply", b.unary("exponential", y), L.broadcast_to(sum_keep(L, g, dims), y.shape)))
    return _out(L, r)


# -- histc -----------------------------------------------------------------------------------------
def _histc_range(L: NodeLowering, flat: Value, lo: float, hi: float) -> tuple[Value, Value]:
    """The outer bin edges, as the CPU's histc_select_outer_bin_edges: min == max means
    the data's min and max (a device reduction: no host sync), and a still-empty range
    widens to [min - 1, max + 1]."""
    b = L.b
    dt = flat.dtype
    if lo != hi or flat.shape[0] == 0:
        if lo == hi:
            lo, hi = lo - 1, hi + 1
        if not (math.isfinite(lo) and math.isfinite(hi)):
            raise ValueError(f"torch.histc: range of [{lo}, {hi}] is not finite")
        if not lo < hi:
            raise ValueError("torch.histc: max must be larger than min")
        return b.constant(lo, dt), b.constant(hi, dt)
    lo_v = reduce_extreme(L, flat, [0], is_max=False)
    hi_v = reduce_extreme(L, flat, [0], is_max=True)
    inf = b.constant(math.inf, dt)
    finite = b.binary("and", b.compare(b.unary("abs", lo_v), inf, "LT"), b.compare(b.unary("abs", hi_v), inf, "LT"))
    # the CPU raises here; a device program can only report it (at the next wait)
    L.check(b.unary("not", finite), "torch.histc: range of the input is not finite (it holds inf or NaN)")
    same = b.compare(lo_v, hi_v, "EQ")
    one = b.constant(1, dt)
    return b.select(same, b.binary("subtract", lo_v, one), lo_v), b.select(same, b.binary("add", hi_v, one), hi_v)


# (exponent bits, mantissa bits) of the 16-bit floats, for stablehlo.reduce_precision
_FLOAT16_BITS = {torch.float16: (5, 10), torch.bfloat16: (8, 7)}


def _histc_bin(L: NodeLowering, x: Value, lo: Value, hi: Value, bins: int) -> Value:
    """(x - lo) * bins / (hi - lo), rounded to x's dtype after every step as the CPU's
    c10::Half/BFloat16 arithmetic does. Plain 16-bit ops would not do: XLA's CPU backend
    computes them in f32 and drops the intermediate roundings, which moves elements
    near a bin edge into the next bin. reduce_precision keeps them."""
    b = L.b
    bits = _FLOAT16_BITS.get(x.dtype)
    if bits is None:
        d = b.binary("multiply", b.binary("subtract", x, lo), L.full(bins, x.shape, x.dtype))
        return b.binary("divide", d, b.binary("subtract", hi, lo))

    def rounded(v: Value) -> Value:
        attrs = f"exponent_bits = {bits[0]} : i32, mantissa_bits = {bits[1]} : i32"
        return b.op1("stablehlo.reduce_precision", [v], v.shape, v.dtype, attrs)

    x, lo, hi = (L.to(v, torch.float32) for v in (x, lo, hi))
    d = rounded(b.binary("multiply", rounded(b.binary("subtract", x, lo)), rounded(L.full(bins, x.shape, torch.float32))))
    return rounded(b.binary("divide", d, rounded(b.binary("subtract", hi, lo))))


@register(aten.histc.default, static_scalars=True)
def histc(L: NodeLowering, x: Value, bins: int = 100, min: Any = 0, max: Any = 0) -> Value:  # noqa: A002
    """Counts per equal-width bin: each element's bin is computed as the CPU computes it,
    trunc((x - lo) * bins / (hi - lo)) in x's dtype (x == hi goes to the last bin;
    NaN and values outside [lo, hi] are not counted), then one scatter-add of ones."""
    b = L.b
    dt = L.out[0].dtype
    bins = int(bins)
    flat = b.reshape(L.to(x, dt), (numel(x.shape),))
    n = flat.shape[0]
    lo, hi = _histc_range(L, flat, float(min), float(max))
    if n == 0:
        return L.zeros((bins,), dt)
    lo_b, hi_b = L.broadcast_to(lo, (n,)), L.broadcast_to(hi, (n,))
    pos = b.convert(_histc_bin(L, flat, lo_b, hi_b, bins), torch.int64)  # truncates toward zero
    pos = b.clamp(L.full(0, (n,), torch.int64), pos, L.full(bins - 1, (n,), torch.int64))
    inside = b.binary("and", b.compare(flat, lo_b, "GE"), b.compare(flat, hi_b, "LE"))  # False for NaN
    # count in int64 and convert once: a 16-bit running count would stall (bf16 at 256)
    ones = b.select(inside, L.full(1, (n,), torch.int64), L.zeros((n,), torch.int64))
    counts = b.scatter(L.zeros((bins,), torch.int64), b.reshape(pos, (n, 1)), ones, [], [0], [0], 1, lambda o, u: b.binary("add", o, u))
    return L.to(counts, dt)


# -- hash_tensor -----------------------------------------------------------------------------------
@register(aten.hash_tensor.default)
def hash_tensor(L: NodeLowering, x: Value, dim: Any = (), *, keepdim: bool = False, mode: int = 0) -> Value:
    """mode 0: XOR of the elements' bits after widening to 64 bits (floats to float64,
    integers and bool to int64), as a uint64."""
    if mode != 0:
        raise NotImplementedError(f"torchtpu: hash_tensor mode={mode} is not supported (only mode=0, xor)")
    b = L.b
    wide = L.to(x, torch.float64 if is_float(x.dtype) else torch.int64)
    bits = b.bitcast_convert(wide, wide.shape, torch.uint64)
    dims = norm_dims(dim, x.rank)
    if dims:
        bits = b.reduce([bits], [b.constant(0, torch.uint64)], dims, _binop(L, "xor"))[0]
    return _out(L, bits)
