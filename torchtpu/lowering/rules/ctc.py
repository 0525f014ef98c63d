"""CTC loss (``aten::_ctc_loss`` and ``aten::_ctc_loss_backward``), like the CPU kernel
(``aten/src/ATen/native/LossCTC.cpp``): the alpha recursion over time is one
``stablehlo.while`` loop, vectorised over the batch and the extended label positions
(blank, l1, blank, l2, ..., blank); the backward runs the beta recursion the same way and
sums alpha*beta per class with two scatters (max, then sum of exponentials).

The lengths arrive as device operands (the ``.Tensor`` overloads), so varying lengths never
recompile; the ``int[]`` overloads are kernels that copy the lists to the device and call
the ``.Tensor`` ones. The label width N is static: ``targets.shape[1]`` for padded 2-D
targets, ``targets.numel()`` (an upper bound on any one target's length) for concatenated
1-D targets, and ``log_alpha`` is (B, T, 2N+1) — wider than the CPU's 2*max(target_lengths)+1
when the targets are longer than the longest length; only our backward reads it. Rows of
``log_alpha`` at or beyond an input's length are unspecified (the CPU leaves them
uninitialised).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ...stablehlo.builder import Value
from ..context import NodeLowering
from ..registry import register

aten = torch.ops.aten
I64 = torch.int64
NEG_INF = -math.inf


def _label_width(targets_shape: Any) -> int:
    return targets_shape[1] if len(targets_shape) == 2 else targets_shape[0]


# -- shared pieces ---------------------------------------------------------------------------------
class _Ctc:
    """The extended labels and the per-step log-probabilities of a batch."""

    def __init__(self, L: NodeLowering, log_probs: Value, targets: Value, input_lengths: Value, target_lengths: Value, blank: int):
        self.L, self.b = L, L.b
        self.T, self.B, self.C = log_probs.shape
        self.N = _label_width(targets.shape)
        self.S = 2 * self.N + 1
        self.dtype = log_probs.dtype
        self.lp = log_probs
        self.il = L.to(input_lengths, I64)
        self.tl = L.to(target_lengths, I64)
        self.blank = blank
        self.labels = self._extended_labels(L.to(targets, I64))  # (B, S) int64
        self.lp_ext = self._gather_labels(log_probs)  # (T, B, S)
        s = self.b.iota((self.B, self.S), 1, I64)
        self.valid = self.b.compare(s, self._bs(self._affine(self.tl, 2, 1)), "LT")  # s < 2*tl + 1
        self.skip = self._skip_allowed()  # (B, S): alpha[s] may come from alpha[s-2]

    def _bs(self, per_batch: Value) -> Value:
        return self.b.broadcast_in_dim(per_batch, (self.B, self.S), [0])

    def _affine(self, x: Value, a: int, c: int) -> Value:
        b = self.b
        return b.binary("add", b.binary("multiply", x, self.L.full(a, x.shape, I64)), self.L.full(c, x.shape, I64))

    def _extended_labels(self, targets: Value) -> Value:
        """l'(b, s): blank at even s, the target's (s-1)/2-th label at odd s (clamped
        reads past a target's end: those positions are never valid)."""
        b, L = self.b, self.L
        if targets.rank == 2:
            picked = targets
        else:  # concatenated: target b starts at the sum of the lengths before it
            ends = L.lower(aten.cumsum.default, self.tl, 0)
            starts = b.binary("subtract", ends, self.tl)
            j = b.iota((self.B, self.N), 1, I64)
            idx = b.binary("add", b.broadcast_in_dim(starts, (self.B, self.N), [0]), j)
            idx = b.clamp(L.zeros((), I64), idx, b.constant(max(self.N - 1, 0), I64))
            picked = L.lower(aten.index_select.default, targets, 0, b.reshape(idx, (self.B * self.N,)))
            picked = b.reshape(picked, (self.B, self.N))
        blanks = L.full(self.blank, (self.B, self.N, 1), I64)
        pairs = b.concatenate([blanks, b.reshape(picked, (self.B, self.N, 1))], 2)
        return b.concatenate([b.reshape(pairs, (self.B, 2 * self.N)), L.full(self.blank, (self.B, 1), I64)], 1)

    def _gather_labels(self, x: Value) -> Value:
        """x[t, b, l'(b, s)] for x of shape (T, B, C)."""
        idx = self.b.broadcast_in_dim(self.labels, (self.T, self.B, self.S), [1, 2])
        return self.L.lower(aten.gather.default, x, 2, idx)

    def _skip_allowed(self) -> Value:
        b = self.b
        prev2 = b.concatenate([self.L.full(self.blank, (self.B, 2), I64), b.slice(self.labels, [0, 0], [self.B, self.S - 2])], 1)
        s = b.iota((self.B, self.S), 1, I64)
        return b.binary("and", b.compare(self.labels, prev2, "NE"), b.compare(s, self.L.full(2, s.shape, I64), "GE"))

    # -- log-space arithmetic ----------------------------------------------------------------------
    def neg_inf(self, shape: Any) -> Value:
        return self.L.full(NEG_INF, shape, self.dtype)

    def shift(self, x: Value, k: int, right: bool) -> Value:
        """x moved k positions along s (to higher s if ``right``), -inf filling in."""
        b = self.b
        fill = self.neg_inf((self.B, k))
        if right:
            return b.concatenate([fill, b.slice(x, [0, 0], [self.B, self.S - k])], 1)
        return b.concatenate([b.slice(x, [0, k], [self.B, self.S]), fill], 1)

    def logsumexp(self, *xs: Value) -> Value:
        """log(sum(exp(x))) as the CPU kernel writes it: the max is taken out, 0 if -inf."""
        b = self.b
        m = xs[0]
        for x in xs[1:]:
            m = b.binary("maximum", m, x)
        m = b.select(b.compare(m, self.neg_inf(m.shape), "EQ"), self.L.zeros(m.shape, self.dtype), m)
        total = None
        for x in xs:
            e = b.unary("exponential", b.binary("subtract", x, m))
            total = e if total is None else b.binary("add", total, e)
        return b.binary("add", b.unary("log", total), m)

    def row(self, x: Value, t: Value) -> Value:
        """x[t] of a (T, B, S) Value, t a 0-d int64 Value."""
        zero = self.b.constant(0, I64)
        return self.b.reshape(self.b.dynamic_slice(x, [t, zero, zero], [1, self.B, self.S]), (self.B, self.S))

    def put_row(self, x: Value, r: Value, t: Value) -> Value:
        zero = self.b.constant(0, I64)
        return self.b.dynamic_update_slice(x, self.b.reshape(r, (1, self.B, self.S)), [t, zero, zero])

    def at_s(self, x: Value, s: Value) -> Value:
        """x[b, s[b]] for x (B, S) and per-batch positions s (B,) (clamped to [0, S))."""
        b = self.b
        s = b.clamp(self.L.zeros((), I64), s, b.constant(self.S - 1, I64))
        hit = b.compare(b.iota((self.B, self.S), 1, I64), self._bs(s), "EQ")
        return self.b.reduce([b.select(hit, x, self.neg_inf(x.shape))], [b.constant(NEG_INF, self.dtype)], [1],
                             lambda a, c: [b.binary("maximum", a, c)])[0]

    def loop(self, state: list[Value], first: int, step: int, end: int, body: Any) -> list[Value]:
        """``for t in range(first, end, step): state = body(t, *state)`` as stablehlo.while."""
        b = self.b
        stop = b.constant(end, I64)

        def cond(t: Value, *rest: Value) -> Value:
            return b.compare(t, stop, "LT" if step > 0 else "GT")

        def loop_body(t: Value, *rest: Value) -> list[Value]:
            return [b.binary("add", t, b.constant(step, I64)), *body(t, *rest)]

        return b.while_loop([b.constant(first, I64), *state], cond, loop_body)[1:]


# -- forward ---------------------------------------------------------------------------------------
def _alphas(c: _Ctc) -> Value:
    """log_alpha (T, B, S); row t is valid for t < input_length and s < 2*tl + 1."""
    b = c.b
    s = b.iota((c.B, c.S), 1, I64)
    first = c.row(c.lp_ext, b.constant(0, I64))
    starts = b.binary("or", b.compare(s, c.L.zeros(s.shape, I64), "EQ"),
                      b.binary("and", b.compare(s, c.L.full(1, s.shape, I64), "EQ"), c._bs(b.compare(c.tl, c.L.zeros(c.tl.shape, I64), "GT"))))
    alpha0 = b.select(starts, first, c.neg_inf(first.shape))
    buf = c.put_row(c.neg_inf((c.T, c.B, c.S)), alpha0, b.constant(0, I64))

    def step(t: Value, prev: Value, buf: Value, lp_ext: Value, skip: Value) -> list[Value]:
        skip2 = b.select(skip, c.shift(prev, 2, True), c.neg_inf(prev.shape))
        new = b.binary("add", c.logsumexp(prev, c.shift(prev, 1, True), skip2), c.row(lp_ext, t))
        return [new, c.put_row(buf, new, t), lp_ext, skip]

    _, buf, _, _ = c.loop([alpha0, buf, c.lp_ext, c.skip], 1, 1, c.T, step)
    return buf


def _nll(c: _Ctc, log_alpha: Value) -> Value:
    b, L = c.b, c.L
    zero = L.zeros((c.B,), I64)
    last_t = b.clamp(L.zeros((), I64), b.binary("subtract", c.il, L.full(1, (c.B,), I64)), b.constant(max(c.T - 1, 0), I64))
    # log_alpha[il-1, b, :] for each b
    idx = b.broadcast_in_dim(last_t, (1, c.B, c.S), [1])
    last = b.reshape(L.lower(aten.gather.default, log_alpha, 0, idx), (c.B, c.S))
    l1 = c.at_s(last, c._affine(c.tl, 2, 0))
    l2 = c.at_s(last, c._affine(c.tl, 2, -1))
    has_target = b.compare(c.tl, zero, "GT")
    ll = b.select(has_target, c.logsumexp(l1, l2), l1)  # an empty target ends in the blank at s = 0
    empty_input = b.compare(c.il, zero, "EQ")
    ll_empty = b.select(has_target, L.full(NEG_INF, (c.B,), c.dtype), L.zeros((c.B,), c.dtype))
    return b.unary("negate", b.select(empty_input, ll_empty, ll))


def _check_lengths(c: _Ctc) -> None:
    L, b = c.L, c.b
    L.check(b.compare(c.il, L.full(c.T, (c.B,), I64), "GT"), f"ctc_loss: Expected input_lengths to have value at most {c.T}")
    L.check(b.compare(c.il, L.zeros((c.B,), I64), "LT"), "ctc_loss: input_lengths must be non-negative")
    L.check(b.compare(c.tl, L.zeros((c.B,), I64), "LT"), "ctc_loss: target_lengths must be non-negative")
    L.check(b.compare(c.tl, L.full(c.N, (c.B,), I64), "GT"), f"ctc_loss: target_lengths must be at most the target width {c.N}")


@register(aten._ctc_loss.Tensor)
def ctc_loss(L: NodeLowering, log_probs: Value, targets: Value, input_lengths: Value, target_lengths: Value,
             blank: int = 0, zero_infinity: bool = False) -> tuple[Value, Value]:
    c = _Ctc(L, log_probs, targets, input_lengths, target_lengths, blank)
    _check_lengths(c)
    log_alpha = _alphas(c)
    return _nll(c, log_alpha), L.b.transpose(log_alpha, [1, 0, 2])


# -- backward --------------------------------------------------------------------------------------
def _betas(c: _Ctc) -> Value:
    """log_beta (T, B, S): -inf at t >= input_length and s >= 2*tl + 1."""
    b, L = c.b, c.L
    s = b.iota((c.B, c.S), 1, I64)
    two_tl = c._bs(c._affine(c.tl, 2, 0))
    ends = b.binary("or", b.compare(s, two_tl, "EQ"),
                    b.binary("and", b.compare(s, b.binary("subtract", two_tl, L.full(1, s.shape, I64)), "EQ"),
                             c._bs(b.compare(c.tl, L.zeros(c.tl.shape, I64), "GT"))))
    il_minus_1 = c._bs(b.binary("subtract", c.il, L.full(1, (c.B,), I64)))
    # beta[s] may come from beta[s+2] where alpha[s+2] may come from alpha[s]
    skip_next = b.concatenate([b.slice(c.skip, [0, 2], [c.B, c.S]), L.full(False, (c.B, 2), torch.bool)], 1)
    ninf = c.neg_inf((c.B, c.S))

    def step(t: Value, nxt: Value, buf: Value, lp_ext: Value) -> list[Value]:
        lp_t = c.row(lp_ext, t)
        t_b = b.broadcast_in_dim(t, (c.B, c.S), [])
        from_next = c.logsumexp(nxt, c.shift(nxt, 1, False), b.select(skip_next, c.shift(nxt, 2, False), ninf))
        start = b.select(ends, lp_t, ninf)
        new = b.select(b.compare(t_b, il_minus_1, "EQ"), start, b.binary("add", from_next, lp_t))
        new = b.select(b.binary("and", b.compare(t_b, il_minus_1, "LE"), c.valid), new, ninf)
        return [new, c.put_row(buf, new, t), lp_ext]

    _, buf, _ = c.loop([ninf, c.neg_inf((c.T, c.B, c.S)), c.lp_ext], c.T - 1, -1, -1, step)
    return buf


def _per_class_logsumexp(c: _Ctc, ab: Value) -> Value:
    """lcab[t, b, k] = log sum over s with l'(b, s) == k of exp(ab[t, b, s]); -inf if none."""
    L, b = c.L, c.b
    idx = b.broadcast_in_dim(c.labels, (c.T, c.B, c.S), [1, 2])
    shape = (c.T, c.B, c.C)
    m = L.lower(aten.scatter_reduce.two, c.neg_inf(shape), 2, idx, ab, "amax", include_self=True)
    finite_m = b.select(b.compare(m, c.neg_inf(shape), "EQ"), L.zeros(shape, c.dtype), m)
    m_at = L.lower(aten.gather.default, finite_m, 2, idx)
    e = b.unary("exponential", b.binary("subtract", ab, m_at))
    total = L.lower(aten.scatter_add.default, L.zeros(shape, c.dtype), 2, idx, e)
    return b.binary("add", b.unary("log", total), finite_m)


@register(aten._ctc_loss_backward.Tensor)
def ctc_loss_backward(L: NodeLowering, grad: Value, log_probs: Value, targets: Value, input_lengths: Value,
                      target_lengths: Value, nll: Value, log_alpha: Value, blank: int, zero_infinity: bool = False) -> Value:
    b = L.b
    c = _Ctc(L, log_probs, targets, input_lengths, target_lengths, blank)
    alpha = b.transpose(log_alpha, [1, 0, 2])  # (T, B, S)
    ab = b.binary("add", alpha, _betas(c))
    lcab = _per_class_logsumexp(c, ab)
    shape = (c.T, c.B, c.C)
    tb = lambda v: b.broadcast_in_dim(v, shape, [1])  # noqa: E731 - per-batch value over (T, B, C)
    nll_tb = tb(L.to(nll, c.dtype))
    # (exp(lp) - exp(lcab + nll - lp)) * grad, the CPU kernel's eq. (16)
    res = b.binary("subtract", b.unary("exponential", log_probs),
                   b.unary("exponential", b.binary("subtract", b.binary("add", lcab, nll_tb), log_probs)))
    res = b.binary("multiply", res, tb(L.to(grad, c.dtype)))
    inside = b.compare(b.iota(shape, 0, I64), tb(c.il), "LT")
    zero = L.zeros(shape, c.dtype)
    res = b.select(inside, res, zero)
    if zero_infinity:
        res = b.select(b.compare(nll_tb, L.full(math.inf, shape, c.dtype), "EQ"), zero, res)
    return res


# -- the int[] overloads: lengths to the device, then the .Tensor ops --------------------------------
def _lengths(x: Any, device: torch.device) -> torch.Tensor:
    return torch.tensor(list(x), dtype=torch.int64, device=device)


def _ctc_loss_lists(log_probs: torch.Tensor, targets: torch.Tensor, input_lengths: Any, target_lengths: Any,
                    blank: int = 0, zero_infinity: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    d = log_probs.device
    return aten._ctc_loss.Tensor(log_probs, targets, _lengths(input_lengths, d), _lengths(target_lengths, d), blank, zero_infinity)


def _ctc_loss_backward_lists(grad: torch.Tensor, log_probs: torch.Tensor, targets: torch.Tensor, input_lengths: Any,
                             target_lengths: Any, nll: torch.Tensor, log_alpha: torch.Tensor, blank: int,
                             zero_infinity: bool = False) -> torch.Tensor:
    d = log_probs.device
    return aten._ctc_loss_backward.Tensor(grad, log_probs, targets, _lengths(input_lengths, d), _lengths(target_lengths, d),
                                          nll, log_alpha, blank, zero_infinity)


def _ctc_loss_meta(log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):  # noqa: ANN001, ANN202
    t, n = log_probs.shape[0], log_probs.shape[1]
    return log_probs.new_empty((n,)), log_probs.new_empty((n, t, 2 * _label_width(targets.shape) + 1))


def _ctc_loss_backward_meta(grad, log_probs, *rest):  # noqa: ANN001, ANN202
    return log_probs.new_empty(log_probs.shape)


# PyTorch has no Meta kernel for the .Tensor overloads (the eager path reads output shapes
# from one), and the int[] overloads' tpu kernels are the two functions above. They are
# dispatcher kernels, not rules: the lists become device operands so that new lengths
# never compile a new program.
_LIB = torch.library.Library("aten", "IMPL")
_LIB.impl("_ctc_loss.Tensor", _ctc_loss_meta, "Meta")
_LIB.impl("_ctc_loss_backward.Tensor", _ctc_loss_backward_meta, "Meta")
if not torch._C._dispatch_has_kernel_for_dispatch_key("aten::_ctc_loss_backward", "Meta"):
    _LIB.impl("_ctc_loss_backward", _ctc_loss_backward_meta, "Meta")
_LIB.impl("_ctc_loss", _ctc_loss_lists, "PrivateUse1")
_LIB.impl("_ctc_loss_backward", _ctc_loss_backward_lists, "PrivateUse1")
