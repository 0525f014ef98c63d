"""Random samplers that draw until they accept: Gamma (so Dirichlet, Beta, Chi2, StudentT
in ``torch.distributions``), Poisson and Binomial; and the reparameterized gradients of a
Gamma and of a Dirichlet (so Beta) sample.

They use the algorithms of PyTorch's kernels (aten/src/ATen/native/Distributions.h), so
the distributions and the edge values are the CPU's, not its exact numbers (the device
draws from Philox):

- Gamma(alpha): Marsaglia and Tsang's squeeze-and-reject method; alpha < 1 draws from
  alpha + 1 and scales by U^(1/alpha). Results below the dtype's smallest normal number
  (and NaN) become that number, as on the CPU.
- Poisson(rate): Knuth's product of uniforms for rate < 10, Hormann's transformed
  rejection (PTRS) above. A negative or NaN rate is the CPU's error.
- Binomial(count, prob): inversion (geometric waiting times) for count * p < 10 with p
  the smaller of prob and 1 - prob, Hormann's BTRS above.

Every element loops at once: one ``stablehlo.while`` whose every trip draws fresh uniforms
for the whole tensor, and an element keeps the first value it accepts. The loop stops when
all have (a trip accepts an element with probability >= 0.95 for Gamma, and Knuth's count
needs about rate + 1 trips), or after ``_MAX_TRIPS``: a bound no real draw reaches, so a
NaN can never hang the device.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ...stablehlo.builder import Value
from ..context import NodeLowering
from ..registry import register, register_meta
from .polynomials import Expr
from .reduction import sum_keep
from .rng import _float_dtype, bits_dtype, box_muller, continue_from, draw_bits, philox_state, uniform01, unit_floats

aten = torch.ops.aten
I64 = torch.int64
_MAX_TRIPS = 4096


class _Draws:
    """Uniforms drawn inside a loop body from a Philox state the loop carries."""

    def __init__(self, L: NodeLowering, state: Value, shape: tuple[int, ...], dtype: torch.dtype):
        self.L, self.state, self.shape, self.dtype = L, state, shape, dtype

    def uniform(self, open_low: bool = False) -> Value:
        self.state, raw = draw_bits(self.L.b, self.state, self.shape, bits_dtype(self.dtype))
        return unit_floats(self.L, raw, self.dtype, open_low)

    def normal(self) -> Value:
        u1 = self.uniform(open_low=True)  # (0, 1]: its log is finite
        return box_muller(self.L, u1, self.uniform())


def _accept_loop(L: NodeLowering, e: Expr, done: Value, result: Value, carried: list[Value], trip: Any) -> Value:
    """``trip(draws, done, result, *carried) -> (accepted, value, carried')`` until every
    element has accepted once (``done``); returns the accepted values."""
    b = L.b
    n_carried = len(carried)

    def cond(i: Value, state: Value, done: Value, result: Value, *rest: Value) -> Value:
        return b.binary("and", b.compare(i, b.constant(_MAX_TRIPS, I64), "LT"), L.any_true(e.not_(done)))

    def body(i: Value, state: Value, done: Value, result: Value, *rest: Value) -> list[Value]:
        draws = _Draws(L, state, e.shape, e.dtype)
        accepted, value, rest = trip(draws, *rest)
        take = e.both(accepted, e.not_(done))
        return [b.binary("add", i, b.constant(1, I64)), draws.state, e.either(done, accepted), e.sel(take, value, result), *rest]

    state = b.while_loop([b.constant(0, I64), philox_state(L), done, result, *carried], cond, body)
    assert len(state) == 4 + n_carried
    continue_from(L, state[1])
    return state[3]


def _at_least_tiny(e: Expr, x: Value, dtype: torch.dtype) -> Value:
    """max(smallest normal of ``dtype``, x), NaN included (C++'s std::max(min, x))."""
    tiny = e.c(torch.finfo(dtype).tiny)
    return e.sel(e.cmp(x, tiny, "GT"), x, tiny)


def gamma_samples(L: NodeLowering, alpha: Value) -> Value:
    """Gamma(alpha, 1) samples in alpha's dtype (float32 or float64), before clamping."""
    e = Expr(L, alpha.shape, alpha.dtype)
    one = e.c(1.0)
    boosted = e.cmp(alpha, 1.0, "LT")
    scale = e.sel(boosted, L.b.binary("power", uniform01(L, alpha.shape, alpha.dtype, open_low=True), e.div(one, alpha)), one)
    a = e.sel(boosted, e.add(alpha, one), alpha)
    d = e.sub(a, e.c(1.0 / 3.0))
    c = e.div(one, e.un("sqrt", e.mul(e.c(9.0), d)))

    def trip(draws: _Draws, d: Value, c: Value) -> tuple[Value, Value, list[Value]]:
        x = draws.normal()
        u = draws.uniform(open_low=True)  # the CPU's 1 - U: log(u) is finite
        y = e.add(one, e.mul(c, x))
        v = e.mul(e.mul(y, y), y)
        xx = e.mul(x, x)
        squeeze = e.cmp(u, e.sub(one, e.mul(e.c(0.0331), e.mul(xx, xx))), "LT")
        log_v = e.un("log", v)
        exact = e.cmp(e.un("log", u), e.add(e.mul(e.c(0.5), xx), e.mul(d, e.add(e.sub(one, v), log_v))), "LT")
        return e.both(e.cmp(y, 0.0, "GT"), e.either(squeeze, exact)), e.mul(d, v), [d, c]

    never = e.not_(e.cmp(d, 0.0, "GT"))  # NaN or a negative alpha: no trip can accept
    sample = _accept_loop(L, e, never, e.c(math.nan), [d, c], trip)
    return e.mul(scale, sample)


@register(aten._standard_gamma.default, random=True)
def standard_gamma(L: NodeLowering, alpha: Value, generator: Any = None) -> Value:
    out = L.out[0]
    (a,) = L.promote(alpha, dtype=_float_dtype(out.dtype))
    e = Expr(L, a.shape, a.dtype)
    return L.to(_at_least_tiny(e, gamma_samples(L, a), out.dtype), out.dtype)


@register_meta(aten._sample_dirichlet.default)
def sample_dirichlet_meta(alpha: torch.Tensor, generator: Any = None) -> torch.Tensor:
    """PyTorch has no Meta kernel for it: the samples are alpha's shape and dtype."""
    return torch.empty_like(alpha)


@register(aten._sample_dirichlet.default, random=True)
def sample_dirichlet(L: NodeLowering, alpha: Value, generator: Any = None) -> Value:
    """Gamma samples normalized along the last dim, as the CPU computes them: a sample
    that is zero (or NaN) counts as the tiniest positive number, so it stays at the
    dtype's smallest normal number, and a row of nothing but those is split equally.
    Samples are float32 for float32 (CUDA's accumulation type; the CPU's is float64), so
    concentrations below about 0.01 underflow to zero sooner than on the CPU, where such a
    row comes out nearly one-hot and here more often split equally."""
    out = L.out[0]
    (a,) = L.promote(alpha, dtype=_float_dtype(out.dtype))
    e = Expr(L, a.shape, a.dtype)
    g = gamma_samples(L, a)
    g = e.sel(e.cmp(g, 0.0, "GT"), g, e.c(0.0))
    last = a.rank - 1
    total = L.broadcast_to(sum_keep(L, g, [last], a.dtype), a.shape)
    parts = e.sel(e.cmp(total, 0.0, "GT"), e.div(g, total), e.c(1.0 / max(a.shape[last], 1)))
    return L.to(_at_least_tiny(e, parts, out.dtype), out.dtype)


@register(aten.poisson.default, random=True)
def poisson(L: NodeLowering, rates: Value, generator: Any = None) -> Value:
    out = L.out[0]
    (lam,) = L.promote(rates, dtype=_float_dtype(out.dtype))
    e = Expr(L, lam.shape, lam.dtype)
    L.check(e.not_(e.cmp(lam, 0.0, "GE")), "invalid Poisson rate, expected rate to be non-negative")
    one = e.c(1.0)
    knuth = e.cmp(lam, 10.0, "LT")
    # Hormann's PTRS constants (used where rate >= 10)
    slam = e.un("sqrt", lam)
    log_lam = e.un("log", lam)
    pb = e.add(e.c(0.931), e.mul(e.c(2.53), slam))
    pa = e.add(e.c(-0.059), e.mul(e.c(0.02483), pb))
    log_inv_alpha = e.un("log", e.add(e.c(1.1239), e.div(e.c(1.1328), e.sub(pb, e.c(3.4)))))
    vr = e.sub(e.c(0.9277), e.div(e.c(3.6224), e.sub(pb, e.c(2.0))))
    exp_neg_lam = e.un("exponential", e.neg(lam))

    def trip(draws: _Draws, count: Value, product: Value) -> tuple[Value, Value, list[Value]]:
        u, v = draws.uniform(), draws.uniform()
        # Knuth: multiply uniforms until the product falls to exp(-rate); the count is the sample
        product = e.mul(product, u)
        knuth_stops = e.both(knuth, e.not_(e.cmp(product, exp_neg_lam, "GT")))
        # PTRS: a candidate k from the transformed uniform, accepted by a squeeze or the exact test
        uc = e.sub(u, e.c(0.5))
        us = e.sub(e.c(0.5), e.abs(uc))
        k = e.un("floor", e.add(e.mul(e.add(e.div(e.mul(e.c(2.0), pa), us), pb), uc), e.add(lam, e.c(0.43))))
        squeeze = e.both(e.cmp(us, 0.07, "GE"), e.cmp(v, vr, "LE"))
        rejected = e.either(e.cmp(k, 0.0, "LT"), e.both(e.cmp(us, 0.013, "LT"), e.cmp(v, us, "GT")))
        lhs = e.sub(e.add(e.un("log", v), log_inv_alpha), e.un("log", e.add(e.div(pa, e.mul(us, us)), pb)))
        rhs = e.sub(e.add(e.neg(lam), e.mul(k, log_lam)), L.b.chlo("lgamma", e.add(k, one)))
        ptrs_accepts = e.both(e.not_(knuth), e.either(squeeze, e.both(e.not_(rejected), e.cmp(lhs, rhs, "LE"))))
        value = e.sel(knuth, count, k)
        return e.either(knuth_stops, ptrs_accepts), value, [e.add(count, one), product]

    zero_or_bad = e.not_(e.cmp(lam, 0.0, "GT"))  # rate 0 is 0; negative and NaN raised above
    sample = _accept_loop(L, e, zero_or_bad, e.c(0.0), [e.c(0.0), one], trip)
    return L.to(sample, out.dtype)


# Stirling's series tail log(k!) - [(k + 1/2) log(k + 1) - (k + 1) + log(2 pi)/2] for k <= 9
_STIRLING_TAIL = (
    0.0810614667953272, 0.0413406959554092, 0.0276779256849983, 0.02079067210376509, 0.0166446911898211,
    0.0138761288230707, 0.0118967099458917, 0.0104112652619720, 0.00925546218271273, 0.00833056343336287,
)  # fmt: skip


def _stirling_tail(e: Expr, k: Value) -> Value:
    """The CPU's stirling_approx_tail: the table up to 9, the series above."""
    kp1 = e.add(k, e.c(1.0))
    kp1sq = e.mul(kp1, kp1)
    series = e.div(e.sub(e.c(1.0 / 12), e.div(e.sub(e.c(1.0 / 360), e.div(e.c(1.0 / 1260), kp1sq)), kp1sq)), kp1)
    out = series
    for i, v in reversed(list(enumerate(_STIRLING_TAIL))):
        out = e.sel(e.cmp(k, float(i), "EQ"), e.c(v), out)
    return out


@register_meta(aten.binomial.default)
def binomial_meta(count: torch.Tensor, prob: torch.Tensor, generator: Any = None) -> torch.Tensor:
    """PyTorch has no Meta kernel for it: the samples are count's shape and dtype."""
    return torch.empty_like(count)


@register(aten.binomial.default, random=True)
def binomial(L: NodeLowering, count: Value, prob: Value, generator: Any = None) -> Value:
    """Binomial(count, prob) as the CPU samples it (sample_binomial): with p the smaller of
    prob and 1 - prob, inversion (counting geometric waiting times) when count * p < 10,
    Hormann's BTRS above; a prob above 1/2 samples count - Binomial(count, 1 - prob).
    count <= 0 or prob <= 0 give 0, prob >= 1 gives count, a NaN prob gives NaN."""
    if not count.dtype.is_floating_point:
        raise ValueError(f"binomial only supports floating-point dtypes for count, got: {count.dtype}")
    out = L.out[0]
    n, prob = L.promote(count, prob, dtype=_float_dtype(out.dtype))
    e = Expr(L, n.shape, n.dtype)
    one, half = e.c(1.0), e.c(0.5)
    flip = e.cmp(prob, 0.5, "GT")
    p = e.sel(flip, e.sub(one, prob), prob)
    inversion = e.cmp(e.mul(n, p), 10.0, "LT")
    log_q = e.un("log_plus_one", e.neg(p))
    # BTRS constants (where count * p >= 10)
    q = e.sub(one, p)
    stddev = e.un("sqrt", e.mul(e.mul(n, p), q))
    b = e.add(e.c(1.15), e.mul(e.c(2.53), stddev))
    a = e.add(e.add(e.c(-0.0873), e.mul(e.c(0.0248), b)), e.mul(e.c(0.01), p))
    c = e.add(e.mul(n, p), half)
    v_r = e.sub(e.c(0.92), e.div(e.c(4.2), b))
    r = e.div(p, q)
    alpha = e.mul(e.add(e.c(2.83), e.div(e.c(5.1), b)), stddev)
    m = e.un("floor", e.mul(e.add(n, one), p))
    log_of = lambda x: e.un("log", x)  # noqa: E731
    nm1 = e.add(e.sub(n, m), one)
    # the k-independent part of BTRS's bound (each log keeps its ratio: float32 cannot
    # afford the difference of two large logs)
    bound_m = e.add(
        e.mul(e.add(m, half), log_of(e.div(e.add(m, one), e.mul(r, nm1)))),
        e.add(_stirling_tail(e, m), _stirling_tail(e, e.sub(n, m))),
    )

    def trip(draws: _Draws, successes: Value, waited: Value) -> tuple[Value, Value, list[Value]]:
        u, v = draws.uniform(open_low=True), draws.uniform()
        # inversion: add geometric waiting times until they pass count; the sample is how many fit
        waited = e.add(waited, e.un("ceil", e.div(log_of(u), log_q)))
        inverted = e.both(inversion, e.cmp(waited, n, "GT"))
        # BTRS: a candidate k from the transformed uniform, accepted by the box or the exact bound
        uc = e.sub(u, half)
        us = e.sub(half, e.abs(uc))
        k = e.un("floor", e.add(e.mul(e.add(e.div(e.mul(e.c(2.0), a), us), b), uc), c))
        sensible = e.both(e.cmp(k, 0.0, "GE"), e.cmp(k, n, "LE"))
        box = e.both(e.cmp(us, 0.07, "GE"), e.cmp(v, v_r, "LE"))
        lhs = log_of(e.div(e.mul(v, alpha), e.add(e.div(a, e.mul(us, us)), b)))
        nk1 = e.add(e.sub(n, k), one)
        rhs = e.sub(
            e.add(
                e.add(bound_m, e.mul(e.add(n, one), log_of(e.div(nm1, nk1)))),
                e.mul(e.add(k, half), log_of(e.div(e.mul(r, nk1), e.add(k, one)))),
            ),
            e.add(_stirling_tail(e, k), _stirling_tail(e, e.sub(n, k))),
        )
        btrs_accepts = e.both(e.not_(inversion), e.both(sensible, e.either(box, e.cmp(lhs, rhs, "LE"))))
        value = e.sel(inversion, successes, k)
        return e.either(inverted, btrs_accepts), value, [e.add(successes, e.sel(inverted, e.c(0.0), one)), waited]

    nan_prob = e.cmp(prob, prob, "NE")
    trivial = e.either(e.not_(e.cmp(n, 0.0, "GT")), e.either(e.not_(e.cmp(p, 0.0, "GT")), nan_prob))
    drawn = _accept_loop(L, e, trivial, e.c(0.0), [e.c(0.0), e.c(0.0)], trip)
    drawn = e.sel(flip, e.sub(n, drawn), drawn)
    edge = e.sel(e.cmp(prob, 1.0, "GE"), n, e.c(0.0))  # count <= 0 or prob <= 0: 0; prob >= 1: count
    sample = e.sel(trivial, e.sel(e.cmp(n, 0.0, "GT"), edge, e.c(0.0)), drawn)
    sample = e.sel(e.both(nan_prob, e.cmp(n, 0.0, "GT")), prob, sample)
    return L.to(sample, out.dtype)


@register_meta(aten._standard_gamma_grad.default)
def standard_gamma_grad_meta(alpha: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """PyTorch has no Meta kernel for it: an elementwise op in alpha's dtype."""
    return alpha.new_empty(torch.broadcast_shapes(alpha.shape, x.shape))


@register(aten._standard_gamma_grad.default)
def standard_gamma_grad(L: NodeLowering, alpha: Value, x: Value) -> Value:
    """d sample / d alpha of a Gamma(alpha, 1) sample x: -(d cdf / d alpha) / pdf, from a
    Taylor series for x < 0.8, Rice's saddle-point expansion for alpha > 8, and a
    bivariate rational fit elsewhere (PyTorch's three regimes)."""
    out = L.out[0]
    # in float64 where the platform has it, as the CPU computes it for every dtype: the
    # saddle-point terms cancel (float32 was 8e-5 off at alpha 9)
    work = torch.float64 if L.ctx.supports_f64 else _float_dtype(out.dtype)
    a, x = L.promote(alpha, x, dtype=work)
    e = Expr(L, a.shape, a.dtype)
    taylor = _gamma_grad_small_x(L, e, a, x)
    saddle = _gamma_grad_large_alpha(e, a, x)
    rational = _gamma_grad_rational(e, a, x)
    grad = e.sel(e.cmp(x, 0.8, "LT"), taylor, e.sel(e.cmp(a, 8.0, "GT"), saddle, rational))
    return L.to(grad, out.dtype)


def _gamma_grad_small_x(L: NodeLowering, e: Expr, a: Value, x: Value) -> Value:
    one = e.c(1.0)
    numer, denom = one, a
    series1 = e.div(numer, denom)
    series2 = e.div(numer, e.mul(denom, denom))
    for i in range(1, 6):
        numer = e.mul(numer, e.div(e.neg(x), e.c(float(i))))
        denom = e.add(denom, one)
        series1 = e.add(series1, e.div(numer, denom))
        series2 = e.add(series2, e.div(numer, e.mul(denom, denom)))
    pow_x_a = L.b.binary("power", x, a)
    pdf = e.mul(L.b.binary("power", x, e.sub(a, one)), e.un("exponential", e.neg(x)))
    cdf = e.mul(pow_x_a, series1)
    digamma_a = L.b.chlo("digamma", a)
    cdf_a = e.sub(e.mul(e.sub(e.un("log", x), digamma_a), cdf), e.mul(pow_x_a, series2))
    result = e.div(e.neg(cdf_a), pdf)
    return e.sel(e.cmp(result, result, "NE"), e.c(0.0), result)  # NaN is 0, as on the CPU


def _gamma_grad_large_alpha(e: Expr, a: Value, x: Value) -> Value:
    one, aa = e.c(1.0), e.mul(a, a)
    near = e.both(e.cmp(x, e.mul(e.c(0.9), a), "GE"), e.cmp(x, e.mul(e.c(1.1), a), "LE"))
    # x within 10% of alpha: a polynomial in x / alpha
    n1 = e.add(one, e.mul(e.mul(e.c(24.0), a), e.add(one, e.mul(e.c(12.0), a))))
    n2 = e.add(
        e.add(e.mul(e.c(1440.0), aa), e.mul(e.mul(e.c(6.0), x), e.sub(e.c(53.0), e.mul(e.c(120.0), x)))),
        e.sub(e.mul(a, e.add(e.c(107.0), e.mul(e.c(3600.0), x))), e.div(e.mul(e.c(65.0), e.mul(x, x)), a)),
    )
    polynomial = e.div(e.mul(n1, n2), e.mul(e.c(1244160.0), e.mul(aa, aa)))
    # elsewhere: the saddle-point expansion
    denom = e.un("sqrt", e.mul(e.c(8.0), a))
    term2 = e.div(denom, e.sub(a, x))
    log_ratio = e.un("log", e.div(x, a))
    term3 = e.b.binary("power", e.sub(e.sub(x, a), e.mul(a, log_ratio)), e.c(-1.5))
    term23 = e.sel(e.cmp(x, a, "LT"), e.sub(term2, term3), e.add(term2, term3))
    a_minus_x = e.sub(a, x)
    term1 = e.sub(e.mul(log_ratio, term23), e.div(e.mul(e.un("sqrt", e.div(e.c(2.0), a)), e.add(a, x)), e.mul(a_minus_x, a_minus_x)))
    stirling = e.add(one, e.mul(e.div(one, e.mul(e.c(12.0), a)), e.add(one, e.div(one, e.mul(e.c(24.0), a)))))
    saddle = e.neg(e.div(e.mul(stirling, e.mul(x, term1)), denom))
    return e.sel(near, polynomial, saddle)


# the rational fit's coefficients: p(u, v) / q(u, v), each a cubic in v whose coefficients
# are quadratics in u (rows: the constant, linear and quadratic terms in u)
# fmt: off
_RATIONAL = (
    (0.16009398, -0.094634809, 0.025146376, -0.0030648343, 1, 0.32668115, 0.10406089, 0.0014179084),
    (0.53487893, 0.1298071, 0.065735949, -0.0015649758, 0.16639465, 0.020070113, -0.0035938915, -0.00058392623),
    (0.040121004, -0.0065914022, -0.0026286047, -0.0013441777, 0.017050642, -0.0021309326, 0.00085092367, -1.5247877e-07),
)
# fmt: on


def _gamma_grad_rational(e: Expr, a: Value, x: Value) -> Value:
    u, v = e.un("log", e.div(x, a)), e.un("log", a)
    k = [e.add(e.c(c0), e.mul(u, e.add(e.c(c1), e.mul(u, e.c(c2))))) for c0, c1, c2 in zip(*_RATIONAL)]

    def cubic(c: list[Value]) -> Value:
        return e.add(c[0], e.mul(v, e.add(c[1], e.mul(v, e.add(c[2], e.mul(v, c[3]))))))

    return e.un("exponential", e.div(cubic(k[:4]), cubic(k[4:])))


# -- the reparameterized gradient of a Dirichlet (so Beta) sample ---------------------------------
@register_meta(aten._dirichlet_grad.default)
def dirichlet_grad_meta(x: torch.Tensor, alpha: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    """PyTorch has no Meta kernel for it: an elementwise op in x's dtype."""
    return x.new_empty(torch.broadcast_shapes(x.shape, alpha.shape, total.shape))


@register(aten._dirichlet_grad.default)
def dirichlet_grad(L: NodeLowering, x: Value, alpha: Value, total: Value) -> Value:
    """d x / d alpha for a component x of a Dirichlet sample with concentration alpha and
    concentrations summing to total (a Beta(alpha, total - alpha) sample), scaled as
    torch.distributions' _Dirichlet backward expects: PyTorch's four regimes -- Taylor
    series in x near 0 and in 1 - x near 1, Rice's saddle-point expansion when both Beta
    parameters exceed 6, a rational correction to an analytic approximation elsewhere.
    The regime is chosen in x's dtype, as the CPU chooses it; the formulas run in float64
    where the platform has it (the CPU's accumulation type for its two expansions)."""
    out = L.out[0]
    xs, a_s, ts = L.promote(x, alpha, total, dtype=out.dtype)
    s = Expr(L, out.shape, out.dtype)
    boundary = s.mul(s.mul(ts, xs), s.sub(s.c(1.0), xs))
    near_zero = s.both(s.cmp(xs, 0.5, "LE"), s.cmp(boundary, 2.5, "LT"))
    near_one = s.both(s.cmp(xs, 0.5, "GE"), s.cmp(boundary, 0.75, "LT"))
    both_large = s.both(s.cmp(a_s, 6.0, "GT"), s.cmp(s.sub(ts, a_s), 6.0, "GT"))
    work = torch.float64 if L.ctx.supports_f64 else _float_dtype(out.dtype)
    xw, aw, tw = (L.to(v, work) for v in (xs, a_s, ts))
    e = Expr(L, out.shape, work)
    beta = e.sub(tw, aw)
    grad = e.sel(
        near_zero,
        _beta_grad_alpha_small_x(L, e, xw, aw, beta),
        e.sel(
            near_one,
            e.neg(_beta_grad_beta_small_x(L, e, e.sub(e.c(1.0), xw), beta, aw)),
            e.sel(both_large, _beta_grad_saddle(e, xw, aw, beta), _beta_grad_rational(L, e, xw, aw, tw, beta)),
        ),
    )
    return L.to(grad, out.dtype)


def _zero_if_nan(e: Expr, v: Value) -> Value:
    return e.sel(e.cmp(v, v, "NE"), e.c(0.0), v)


def _beta_grad_alpha_small_x(L: NodeLowering, e: Expr, x: Value, a: Value, beta: Value) -> Value:
    """Beta(a, beta)'s gradient in a for x near 0: a Taylor series in x (11 terms)."""
    one = e.c(1.0)
    factor = e.sub(e.sub(L.b.chlo("digamma", a), L.b.chlo("digamma", e.add(a, beta))), e.un("log", x))
    numer = one
    series = e.mul(e.div(one, a), e.add(factor, e.div(one, a)))
    for i in range(1, 11):
        numer = e.mul(numer, e.div(e.mul(e.sub(e.c(float(i)), beta), x), e.c(float(i))))
        denom = e.add(a, e.c(float(i)))
        series = e.add(series, e.mul(e.div(numer, denom), e.add(factor, e.div(one, denom))))
    return _zero_if_nan(e, e.mul(e.mul(x, L.b.binary("power", e.sub(one, x), e.neg(beta))), series))


def _beta_grad_beta_small_x(L: NodeLowering, e: Expr, x: Value, a: Value, beta: Value) -> Value:
    """Beta(a, beta)'s gradient in beta for x near 0: a Taylor series in x (9 terms)."""
    one = e.c(1.0)
    factor = e.sub(L.b.chlo("digamma", e.add(a, beta)), L.b.chlo("digamma", beta))
    numer, betas, dbetas = one, one, e.c(0.0)
    series = e.div(factor, a)
    for i in range(1, 9):
        c = e.c(float(i))
        numer = e.mul(numer, e.div(e.neg(x), c))
        dbetas = e.add(e.mul(dbetas, e.sub(beta, c)), betas)
        betas = e.mul(betas, e.sub(beta, c))
        series = e.add(series, e.mul(e.div(numer, e.add(a, c)), e.add(dbetas, e.mul(factor, betas))))
    return _zero_if_nan(e, e.neg(e.mul(L.b.binary("power", e.sub(one, x), e.sub(one, beta)), series)))


def _beta_grad_saddle(e: Expr, x: Value, a: Value, beta: Value) -> Value:
    """Beta(a, beta)'s gradient in a when both exceed 6: Rice's saddle-point expansion,
    with a polynomial within a tenth of a standard deviation of the mean (its singularity)."""
    one = e.c(1.0)
    c = e.c
    total = e.add(a, beta)
    mean = e.div(a, total)
    std = e.div(e.un("sqrt", e.div(e.mul(a, beta), e.add(total, one))), total)
    near_mean = e.both(e.cmp(e.sub(mean, e.mul(c(0.1), std)), x, "LE"), e.cmp(x, e.add(mean, e.mul(c(0.1), std)), "LE"))
    bb = e.mul(beta, beta)
    one_x = e.sub(one, x)
    # the polynomial, Horner in a
    inner = e.mul(e.mul(c(8.0), one_x), e.sub(e.mul(c(135.0), beta), c(11.0)))
    inner = e.add(e.mul(e.sub(e.add(c(453.0), e.mul(e.mul(c(1620.0), beta), one_x)), e.mul(c(455.0), x)), beta), e.mul(a, inner))
    inner = e.add(e.mul(e.mul(c(3.0), e.sub(e.add(c(59.0), e.mul(c(180.0), beta)), e.mul(c(90.0), x))), bb), e.mul(a, inner))
    inner = e.add(e.mul(e.mul(e.add(c(43.0), e.mul(e.mul(c(20.0), e.add(c(16.0), e.mul(c(27.0), beta))), x)), bb), beta), e.mul(a, inner))
    poly = e.add(e.mul(e.mul(c(47.0), x), e.mul(bb, bb)), e.mul(a, inner))
    pre_num = e.div(e.mul(e.add(one, e.mul(c(12.0), a)), e.add(one, e.mul(c(12.0), beta))), e.mul(total, total))
    pre_den = e.mul(e.mul(e.mul(c(12960.0), e.mul(e.mul(a, a), a)), bb), e.add(one, e.mul(c(12.0), total)))
    polynomial = e.div(e.mul(e.div(pre_num, one_x), poly), pre_den)
    # the expansion
    prefactor = e.div(e.neg(x), e.un("sqrt", e.div(e.mul(e.mul(c(2.0), a), beta), total)))

    def stirling_factor(v: Value) -> Value:
        return e.add(e.add(one, e.div(one, e.mul(c(12.0), v))), e.div(one, e.mul(c(288.0), e.mul(v, v))))

    stirling = e.div(e.mul(stirling_factor(a), stirling_factor(beta)), stirling_factor(total))
    x_1 = e.sub(x, one)
    term1_num = e.sub(e.add(e.mul(e.mul(c(2.0), e.mul(a, a)), x_1), e.mul(e.mul(a, beta), x_1)), e.mul(x, bb))
    axbx = e.add(e.mul(a, x_1), e.mul(beta, x))
    term1_den = e.mul(
        e.mul(e.un("sqrt", e.div(e.mul(c(2.0), a), beta)), e.b.binary("power", total, c(1.5))), e.mul(axbx, axbx)
    )
    term1 = e.div(term1_num, term1_den)
    term2 = e.mul(c(0.5), e.un("log", e.div(a, e.mul(total, x))))
    term3 = e.div(e.un("sqrt", e.div(e.mul(e.mul(c(8.0), a), beta), total)), axbx)
    term4_base = e.add(
        e.mul(beta, e.un("log", e.div(beta, e.mul(total, one_x)))), e.mul(a, e.un("log", e.div(a, e.mul(total, x))))
    )
    term4 = e.b.binary("power", term4_base, c(-1.5))
    term1234 = e.add(term1, e.mul(term2, e.add(term3, e.sel(e.cmp(x, mean, "LT"), term4, e.neg(term4)))))
    return e.sel(near_mean, polynomial, e.mul(e.mul(stirling, prefactor), term1234))


# the rational correction's coefficients: [p or q][power of u][power of a'][power of b'],
# with u = log x, a' = log alpha - u, b' = log total - a' (PyTorch's fit)
# fmt: off
_DIRICHLET_RATIONAL = (
    (((1.003668233, -0.01061107488, -0.0657888334, 0.01201642863),
      (0.6336835991, -0.3557432599, 0.05486251648, -0.001465281033),
      (-0.03276231906, 0.004474107445, 0.002429354597, -0.0001557569013)),
     ((0.221950385, -0.3187676331, 0.01799915743, 0.01074823814),
      (-0.2951249643, 0.06219954479, 0.01535556598, 0.001550077057),
      (0.02155310298, 0.004170831599, 0.001292462449, 6.976601077e-05)),
     ((-0.05980841433, 0.008441916499, 0.01085618172, 0.002319392565),
      (0.02911413504, 0.01400243777, -0.002721828457, 0.000751041181),
      (0.005900514878, -0.001936558688, -9.495446725e-06, 5.385558597e-05))),
    (((1.0, -0.02924021934, -0.04438342661, 0.007285809825),
      (0.6357567472, -0.3473456711, 0.05454656494, -0.002407477521),
      (-0.03301322327, 0.004845219414, 0.00231480583, -0.0002307248149)),
     ((0.5925320577, -0.1757678135, 0.01505928619, 0.000564515273),
      (0.1014815858, -0.06589186703, 0.01272886114, -0.0007316646956),
      (-0.007258481865, 0.001096195486, 0.0003934994223, -4.12701925e-05)),
     ((0.06469649321, -0.0236701437, 0.002902096474, -5.896963079e-05),
      (0.001925008108, -0.002869809258, 0.0008000589141, -6.063713228e-05),
      (-0.0003477407336, 6.959756487e-05, 1.097287507e-05, -1.650964693e-06))),
)
# fmt: on


def _beta_grad_rational(L: NodeLowering, e: Expr, x: Value, a: Value, total: Value, beta: Value) -> Value:
    """x (digamma(total) - digamma(a)) / beta, corrected by a rational fit p / q."""
    u = e.un("log", x)
    la = e.sub(e.un("log", a), u)
    lb = e.sub(e.un("log", total), la)
    pow_u, pow_a = (e.c(1.0), u, e.mul(u, u)), (e.c(1.0), la, e.mul(la, la))

    def fit(table: tuple) -> Value:
        acc = e.c(0.0)
        for i in range(3):
            for j in range(3):
                c0, c1, c2, c3 = (e.c(v) for v in table[i][j])
                cubic = e.add(c0, e.mul(lb, e.add(c1, e.mul(lb, e.add(c2, e.mul(lb, c3))))))
                acc = e.add(acc, e.mul(e.mul(pow_u[i], pow_a[j]), cubic))
        return acc

    approx = e.div(e.mul(x, e.sub(L.b.chlo("digamma", total), L.b.chlo("digamma", a))), beta)
    return e.mul(e.div(fit(_DIRICHLET_RATIONAL[0]), fit(_DIRICHLET_RATIONAL[1])), approx)
