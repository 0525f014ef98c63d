"""Elementwise ops: one generic rule per arity, a table entry per op."""

from __future__ import annotations

import functools
import math
from copy import copy as _shallow_copy
from typing import Any

import torch

from ...stablehlo.builder import Value
from ...stablehlo.types import is_complex, is_float, is_unsigned
from ..context import NodeLowering, ScalarValue, TensorSpec
from ..registry import register, register_meta
from .complex import COMPLEX_FIXED, complex_power, complex_power_scalar, complex_unary, conj, imag, make_complex, modulus, real
from .reduction import acc_dtype

aten = torch.ops.aten
prims = torch.ops.prims
_HALF = (torch.float16, torch.bfloat16)


def _compute_dtype(L: NodeLowering, *args: Any) -> torch.dtype:
    """Float ops on integer tensors compute in the output's float dtype."""
    return L.out[0].dtype


# PyTorch's CPU kernels compute 16-bit float math in float32 ("opmath") and round once.
def _opmath(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in _HALF else dtype


def in_opmath(rule: Any) -> Any:
    """``rule`` computed in float32 when its outputs are 16-bit floats, rounded once at the
    end, as PyTorch's CPU kernels do for fused elementwise math (tanh_backward's
    ``float(g) * (1 - float(y) * float(y))``): the rule sees float32 inputs and outputs.
    Other dtypes run the rule unchanged."""

    @functools.wraps(rule)
    def wrapped(L: NodeLowering, *args: Any, **kwargs: Any) -> Any:
        if not any(s is not None and s.dtype in _HALF for s in L.out):
            return rule(L, *args, **kwargs)
        wide = _shallow_copy(L)
        wide.out = [None if s is None else TensorSpec(s.shape, _opmath(s.dtype)) for s in L.out]
        result = rule(wide, *(_widen(L, a) for a in args), **{k: _widen(L, v) for k, v in kwargs.items()})
        if isinstance(result, Value):
            return L.to(result, L.out[0].dtype)
        specs = iter(L.out)
        return type(result)(r if r is None else L.to(r, next(specs).dtype) for r in result)

    return wrapped


def _widen(L: NodeLowering, v: Any) -> Any:
    """A 16-bit float tensor operand as float32 (Python numbers and device scalars stay)."""
    if isinstance(v, Value) and not isinstance(v, ScalarValue) and v.dtype in _HALF:
        return L.to(v, torch.float32)
    return v


# -- unary ops that map 1:1 onto a StableHLO/CHLO op ------------------------------------------
_UNARY_HLO = {
    aten.abs: "stablehlo.abs",
    aten.neg: "stablehlo.negate",
    aten.exp: "stablehlo.exponential",
    aten.expm1: "stablehlo.exponential_minus_one",
    aten.log: "stablehlo.log",
    aten.log1p: "stablehlo.log_plus_one",
    aten.sqrt: "stablehlo.sqrt",
    aten.rsqrt: "stablehlo.rsqrt",
    aten.tanh: "stablehlo.tanh",
    aten.sin: "stablehlo.sine",
    aten.cos: "stablehlo.cosine",
    aten.tan: "stablehlo.tan",
    aten.floor: "stablehlo.floor",
    aten.ceil: "stablehlo.ceil",
    aten.sigmoid: "stablehlo.logistic",
    aten.round: "stablehlo.round_nearest_even",
    aten.erf: "chlo.erf",
    aten.erfinv: "chlo.erf_inv",
    aten.lgamma: "chlo.lgamma",
    aten.asin: "chlo.asin",
    aten.acos: "chlo.acos",
    aten.atan: "chlo.atan",
    aten.sinh: "chlo.sinh",
    aten.cosh: "chlo.cosh",
    aten.asinh: "chlo.asinh",
    aten.acosh: "chlo.acosh",
    aten.atanh: "chlo.atanh",
}
# ops that keep integer dtypes (the rest compute in float)
_INT_OK = {aten.abs, aten.neg, aten.floor, aten.ceil, aten.round}
# CHLO expansions whose float32 form is far less accurate than the CPU's libm, computed in
# float64 where the platform has it: chlo.lgamma's absolute error on [-6, 6] reaches 4.7e-6
# (glibc's lgammaf: 4.5e-7), which sums of lgamma (mvlgamma) turn into 3e-4 relative.
# chlo.sinh and chlo.cosh were up to 8.7 ulp off on [-10, 10] and 24 ulp on [10, 89] (the
# CPU's: 0.9 and 0.5; CUDA documents 3 and 2): cosh(55) 12 ulp, beyond the float32
# tolerance; chlo.erfc up to 10.7 ulp on [-3, 3] (the CPU's 0.8, CUDA's 4). They are rare
# in models, so their float64 cost is too. (tanh 4.2, erf 4.8, erfinv 4.4 and expm1 5.3 ulp
# stay in float32: they are activations, on every step's path; docs/conformance.md, "Accuracy of float32 functions".)
_WIDE_IN_F64 = {"chlo.lgamma", "chlo.sinh", "chlo.cosh", "chlo.erfc"}
# ops whose operand's subnormals are flushed first on the CPU platform (flushed_on_cpu):
# XLA:CPU's float32 log reads a subnormal as zero in its vector loop and by its bits in the
# loop's scalar tail: log(2.9e-39) was -inf or -103.97 (exact -88.72) by the element's
# position in a 14-element tensor
_FLUSHED_ON_CPU = {"stablehlo.log"}


def _unary(hlo: str, int_ok: bool) -> Any:
    def rule(L: NodeLowering, x: Value) -> Value:
        out = L.out[0].dtype
        if is_complex(x.dtype) and not is_complex(out):  # abs: complex -> its real modulus
            return modulus(L, x) if hlo == "stablehlo.abs" else L.b.op1(hlo, [x], x.shape, out)
        if int_ok and not is_float(x.dtype) and not is_complex(x.dtype):
            if hlo in ("stablehlo.floor", "stablehlo.ceil", "stablehlo.round_nearest_even"):
                return x
            if hlo == "stablehlo.abs" and is_unsigned(x.dtype):
                return x
            return L.b.op1(hlo, [x], x.shape, x.dtype)
        x = L.to(x, out)
        if is_complex(x.dtype) and hlo in COMPLEX_FIXED:
            return complex_unary(L, hlo, x)
        if hlo in _FLUSHED_ON_CPU:
            (x,) = flushed_on_cpu(L, x)
        if hlo in _WIDE_IN_F64 and out in (torch.float32, *_HALF) and L.ctx.supports_f64:
            return L.to(L.b.op1(hlo, [L.to(x, torch.float64)], x.shape, torch.float64), out)
        if out in _HALF and not int_ok:
            # The CPU computes 16-bit math functions in float32 and rounds once (XLA's own fp16
            # logistic was 1.7x farther from float64, and CHLO expansions are inaccurate in 16 bits).
            return L.to(L.b.op1(hlo, [L.to(x, torch.float32)], x.shape, torch.float32), out)
        return L.b.op1(hlo, [x], x.shape, out)

    return rule


for _packet, _hlo in _UNARY_HLO.items():
    register(_packet.default)(_unary(_hlo, _packet in _INT_OK))


@register(aten.reciprocal.default)
@in_opmath
def reciprocal(L: NodeLowering, x: Value) -> Value:
    x = L.to(x, L.out[0].dtype)
    return L.b.binary("divide", L.full(1, x.shape, x.dtype), x)


@register(aten.sign.default, aten.sgn.default)
def sign(L: NodeLowering, x: Value) -> Value:
    if x.dtype is torch.bool:
        return x
    if is_unsigned(x.dtype):
        return L.to(L.b.compare(x, L.zeros(x.shape, x.dtype), "NE"), x.dtype)
    if is_float(x.dtype):
        # The CPU computes (0 < x) - (x < 0): sign(NaN) is 0 (StableHLO's sign gives NaN)
        # and sign(-0.0) is +0.0.
        zero = L.zeros(x.shape, x.dtype)
        positive = L.to(L.b.compare(x, zero, "GT"), x.dtype)
        return L.b.binary("subtract", positive, L.to(L.b.compare(x, zero, "LT"), x.dtype))
    if is_complex(x.dtype):
        return _complex_sgn(L, x)
    return L.b.unary("sign", x)


def _complex_sgn(L: NodeLowering, x: Value) -> Value:
    """z / |z|, with z first divided by its larger part where that is finite and nonzero:
    |z| overflows for parts near the dtype's max (sgn(-M - Mj) was 0, the value is
    -(1 + 1j) / sqrt(2)). Dividing both parts by one real keeps the direction, which is all
    sgn returns."""
    b = L.b
    re, im = real(L, x), imag(L, x)
    big = b.binary("maximum", b.unary("abs", re), b.unary("abs", im))
    scalable = b.binary("and", b.unary("is_finite", big, torch.bool), b.compare(big, L.zeros(big.shape, big.dtype), "GT"))
    safe = b.select(scalable, big, L.full(1.0, big.shape, big.dtype))
    scaled = make_complex(L, b.binary("divide", re, safe), b.binary("divide", im, safe))
    return b.unary("sign", scaled)


@register(aten.trunc.default, aten.fix.default)
def trunc(L: NodeLowering, x: Value) -> Value:
    if not is_float(x.dtype):
        return x
    zero = L.zeros(x.shape, x.dtype)
    return L.b.select(L.b.compare(x, zero, "LT"), L.b.unary("ceil", x), L.b.unary("floor", x))


@register(aten.frac.default)
def frac(L: NodeLowering, x: Value) -> Value:
    return L.b.binary("subtract", x, trunc(L, x))


@register(aten.log2.default, aten.log10.default)
@in_opmath
def log_base(L: NodeLowering, x: Value) -> Value:
    import math

    x = L.to(x, L.out[0].dtype)
    base = 2.0 if L.op is aten.log2.default else 10.0
    if not is_complex(x.dtype):
        (x,) = flushed_on_cpu(L, x)  # as log's rule does
    if is_complex(x.dtype):
        # the CPU divides log(z) by the real log(base) part by part; a complex division
        # by log(base) + 0i turns an infinite real part into NaN + NaN i
        return _scale_parts(L, L.b.unary("log", x), 1.0 / math.log(base), divide=math.log(base))
    return L.b.binary("divide", L.b.unary("log", x), L.full(math.log(base), x.shape, x.dtype))


@register(aten.exp2.default)
@in_opmath
def exp2(L: NodeLowering, x: Value) -> Value:
    x = L.to(x, L.out[0].dtype)
    if is_complex(x.dtype):
        # 2^z = exp(z log 2) with z log 2 scaled part by part (XLA's complex power gives
        # NaN for 2^(inf + 0i), where the CPU gives inf)
        return complex_unary(L, "stablehlo.exponential", _scale_parts(L, x, math.log(2.0)))
    return L.b.binary("power", L.full(2, x.shape, x.dtype), x)


def _scale_parts(L: NodeLowering, z: Value, factor: float, divide: float | None = None) -> Value:
    """A complex ``z`` with both parts multiplied by ``factor`` (or divided by ``divide``)."""
    re, im = real(L, z), imag(L, z)
    op, c = ("divide", divide) if divide is not None else ("multiply", factor)
    k = L.full(c, re.shape, re.dtype)
    k = opaque(L, k) if divide is not None else k  # a true division (see opaque)
    return make_complex(L, L.b.binary(op, re, k), L.b.binary(op, im, k))


@register(aten.logical_not.default)
def logical_not(L: NodeLowering, x: Value) -> Value:
    return L.to(L.b.compare(x, L.zeros(x.shape, x.dtype), "EQ"), L.out[0].dtype)


@register(aten.bitwise_not.default)
def bitwise_not(L: NodeLowering, x: Value) -> Value:
    return L.b.unary("not", x)


def _either_part(L: NodeLowering, x: Value, test: Any, combine: str = "or") -> Value:
    """isnan/isinf/isfinite of a complex number combine the tests of its two parts."""
    return L.b.binary(combine, test(L, real(L, x)), test(L, imag(L, x)))


@register(aten.isnan.default)
def isnan(L: NodeLowering, x: Value) -> Value:
    if is_complex(x.dtype):
        return _either_part(L, x, isnan)
    if not is_float(x.dtype):
        return L.full(False, x.shape, torch.bool)
    return L.b.compare(x, x, "NE")


@register(aten.isinf.default)
def isinf(L: NodeLowering, x: Value) -> Value:
    if is_complex(x.dtype):
        return _either_part(L, x, isinf)
    if not is_float(x.dtype):
        return L.full(False, x.shape, torch.bool)
    return L.b.compare(L.b.unary("abs", x), L.full(float("inf"), x.shape, x.dtype), "EQ")


@register(aten.isfinite.default)
def isfinite(L: NodeLowering, x: Value) -> Value:
    if is_complex(x.dtype):
        return _either_part(L, x, isfinite, "and")
    if not is_float(x.dtype):
        return L.full(True, x.shape, torch.bool)
    return L.b.op1("stablehlo.is_finite", [x], x.shape, torch.bool)


# -- binary arithmetic ----------------------------------------------------------------------
# PyTorch's CPU kernels compute 16-bit float arithmetic in float32 ("opmath") and round
# once. mul and div keep a Python scalar operand in float32 (bf16 ``x * 0.1`` multiplies
# by 0.1f, not by bf16(0.1) = 0.10009765625: they read the scalar's original value); add
# and sub round a scalar operand and ``alpha`` to the tensor's dtype first (TensorIterator's
# common dtype; ``alpha.to<scalar_t>()``), then compute in float32. The rules do the same.
def _scaled(L: NodeLowering, y: Value, alpha: Any, alpha_dtype: torch.dtype) -> Value:
    """``alpha * y``, with ``alpha`` rounded to ``alpha_dtype`` (the result's dtype)."""
    if alpha is None or (not isinstance(alpha, Value) and alpha == 1):
        return y
    return L.b.binary("multiply", y, L.to(L.full(alpha, y.shape, alpha_dtype), y.dtype))


@register(aten.add.Tensor, aten.add.Scalar)
def add(L: NodeLowering, x: Any, y: Any, alpha: Any = 1) -> Value:
    out = L.out[0].dtype
    x, y = (L.to(v, _opmath(out)) for v in L.promote(x, y, dtype=out))
    if x.dtype is torch.bool:  # x + alpha*y on bools: x or (alpha and y)
        if alpha is not None and not isinstance(alpha, Value) and not alpha:
            return x
        if isinstance(alpha, Value):
            y = L.b.binary("and", y, L.broadcast_to(L.to(alpha, torch.bool), y.shape))
        return L.b.binary("or", x, y)
    return L.to(L.b.binary("add", x, _scaled(L, y, alpha, out)), out)


@register(aten.sub.Tensor, aten.sub.Scalar, aten.rsub.Tensor, aten.rsub.Scalar)
def sub(L: NodeLowering, x: Any, y: Any, alpha: Any = 1) -> Value:
    if L.op in (aten.rsub.Tensor, aten.rsub.Scalar):
        x, y = y, x
    out = L.out[0].dtype
    x, y = (L.to(v, _opmath(out)) for v in L.promote(x, y, dtype=out))
    return L.to(L.b.binary("subtract", x, _scaled(L, y, alpha, out)), out)


@register(aten.mul.Tensor, aten.mul.Scalar)
def mul(L: NodeLowering, x: Any, y: Any) -> Value:
    out = L.out[0].dtype
    x, y = L.promote(x, y, dtype=_opmath(out))
    if x.dtype is torch.bool:
        return L.b.binary("and", x, y)
    return L.to(L.b.binary("multiply", x, y), out)


def _integral(dtype: torch.dtype) -> bool:
    return not (is_float(dtype) or is_complex(dtype) or dtype is torch.bool)


def _int_operands(L: NodeLowering, x: Any, y: Any) -> list[Value]:
    """``x``, ``y`` promoted to the integer result dtype, checking the divisor as the CPU
    does: a Python 0 (static here: 0 is never a device operand) raises at once; a zero
    element raises at the next wait (XLA would return -1, or x for a remainder)."""
    if not isinstance(y, Value) and y == 0:
        raise RuntimeError("ZeroDivisionError")
    x, y = L.promote(x, y, dtype=L.out[0].dtype)
    L.check(L.b.compare(y, L.zeros(y.shape, y.dtype), "EQ"), "ZeroDivisionError")
    return [x, y]


@register(aten.div.Tensor, aten.div.Scalar, aten.div.Tensor_mode, aten.div.Scalar_mode)
def div(L: NodeLowering, x: Any, y: Any, rounding_mode: str | None = None) -> Value:
    # Every float divisor is opaque (see opaque): XLA rewrites a / broadcast(b) into
    # a * broadcast(1 / b), an ulp off for a quarter of the elements (a / a = 0.99999994,
    # so 5.125 // 5.125 truncated to 0), and a divisor can be a broadcast without looking
    # like one here: a number, a smaller operand, or an expanded view (read as a broadcast).
    out = L.out[0].dtype
    if rounding_mode is None:
        x, y = L.promote(x, y, dtype=_opmath(out))
        return L.to(L.b.binary("divide", x, opaque(L, y)), out)
    if _integral(out):
        return _div_rounded(L, *_int_operands(L, x, y), rounding_mode)
    x, y = L.promote(x, y, dtype=torch.float32 if _opmath(out) is not out else out)
    return L.to(_div_rounded(L, x, opaque(L, y), rounding_mode), out)


def _div_rounded(L: NodeLowering, x: Value, y: Value, rounding_mode: str) -> Value:
    out = x.dtype
    if not is_float(out):
        q = L.b.binary("divide", x, y)  # integer division truncates toward zero
        if rounding_mode == "trunc":
            return q
        # floor: subtract one where the signs differ and the division is inexact
        r = L.b.binary("remainder", x, y)
        zero = L.zeros(x.shape, out)
        inexact = L.b.compare(r, zero, "NE")
        signs_differ = L.b.compare(L.b.compare(x, zero, "LT"), L.b.compare(y, zero, "LT"), "NE")
        fix = L.b.binary("and", inexact, signs_differ)
        return L.b.select(fix, L.b.binary("subtract", q, L.full(1, x.shape, out)), q)
    q = L.b.binary("divide", x, y)
    if rounding_mode == "trunc":
        return trunc(L, q)
    return _floor_divide_float(L, x, y)


def _floor_divide_float(L: NodeLowering, x: Value, y: Value) -> Value:
    # PyTorch's floor division: (x - fmod(x, y)) / y, corrected when the remainder's sign
    # differs from y's, then rounded; matches c10::div_floor_floating.
    mod = L.b.binary("remainder", x, y)
    div = L.b.binary("divide", L.b.binary("subtract", x, mod), y)
    zero = L.zeros(x.shape, x.dtype)
    fix = L.b.binary(
        "and", L.b.compare(mod, zero, "NE"), L.b.compare(L.b.compare(y, zero, "LT"), L.b.compare(mod, zero, "LT"), "NE")
    )
    div = L.b.select(fix, L.b.binary("subtract", div, L.full(1, x.shape, x.dtype)), div)
    floor = L.b.unary("floor", div)
    half = L.full(0.5, x.shape, x.dtype)
    floor = L.b.select(
        L.b.compare(L.b.binary("subtract", div, floor), half, "GT"), L.b.binary("add", floor, L.full(1, x.shape, x.dtype)), floor
    )
    plain = L.b.binary("divide", x, y)
    floor = L.b.select(L.b.compare(div, zero, "EQ"), L.b.binary("multiply", L.b.unary("sign", plain), zero), floor)
    return L.b.select(L.b.compare(y, zero, "EQ"), plain, floor)  # by zero: IEEE's x / 0 (+-inf, NaN)


@register(aten.floor_divide.default, aten.floor_divide.Scalar)
def floor_divide(L: NodeLowering, x: Any, y: Any) -> Value:
    return div(L, x, y, "floor")


@register(aten.remainder.Tensor, aten.remainder.Scalar, aten.remainder.Scalar_Tensor)
def remainder(L: NodeLowering, x: Any, y: Any) -> Value:
    out = L.out[0].dtype
    x, y = _int_operands(L, x, y) if _integral(out) else L.promote(x, y, dtype=out)
    r = L.b.binary("remainder", x, y)
    if is_unsigned(x.dtype):
        return r
    zero = L.zeros(x.shape, x.dtype)
    fix = L.b.binary("and", L.b.compare(r, zero, "NE"), L.b.compare(L.b.compare(r, zero, "LT"), L.b.compare(y, zero, "LT"), "NE"))
    return L.b.select(fix, L.b.binary("add", r, y), r)


@register(aten.fmod.Tensor, aten.fmod.Scalar)
def fmod(L: NodeLowering, x: Any, y: Any) -> Value:
    out = L.out[0].dtype
    x, y = _int_operands(L, x, y) if _integral(out) else L.promote(x, y, dtype=out)
    return L.b.binary("remainder", x, y)


@register(aten.pow.Tensor_Tensor, aten.pow.Tensor_Scalar, aten.pow.Scalar)
def pow_(L: NodeLowering, x: Any, y: Any) -> Value:
    out = L.out[0].dtype
    if L.op is aten.pow.Tensor_Scalar and not (is_float(x.dtype) or is_complex(x.dtype)):
        _check_int_exponent(L, y)
    if not isinstance(y, Value) and y == 2 and isinstance(x, Value):
        x = L.to(x, out)
        return L.b.binary("multiply", x, x)
    if is_complex(out) and L.op is aten.pow.Tensor_Scalar:
        return complex_power_scalar(L, L.to(x, out), y)
    x, y = L.promote(x, y, dtype=out)
    if out is torch.bool:  # a bool to a bool power (_pow_scalar_meta): x ** y is x or not y
        return L.b.binary("or", x, L.b.unary("not", y))
    if _integral(out):
        return _int_power(L, x, y)
    if is_complex(out):
        return complex_power(L, x, y)
    return L.b.binary("power", *flushed_on_cpu(L, x, y))


@register_meta(aten.pow.Tensor_Scalar)
def _pow_scalar_meta(base: torch.Tensor, exponent: Any) -> torch.Tensor:
    """The CPU's and CUDA's pow(tensor, number) is a structured kernel whose result type
    is ``result_type(base, exponent)``: a bool tensor to a bool power stays bool. PyTorch's
    Python meta function promotes bool to int64 (its reference's BOOL_TO_LONG)."""
    return torch.empty_like(base, dtype=torch.result_type(base, exponent))


@register_meta(aten._foreach_pow.Scalar)
def _foreach_pow_scalar_meta(bases: list[torch.Tensor], exponent: Any) -> list[torch.Tensor]:
    return [_pow_scalar_meta(b, exponent) for b in bases]


def _int_power(L: NodeLowering, x: Value, y: Value) -> Value:
    """c10's powi: exponentiation by squaring, wrapping like the CPU's integers (XLA's
    integer power reads only the exponent's low 6 bits: 5 ** 64 gave 1). A negative
    exponent gives 1 for x == 1, -1 or 1 for x == -1 (odd or even) and 0 otherwise."""
    b = L.b
    shape, dt = x.shape, x.dtype

    def c(v: int) -> Value:  # made where it is used: loop regions may not capture values
        return L.full(v, shape, dt)

    def step(acc: Value, base: Value, e: Value) -> list[Value]:
        odd = b.compare(b.binary("and", e, c(1)), c(0), "NE")
        return [
            b.select(odd, b.binary("multiply", acc, base), acc),
            b.binary("multiply", base, base),
            b.binary("shift_right_logical", e, c(1)),
        ]

    e = b.binary("maximum", y, c(0))
    r, _, _ = b.while_loop([c(1), x, e], lambda acc, base, e: L.any_true(b.compare(e, c(0), "GT")), step)
    if is_unsigned(dt):
        return r
    odd = b.compare(b.binary("and", y, c(1)), c(0), "NE")
    minus_one = b.select(odd, c(-1), c(1))
    neg = b.select(b.compare(x, c(1), "EQ"), c(1), b.select(b.compare(x, c(-1), "EQ"), minus_one, c(0)))
    return b.select(b.compare(y, c(0), "LT"), neg, r)


def _check_int_exponent(L: NodeLowering, y: Any) -> None:
    """PyTorch's meta check for an integer (or bool) tensor to a Python int power: a
    negative exponent raises; at once when it is static (-1), at the next wait when it
    is a device operand."""
    msg = "Integers to negative integer powers are not allowed."
    if isinstance(y, ScalarValue):
        if y.pytype is int:
            L.check(L.b.compare(y, L.zeros((), y.dtype), "LT"), msg)
    elif isinstance(y, int) and y < 0:  # bool is an int too, and never negative
        raise RuntimeError(msg)


@register(aten.atan2.default)
def atan2(L: NodeLowering, x: Any, y: Any) -> Value:
    x, y = L.promote(x, y, dtype=L.out[0].dtype)
    return L.b.binary("atan2", *flushed_on_cpu(L, x, y))


def flushed_on_cpu(L: NodeLowering, *operands: Value) -> list[Value]:
    """Real floating operands with their subnormals flushed where XLA:CPU computes (its
    arithmetic reads subnormals as zeros, but not every step of atan2 and pow does).
    float16 is left alone: its subnormals widen to normal float32s, on the CPU too."""
    if operands[0].dtype not in _BITS or L.ctx.platform != "cpu":
        return list(operands)
    return [flush_subnormal(L, v) for v in operands]


# the integer type of a float's width: its bits, for flush_subnormal
_BITS = {torch.float64: torch.int64, torch.float32: torch.int32, torch.bfloat16: torch.int16}


def flush_subnormal(L: NodeLowering, v: Value) -> Value:
    """A real floating ``v`` with its subnormals replaced by zeros of their sign, as
    XLA:CPU's denormals-are-zero arithmetic reads them (atan2, pow and complex angle).
    Those functions test some operands by their bits and others by float compares, so a
    subnormal was half zero and half not: float64 atan2(2^-1024, -1) came out -pi (pi
    whether flushed or not) and atan2(2^-1024, 2^-1024) pi/2 (0 flushed, pi/4 exact);
    float32 atan2(2.9e-39, 2.9e-39) NaN, pow(2.9e-39, 0.5) 2.6e-23 (0 flushed, 5.4e-20
    exact)."""
    b = L.b
    itype = _BITS[v.dtype]
    sign_bit = -(1 << (torch.iinfo(itype).bits - 1))
    bits = b.bitcast_convert(v, v.shape, itype)
    signed_zero = b.bitcast_convert(b.binary("and", bits, L.full(sign_bit, v.shape, itype)), v.shape, v.dtype)
    tiny = b.compare(b.unary("abs", v), L.full(torch.finfo(v.dtype).tiny, v.shape, v.dtype), "LT")
    return b.select(tiny, signed_zero, v)


def _minmax(name: str, nan_propagating: bool) -> Any:
    def rule(L: NodeLowering, x: Any, y: Any) -> Value:
        x, y = L.promote(x, y, dtype=L.out[0].dtype)
        if x.dtype is torch.bool:
            return L.b.binary("or" if name == "maximum" else "and", x, y)
        r = L.b.binary(name, x, y)
        if nan_propagating and is_float(x.dtype):
            # stablehlo max/min propagate NaN on XLA already; keep an explicit select for other backends
            nan = L.b.compare(x, x, "NE")
            r = L.b.select(nan, x, L.b.select(L.b.compare(y, y, "NE"), y, r))
        elif not nan_propagating and is_float(x.dtype):  # fmax/fmin ignore NaN
            r = L.b.select(L.b.compare(x, x, "NE"), y, L.b.select(L.b.compare(y, y, "NE"), x, r))
        return r

    return rule


register(aten.maximum.default)(_minmax("maximum", True))
register(aten.minimum.default)(_minmax("minimum", True))
register(aten.fmax.default)(_minmax("maximum", False))
register(aten.fmin.default)(_minmax("minimum", False))


def _bitwise(name: str) -> Any:
    def rule(L: NodeLowering, x: Any, y: Any) -> Value:
        x, y = L.promote(x, y, dtype=L.out[0].dtype)
        return L.b.binary(name, x, y)

    return rule


for _name in ("and", "or", "xor"):
    register(getattr(aten, f"bitwise_{_name}").Tensor, getattr(aten, f"bitwise_{_name}").Scalar)(_bitwise(_name))


def _logical(name: str) -> Any:
    def rule(L: NodeLowering, x: Any, y: Any) -> Value:
        xs, ys = L.promote(x, y)
        xb = L.to(xs, torch.bool)
        yb = L.to(ys, torch.bool)
        return L.to(L.b.binary(name, xb, yb), L.out[0].dtype)

    return rule


for _name in ("and", "or", "xor"):
    register(getattr(aten, f"logical_{_name}").default)(_logical(_name))


@register(aten.bitwise_left_shift.Tensor, aten.bitwise_left_shift.Tensor_Scalar, aten.__lshift__.Tensor, aten.__lshift__.Scalar)
def lshift(L: NodeLowering, x: Any, y: Any) -> Value:
    x, y = L.promote(x, y, dtype=L.out[0].dtype)
    return L.b.binary("shift_left", x, y)


@register(aten.bitwise_right_shift.Tensor, aten.bitwise_right_shift.Tensor_Scalar, aten.__rshift__.Tensor, aten.__rshift__.Scalar)
def rshift(L: NodeLowering, x: Any, y: Any) -> Value:
    x, y = L.promote(x, y, dtype=L.out[0].dtype)
    name = "shift_right_logical" if is_unsigned(x.dtype) else "shift_right_arithmetic"
    return L.b.binary(name, x, y)


# -- comparisons -------------------------------------------------------------------------------
def _compare(direction: str) -> Any:
    def rule(L: NodeLowering, x: Any, y: Any) -> Value:
        x, y = L.promote(x, y, shape=L.out[0].shape)
        return L.b.compare(x, y, direction)

    return rule


for _name, _dir in (("eq", "EQ"), ("ne", "NE"), ("lt", "LT"), ("le", "LE"), ("gt", "GT"), ("ge", "GE")):
    register(getattr(aten, _name).Tensor, getattr(aten, _name).Scalar)(_compare(_dir))


@register(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def where(L: NodeLowering, cond: Value, x: Any, y: Any) -> Value:
    out = L.out[0]
    x, y = L.promote(x, y, dtype=out.dtype, shape=out.shape)
    cond = L.broadcast_to(L.to(cond, torch.bool), out.shape)
    return L.b.select(cond, x, y)


@register(aten.clamp.default, aten.clamp.Tensor, aten.clip.default, aten.clip.Tensor)
def clamp(L: NodeLowering, x: Value, min: Any = None, max: Any = None) -> Value:  # noqa: A002 - schema names
    out = L.out[0]
    x = L.broadcast_to(L.to(x, out.dtype), out.shape)
    if min is not None:
        (lo,) = L.promote(min, dtype=out.dtype, shape=out.shape)
        x = _minmax("maximum", True)(L, x, lo)
    if max is not None:
        (hi,) = L.promote(max, dtype=out.dtype, shape=out.shape)
        x = _minmax("minimum", True)(L, x, hi)
    return x


@register(aten.clamp_min.default, aten.clamp_min.Tensor)
def clamp_min(L: NodeLowering, x: Value, min: Any) -> Value:  # noqa: A002
    return clamp(L, x, min, None)


@register(aten.clamp_max.default, aten.clamp_max.Tensor)
def clamp_max(L: NodeLowering, x: Value, max: Any) -> Value:  # noqa: A002
    return clamp(L, x, None, max)


# -- activations -------------------------------------------------------------------------------
@register(aten.relu.default)
def relu(L: NodeLowering, x: Value) -> Value:
    if x.dtype is torch.bool:
        return x
    return L.b.binary("maximum", x, L.zeros(x.shape, x.dtype))


@register(aten.gelu.default)
@in_opmath
def gelu(L: NodeLowering, xf: Value, approximate: str = "none") -> Value:
    b = L.b

    def c(v: float) -> Value:
        return L.full(v, xf.shape, xf.dtype)

    if approximate == "tanh":
        inner = b.binary(
            "multiply",
            c(0.7978845608028654),
            b.binary("add", xf, b.binary("multiply", c(0.044715), b.binary("multiply", xf, b.binary("multiply", xf, xf)))),
        )
        y = b.binary("multiply", b.binary("multiply", c(0.5), xf), b.binary("add", c(1.0), b.unary("tanh", inner)))
    else:
        erf = b.chlo("erf", b.binary("multiply", xf, c(0.7071067811865476)))
        y = b.binary("multiply", b.binary("multiply", c(0.5), xf), b.binary("add", c(1.0), erf))
    return y


@register(aten.silu.default)
@in_opmath
def silu(L: NodeLowering, x: Value) -> Value:
    return L.b.binary("multiply", x, L.b.unary("logistic", x))


@register(aten.leaky_relu.default)
@in_opmath
def leaky_relu(L: NodeLowering, x: Value, negative_slope: Any = 0.01) -> Value:
    zero = L.zeros(x.shape, x.dtype)
    return L.b.select(L.b.compare(x, zero, "GT"), x, L.b.binary("multiply", x, L.full(negative_slope, x.shape, x.dtype)))


@register(aten.hardtanh.default)
def hardtanh(L: NodeLowering, x: Value, min_val: Any = -1.0, max_val: Any = 1.0) -> Value:
    return clamp(L, x, min_val, max_val)


@register(aten.threshold.default)
def threshold(L: NodeLowering, x: Value, threshold: Any, value: Any) -> Value:
    return L.b.select(L.b.compare(x, L.full(threshold, x.shape, x.dtype), "LE"), L.full(value, x.shape, x.dtype), x)


@register(aten.threshold_backward.default)
def threshold_backward(L: NodeLowering, grad: Value, x: Value, threshold: Any) -> Value:
    out = L.out[0]
    x = L.broadcast_to(x, out.shape)
    grad = L.broadcast_to(grad, out.shape)
    return L.b.select(L.b.compare(x, L.full(threshold, x.shape, x.dtype), "LE"), L.zeros(out.shape, out.dtype), grad)


@register(aten.softplus.default)
@in_opmath
def softplus(L: NodeLowering, x: Value, beta: Any = 1, threshold: Any = 20) -> Value:
    b = L.b
    bx = b.binary("multiply", x, L.full(beta, x.shape, x.dtype)) if (isinstance(beta, Value) or beta != 1) else x
    soft = b.unary("log_plus_one", b.unary("exponential", bx))
    if isinstance(beta, Value) or beta != 1:
        soft = b.binary("divide", soft, L.full(beta, x.shape, x.dtype))
    return b.select(b.compare(bx, L.full(threshold, x.shape, x.dtype), "GT"), x, soft)


@register(aten.elu.default)
@in_opmath
def elu(L: NodeLowering, x: Value, alpha: Any = 1, scale: Any = 1, input_scale: Any = 1) -> Value:
    b = L.b
    xs = b.binary("multiply", x, L.full(input_scale, x.shape, x.dtype))
    neg = b.binary("multiply", L.full(alpha, x.shape, x.dtype), b.unary("exponential_minus_one", xs))
    y = b.select(b.compare(x, L.zeros(x.shape, x.dtype), "GT"), x, neg)
    return b.binary("multiply", y, L.full(scale, x.shape, x.dtype))


def _broadcast_pair(L: NodeLowering, grad: Value, y: Value) -> tuple[Value, Value]:
    """Both operands at the output's shape and dtype: the CPU kernels broadcast and promote
    them (jacfwd's vmap calls tanh_backward with a batched gradient and an unbatched output)."""
    out = L.out[0]
    grad, y = L.promote(grad, y, dtype=out.dtype, shape=out.shape)
    return grad, y


# Complex backwards multiply by the conjugate of the derivative (PyTorch's convention for
# the gradient of a real loss through a holomorphic function).
@register(aten.sigmoid_backward.default)
@in_opmath
def sigmoid_backward(L: NodeLowering, grad: Value, y: Value) -> Value:
    b = L.b
    grad, y = _broadcast_pair(L, grad, y)
    one = L.full(1, y.shape, y.dtype)
    return b.binary("multiply", grad, conj(L, b.binary("multiply", y, b.binary("subtract", one, y))))


@register(aten.tanh_backward.default)
@in_opmath
def tanh_backward(L: NodeLowering, grad: Value, y: Value) -> Value:
    b = L.b
    grad, y = _broadcast_pair(L, grad, y)
    one = L.full(1, y.shape, y.dtype)
    return b.binary("multiply", grad, conj(L, b.binary("subtract", one, b.binary("multiply", y, y))))


# -- fused multiply-adds ------------------------------------------------------------------------
# The CPU kernels compute these in "opmath" (float32 for float16/bfloat16) and round once at
# the end; computing in the 16-bit dtype rounds every intermediate and lands 10-40x farther
# from float64 than the CPU.
@register(aten.addcmul.default)
def addcmul(L: NodeLowering, x: Value, t1: Value, t2: Value, value: Any = 1) -> Value:
    """self + value * t1 * t2, in that order, as the CPU kernel."""
    out = L.out[0].dtype
    x, t1, t2 = L.promote(x, t1, t2, dtype=acc_dtype(out))
    b = L.b
    return L.to(b.binary("add", x, b.binary("multiply", _scaled(L, t1, value, t1.dtype), t2)), out)


@register(aten.addcdiv.default)
def addcdiv(L: NodeLowering, x: Value, t1: Value, t2: Value, value: Any = 1) -> Value:
    """self + value * t1 / t2, in that order, as the CPU kernel."""
    out = L.out[0].dtype
    x, t1, t2 = L.promote(x, t1, t2, dtype=acc_dtype(out))
    b = L.b
    return L.to(b.binary("add", x, b.binary("divide", _scaled(L, t1, value, t1.dtype), t2)), out)


@register(aten.lerp.Scalar, aten.lerp.Tensor)
def lerp(L: NodeLowering, x: Value, end: Value, weight: Any) -> Value:
    """PyTorch's two-sided formula: start + w * (end - start) for |w| < 0.5, else
    end - (end - start) * (1 - w), so both end points are exact (lerp(a, b, 1) == b)."""
    out = L.out[0].dtype
    x, end, w = L.promote(x, end, weight, dtype=acc_dtype(out))
    b = L.b
    diff = b.binary("subtract", end, x)
    one = L.full(1, w.shape, w.dtype)
    near_start = b.binary("add", x, b.binary("multiply", w, diff))
    near_end = b.binary("subtract", end, b.binary("multiply", diff, b.binary("subtract", one, w)))
    real_dtype = w.dtype.to_real()  # |w| of a complex weight is real, as std::abs on the CPU
    small = b.compare(b.unary("abs", w, real_dtype), L.full(0.5, w.shape, real_dtype), "LT")
    return L.to(b.select(small, near_start, near_end), out)


# -- dtype conversion and copies ----------------------------------------------------------------
@register(aten._to_copy.default)
def to_copy(L: NodeLowering, x: Value | complex, **kwargs: Any) -> Value:
    if isinstance(x, (bool, int, float, complex)):  # a Python number where the schema has a Tensor
        # (torch.ops wraps it in a 0-dim tensor; flex_attention's score modifications trace so)
        return L.full(x, L.out[0].shape, L.out[0].dtype)
    return L.to(x, L.out[0].dtype)


@register(prims.convert_element_type.default)
def convert_element_type(L: NodeLowering, x: Value, dtype: torch.dtype) -> Value:
    return L.to(x, dtype)


@register(aten.copy.default)
def copy(L: NodeLowering, dst: Value, src: Value, non_blocking: bool = False) -> Value:
    return L.broadcast_to(L.to(src, dst.dtype), dst.shape)


@register(aten.clone.default, aten.alias.default, aten.lift_fresh_copy.default, aten.detach.default, aten.contiguous.default)
def clone(L: NodeLowering, x: Value, **kwargs: Any) -> Value:
    return x


@register(aten.fill.Scalar, aten.fill.Tensor)
def fill(L: NodeLowering, x: Value, value: Any) -> Value:
    if isinstance(value, Value) and value.rank:
        value = L.b.reshape(value, ())
    return L.full(value, x.shape, x.dtype) if not isinstance(value, Value) else L.broadcast_to(L.to(value, x.dtype), x.shape)


@register(aten.zero.default)
def zero(L: NodeLowering, x: Value) -> Value:
    return L.zeros(x.shape, x.dtype)


@register(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def masked_fill(L: NodeLowering, x: Value, mask: Value, value: Any) -> Value:
    out = L.out[0]
    x = L.broadcast_to(L.to(x, out.dtype), out.shape)
    mask = L.broadcast_to(mask, out.shape)
    if isinstance(value, Value) and value.rank:
        value = L.b.reshape(value, ())
    fillv = L.broadcast_to(L.to(value, out.dtype), out.shape) if isinstance(value, Value) else L.full(value, out.shape, out.dtype)
    return L.b.select(mask, fillv, x)


# -- special functions and prims that PyTorch's decompositions emit ----------------------------
register(aten.erfc.default, prims.erfc.default)(_unary("chlo.erfc", False))
register(prims.round.default)(_unary("stablehlo.round_nearest_even", True))
register(prims.bessel_i1e.default, aten.special_i1e.default)(_unary("chlo.bessel_i1e", False))


def _f32_compute(L: NodeLowering, hlo: str, *xs: Value) -> Value:
    """A CHLO op in the output dtype (16-bit floats compute in f32, as PyTorch's opmath does)."""
    out = L.out[0].dtype
    work = torch.float32 if out in (torch.float16, torch.bfloat16) else out
    xs = L.promote(*xs, dtype=work)
    return L.to(L.b.op1(hlo, xs, xs[0].shape, work), out)


@register(aten.nextafter.default, prims.nextafter.default)
def nextafter(L: NodeLowering, x: Any, y: Any) -> Value:
    x, y = L.promote(x, y, dtype=L.out[0].dtype)  # exact in the output dtype, never upcast
    return L.b.op1("chlo.next_after", [x, y], x.shape, x.dtype)


@register(aten.digamma.default, aten.special_digamma.default)
def digamma(L: NodeLowering, x: Any) -> Value:
    """chlo.digamma, with the CPU kernel's values at zero: digamma(+-0) = -+inf."""
    out = L.out[0].dtype
    work = torch.float32 if out in (torch.float16, torch.bfloat16) else out
    (x,) = L.promote(x, dtype=work)
    b = L.b
    zero = L.zeros(x.shape, work)
    r = b.op1("chlo.digamma", [x], x.shape, work)
    at_zero = b.select(
        b.op1("stablehlo.is_finite", [b.binary("divide", L.full(1.0, x.shape, work), x)], x.shape, torch.bool),
        zero,
        b.binary("divide", L.full(-1.0, x.shape, work), x),
    )  # 1/x is +-inf exactly at +-0
    return L.to(b.select(b.compare(x, zero, "EQ"), at_zero, r), out)


def _trigamma(L: NodeLowering, x: Value) -> Value:
    """The CPU kernel's trigamma (calc_trigamma): reflection below 1/2, six recurrence
    steps, then the asymptotic series — same algorithm, so the same values near poles."""
    b = L.b
    full = lambda v: L.full(v, x.shape, x.dtype)  # noqa: E731
    add, sub, mul, div = (lambda p, q, n=n: b.binary(n, p, q) for n in ("add", "subtract", "multiply", "divide"))
    reflect = b.compare(x, full(0.5), "LT")
    s = b.unary("sine", mul(full(math.pi), x))
    result = b.select(reflect, b.unary("negate", div(full(math.pi**2), mul(s, s))), full(0.0))
    sign = b.select(reflect, full(-1.0), full(1.0))
    x = b.select(reflect, sub(full(1.0), x), x)
    for _ in range(6):
        result = add(result, div(full(1.0), mul(x, x)))
        x = add(x, full(1.0))
    ixx = div(full(1.0), mul(x, x))
    series = sub(full(1.0 / 6), mul(ixx, sub(full(1.0 / 30), mul(ixx, full(1.0 / 42)))))
    tail = div(add(add(full(1.0), div(full(1.0), mul(full(2.0), x))), mul(ixx, series)), x)
    return mul(sign, add(result, tail))


# polygamma and zeta: gamma.py (ports of the CPU's algorithms).


@register(aten.signbit.default, prims.signbit.default)
def signbit(L: NodeLowering, x: Value) -> Value:
    b = L.b
    if x.dtype is torch.bool or is_unsigned(x.dtype):
        return L.full(False, x.shape, torch.bool)
    if not is_float(x.dtype):
        return b.compare(x, L.zeros(x.shape, x.dtype), "LT")
    # the sign bit itself (true for -0.0 and negative NaNs, like std::signbit)
    ibits = {torch.float64: torch.int64, torch.float32: torch.int32}.get(x.dtype, torch.int16)
    bits = b.bitcast_convert(x, x.shape, ibits)
    return b.compare(bits, L.zeros(x.shape, ibits), "LT")


@register(aten.hypot.default, prims.hypot.default)
@in_opmath
def hypot(L: NodeLowering, x: Any, y: Any) -> Value:
    """sqrt(x^2 + y^2) without overflow: m * sqrt(1 + (n/m)^2), m = max(|x|, |y|)."""
    b = L.b
    work = L.out[0].dtype
    x, y = L.promote(x, y, dtype=work)
    ax, ay = b.unary("abs", x), b.unary("abs", y)
    m, n = b.binary("maximum", ax, ay), b.binary("minimum", ax, ay)
    zero, one = L.zeros(m.shape, work), L.full(1, m.shape, work)
    m_is_zero = b.compare(m, zero, "EQ")
    r = b.binary("divide", n, b.select(m_is_zero, one, m))
    res = b.binary("multiply", m, b.unary("sqrt", b.binary("add", one, b.binary("multiply", r, r))))
    # hypot(inf, nan) is inf, as C's hypot; maximum(inf, nan) is NaN, so test both operands
    inf = L.full(float("inf"), m.shape, work)
    either_inf = b.binary("or", b.compare(ax, inf, "EQ"), b.compare(ay, inf, "EQ"))
    return b.select(either_inf, inf, res)


@register(aten.round.decimals)
def round_decimals(L: NodeLowering, x: Value, decimals: int = 0) -> Value:
    """As the CPU kernel: in opmath, with t = 10^|d|, nearbyint(x * t) / t, or for d < 0
    nearbyint(x / t) * t."""
    b = L.b
    if decimals == 0 or not is_float(x.dtype):
        return b.unary("round_nearest_even", x) if is_float(x.dtype) else x
    out = x.dtype
    x = L.to(x, _opmath(out))
    t = opaque(L, L.full(10.0 ** abs(decimals) if abs(decimals) < 309 else math.inf, x.shape, x.dtype))
    if decimals < 0:
        r = b.binary("multiply", b.unary("round_nearest_even", b.binary("divide", x, t)), t)
    else:
        r = b.binary("divide", b.unary("round_nearest_even", b.binary("multiply", x, t)), t)
    return L.to(r, out)


def opaque(L: NodeLowering, c: Value) -> Value:
    """``c`` behind an optimization barrier: XLA rewrites a division by a constant or a
    broadcast into a multiplication by its rounded reciprocal (x / 1000 becomes x * 0.001,
    an ulp off for half the inputs); dividing by an opaque value rounds once, as the CPU
    does. The one way every rule keeps a divisor exact (put it on the full-size divisor:
    a barrier before a broadcast leaves the broadcast to rewrite)."""
    (v,) = L.b.op("stablehlo.optimization_barrier", [c], [(c.shape, c.dtype)])
    return v


# prims that PyTorch's decompositions (torch._refs) emit and that mean exactly their aten op
# for same-dtype operands (prims.div and prims.remainder differ on integers: not here).
_PRIMS_AS_ATEN = {
    name: (
        getattr(prims, name).default,
        getattr(aten, aname).default if "." not in aname else getattr(getattr(aten, aname.split(".")[0]), aname.split(".")[1]),
    )
    for name, aname in {
        "abs": "abs",
        "neg": "neg",
        "exp": "exp",
        "expm1": "expm1",
        "log": "log",
        "log1p": "log1p",
        "sqrt": "sqrt",
        "rsqrt": "rsqrt",
        "tanh": "tanh",
        "sin": "sin",
        "cos": "cos",
        "tan": "tan",
        "floor": "floor",
        "ceil": "ceil",
        "sign": "sign",
        "erf": "erf",
        "erf_inv": "erfinv",
        "lgamma": "lgamma",
        "digamma": "digamma",
        "asin": "asin",
        "acos": "acos",
        "atan": "atan",
        "sinh": "sinh",
        "cosh": "cosh",
        "asinh": "asinh",
        "acosh": "acosh",
        "atanh": "atanh",
        "trunc": "trunc",
        "exp2": "exp2",
        "log2": "log2",
        "log10": "log10",
        "bitwise_not": "bitwise_not",
        "isfinite": "isfinite",
        "add": "add.Tensor",
        "sub": "sub.Tensor",
        "mul": "mul.Tensor",
        "atan2": "atan2",
        "pow": "pow.Tensor_Tensor",
        "maximum": "maximum",
        "minimum": "minimum",
        "eq": "eq.Tensor",
        "ne": "ne.Tensor",
        "lt": "lt.Tensor",
        "le": "le.Tensor",
        "gt": "gt.Tensor",
        "ge": "ge.Tensor",
        "bitwise_and": "bitwise_and.Tensor",
        "bitwise_or": "bitwise_or.Tensor",
        "bitwise_xor": "bitwise_xor.Tensor",
        "fmod": "fmod.Tensor",
        "where": "where.self",
    }.items()
    if hasattr(prims, name)
}


def _alias_prims() -> None:
    from ..registry import RULES

    for prim, aten_op in _PRIMS_AS_ATEN.values():
        if prim not in RULES and aten_op in RULES:
            RULES[prim] = RULES[aten_op]


_alias_prims()


# (mantissa bits, exponent bits, same-width integer type) of each float format
_FLOAT_LAYOUT = {
    torch.float64: (52, 11, torch.int64),
    torch.float32: (23, 8, torch.int32),
    torch.float16: (10, 5, torch.int16),
    torch.bfloat16: (7, 8, torch.int16),
}


def _signed(v: int, bits: int) -> int:
    """A bit pattern as the two's-complement integer of that width (for int constants)."""
    v &= (1 << bits) - 1
    return v - (1 << bits) if v >> (bits - 1) else v


@register(aten.frexp.Tensor, prims.frexp.default)
def frexp(L: NodeLowering, x: Value) -> tuple[Value, Value]:
    """std::frexp from the bits: x = m * 2^e with 0.5 <= |m| < 1; zeros, infinities and NaN
    give (x, 0). Everything is integer work on the bit pattern, because XLA's CPU flushes
    subnormal floats to zero in arithmetic and comparisons; a subnormal is normalised by
    shifting its fraction up past its leading zeros."""
    b = L.b
    mant, ebits, itype = _FLOAT_LAYOUT[x.dtype]
    width = 1 + ebits + mant
    bias = (1 << (ebits - 1)) - 1
    emask = (1 << ebits) - 1

    def c(v: int, dt: torch.dtype = itype) -> Value:
        return L.full(_signed(v, width) if dt is itype else v, x.shape, dt)

    def i32(v: Value) -> Value:
        return L.to(v, torch.int32)

    bits = b.bitcast_convert(x, x.shape, itype)
    field = b.binary("and", b.binary("shift_right_logical", bits, c(mant)), c(emask))
    frac = b.binary("and", bits, c((1 << mant) - 1))
    zero = b.compare(b.binary("and", bits, c(~(1 << (width - 1)))), c(0), "EQ")  # +-0
    special = b.binary("or", zero, b.compare(field, c(emask), "EQ"))  # zero, inf, nan
    subnormal = b.binary("and", b.compare(field, c(0), "EQ"), b.unary("not", zero))
    half_exp = c((bias - 1) << mant)  # the exponent field of the binade [0.5, 1)

    normal_m = b.binary("or", b.binary("and", bits, c(~(emask << mant))), half_exp)
    normal_e = b.binary("subtract", i32(field), c(bias - 1, torch.int32))
    # subnormal: the leading 1 of the fraction becomes the implicit bit
    lead = b.binary("subtract", b.unary("count_leading_zeros", frac), c(width - mant))
    shifted = b.binary("and", b.binary("shift_left", frac, b.binary("add", lead, c(1))), c((1 << mant) - 1))
    sub_m = b.binary("or", b.binary("or", b.binary("and", bits, c(1 << (width - 1))), half_exp), shifted)
    sub_e = b.binary("subtract", c(1 - bias, torch.int32), i32(lead))

    # select on the bit patterns, not on floats: float selects may flush subnormals to zero
    mantissa_bits = b.select(special, bits, b.select(subnormal, sub_m, normal_m))
    exponent = b.select(subnormal, sub_e, normal_e)
    return b.bitcast_convert(mantissa_bits, x.shape, x.dtype), b.select(special, L.zeros(x.shape, torch.int32), exponent)


# -- gcd / lcm ----------------------------------------------------------------------------------
@register(aten.gcd.default, prims.gcd.default)
def gcd(L: NodeLowering, x: Any, y: Any) -> Value:
    """Euclid on |x|, |y| as the CPU's calc_gcd: a while loop that runs until every
    element's remainder is zero (the longest chain in the tensor decides the trip count)."""
    b = L.b
    out = L.out[0]
    x, y = L.promote(x, y, dtype=out.dtype)
    zero = L.zeros(out.shape, out.dtype)

    def active(a: Value, c: Value) -> Value:
        return L.any_true(b.compare(a, zero, "NE"))

    def step(a: Value, c: Value) -> list[Value]:
        live = b.compare(a, zero, "NE")
        safe = b.select(live, a, L.full(1, out.shape, out.dtype))
        return [b.select(live, b.binary("remainder", c, safe), a), b.select(live, a, c)]

    if not is_unsigned(out.dtype):
        x, y = b.unary("abs", x), b.unary("abs", y)
    _, result = b.while_loop([x, y], active, step)
    return result


@register(prims.div.default)
def prims_div(L: NodeLowering, x: Any, y: Any) -> Value:
    """prims.div: true division for floats, C's truncating division for integers (what
    stablehlo.divide does for each)."""
    x, y = L.promote(x, y, dtype=L.out[0].dtype)
    return L.b.binary("divide", x, y)


# -- device-side asserts -----------------------------------------------------------------------
@register(aten._assert_async.default, aten._assert_async.msg)
def assert_async(L: NodeLowering, x: Value, assert_msg: str | None = None) -> tuple[()]:
    """``torch._assert_async(cond[, msg])`` (and a tensor ``assert`` that Dynamo rewrites into
    it): reported at the next synchronize when ``cond`` is zero, as CUDA's device-side
    assert is; the CPU raises at once, with the same words."""
    zero = L.b.compare(x, L.zeros(x.shape, x.dtype), "EQ")
    L.check(zero, assert_msg or "Expected Tensor with single nonzero value, but got zero")
    return ()
