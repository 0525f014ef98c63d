"""Complex numbers: building them (complex, polar, view_as_complex), taking them apart
(view_as_real, angle) and conjugating. The element types come from the dtype table
(complex64 = ``complex<f32>``, complex128 = ``complex<f64>``)."""

from __future__ import annotations

import math

import torch

from ...stablehlo.builder import Value
from ...stablehlo.types import is_complex
from ..context import NodeLowering
from ..registry import register

aten = torch.ops.aten

_PART = {torch.complex64: torch.float32, torch.complex128: torch.float64}
_COMPLEX = {v: k for k, v in _PART.items()}


def part_dtype(dtype: torch.dtype) -> torch.dtype:
    """The real dtype of a complex dtype's parts (complex64 -> float32)."""
    if dtype not in _PART:
        raise _no_complex_half(dtype)
    return _PART[dtype]


def _no_complex_half(dtype: torch.dtype) -> NotImplementedError:
    """complex32 (ComplexHalf, float16 parts) has no XLA element type."""
    return NotImplementedError(
        f"torchtpu: {dtype} (complex numbers with float16 parts) is not supported on the tpu device: "
        "XLA has no complex<f16> element type. Build the complex tensor from float32 parts "
        "(e.g. torch.complex(re.float(), im.float()) gives complex64), or run it on the CPU."
    )


def real(L: NodeLowering, x: Value) -> Value:
    return L.b.op1("stablehlo.real", [x], x.shape, part_dtype(x.dtype))


def imag(L: NodeLowering, x: Value) -> Value:
    return L.b.op1("stablehlo.imag", [x], x.shape, part_dtype(x.dtype))


def modulus(L: NodeLowering, x: Value) -> Value:
    """|x| of a complex ``x`` as C's hypot (the CPU's std::abs): +inf when either part is
    infinite, even if the other is NaN (XLA's complex abs gives NaN there)."""
    b = L.b
    re, im = real(L, x), imag(L, x)
    inf = L.full(math.inf, re.shape, re.dtype)
    infinite = b.binary("or", b.compare(b.unary("abs", re), inf, "EQ"), b.compare(b.unary("abs", im), inf, "EQ"))
    return b.select(infinite, inf, b.op1("stablehlo.abs", [x], x.shape, re.dtype))


def make_complex(L: NodeLowering, re: Value, im: Value) -> Value:
    if re.dtype not in _COMPLEX:
        raise _no_complex_half(torch.complex32)
    return L.b.op1("stablehlo.complex", [re, im], re.shape, _COMPLEX[re.dtype])


def conj(L: NodeLowering, x: Value) -> Value:
    if not is_complex(x.dtype):
        return x
    return make_complex(L, real(L, x), L.b.unary("negate", imag(L, x)))


@register(aten.complex.default)
def complex_(L: NodeLowering, re: Value, im: Value) -> Value:
    out = L.out[0]
    re, im = L.promote(re, im, dtype=part_dtype(out.dtype), shape=out.shape)
    return make_complex(L, re, im)


@register(aten.polar.default)
def polar(L: NodeLowering, r: Value, theta: Value) -> Value:
    out = L.out[0]
    r, theta = L.promote(r, theta, dtype=part_dtype(out.dtype), shape=out.shape)
    b = L.b
    return make_complex(L, b.binary("multiply", r, b.unary("cosine", theta)), b.binary("multiply", r, b.unary("sine", theta)))


@register(aten.angle.default)
def angle(L: NodeLowering, x: Value) -> Value:
    out = L.out[0].dtype
    b = L.b
    if is_complex(x.dtype):
        return b.binary("atan2", imag(L, x), real(L, x))
    # real input: pi for negative numbers, 0 otherwise, NaN stays NaN (as on the CPU)
    x = L.to(x, out)
    pi = b.select(b.compare(x, L.zeros(x.shape, out), "LT"), L.full(math.pi, x.shape, out), L.zeros(x.shape, out))
    return b.select(b.compare(x, x, "NE"), x, pi)


@register(aten.conj_physical.default, aten._conj_physical.default)
def conj_physical(L: NodeLowering, x: Value) -> Value:
    # A lazy conj bit on the input is already applied when its view is read, so this
    # conjugates the values it receives.
    return conj(L, x)


@register(aten.view_as_real.default, aten.view_as_real_copy.default)
def view_as_real(L: NodeLowering, x: Value) -> Value:
    """Inside a program (compiled graphs, decompositions) the view is a fresh value; eager
    views share storage through the runtime's view kernels instead."""
    b = L.b
    parts = [b.reshape(p, x.shape + (1,)) for p in (real(L, x), imag(L, x))]
    return b.concatenate(parts, x.rank)


@register(aten.view_as_complex.default, aten.view_as_complex_copy.default)
def view_as_complex(L: NodeLowering, x: Value) -> Value:
    b = L.b
    lead = x.shape[:-1]
    re = b.reshape(b.slice(x, [0] * x.rank, lead + (1,)), lead)
    im = b.reshape(b.slice(x, [0] * (x.rank - 1) + [1], lead + (2,)), lead)
    return make_complex(L, re, im)


