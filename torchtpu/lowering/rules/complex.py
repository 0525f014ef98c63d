"""Complex numbers: building them (complex, polar, view_as_complex), taking them apart
(view_as_real, angle) and conjugating. The element types come from the dtype table
(complex64 = ``complex<f32>``, complex128 = ``complex<f64>``)."""

from __future__ import annotations

import functools
import math
from typing import Any

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
        re, im = real(L, x), imag(L, x)
        from .elementwise import flushed_on_cpu  # elementwise imports this module

        return b.binary("atan2", *flushed_on_cpu(L, im, re))
    # real input: pi for negative numbers, 0 otherwise, NaN stays NaN (as on the CPU)
    x = L.to(x, out)
    pi = b.select(b.compare(x, L.zeros(x.shape, out), "LT"), L.full(math.pi, x.shape, out), L.zeros(x.shape, out))
    return b.select(b.compare(x, x, "NE"), x, pi)


@register(aten.conj_physical.default, aten._conj_physical.default)
def conj_physical(L: NodeLowering, x: Value) -> Value:
    # A lazy conj bit on the input is already applied when its view is read, so this
    # conjugates the values it receives.
    return conj(L, x)


@register(aten._conj.default, aten._conj_copy.default)
def conj_view(L: NodeLowering, x: Value) -> Value:
    """The lazy-conjugate view (``x.conj()`` of a complex tensor) as a compiled graph holds
    it, e.g. saved for the backward of a complex product (Llama 4's RoPE): inside a program
    the view is its values, conjugated. Eager views keep PyTorch's conj bit instead."""
    return conj(L, x)


@register(aten._neg_view.default, aten._neg_view_copy.default)
def neg_view(L: NodeLowering, x: Value) -> Value:
    return L.b.unary("negate", x)


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
_SMALL_PART_FIXED = {"stablehlo.sine", "stablehlo.cosine", "chlo.sinh", "chlo.cosh"}
COMPLEX_FIXED = _CONJ_SYMMETRIC | _ODD_CONJ_SYMMETRIC | _SMALL_PART_FIXED
COMPLEX_FIXED |= {"stablehlo.exponential", "stablehlo.log", "stablehlo.logistic"}


def _sign_bit(L: NodeLowering, v: Value) -> Value:
    """v's sign bit (set for -0.0 and negative NaNs), read from the bits."""
    itype = torch.int32 if v.dtype is torch.float32 else torch.int64
    return L.b.compare(L.b.bitcast_convert(v, v.shape, itype), L.zeros(v.shape, itype), "LT")


def _negate_if(L: NodeLowering, flag: Value, v: Value) -> Value:
    return L.b.select(flag, L.b.unary("negate", v), v)


def complex_unary(L: NodeLowering, hlo: str, x: Value) -> Value:
    """``hlo`` of a complex ``x`` with the CPU's branch-cut signs and special values."""
    b = L.b
    if hlo == "stablehlo.logistic":
        return _logistic(L, x)
    re, im = real(L, x), imag(L, x)
    re_neg, im_neg = _sign_bit(L, re), _sign_bit(L, im)
    odd = hlo in _ODD_CONJ_SYMMETRIC
    if odd or hlo in _CONJ_SYMMETRIC:
        folded_re = b.unary("abs", re) if odd else re
        folded = make_complex(L, folded_re, b.unary("abs", im))
        w = b.op1(hlo, [folded], x.shape, x.dtype)
        if hlo in ("chlo.atan", "chlo.atanh"):
            w = _near_branch_point(L, hlo, folded_re, b.unary("abs", im), w)
        wr, wi = real(L, w), imag(L, w)
        wr = _negate_if(L, re_neg, wr) if odd else wr
        return _special_values(L, hlo, re, im, make_complex(L, wr, _negate_if(L, im_neg, wi)))
    w = b.op1(hlo, [x], x.shape, x.dtype)
    if hlo in _SMALL_PART_FIXED:
        w = _small_part(L, hlo, re, im, w)
    return _special_values(L, hlo, re, im, w)


def _logistic(L: NodeLowering, x: Value) -> Value:
    """sigmoid(z) = 1 / (1 + exp(-z)) as the CPU computes it, with C99's exp: sigmoid(inf + iy)
    is 1 (exp(-inf - iy) = 0; XLA's complex logistic gives NaN)."""
    b = L.b
    one = L.full(1, x.shape, x.dtype)
    e = complex_unary(L, "stablehlo.exponential", b.unary("negate", x))
    return b.binary("divide", one, b.binary("add", one, e))


