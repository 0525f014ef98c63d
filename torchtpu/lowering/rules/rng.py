"""Random ops on the device: every draw is one ``stablehlo.rng_bit_generator`` (Philox).

The eager dispatcher passes ``[seed, counter]`` (u64[2], see eager/rng.py) as an operand
of every op registered ``random=True``; the counter moves on after each call. Philox's
128-bit counter increments once per 4 words drawn, so the state is widened here to
``[key=seed, counter_lo=0, counter_hi=counter]``: each call gets its own 2^64-block stream
and calls never overlap. Several draws in one program thread the returned state.

The values are reproducible under ``torch.manual_seed`` but are NOT the numbers PyTorch's
CPU generator (mt19937) or CUDA's (Philox with another layout) would give for the same seed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from ...errors import TpuError
from ...stablehlo.builder import Value, prod
from ...stablehlo.types import is_float, is_unsigned
from ..context import NodeLowering
from ..registry import register

aten = torch.ops.aten

# mantissa digits (incl. the implicit bit) PyTorch uses to draw a uniform float
_DIGITS = {torch.float64: 53, torch.float32: 24, torch.bfloat16: 8, torch.float16: 11}


# -- raw bits ----------------------------------------------------------------------------------
def _state(L: NodeLowering) -> Value:
    ctx = L.ctx
    src = ctx.rng_state
    if src is None:
        raise TpuError(f"torchtpu: random op {L.op} lowered without a device RNG state (register it random=True)")
    cached = getattr(ctx, "_philox_state", None)
    if cached is not None and cached[0] is src:
        return cached[1]
    b = L.b
    if src.shape == (2,):
        seed = b.slice(src, [0], [1])
        counter = b.slice(src, [1], [2])
        state = b.concatenate([seed, b.constant(0, torch.uint64, (1,)), counter], 0)
    else:
        state = src
    ctx._philox_state = (src, state)
    return state


def draw_bits(b: Any, state: Value, shape: Sequence[int], dtype: torch.dtype = torch.uint32) -> tuple[Value, Value]:
    """(the Philox state after, uniform random bits of ``shape``) drawn from ``state``: the
    pure form, for loops that carry the state themselves (see ``philox_state``)."""
    shape = tuple(int(d) for d in shape)
    new_state, out = b.op(
        "stablehlo.rng_bit_generator",
        [state],
        [(state.shape, torch.uint64), (shape, dtype)],
        "rng_algorithm = #stablehlo<rng_algorithm PHILOX>",
    )
    return new_state, out


def philox_state(L: NodeLowering) -> Value:
    """The program's current Philox state, for a sampler that draws inside a loop; it must
    hand the state the loop ends with to ``continue_from``."""
    return _state(L)


def continue_from(L: NodeLowering, state: Value) -> None:
    """Later draws of this program start from ``state``."""
    L.ctx._philox_state = (L.ctx.rng_state, state)


def bits(L: NodeLowering, shape: Sequence[int], dtype: torch.dtype = torch.uint32) -> Value:
    """Uniform random bits (``uint32`` or ``uint64``) of ``shape``."""
    new_state, out = draw_bits(L.b, _state(L), shape, dtype)
    continue_from(L, new_state)
    return out


def _float_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a random float of ``dtype`` is computed in."""
    return torch.float64 if dtype is torch.float64 else torch.float32


def bits_dtype(dtype: torch.dtype) -> torch.dtype:
    """The raw bits a uniform float of ``dtype`` is made from."""
    return torch.uint64 if _float_dtype(dtype) is torch.float64 else torch.uint32


def unit_floats(L: NodeLowering, raw: Value, dtype: torch.dtype, open_low: bool = False) -> Value:
    """Raw bits (``bits_dtype(dtype)``) as uniform floats in [0, 1) (or (0, 1] with
    ``open_low``) in ``_float_dtype(dtype)``, with as many random bits as ``dtype`` has
    mantissa digits."""
    cdt = _float_dtype(dtype)
    digits = _DIGITS.get(dtype, 24)
    width = 64 if cdt is torch.float64 else 32
    b = L.b
    raw = b.binary("shift_right_logical", raw, L.full(width - digits, raw.shape, raw.dtype))
    u = b.convert(raw, cdt)
    if open_low:
        u = b.binary("add", u, L.full(1, u.shape, cdt))
    return b.binary("multiply", u, L.full(2.0**-digits, u.shape, cdt))


