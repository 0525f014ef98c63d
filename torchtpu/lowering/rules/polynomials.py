"""Orthogonal polynomials (torch.special.*_polynomial_*): ports of PyTorch's CPU kernels
(aten/src/ATen/native/Math.h, ``chebyshev_polynomial_t_forward`` and friends).

Each kernel converts ``n`` to int64, returns fixed values in special cases (n < 0, n = 0,
n = 1, |x| = 1, ...), uses a closed trigonometric form for large ``n`` inside [-1, 1],
and otherwise runs a three-term recurrence ``n`` times. The recurrence is one
``stablehlo.while`` shared by the whole tensor: it runs until no element is still
iterating (so the trip count is max(n) over the elements that need the loop, found on
the device) and each element stops updating, by select, once the counter passes its own
``n`` -- or, like the CPU loop, once its value turned NaN.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ...stablehlo.builder import Value
from ..context import NodeLowering
from ..registry import register

aten = torch.ops.aten
I64 = torch.int64

# Above these degrees the CPU's Hermite kernels return NaN (getHermitianLimit in Math.h).
_HERMITE_LIMIT = {torch.float32: 128, torch.float64: 512}


class Expr:
    """Terse elementwise arithmetic on Values of one shape, for kernels that are long
    formulas (here and in gamma.py)."""

    def __init__(self, L: NodeLowering, shape: tuple[int, ...], dtype: torch.dtype):
        self.L, self.b, self.shape, self.dtype = L, L.b, shape, dtype

    def c(self, v: Any, dtype: torch.dtype | None = None) -> Value:
        return self.L.full(v, self.shape, dtype or self.dtype)

    def add(self, x: Value, y: Value) -> Value:
        return self.b.binary("add", x, y)

    def sub(self, x: Value, y: Value) -> Value:
        return self.b.binary("subtract", x, y)

    def mul(self, x: Value, y: Value) -> Value:
        return self.b.binary("multiply", x, y)

    def div(self, x: Value, y: Value) -> Value:
        return self.b.binary("divide", x, y)

    def cmp(self, x: Value, y: Value | float | int, direction: str) -> Value:
        if not isinstance(y, Value):
            y = self.c(y, x.dtype)
        return self.b.compare(x, y, direction)

    def both(self, x: Value, y: Value) -> Value:
        return self.b.binary("and", x, y)

    def either(self, x: Value, y: Value) -> Value:
        return self.b.binary("or", x, y)

    def sel(self, pred: Value, x: Value | float, y: Value) -> Value:
        return self.b.select(pred, x if isinstance(x, Value) else self.c(x), y)

    def f(self, n: Value) -> Value:
        """An int64 expression as a float of the working dtype (as C++ converts it)."""
        return self.b.convert(n, self.dtype)

    def abs(self, x: Value) -> Value:
        return self.b.unary("abs", x)

    def acos(self, x: Value) -> Value:
        return self.b.chlo("acos", x)

    def cos(self, x: Value) -> Value:
        return self.b.unary("cosine", x)

    def sin(self, x: Value) -> Value:
        return self.b.unary("sine", x)

    def neg(self, x: Value) -> Value:
        return self.b.unary("negate", x)

    def not_(self, x: Value) -> Value:
        return self.b.unary("not", x)

    def un(self, name: str, x: Value) -> Value:
        """A one-operand StableHLO op by name (log, exponential, sqrt, log_plus_one, ...)."""
        return self.b.unary(name, x)


def _operands(L: NodeLowering, x: Any, n: Any) -> tuple[Expr, Value, Value]:
    """x in the output dtype, and n converted like the kernel's ``static_cast<int64_t>(n)``
    of the promoted float: truncation toward zero, and NaN, infinities and values out of
    int64 range become INT64_MIN (what x86's conversion gives) -- a negative degree."""
    out = L.out[0]
    x, nf = L.promote(x, n, dtype=out.dtype, shape=out.shape)
    e = Expr(L, out.shape, out.dtype)
    representable = e.both(e.cmp(nf, -(2.0**63), "GE"), e.cmp(nf, 2.0**63, "LT"))  # false for NaN too
    n_int = e.sel(representable, L.b.convert(nf, I64), e.c(-(2**63), I64))
    return e, x, n_int


def _recurrence(
    e: Expr,
    x: Value,
    last: Value,
    p0: Value,
    q0: Value,
    first_k: int,
    step: Callable[[Expr, Value, Value, Value, Value], Value],
    stop_on_nan: bool = True,
) -> Value:
    """The CPU's ``for (k = first_k; k <= last && !isnan(q); k++) { r = step(k, x, p, q);
    p = q; q = r; }`` for every element at once; returns q. An element with
    ``last < first_k`` never changes."""
    L, b = e.L, e.b

    def active(k: Value, last: Value, q: Value) -> Value:
        going = e.cmp(b.broadcast_in_dim(k, e.shape, []), last, "LE")
        return e.both(going, e.cmp(q, q, "EQ")) if stop_on_nan else going

    def cond(k: Value, x: Value, last: Value, p: Value, q: Value) -> Value:
        return L.any_true(active(k, last, q))

    def body(k: Value, x: Value, last: Value, p: Value, q: Value) -> list[Value]:
        on = active(k, last, q)
        r = step(e, b.broadcast_in_dim(k, e.shape, []), x, p, q)
        return [b.binary("add", k, b.constant(1, I64)), x, last, b.select(on, q, p), b.select(on, r, q)]

    state = b.while_loop([b.constant(first_k, I64), x, last, p0, q0], cond, body)
    return state[4]


def _even(e: Expr, n: Value) -> Value:
    return e.cmp(e.b.binary("and", n, e.c(1, I64)), 0, "EQ")


def _loop_last(e: Expr, n: Value, loops: Value, offset: int = 0) -> Value:
    """The recurrence's last counter value: n + offset where the element loops, else -1
    (below every start, so the element never iterates)."""
    last = e.b.binary("add", n, e.c(offset, I64)) if offset else n
    return e.sel(loops, last, e.c(-1, I64))


def _chebyshev_step(e: Expr, k: Value, x: Value, p: Value, q: Value) -> Value:
    # r = (x + x) q - p
    return e.sub(e.mul(e.add(x, x), q), p)


def _shifted_chebyshev_step(e: Expr, k: Value, x: Value, p: Value, q: Value) -> Value:
    # r = (y + y) q - p with y = x + x - 1, recomputed here: loop regions see only the loop state
    y = e.sub(e.add(x, x), e.c(1.0))
    return e.sub(e.mul(e.add(y, y), q), p)


def _chebyshev(
    L: NodeLowering,
    x_arg: Any,
    n_arg: Any,
    kind: str,
    shifted: bool,
) -> Value:
    """Chebyshev polynomials of the first..fourth kind (T, U, V, W), plain or shifted to
    [0, 1] (argument y = 2x - 1), with each kernel's special cases."""
    e, x, n = _operands(L, x_arg, n_arg)
    y = e.sub(e.add(x, x), e.c(1.0)) if shifted else x
    nf = e.f(n)
    n1 = e.b.binary("add", n, e.c(1, I64))
    n2p1 = e.b.binary("add", e.b.binary("add", n, n), e.c(1, I64))  # n + n + 1 in int64
    even = _even(e, n)

    def odd_sign(v: Value) -> Value:  # v if n is even else -v
        return e.sel(even, v, e.b.unary("negate", v))

    one, minus_one = e.c(1.0), e.c(-1.0)
    sign_one = e.sel(even, one, minus_one)
    # the degree above which the closed trigonometric form is used inside (-1, 1)
    trig_from = {"t": 6, "u": 8, "v": 8, "w": 8}[kind] if not shifted else {"t": 6, "u": 6, "v": 6, "w": 4}[kind]
    inside = e.both(e.cmp(n, trig_from, "GT"), e.cmp(e.abs(y), 1.0, "LT"))
    t = e.acos(y)
    half = e.div(t, e.c(2.0))
    n_half = e.add(nf, e.c(0.5))
    if kind == "t":
        trig = e.cos(e.mul(nf, t))
        q0 = y
    elif kind == "u":
        s = e.sin(t)
        m = e.f(n1)
        trig = e.sel(e.cmp(s, 0.0, "NE"), e.div(e.sin(e.mul(m, t)), s), e.div(e.mul(m, e.cos(e.mul(m, t))), y))
        q0 = e.add(y, y)
    elif kind == "v":
        trig = e.sel(
            e.cmp(e.sin(half), 1.0, "NE"), e.div(e.cos(e.mul(n_half, t)), e.cos(half)), odd_sign(e.f(n2p1))
        )
        q0 = e.sub(e.add(y, y), one)
    else:
        # the W kernel's fallback where cos(acos(y)/2) == 1: the value at y = 1
        at_one = e.f(n2p1) if not shifted else sign_one
        if not shifted:
            at_one = e.sel(e.cmp(x, 0.0, "GT"), at_one, sign_one)
        trig = e.sel(e.cmp(e.cos(half), 1.0, "NE"), e.div(e.sin(e.mul(n_half, t)), e.sin(half)), at_one)
        q0 = e.add(e.add(y, y), one)

    # the values where the kernels return early, before the trigonometric form
    if shifted:
        edge_at_one = {"t": one, "u": e.f(n1), "v": one, "w": e.f(n2p1)}[kind]
        edge_at_zero = {"t": sign_one, "u": odd_sign(e.f(n1)), "v": odd_sign(e.f(n2p1)), "w": sign_one}[kind]
        edges = [(e.cmp(x, 1.0, "EQ"), edge_at_one), (e.cmp(x, 0.0, "EQ"), edge_at_zero)]
    else:
        positive = e.cmp(x, 0.0, "GT")
        edge = {
            "t": e.sel(e.either(positive, even), one, minus_one),
            "u": e.sel(e.either(positive, even), e.f(n1), e.b.unary("negate", e.f(n1))),
            "v": e.sel(positive, one, odd_sign(e.f(n2p1))),
            "w": e.sel(positive, e.f(n2p1), sign_one),
        }[kind]
        edges = [(e.cmp(e.abs(x), 1.0, "EQ"), edge)]

    early = inside
    for pred, _ in edges:
        early = e.either(early, pred)
    loops = e.both(e.cmp(n, 2, "GE"), e.b.unary("not", early))
    step = _shifted_chebyshev_step if shifted else _chebyshev_step
    res = _recurrence(e, x, _loop_last(e, n, loops), one, q0, 2, step)
    res = e.sel(e.cmp(n, 1, "EQ"), q0, res)
    res = e.sel(e.cmp(n, 0, "EQ"), one, res)
    res = e.sel(inside, trig, res)
    for pred, value in reversed(edges):
        res = e.sel(pred, value, res)
    return e.sel(e.cmp(n, 0, "LT"), 0.0, res)


def _hermite(L: NodeLowering, x_arg: Any, n_arg: Any, physicists: bool) -> Value:
    """H_n (physicists', r = 2x q - 2k p) or He_n (probabilists', r = x q - k p)."""
    e, x, n = _operands(L, x_arg, n_arg)
    limit = _HERMITE_LIMIT.get(e.dtype, 1024)
    q0 = e.add(x, x) if physicists else x
    loops = e.both(e.cmp(n, 2, "GE"), e.cmp(n, limit, "LE"))

    def step(e: Expr, k: Value, x: Value, p: Value, q: Value) -> Value:
        if physicists:  # the CPU counts k = 2, 4, .., < 2n: here k = 1, 2, .., < n and 2k
            return e.sub(e.mul(e.add(x, x), q), e.mul(e.f(e.b.binary("add", k, k)), p))
        return e.sub(e.mul(x, q), e.mul(e.f(k), p))

    res = _recurrence(e, x, _loop_last(e, n, loops, -1), e.c(1.0), q0, 1, step, stop_on_nan=False)
    res = e.sel(e.cmp(n, limit, "GT"), float("nan"), res)
    res = e.sel(e.cmp(n, 1, "EQ"), q0, res)
    res = e.sel(e.cmp(n, 0, "EQ"), 1.0, res)
    return e.sel(e.cmp(n, 0, "LT"), 0.0, res)


def _laguerre_step(e: Expr, k: Value, x: Value, p: Value, q: Value) -> Value:
    # r = (((k + k) + (1 - x)) q - k p) / (k + 1)
    b = e.b
    a = e.add(e.f(b.binary("add", k, k)), e.sub(e.c(1.0), x))
    return e.div(e.sub(e.mul(a, q), e.mul(e.f(k), p)), e.f(b.binary("add", k, e.c(1, I64))))


def _legendre_step(e: Expr, k: Value, x: Value, p: Value, q: Value) -> Value:
    # r = ((k + k + 1) x q - k p) / (k + 1)
    b = e.b
    two_k1 = e.f(b.binary("add", b.binary("add", k, k), e.c(1, I64)))
    return e.div(e.sub(e.mul(e.mul(two_k1, x), q), e.mul(e.f(k), p)), e.f(b.binary("add", k, e.c(1, I64))))


def _laguerre(L: NodeLowering, x_arg: Any, n_arg: Any) -> Value:
    e, x, n = _operands(L, x_arg, n_arg)
    q0 = e.sub(e.c(1.0), x)
    at_zero = e.cmp(e.abs(x), 0.0, "EQ")
    loops = e.both(e.cmp(n, 2, "GE"), e.b.unary("not", at_zero))
    res = _recurrence(e, x, _loop_last(e, n, loops, -1), e.c(1.0), q0, 1, _laguerre_step)
    res = e.sel(e.cmp(n, 1, "EQ"), q0, res)
    res = e.sel(e.cmp(n, 0, "EQ"), 1.0, res)
    res = e.sel(at_zero, 1.0, res)
    return e.sel(e.cmp(n, 0, "LT"), 0.0, res)


def _legendre(L: NodeLowering, x_arg: Any, n_arg: Any) -> Value:
    e, x, n = _operands(L, x_arg, n_arg)
    at_pm_one = e.cmp(e.abs(x), 1.0, "EQ")
    edge = e.sel(e.either(e.cmp(x, 0.0, "GT"), _even(e, n)), 1.0, e.c(-1.0))
    loops = e.both(e.cmp(n, 2, "GE"), e.b.unary("not", at_pm_one))
    res = _recurrence(e, x, _loop_last(e, n, loops, -1), e.c(1.0), x, 1, _legendre_step)
    res = e.sel(e.cmp(n, 1, "EQ"), x, res)
    res = e.sel(e.cmp(n, 0, "EQ"), 1.0, res)
    res = e.sel(at_pm_one, edge, res)
    return e.sel(e.cmp(n, 0, "LT"), 0.0, res)


def _overloads(packet: Any) -> list[Any]:
    return [packet.default, packet.x_scalar, packet.n_scalar]


def _register_chebyshev(packet: Any, kind: str, shifted: bool) -> None:
    def rule(L: NodeLowering, x: Any, n: Any) -> Value:
        return _chebyshev(L, x, n, kind, shifted)

    register(*_overloads(packet))(rule)


for _kind in "tuvw":
    _register_chebyshev(getattr(aten, f"special_chebyshev_polynomial_{_kind}"), _kind, False)
    _register_chebyshev(getattr(aten, f"special_shifted_chebyshev_polynomial_{_kind}"), _kind, True)


@register(*_overloads(aten.special_hermite_polynomial_h))
def hermite_polynomial_h(L: NodeLowering, x: Any, n: Any) -> Value:
    return _hermite(L, x, n, physicists=True)


@register(*_overloads(aten.special_hermite_polynomial_he))
def hermite_polynomial_he(L: NodeLowering, x: Any, n: Any) -> Value:
    return _hermite(L, x, n, physicists=False)


@register(*_overloads(aten.special_laguerre_polynomial_l))
def laguerre_polynomial_l(L: NodeLowering, x: Any, n: Any) -> Value:
    return _laguerre(L, x, n)


@register(*_overloads(aten.special_legendre_polynomial_p))
def legendre_polynomial_p(L: NodeLowering, x: Any, n: Any) -> Value:
    return _legendre(L, x, n)