def _small_part(L: NodeLowering, hlo: str, re: Value, im: Value, w: Value) -> Value:
    """sin/cos where |Im z| < 1 (sinh/cosh where |Re z| < 1) from the real functions of the
    parts, as the CPU's libm does: XLA's complex expansion takes the sinh of the small part
    as a difference of exponentials, which cancels (sin(0.3 + 1e-8j) had imaginary part 0 in
    complex64, sinh(1e-3 + 0j) was 1.000017e-3), and halves the smallest normal into a
    flushed subnormal (sinh(1.2e-38j) gave 0). With one part below 1 and the other finite,
    the textbook products neither cancel nor overflow."""
    b = L.b
    trig = hlo in ("stablehlo.sine", "stablehlo.cosine")
    small, other = (im, re) if trig else (re, im)
    use = b.binary(
        "and",
        b.compare(b.unary("abs", small), L.full(1.0, small.shape, small.dtype), "LT"),
        b.unary("is_finite", other, torch.bool),
    )
    sh, ch = (b.op1(f"chlo.{f}", [small], small.shape, small.dtype) for f in ("sinh", "cosh"))
    s_, c_ = b.unary("sine", other), b.unary("cosine", other)
    mul = functools.partial(b.binary, "multiply")
    parts = {
        "stablehlo.sine": (mul(s_, ch), mul(c_, sh)),  # sin(x + iy) = sin x cosh y + i cos x sinh y
        "stablehlo.cosine": (mul(c_, ch), b.unary("negate", mul(s_, sh))),  # cos x cosh y - i sin x sinh y
        "chlo.sinh": (mul(sh, c_), mul(ch, s_)),  # sinh(x + iy) = sinh x cos y + i cosh x sin y
        "chlo.cosh": (mul(ch, c_), mul(sh, s_)),  # cosh(x + iy) = cosh x cos y + i sinh x sin y
    }[hlo]
    return make_complex(L, b.select(use, parts[0], real(L, w)), b.select(use, parts[1], imag(L, w)))


def _log_hypot(L: NodeLowering, a: Value, c: Value) -> Value:
    """log(sqrt(a^2 + c^2)) without squaring a or c (no underflow, no overflow)."""
    b = L.b
    a, c = b.unary("abs", a), b.unary("abs", c)
    big, small = b.binary("maximum", a, c), b.binary("minimum", a, c)
    ratio = b.binary("divide", small, big)
    return b.binary(
        "add",
        b.unary("log", big),
        b.binary("multiply", L.full(0.5, a.shape, a.dtype), b.unary("log_plus_one", b.binary("multiply", ratio, ratio))),
    )


def _near_branch_point(L: NodeLowering, hlo: str, x: Value, y: Value, w: Value) -> Value:
    """atan's imaginary part (atanh's real part) next to its singularities +-i (+-1), for the
    folded x, y >= 0: XLA's expansion squares the small part, which underflows, and gives
    inf where the exact value is finite: atan(1.2e-38 + 1j) is 0.785 + 44.01j in
    complex64. There the part is (log|z + i| - log|z - i|) / 2, with no cancellation (one
    term is large)."""
    b = L.b
    one = L.full(1.0, x.shape, x.dtype)
    if hlo == "chlo.atanh":  # atanh(x + iy): the roles of the parts swap
        x, y = y, x
    # atan(x + iy): imaginary part (log|x + i(y + 1)| - log|x + i(y - 1)|) / 2
    part = b.binary(
        "multiply",
        L.full(0.5, x.shape, x.dtype),
        b.binary("subtract", _log_hypot(L, x, b.binary("add", y, one)), _log_hypot(L, x, b.binary("subtract", y, one))),
    )
    inf = L.full(math.inf, x.shape, x.dtype)
    at_pole = b.binary("and", b.compare(x, L.zeros(x.shape, x.dtype), "EQ"), b.compare(y, one, "EQ"))
    finite = b.binary("and", b.unary("is_finite", x, torch.bool), b.unary("is_finite", y, torch.bool))
    wr, wi = real(L, w), imag(L, w)
    if hlo == "chlo.atanh":
        fix = b.binary("and", b.binary("and", b.compare(b.unary("abs", wr), inf, "EQ"), finite), b.unary("not", at_pole))
        return make_complex(L, b.select(fix, part, wr), wi)
    fix = b.binary("and", b.binary("and", b.compare(b.unary("abs", wi), inf, "EQ"), finite), b.unary("not", at_pole))
    return make_complex(L, wr, b.select(fix, part, wi))