def uniform01(L: NodeLowering, shape: Sequence[int], dtype: torch.dtype, open_low: bool = False) -> Value:
    """Uniform floats in [0, 1) (or (0, 1] with ``open_low``) in ``_float_dtype(dtype)``."""
    return unit_floats(L, bits(L, shape, bits_dtype(dtype)), dtype, open_low)


def _scalar(L: NodeLowering, x: Any, dtype: torch.dtype, shape: Sequence[int]) -> Value:
    if isinstance(x, Value):
        return L.broadcast_to(L.to(x, dtype), shape)
    return L.full(x, shape, dtype)


def _uniform(L: NodeLowering, shape: Sequence[int], dtype: torch.dtype, low: Any = 0.0, high: Any = 1.0) -> Value:
    u = uniform01(L, shape, dtype)
    cdt = u.dtype
    b = L.b
    static_unit = not isinstance(low, Value) and not isinstance(high, Value) and low == 0 and high == 1
    if static_unit:
        return L.to(u, dtype)
    lo, hi = _scalar(L, low, cdt, shape), _scalar(L, high, cdt, shape)
    v = b.binary("add", b.binary("multiply", u, b.binary("subtract", hi, lo)), lo)
    out = L.to(v, dtype)
    # rounding may reach the (excluded) upper bound: map it to the lower one, as CUDA does
    hi_d, lo_d = L.to(hi, dtype), L.to(lo, dtype)
    return b.select(b.compare(out, hi_d, "GE"), lo_d, out)


def box_muller(L: NodeLowering, u1: Value, u2: Value) -> Value:
    """Standard normal samples from uniforms ``u1`` in (0, 1] and ``u2`` in [0, 1)."""
    b = L.b
    shape, cdt = u1.shape, u1.dtype
    r = b.unary("sqrt", b.binary("multiply", L.full(-2.0, shape, cdt), b.unary("log", u1)))
    return b.binary("multiply", r, b.unary("cosine", b.binary("multiply", L.full(2 * math.pi, shape, cdt), u2)))


def normal01(L: NodeLowering, shape: Sequence[int], dtype: torch.dtype) -> Value:
    """Standard normal samples (Box-Muller) in ``_float_dtype(dtype)``."""
    n = prod(shape)
    u1 = uniform01(L, (n,), dtype, open_low=True)  # (0, 1]: log is finite
    u2 = uniform01(L, (n,), dtype)
    return L.b.reshape(box_muller(L, u1, u2), shape)


def _normal(L: NodeLowering, mean: Any, std: Any) -> Value:
    out = L.out[0]
    b = L.b
    z = normal01(L, out.shape, out.dtype)
    cdt = z.dtype
    z = b.binary("add", b.binary("multiply", z, _scalar(L, std, cdt, out.shape)), _scalar(L, mean, cdt, out.shape))
    return L.to(z, out.dtype)


# -- uniform / normal --------------------------------------------------------------------------
@register(aten.uniform.default, random=True)
def uniform(L: NodeLowering, x: Value, low: Any = 0.0, high: Any = 1.0, **kwargs: Any) -> Value:
    return _uniform(L, x.shape, x.dtype, low, high)


@register(aten.rand.default, aten.rand.generator, aten.rand_like.default, aten.rand_like.generator, random=True)
def rand(L: NodeLowering, *args: Any, **kwargs: Any) -> Value:
    out = L.out[0]
    return _uniform(L, out.shape, out.dtype)


@register(aten.normal_functional.default, random=True)
def normal_functional(L: NodeLowering, x: Value, mean: Any = 0.0, std: Any = 1.0, **kwargs: Any) -> Value:
    return _normal(L, mean, std)


@register(aten.randn.default, aten.randn.generator, aten.randn_like.default, aten.randn_like.generator, random=True)
def randn(L: NodeLowering, *args: Any, **kwargs: Any) -> Value:
    return _normal(L, 0.0, 1.0)