# -- C99 (Annex G) values XLA's complex expansions miss ----------------------------------------
# The CPU's complex functions (std::sqrt, std::asinh, ... on c10::complex) keep the sign of
# a zero part on the branch cuts (sqrt(-2.5 - 0j) = -1.58j) and give the special values of
# C99 Annex G at infinities; XLA's expansions drop the zero's sign (sqrt(-2.5 - 0j) = +1.58j)
# and return NaN for several infinite arguments.
# Functions symmetric under conjugation, f(conj z) = conj f(z), are evaluated with |im| and
# conjugated back when im's sign bit is set; the odd ones, f(-z) = -f(z), also with |re|.
_CONJ_SYMMETRIC = {"stablehlo.sqrt", "chlo.acos", "chlo.acosh"}
_ODD_CONJ_SYMMETRIC = {"chlo.asin", "chlo.asinh", "chlo.atan", "chlo.atanh"}
COMPLEX_FIXED = _CONJ_SYMMETRIC | _ODD_CONJ_SYMMETRIC | {"stablehlo.exponential", "stablehlo.sine", "stablehlo.cosine"}


def _sign_bit(L: NodeLowering, v: Value) -> Value:
    """v's sign bit (set for -0.0 and negative NaNs), read from the bits."""
    itype = torch.int32 if v.dtype is torch.float32 else torch.int64
    return L.b.compare(L.b.bitcast_convert(v, v.shape, itype), L.zeros(v.shape, itype), "LT")


def _negate_if(L: NodeLowering, flag: Value, v: Value) -> Value:
    return L.b.select(flag, L.b.unary("negate", v), v)


def complex_unary(L: NodeLowering, hlo: str, x: Value) -> Value:
    """``hlo`` of a complex ``x`` with the CPU's branch-cut signs and special values."""
    b = L.b
    re, im = real(L, x), imag(L, x)
    re_neg, im_neg = _sign_bit(L, re), _sign_bit(L, im)
    odd = hlo in _ODD_CONJ_SYMMETRIC
    if odd or hlo in _CONJ_SYMMETRIC:
        folded = make_complex(L, b.unary("abs", re) if odd else re, b.unary("abs", im))
        w = b.op1(hlo, [folded], x.shape, x.dtype)
        wr, wi = real(L, w), imag(L, w)
        wr = _negate_if(L, re_neg, wr) if odd else wr
        return _special_values(L, hlo, re, im, make_complex(L, wr, _negate_if(L, im_neg, wi)))
    return _special_values(L, hlo, re, im, b.op1(hlo, [x], x.shape, x.dtype))


def _special_values(L: NodeLowering, hlo: str, re: Value, im: Value, w: Value) -> Value:
    """C99 Annex G's values where XLA's expansion of ``hlo`` gives NaN (the CPU's too)."""
    b = L.b
    zero, nan, inf = (L.full(v, re.shape, re.dtype) for v in (0.0, math.nan, math.inf))

    def isinf(v: Value) -> Value:
        return b.compare(b.unary("abs", v), inf, "EQ")

    def isnan(v: Value) -> Value:
        return b.compare(v, v, "NE")

    def where(cond: Value, r: Value, i: Value) -> Value:
        return b.select(L.broadcast_to(cond, w.shape), make_complex(L, r, i), w)

    if hlo == "stablehlo.sqrt":  # sqrt(x +- i inf) = inf +- i inf, NaN x included
        return where(isinf(im), inf, im)
    if hlo == "chlo.atan":  # atan(NaN +- i inf) = NaN +- 0i
        return where(b.binary("and", isnan(re), isinf(im)), nan, b.binary("divide", L.full(1.0, im.shape, im.dtype), im))
    if hlo == "chlo.atanh":  # atanh(+-inf + i NaN) = +-0 + i NaN
        return where(b.binary("and", isinf(re), isnan(im)), b.binary("divide", L.full(1.0, re.shape, re.dtype), re), nan)
    if hlo == "stablehlo.exponential":  # exp(-inf + i y) = 0 for infinite or NaN y too
        minus_inf = b.compare(re, b.unary("negate", inf), "EQ")
        return where(b.binary("and", minus_inf, b.unary("not", b.unary("is_finite", im, torch.bool))), zero, zero)
    if hlo in ("stablehlo.sine", "stablehlo.cosine"):
        # sin(+-0 + iy) = +-0 + i sinh(y) and cos(+-0 + iy) = cosh(y) -+ 0i exactly, for
        # infinite y too (XLA multiplies sin(0) by cosh(inf): NaN)
        at_zero = b.compare(re, zero, "EQ")
        if hlo == "stablehlo.sine":
            return where(at_zero, re, imag(L, w))
        return where(at_zero, real(L, w), b.unary("negate", b.binary("multiply", re, b.unary("sign", im))))
    return w