def complex_power(L: NodeLowering, x: Value, y: Value) -> Value:
    """x ** y for complex x and y of one shape: XLA's power, and where that is not finite,
    exp(y log x) (glibc's cpow, which the CPU calls). XLA multiplies |x|^Re(y) by
    exp(-Im(y) arg x) separately, so (-501-501j) ** (-501+501j) came out 0 * inf = NaN
    (the value, e^-2108, is 0); exp(y log x) rounds the sum of the two exponents once."""
    b = L.b
    w = b.binary("power", x, y)
    finite = b.binary("and", b.unary("is_finite", real(L, w), torch.bool), b.unary("is_finite", imag(L, w), torch.bool))
    log_x = complex_unary(L, "stablehlo.log", x)
    via_log = complex_unary(L, "stablehlo.exponential", b.binary("multiply", y, log_x))
    return b.select(finite, w, via_log)


# Exponents the CPU's pow(tensor, scalar) computes without pow (PowKernel.cpp): x ** 2 is
# x * x there (and square(x) is pow(x, 2)), so its infinities follow the multiplication.
_SCALAR_POWERS = (0.5, -0.5, -1.0, 2.0, 3.0, -2.0)


def _scalar_power(L: NodeLowering, x: Value, e: float) -> Value:
    b = L.b
    one = L.full(1, x.shape, x.dtype)
    if e in (0.5, -0.5):
        r = complex_unary(L, "stablehlo.sqrt", x)
        return r if e == 0.5 else b.binary("divide", one, r)
    if e == -1.0:
        return b.binary("divide", one, x)
    sq = b.binary("multiply", x, x)
    return {2.0: sq, 3.0: b.binary("multiply", sq, x), -2.0: b.binary("divide", one, sq)}[e]


def complex_power_scalar(L: NodeLowering, x: Value, y: Any) -> Value:
    """pow(complex tensor, scalar) as the CPU's kernel: 0 gives 1, 1 gives x, and the
    exponents of :data:`_SCALAR_POWERS` their sqrt/reciprocal/product forms; a device scalar
    picks among them per call (select on its value)."""
    b = L.b
    if not isinstance(y, Value):
        e = complex(y)
        if e.imag == 0 and e.real in _SCALAR_POWERS:
            return _scalar_power(L, x, e.real)
        if e == 1:
            return x
        if e == 0:
            return L.full(1, x.shape, x.dtype)
        return complex_power(L, x, L.full(y, x.shape, x.dtype))
    (yv,) = L.promote(y, dtype=x.dtype, shape=x.shape)
    r = complex_power(L, x, yv)
    yr, yi = real(L, yv), imag(L, yv)
    real_exponent = b.compare(yi, L.zeros(yi.shape, yi.dtype), "EQ")
    candidates = [(e, _scalar_power(L, x, e)) for e in _SCALAR_POWERS] + [(1.0, x), (0.0, L.full(1, x.shape, x.dtype))]
    for e, value in candidates:
        hit = b.binary("and", real_exponent, b.compare(yr, L.full(e, yr.shape, yr.dtype), "EQ"))
        r = b.select(hit, value, r)
    return r


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
    if hlo == "stablehlo.exponential":
        # exp(-inf + i y) = 0 and exp(+inf + i y) = inf + i NaN for infinite or NaN y
        unbounded = b.unary("not", b.unary("is_finite", im, torch.bool))
        w = where(b.binary("and", b.compare(re, inf, "EQ"), unbounded), inf, nan)
        minus_inf = b.compare(re, b.unary("negate", inf), "EQ")
        return where(b.binary("and", minus_inf, unbounded), zero, zero)
    if hlo == "stablehlo.log":  # log(z) = inf + i arg(z) when a part is infinite, the other NaN too
        return where(b.binary("or", isinf(re), isinf(im)), inf, b.binary("atan2", im, re))
    if hlo in ("stablehlo.sine", "stablehlo.cosine"):
        # sin(+-0 + iy) = +-0 + i sinh(y) and cos(+-0 + iy) = cosh(y) -+ 0i exactly, for
        # infinite y too (XLA multiplies sin(0) by cosh(inf): NaN)
        at_zero = b.compare(re, zero, "EQ")
        if hlo == "stablehlo.sine":
            return where(at_zero, re, imag(L, w))
        return where(at_zero, real(L, w), b.unary("negate", b.binary("multiply", re, b.unary("sign", im))))
    return w