@register(aten.normal.Tensor_float, aten.normal.float_Tensor, aten.normal.Tensor_Tensor, random=True)
def normal(L: NodeLowering, mean: Any, std: Any = 1.0, **kwargs: Any) -> Value:
    return _normal(L, mean, std)


@register(aten.normal.float_float, random=True)
def normal_float_float(L: NodeLowering, mean: Any, std: Any, size: Any, **kwargs: Any) -> Value:
    return _normal(L, mean, std)


@register(aten.log_normal.default, random=True)
def log_normal(L: NodeLowering, x: Value, mean: Any = 1.0, std: Any = 2.0, **kwargs: Any) -> Value:
    out = L.out[0]
    z = normal01(L, out.shape, out.dtype)
    cdt = z.dtype
    b = L.b
    z = b.binary("add", b.binary("multiply", z, _scalar(L, std, cdt, out.shape)), _scalar(L, mean, cdt, out.shape))
    return L.to(b.unary("exponential", z), out.dtype)


@register(aten.exponential.default, random=True)
def exponential(L: NodeLowering, x: Value, lambd: Any = 1.0, **kwargs: Any) -> Value:
    b = L.b
    u = uniform01(L, x.shape, x.dtype)  # [0, 1): log1p(-u) is finite
    cdt = u.dtype
    e = b.binary("divide", b.unary("negate", b.unary("log_plus_one", b.unary("negate", u))), _scalar(L, lambd, cdt, x.shape))
    return L.to(e, x.dtype)


@register(aten.cauchy.default, random=True)
def cauchy(L: NodeLowering, x: Value, median: Any = 0.0, sigma: Any = 1.0, **kwargs: Any) -> Value:
    b = L.b
    u = uniform01(L, x.shape, x.dtype)
    cdt = u.dtype
    t = b.unary("tan", b.binary("multiply", L.full(math.pi, x.shape, cdt), b.binary("subtract", u, L.full(0.5, x.shape, cdt))))
    return L.to(
        b.binary("add", _scalar(L, median, cdt, x.shape), b.binary("multiply", _scalar(L, sigma, cdt, x.shape), t)), x.dtype
    )


@register(aten.geometric.default, random=True)
def geometric(L: NodeLowering, x: Value, p: Any, **kwargs: Any) -> Value:
    b = L.b
    u = uniform01(L, x.shape, x.dtype, open_low=True)
    cdt = u.dtype
    q = b.unary("log_plus_one", b.unary("negate", _scalar(L, p, cdt, x.shape)))
    return L.to(b.unary("ceil", b.binary("divide", b.unary("log", u), q)), x.dtype)


# -- bernoulli / dropout -----------------------------------------------------------------------
def _bernoulli_mask(L: NodeLowering, shape: Sequence[int], p: Any, dtype: torch.dtype) -> Value:
    """bool mask, True with probability ``p`` (a number or a Value broadcastable to shape)."""
    u = uniform01(L, shape, dtype if is_float(dtype) else torch.float32)
    return L.b.compare(u, _scalar(L, p, u.dtype, shape), "LT")


@register(aten.bernoulli.p, random=True)
def bernoulli_p(L: NodeLowering, x: Value, p: Any = 0.5, **kwargs: Any) -> Value:
    out = L.out[0]
    return L.to(_bernoulli_mask(L, out.shape, p, out.dtype), out.dtype)


@register(aten.bernoulli.default, random=True)
def bernoulli(L: NodeLowering, x: Value, **kwargs: Any) -> Value:
    out = L.out[0]
    return L.to(_bernoulli_mask(L, out.shape, x, x.dtype), out.dtype)


@register(aten.bernoulli.Tensor, random=True)
def bernoulli_tensor(L: NodeLowering, x: Value, p: Value, **kwargs: Any) -> Value:
    out = L.out[0]
    return L.to(_bernoulli_mask(L, out.shape, p, p.dtype), out.dtype)


