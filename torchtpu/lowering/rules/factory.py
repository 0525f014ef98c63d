"""Factory ops: zeros/ones/full (and their ``*_like``/``new_*`` forms), arange,
linspace, logspace, eye, scalar_tensor, tril_indices/triu_indices.

Every rule builds its result from the output spec PyTorch's meta kernel computed
(``L.out[0]``), so the ``device``/``layout``/``pin_memory`` arguments are ignored here.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ...stablehlo.builder import Value
from ...stablehlo.types import is_complex, is_float
from ..context import NodeLowering
from ..registry import register
from .elementwise import opaque

aten = torch.ops.aten


def _compute_dtype(L: NodeLowering, dtype: torch.dtype) -> torch.dtype:
    """Dtype the values are computed in before the final conversion (like PyTorch's
    accumulate types): f64 for floats when available, i64 for integers."""
    if is_float(dtype) or is_complex(dtype):
        return torch.float64 if L.ctx.supports_f64 else torch.float32
    return torch.int64


# -- constant fills --------------------------------------------------------------------------
def _fill(L: NodeLowering, value: Any) -> Value:
    out = L.out[0]
    if isinstance(value, Value):
        if value.rank:
            value = L.b.reshape(value, ())
        return L.broadcast_to(L.to(value, out.dtype), out.shape)
    return L.full(value, out.shape, out.dtype)


# empty* inside a program (a traced decomposition's scratch buffer) is zeros; eager
# empty* are runtime kernels (eager/minimal.py) that allocate without running anything
@register(
    aten.zeros.default,
    aten.zeros_like.default,
    aten.new_zeros.default,
    aten.empty_like.default,
    aten.empty.memory_format,
    aten.empty_strided.default,
    aten.new_empty.default,
    aten.new_empty_strided.default,
)
def zeros(L: NodeLowering, *args: Any, **kwargs: Any) -> Value:
    return _fill(L, 0)


@register(aten.ones.default, aten.ones_like.default, aten.new_ones.default)
def ones(L: NodeLowering, *args: Any, **kwargs: Any) -> Value:
    return _fill(L, 1)


@register(aten.full.default)
def full(L: NodeLowering, size: Any, fill_value: Any, **kwargs: Any) -> Value:
    return _fill(L, fill_value)


@register(aten.full_like.default)
def full_like(L: NodeLowering, x: Value, fill_value: Any, **kwargs: Any) -> Value:
    return _fill(L, fill_value)


@register(aten.new_full.default)
def new_full(L: NodeLowering, x: Value, size: Any, fill_value: Any, **kwargs: Any) -> Value:
    return _fill(L, fill_value)


@register(aten.scalar_tensor.default, torch.ops.prims.scalar_tensor.default)
def scalar_tensor(L: NodeLowering, s: Any, **kwargs: Any) -> Value:
    return _fill(L, s)


@register(aten.tril_indices.default, aten.triu_indices.default)
def tril_triu_indices(L: NodeLowering, row: int, col: int, offset: int = 0, **kwargs: Any) -> Value:
    """The indices depend on the sizes alone: a constant, in the CPU's row-major order."""
    import numpy as np

    out = L.out[0]
    if not row or not col or 0 in out.shape:
        return L.zeros(out.shape, out.dtype)  # no element
    pick = np.tril_indices if L.op is aten.tril_indices.default else np.triu_indices
    rows, cols = pick(row, offset, col)
    return L.b.constant_array(np.stack([rows, cols]).astype(np.int64).reshape(out.shape), out.dtype)


# -- ranges ----------------------------------------------------------------------------------
@register(aten.arange.default, aten.arange.start, aten.arange.start_step, static_scalars=True)
def arange(L: NodeLowering, *args: Any, **kwargs: Any) -> Value:
    # the length comes from the output spec; only start and step matter here
    if L.op is aten.arange.default:
        start, step = 0, 1
    else:
        start = args[0]
        step = args[2] if len(args) > 2 else kwargs.get("step", 1)
    out = L.out[0]
    (n,) = out.shape
    cdt = _compute_dtype(L, out.dtype)
    idx = L.b.iota((n,), 0, cdt)
    vals = L.b.binary("add", L.full(start, (n,), cdt), L.b.binary("multiply", idx, L.full(step, (n,), cdt)))
    return L.to(vals, out.dtype)