@register(aten.rrelu_with_noise_functional.default, random=True)
def rrelu_with_noise(
    L: NodeLowering,
    x: Value,
    noise: Value,
    lower: Any = 0.125,
    upper: Any = 1 / 3,
    training: bool = False,
    generator: Any = None,
) -> tuple[Value, Value]:
    """RReLU: in training each negative element takes a slope drawn from U(lower, upper),
    recorded in ``noise`` (1 where the element is not negative, as the CPU writes it, so
    the backward is grad * noise); in eval the mean slope and ``noise`` untouched."""
    b = L.b
    cdt = _float_dtype(x.dtype)
    xc = L.to(x, cdt)
    negative = b.compare(xc, L.full(0, x.shape, cdt), "LT")
    if training:
        slope = _uniform(L, x.shape, cdt, lower, upper)
        noise_out = L.to(b.select(negative, slope, L.full(1, x.shape, cdt)), noise.dtype)
    else:
        slope = b.binary("divide", b.binary("add", _scalar(L, lower, cdt, x.shape), _scalar(L, upper, cdt, x.shape)), L.full(2, x.shape, cdt))
        noise_out = noise
    out = b.select(negative, b.binary("multiply", xc, slope), xc)
    return L.to(out, x.dtype), noise_out


def _is(x: Any, v: float) -> bool:
    return not isinstance(x, Value) and x == v


@register(aten.native_dropout.default, random=True)
def native_dropout(L: NodeLowering, x: Value, p: Any, train: bool | None) -> tuple[Value, Value]:
    b = L.b
    if train is False or _is(p, 0):
        return x, L.full(True, x.shape, torch.bool)
    if _is(p, 1):
        return L.zeros(x.shape, x.dtype), L.full(False, x.shape, torch.bool)
    u = uniform01(L, x.shape, x.dtype)
    cdt = u.dtype
    pv = _scalar(L, p, cdt, x.shape)
    keep = b.compare(u, pv, "GE")  # P(keep) = 1 - p
    scale = b.binary("divide", L.full(1, x.shape, cdt), b.binary("subtract", L.full(1, x.shape, cdt), pv))
    y = b.binary("multiply", L.to(x, cdt), scale)
    y = b.select(keep, y, L.zeros(x.shape, cdt))
    return L.to(y, x.dtype), keep


@register(aten.native_dropout_backward.default)
def native_dropout_backward(L: NodeLowering, grad: Value, mask: Value, scale: Any) -> Value:
    """grad * mask * scale; a bool mask selects (so an infinite gradient where the mask
    drops it is 0), any other mask multiplies, as the CPU kernel does."""
    out = L.out[0]
    b = L.b
    cdt = _float_dtype(out.dtype)
    g = b.binary("multiply", L.broadcast_to(L.to(grad, cdt), out.shape), _scalar(L, scale, cdt, out.shape))
    if mask.dtype is not torch.bool:
        return L.to(b.binary("multiply", L.broadcast_to(L.to(mask, cdt), out.shape), g), out.dtype)
    mask = L.broadcast_to(mask, out.shape)
    return L.to(b.select(mask, g, L.zeros(out.shape, cdt)), out.dtype)


# -- integers ----------------------------------------------------------------------------------
def _int_range(L: NodeLowering, shape: Sequence[int], low: int, span: int, dtype: torch.dtype) -> Value:
    """Uniform integers in [low, low + span) as ``dtype`` (span <= 2**64)."""
    b = L.b
    raw = bits(L, shape, torch.uint64)
    if span < 2**64:
        raw = b.binary("remainder", raw, L.full(span, raw.shape, torch.uint64))
    if low >= 0 and low + span <= 2**64 and is_unsigned(dtype):
        v = raw if low == 0 else b.binary("add", raw, L.full(low, raw.shape, torch.uint64))
        return L.to(v, dtype)
    v = b.bitcast_convert(raw, raw.shape, torch.int64)  # wraps: low + raw mod 2^64
    if low:
        v = b.binary("add", v, L.full(_wrap64(low), raw.shape, torch.int64))
    return L.to(v, dtype)


def _wrap64(x: int) -> int:
    x &= 2**64 - 1
    return x - 2**64 if x >= 2**63 else x


def _dtype_max(dtype: torch.dtype) -> int:
    if dtype is torch.bool:
        return 1
    if is_float(dtype):
        return 2 ** _DIGITS[dtype]
    return int(torch.iinfo(dtype).max)


def _random_from_to(L: NodeLowering, low: int, high: int | None) -> Value:
    """Integers in [low, high) (high None: [low, max of dtype]), PyTorch's random_ semantics."""
    out = L.out[0]
    if high is None:
        high = _dtype_max(out.dtype) + 1
    span = int(high) - int(low)
    if span <= 0:
        raise ValueError(f"random_ expects 'from' to be less than 'to', but got from={low} >= to={high}")
    return _int_range(L, out.shape, int(low), span, out.dtype)


@register(aten.random.default, random=True)
def random_(L: NodeLowering, x: Value, **kwargs: Any) -> Value:
    return _random_from_to(L, 0, None)


@register(aten.random.to, random=True)
def random_to(L: NodeLowering, x: Value, to: int, **kwargs: Any) -> Value:
    return _random_from_to(L, 0, to)


@register(getattr(aten.random, "from"), random=True)  # "from" is a Python keyword
def random_from(L: NodeLowering, x: Value, low: int, high: int | None = None, **kwargs: Any) -> Value:
    return _random_from_to(L, low, high)


@register(aten.randint.default, aten.randint.generator, random=True)
def randint(L: NodeLowering, high: int, size: Any, **kwargs: Any) -> Value:
    return _random_from_to(L, 0, high)


@register(aten.randint.low, aten.randint.low_generator, random=True)
def randint_low(L: NodeLowering, low: int, high: int, size: Any, **kwargs: Any) -> Value:
    return _random_from_to(L, low, high)


@register(aten.randint_like.default, aten.randint_like.generator, random=True)
def randint_like(L: NodeLowering, x: Value, high: int, **kwargs: Any) -> Value:
    return _random_from_to(L, 0, high)


@register(aten.randint_like.low_dtype, aten.randint_like.low_generator_dtype, random=True)
def randint_like_low(L: NodeLowering, x: Value, low: int, high: int, **kwargs: Any) -> Value:
    return _random_from_to(L, low, high)


@register(aten.randperm.default, aten.randperm.generator, random=True)
def randperm(L: NodeLowering, n: int, **kwargs: Any) -> Value:
    out = L.out[0]
    n = int(n)
    if n == 0:
        return L.zeros((0,), out.dtype)
    b = L.b
    keys = bits(L, (n,), torch.uint64)
    idx = b.iota((n,), 0, torch.int64)
    _, perm = b.sort([keys, idx], 0, lambda ka, kb, ia, ib: [b.compare(ka, kb, "LT")])
    return L.to(perm, out.dtype)


# -- multinomial -------------------------------------------------------------------------------
def _gumbel_keys(L: NodeLowering, logp: Value) -> Value:
    """log(p) + Gumbel noise, in logp's dtype."""
    b = L.b
    u = uniform01(L, logp.shape, logp.dtype, open_low=True)  # (0, 1]
    u = L.to(u, logp.dtype)
    # -log(-log(u)); u == 1 gives +inf, harmless for an argmax of finite-or-(-inf) keys
    g = b.unary("negate", b.unary("log", b.unary("negate", b.unary("log", u))))
    return b.binary("add", logp, g)


_BAD_PROBS = "probability tensor contains either `inf`, `nan` or element < 0"
_ZERO_SUM = "invalid multinomial distribution (sum of probabilities <= 0)"
_ROW_ERRORS = (  # the CPU's with-replacement kernel, by the kind of the row's first bad entry
    "invalid multinomial distribution (encountering probability entry < 0)",
    "invalid multinomial distribution (encountering probability entry = infinity or NaN)",
    _ZERO_SUM,
)