def _linspace_values(L: NodeLowering, start: Any, end: Any, steps: int, cdt: torch.dtype) -> Value:
    """PyTorch's symmetric linspace: start + i*step for the first half, end - (n-1-i)*step
    after, in ``cdt``. For an integer result the CPU first converts start and end to it
    (truncating); floats take the exact path of ``_float_linspace``."""
    b = L.b
    shape = (steps,)
    out = L.out[0].dtype
    integral = not is_float(out) and not is_complex(out)

    def scalar(x: Any) -> Value:
        if isinstance(x, Value):
            x = b.reshape(x, ()) if x.rank else x
            if integral:
                x = L.to(x, out)
            return L.broadcast_to(L.to(x, cdt), shape)
        return L.full(math.trunc(x) if integral else x, shape, cdt)

    s, e = scalar(start), scalar(end)
    if steps == 1:
        return s
    step = b.binary("divide", b.binary("subtract", e, s), _opaque_count(L, steps - 1, shape, cdt))
    idx = b.iota(shape, 0, cdt)
    lo = b.binary("add", s, b.binary("multiply", step, idx))
    rev = b.binary("subtract", L.full(steps - 1, shape, cdt), idx)
    hi = b.binary("subtract", e, b.binary("multiply", step, rev))
    return b.select(_first_half(L, steps), lo, hi)


def _opaque_count(L: NodeLowering, n: int, shape: tuple[int, ...], dtype: torch.dtype) -> Value:
    """The constant ``n`` behind an optimization barrier: XLA would turn a division by a
    constant into a multiplication by its rounded reciprocal, and linspace(50, 1, 50) in
    int64 would truncate 1 + 24 * 0.999... to 24 where the CPU's exact step gives 25. The
    barrier goes after the broadcast: XLA also rewrites a division by a broadcast value."""
    return opaque(L, L.b.broadcast_in_dim(_as_scalar_t(L, n, dtype), shape, []))