def _first_along_last(L: NodeLowering, bad: Value, v: Value) -> Value:
    """``v`` at the first true element of ``bad`` along the last dim (0 where none is)."""
    b = L.b
    k = bad.shape[-1]
    pos = b.iota(bad.shape, bad.rank - 1, torch.int64)
    (first,) = b.reduce(
        [b.select(bad, pos, L.full(k, bad.shape, torch.int64))],
        [b.constant(k, torch.int64)],
        [bad.rank - 1],
        lambda acc, x: [b.binary("minimum", acc, x)],
    )
    hit = b.compare(pos, b.broadcast_in_dim(first, bad.shape, list(range(bad.rank - 1))), "EQ")
    (picked,) = b.reduce(
        [b.select(hit, v, L.zeros(v.shape, v.dtype))],
        [b.constant(0, v.dtype)],
        [bad.rank - 1],
        lambda acc, x: [b.binary("add", acc, x)],
    )
    return picked


def _check_probs(L: NodeLowering, p: Value, replacement: bool, n: int) -> None:
    """The CPU's checks of the probabilities (XLA would sample from anything). One draw,
    or none replaced, checks the whole tensor first; several draws with replacement check
    row by row, naming the first bad entry's kind (NaN fails "entry >= 0")."""
    b = L.b
    i64 = torch.int64
    zero = L.zeros(p.shape, p.dtype)
    not_nonneg = b.unary("not", b.compare(p, zero, "GE"))
    inf = b.compare(p, L.full(float("inf"), p.shape, p.dtype), "EQ")
    (any_nonzero,) = b.reduce(
        [b.compare(p, zero, "NE")], [b.constant(False, torch.bool)], [p.rank - 1], lambda acc, x: [b.binary("or", acc, x)]
    )
    all_zero = b.unary("not", any_nonzero)
    if not replacement or n == 1:
        L.check(b.binary("or", not_nonneg, inf), _BAD_PROBS)
        L.check(all_zero, _ZERO_SUM)
        return
    kind = b.select(not_nonneg, L.full(1, p.shape, i64), L.full(2, p.shape, i64))
    entry = _first_along_last(L, b.binary("or", not_nonneg, inf), kind)  # 0: the row's entries are fine
    none = L.zeros(entry.shape, i64)
    row = b.select(b.compare(entry, none, "NE"), entry, b.select(all_zero, L.full(3, entry.shape, i64), none))
    flat = b.reshape(row, (math.prod(row.shape),))
    code = _first_along_last(L, b.compare(flat, L.zeros(flat.shape, i64), "NE"), flat)
    for c, message in enumerate(_ROW_ERRORS, 1):
        L.check(b.compare(code, L.full(c, (), i64), "EQ"), message)


@register(aten.multinomial.default, random=True)
def multinomial(L: NodeLowering, probs: Value, num_samples: int, replacement: bool = False, **kwargs: Any) -> Value:
    out = L.out[0]
    b = L.b
    cdt = _float_dtype(probs.dtype)
    p = L.to(probs, cdt)
    batch = p.shape[:-1]
    k = p.shape[-1]
    n = int(num_samples)
    _check_probs(L, p, replacement, n)
    logp = b.unary("log", p)  # zero weight -> -inf: never drawn
    if not replacement:
        keys = _gumbel_keys(L, logp)
        idx = b.iota(keys.shape, keys.rank - 1, torch.int64)
        _, order = b.sort([keys, idx], keys.rank - 1, lambda ka, kb, ia, ib: [b.compare(ka, kb, "GT")])
        start = [0] * order.rank
        limit = list(order.shape)
        limit[-1] = n
        return L.to(b.slice(order, start, limit), out.dtype)
    # with replacement: an independent Gumbel-max draw per sample
    shape = (*batch, n, k)
    logp_b = b.broadcast_in_dim(logp, shape, [*range(len(batch)), len(batch) + 1])
    keys = _gumbel_keys(L, logp_b)
    idx = b.iota(shape, len(shape) - 1, torch.int64)
    neg_inf = b.constant(float("-inf"), cdt)
    zero = b.constant(0, torch.int64)

    def body(av: Value, ai: Value, xv: Value, xi: Value) -> list[Value]:
        take_x = b.binary("or", b.compare(xv, av, "GT"), b.binary("and", b.compare(xv, av, "EQ"), b.compare(xi, ai, "LT")))
        return [b.select(take_x, xv, av), b.select(take_x, xi, ai)]

    _, arg = b.reduce([keys, idx], [neg_inf, zero], [len(shape) - 1], body)
    return L.to(arg, out.dtype)