def _first_half(L: NodeLowering, steps: int) -> Value:
    """Where the CPU counts up from start (the rest counts down from end)."""
    idx = L.b.iota((steps,), 0, torch.int64)
    return L.b.compare(idx, L.full(steps // 2, (steps,), torch.int64), "LT")


# (exponent bits, mantissa bits) of c10::Half and c10::BFloat16
_HALF_BITS = {torch.float16: (5, 10), torch.bfloat16: (8, 7)}
_HALF_TYPES = tuple(_HALF_BITS)


def _round_half(L: NodeLowering, x: Value, dtype: torch.dtype) -> Value:
    """Round the float32 ``x`` to ``dtype`` (a 16-bit float) and keep it in float32.

    c10::Half/BFloat16 arithmetic computes each operation in float and rounds its result.
    Plain 16-bit ops (or converts to 16 bits and back) do not always reproduce that on
    XLA's CPU backend: it can fuse a float16 multiply and add into one operation (a single
    rounding; 15 of linspace(-2, 1, 50)'s 50 elements differed).
    stablehlo.reduce_precision keeps every rounding but flushes float16 subnormals to
    zero, so those (|x| < 2**-14) round to a multiple of 2**-24 by hand."""
    b = L.b
    exp, man = _HALF_BITS[dtype]
    attrs = f"exponent_bits = {exp} : i32, mantissa_bits = {man} : i32"
    rounded = b.op1("stablehlo.reduce_precision", [x], x.shape, x.dtype, attrs)
    if dtype is not torch.float16:
        return rounded
    scaled = b.unary("round_nearest_even", b.binary("multiply", x, L.full(2.0**24, x.shape, x.dtype)))
    subnormal = b.binary("multiply", scaled, L.full(2.0**-24, x.shape, x.dtype))
    tiny = b.compare(b.unary("abs", x), L.full(2.0**-14, x.shape, x.dtype), "LT")
    return b.select(tiny, subnormal, rounded)


def _as_scalar_t(L: NodeLowering, x: Any, dtype: torch.dtype) -> Value:
    """``Scalar::to<scalar_t>()`` of a float ``dtype`` as a 0-d Value; a 16-bit one comes
    back rounded but held in float32. c10::Half and c10::BFloat16 are built from a float,
    so a double rounds to float first, then to 16 bits (as here)."""
    if isinstance(x, Value):
        x = L.b.reshape(x, ()) if x.rank else x
        if dtype in _HALF_TYPES:
            return _round_half(L, L.to(x, torch.float32), dtype)
        return L.to(x, dtype)
    if dtype in _HALF_TYPES:
        return _round_half(L, L.scalar(x, torch.float32), dtype)
    return L.scalar(x, dtype)


def _float_linspace(L: NodeLowering, start: Any, end: Any, steps: int) -> Value:
    """The CPU's linspace kernel for a floating result, in its scalar_t: start and end
    converted to scalar_t, ``step = (end - start) / (steps - 1)``, then ``start + step * i``
    for i < steps // 2 and ``end - step * (steps - i - 1)`` after."""
    dt = L.out[0].dtype
    if dt is torch.float64 and not L.ctx.supports_f64:
        dt = torch.float32
    shape = (steps,)
    s = L.b.broadcast_in_dim(_as_scalar_t(L, start, dt), shape, [])
    if steps == 1:
        return s
    e = L.b.broadcast_in_dim(_as_scalar_t(L, end, dt), shape, [])
    idx = L.b.iota(shape, 0, torch.int64)
    rev = L.b.binary("subtract", L.full(steps - 1, shape, torch.int64), idx)
    if dt in _HALF_TYPES:
        lo, hi = _half_linspace_halves(L, s, e, idx, rev, steps, dt)
    else:
        lo, hi = _fused_linspace_halves(L, s, e, idx, rev, steps, dt)
    return L.b.select(_first_half(L, steps), lo, hi)


def _half_linspace_halves(
    L: NodeLowering, s: Value, e: Value, idx: Value, rev: Value, steps: int, dt: torch.dtype
) -> tuple[Value, Value]:
    """16-bit linspace: every c10 operation rounds to 16 bits, and ``step * i`` converts
    the int64 i to 16 bits first (``operator*(BFloat16, int64_t)``), so the result is not
    the float64 linspace rounded once."""
    b = L.b

    def rnd(v: Value) -> Value:
        return _round_half(L, v, dt)

    def count(i: Value) -> Value:
        return rnd(L.to(i, torch.float32))

    n = _opaque_count(L, steps - 1, s.shape, torch.float32)
    step = rnd(b.binary("divide", rnd(b.binary("subtract", e, s)), rnd(n)))
    lo = rnd(b.binary("add", s, rnd(b.binary("multiply", step, count(idx)))))
    hi = rnd(b.binary("subtract", e, rnd(b.binary("multiply", step, count(rev)))))
    return lo, hi


def _fused_linspace_halves(
    L: NodeLowering, s: Value, e: Value, idx: Value, rev: Value, steps: int, dt: torch.dtype
) -> tuple[Value, Value]:
    """float32/float64 linspace. The CPU's kernels are compiled with floating-point
    contraction, so ``start + step * i`` is one fused multiply-add (a single rounding); a
    float32 one is emulated in float64 (the product is exact there). A float64 one (or a
    float32 one without float64) is left to XLA, which may or may not fuse it: it can
    differ from the CPU by an ulp."""
    b = L.b
    step = b.binary("divide", b.binary("subtract", e, s), _opaque_count(L, steps - 1, s.shape, dt))
    wide = torch.float64 if dt is torch.float32 and L.ctx.supports_f64 else dt

    def w(v: Value) -> Value:
        return L.to(v, wide)

    i, r = w(L.to(idx, dt)), w(L.to(rev, dt))
    lo = L.to(b.binary("add", w(s), b.binary("multiply", w(step), i)), dt)
    hi = L.to(b.binary("subtract", w(e), b.binary("multiply", w(step), r)), dt)
    return lo, hi


@register(aten.linspace.default, aten.linspace.Tensor_Tensor, aten.linspace.Tensor_Scalar, aten.linspace.Scalar_Tensor)
def linspace(L: NodeLowering, start: Any, end: Any, steps: int, **kwargs: Any) -> Value:
    out = L.out[0]
    if steps == 0:
        return L.zeros(out.shape, out.dtype)
    if is_float(out.dtype):
        return L.to(_float_linspace(L, start, end, steps), out.dtype)
    cdt = torch.float64 if L.ctx.supports_f64 else torch.float32
    # integer linspace: PyTorch also computes in double and truncates on conversion
    return L.to(_linspace_values(L, start, end, steps, cdt), out.dtype)


def _from_double(L: NodeLowering, x: Value, dtype: torch.dtype) -> Value:
    """A double stored into a scalar_t: through float for the 16-bit types (their only
    constructor takes a float)."""
    return L.to(L.to(x, torch.float32), dtype) if dtype in _HALF_TYPES else L.to(x, dtype)


def _logspace_exponents(L: NodeLowering, start: Any, end: Any, steps: int, cdt: torch.dtype) -> Value:
    """The CPU's real logspace exponents, in double: start and end converted to scalar_t,
    ``step = double(end - start) / (steps - 1)`` with ``end - start`` computed in scalar_t,
    then ``start + step * i`` or ``end - step * (steps - i - 1)``."""
    b = L.b
    dt = L.out[0].dtype
    shape = (steps,)
    if is_float(dt):
        sdt = torch.float32 if dt is torch.float64 and cdt is torch.float32 else dt
        s, e = _as_scalar_t(L, start, sdt), _as_scalar_t(L, end, sdt)
        diff = b.binary("subtract", e, s)
        diff = L.to(_round_half(L, diff, sdt) if sdt in _HALF_TYPES else diff, cdt)
    else:
        # integers: C++ promotes int8/int16/uint8 to int for the subtraction; int64 holds it
        s, e = (_int_scalar(L, x, dt) for x in (start, end))
        diff = L.to(b.binary("subtract", L.to(e, torch.int64), L.to(s, torch.int64)), cdt)
    s = b.broadcast_in_dim(L.to(s, cdt), shape, [])
    e = b.broadcast_in_dim(L.to(e, cdt), shape, [])
    step = b.binary("divide", b.broadcast_in_dim(diff, shape, []), _opaque_count(L, steps - 1, shape, cdt))
    idx = b.iota(shape, 0, torch.int64)
    rev = b.binary("subtract", L.full(steps - 1, shape, torch.int64), idx)
    # the CPU rounds step * i before adding (RangeFactories.cpp is built without
    # floating-point contraction); XLA's CPU backend may fuse the two (one rounding), which
    # can move a float64 exponent by an ulp
    lo = b.binary("add", s, b.binary("multiply", step, L.to(idx, cdt)))
    hi = b.binary("subtract", e, b.binary("multiply", step, L.to(rev, cdt)))
    return b.select(_first_half(L, steps), lo, hi)


def _int_scalar(L: NodeLowering, x: Any, dtype: torch.dtype) -> Value:
    """``Scalar::to<scalar_t>()`` for an integer scalar_t (a float truncates). A Python
    number stays in int64: one out of scalar_t's range is an error on the CPU."""
    if isinstance(x, Value):
        x = L.b.reshape(x, ()) if x.rank else x
        return L.to(x, dtype)
    return L.scalar(math.trunc(x), torch.int64)


@register(aten.logspace.default, aten.logspace.Tensor_Tensor, aten.logspace.Tensor_Scalar, aten.logspace.Scalar_Tensor)
def logspace(L: NodeLowering, start: Any, end: Any, steps: int, base: Any = 10.0, **kwargs: Any) -> Value:
    out = L.out[0]
    if steps == 0:
        return L.zeros(out.shape, out.dtype)
    cdt = torch.float64 if L.ctx.supports_f64 else torch.float32
    shape = (steps,)
    if is_complex(out.dtype):
        exps = _linspace_values(L, start, end, steps, cdt)
    elif steps == 1:
        # the CPU fills pow(base, start) with start as a double, not converted to scalar_t
        s = start if isinstance(start, Value) else L.scalar(start, cdt)
        exps = L.broadcast_to(L.to(L.b.reshape(s, ()) if s.rank else s, cdt), shape)
    else:
        exps = _logspace_exponents(L, start, end, steps, cdt)
    if isinstance(base, Value):
        base_v = L.broadcast_to(L.to(base, cdt), exps.shape)
    else:
        base_v = L.full(base, exps.shape, cdt)
    return _from_double(L, L.b.binary("power", base_v, exps), out.dtype)


@register(aten.eye.default, aten.eye.m)
def eye(L: NodeLowering, n: int, m: int | None = None, **kwargs: Any) -> Value:
    out = L.out[0]
    rows = L.b.iota(out.shape, 0, torch.int64)
    cols = L.b.iota(out.shape, 1, torch.int64)
    return L.to(L.b.compare(rows, cols, "EQ"), out.dtype)
