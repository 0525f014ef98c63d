"""Losses: nll_loss (1d/2d, weights, ignore_index), mse, smooth_l1/huber, binary cross
entropy (probabilities and logits), with their backward ops. cross_entropy and l1_loss
decompose (log_softmax + nll_loss, abs + mean) into these and the reduction rules.

``reduction`` follows ATen's enum: 0 none, 1 mean, 2 sum.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from ...stablehlo.builder import Value
from ..context import NodeLowering
from ..registry import register
from .reduction import acc_dtype, numel, reduce_sum

aten = torch.ops.aten

NONE, MEAN, SUM = 0, 1, 2


def _reduce(L: NodeLowering, loss: Value, reduction: int) -> Value:
    """Apply the reduction; the result is converted to the op's output dtype/shape."""
    out = L.out[0]
    if reduction == NONE:
        return L.to(loss, out.dtype)
    s = reduce_sum(L, loss, list(range(loss.rank)), acc_dtype(loss.dtype))
    if reduction == MEAN:
        s = L.b.binary("divide", s, L.full(numel(loss.shape), (), s.dtype))
    return L.to(s, out.dtype)


def _grad_scale(L: NodeLowering, grad: Value, shape: tuple[int, ...], reduction: int, count: int | None = None) -> Value:
    """The incoming gradient broadcast to ``shape`` (divided by the loss's element count,
    ``count`` or numel(shape), for mean)."""
    g = L.broadcast_to(grad, shape)
    if reduction == MEAN:
        g = L.b.binary("divide", g, L.full(numel(shape) if count is None else count, shape, g.dtype))
    return g


def _c(L: NodeLowering, v: Any, like: Value) -> Value:
    return L.full(v, like.shape, like.dtype)


# -- nll_loss ------------------------------------------------------------------------------------
class _NllParts(NamedTuple):
    onehot: Value  # x's shape: the target's class
    weight: Value  # per target: its class weight, 0 for an ignored target
    valid: Value  # per target: not ignore_index
    cdim: int  # the class dim of x


def _nll_parts(L: NodeLowering, x: Value, target: Value, weight: Value | None, ignore_index: int) -> _NllParts:
    """What nll_loss's forward and backward both need of the targets (and the bounds check)."""
    b = L.b
    cdim = 1 if x.rank >= 2 else 0
    keep = [d for d in range(x.rank) if d != cdim]
    t = L.to(target, torch.int64)
    t_b = b.broadcast_in_dim(t, x.shape, keep)
    onehot = b.compare(b.iota(x.shape, cdim, torch.int64), t_b, "EQ")
    valid = b.compare(t, L.full(ignore_index, t.shape, torch.int64), "NE")
    _check_targets(L, t, valid, x.shape[cdim])
    acc = acc_dtype(x.dtype)
    if weight is not None:
        w = b.broadcast_in_dim(L.to(weight, acc), x.shape, [cdim])
        wt = reduce_sum(L, b.select(onehot, w, L.zeros(x.shape, acc)), [cdim], acc)
    else:
        wt = L.full(1, t.shape, acc)
    wt = b.select(valid, wt, L.zeros(t.shape, acc))
    return _NllParts(onehot, wt, valid, cdim)


def _check_targets(L: NodeLowering, t: Value, valid: Value, n_classes: int) -> None:
    """The CPU's IndexError for a class index outside [0, C) that is not ignore_index;
    without it the one-hot mask would be all false and the loss silently 0."""
    b = L.b
    outside = b.binary(
        "or", b.compare(t, L.zeros(t.shape, t.dtype), "LT"), b.compare(t, L.full(n_classes, t.shape, t.dtype), "GE")
    )
    L.check(b.binary("and", valid, outside), "Target {} is out of bounds.", exc=IndexError, values=[t])


@register(aten.nll_loss_forward.default, aten.nll_loss2d_forward.default)
def nll_loss_forward(
    L: NodeLowering, x: Value, target: Value, weight: Value | None, reduction: int, ignore_index: int
) -> tuple[Value, Value]:
    b = L.b
    acc = acc_dtype(x.dtype)
    onehot, wt, valid, cdim = _nll_parts(L, x, target, weight, ignore_index)
    xf = L.to(x, acc)
    picked = reduce_sum(L, b.select(onehot, xf, L.zeros(x.shape, acc)), [cdim], acc)
    # an ignored target's loss is +0, as the CPU writes it (not -(x * 0) = -0)
    loss = b.select(valid, b.unary("negate", b.binary("multiply", picked, wt)), L.zeros(wt.shape, acc))
    tw_spec = L.out[1]
    total = reduce_sum(L, wt, list(range(wt.rank)), acc)
    if reduction == NONE and x.rank >= 2:
        # the CPU's batched kernel leaves total_weight at 0 when nothing is reduced (a 1-d
        # input still reports its target's weight); the backward does not read it then
        total = L.zeros((), acc)
    if reduction == NONE:
        return L.to(loss, L.out[0].dtype), L.to(L.b.reshape(total, tw_spec.shape), tw_spec.dtype)
    s = reduce_sum(L, loss, list(range(loss.rank)), acc)
    if reduction == MEAN:
        s = b.binary("divide", s, total)
    out = L.out[0]
    return b.reshape(L.to(s, out.dtype), out.shape), b.reshape(L.to(total, tw_spec.dtype), tw_spec.shape)


@register(aten.nll_loss_backward.default, aten.nll_loss2d_backward.default)
def nll_loss_backward(
    L: NodeLowering,
    grad: Value,
    x: Value,
    target: Value,
    weight: Value | None,
    reduction: int,
    ignore_index: int,
    total_weight: Value,
) -> Value:
    b = L.b
    acc = acc_dtype(x.dtype)
    onehot, wt, valid, cdim = _nll_parts(L, x, target, weight, ignore_index)
    keep = [d for d in range(x.rank) if d != cdim]
    g = L.to(grad, acc)
    if reduction == NONE:
        g = b.binary("multiply", b.reshape(g, wt.shape), wt)
    else:
        g = b.reshape(g, ())
        if reduction == MEAN:
            g = b.binary("divide", g, L.to(b.reshape(total_weight, ()), acc))
        g = b.binary("multiply", L.broadcast_to(g, wt.shape), wt)
    # the CPU kernel writes no gradient for an ignored target: it stays 0 even where the
    # incoming one is not finite (a mean over a batch whose targets are all ignored divides
    # by a total weight of 0, and inf * 0 would give NaN)
    g = b.select(valid, b.unary("negate", g), L.zeros(wt.shape, acc))
    gb = b.broadcast_in_dim(g, x.shape, keep)
    r = b.select(onehot, gb, L.zeros(x.shape, acc))
    return L.to(r, L.out[0].dtype)


# -- regression losses ------------------------------------------------------------------------------
def _diff(L: NodeLowering, x: Value, t: Value) -> Value:
    shape = tuple(torch.broadcast_shapes(x.shape, t.shape))
    dtype = acc_dtype(torch.promote_types(x.dtype, t.dtype))
    x, t = L.broadcast_to(L.to(x, dtype), shape), L.broadcast_to(L.to(t, dtype), shape)
    return L.b.binary("subtract", x, t)


def _diff_and_grad(L: NodeLowering, x: Value, t: Value, grad: Value, reduction: int) -> tuple[Value, Value]:
    """x - t and the incoming gradient for a loss backward, both at the result's shape: a
    gradient larger than x (a vmapped backward) broadcasts, as in the CPU kernels'
    TensorIterator; the mean divides by the input's element count, as those kernels do."""
    d = _diff(L, x, t)
    count = numel(x.shape)
    d = L.broadcast_to(d, L.out[0].shape)
    return d, _grad_scale(L, L.to(grad, d.dtype), d.shape, reduction, count)


@register(aten.mse_loss.default)
def mse_loss(L: NodeLowering, x: Value, t: Value, reduction: int = MEAN) -> Value:
    d = _diff(L, x, t)
    return _reduce(L, L.b.binary("multiply", d, d), reduction)


@register(aten.mse_loss_backward.default)
def mse_loss_backward(L: NodeLowering, grad: Value, x: Value, t: Value, reduction: int) -> Value:
    d, g = _diff_and_grad(L, x, t, grad, reduction)
    r = L.b.binary("multiply", L.b.binary("multiply", _c(L, 2, d), d), g)
    return L.broadcast_to(L.to(r, L.out[0].dtype), L.out[0].shape)


def _is_zero(v: Any) -> bool:
    return not isinstance(v, Value) and float(v) == 0.0


@register(aten.smooth_l1_loss.default, aten.huber_loss.default)
def smooth_l1_loss(L: NodeLowering, x: Value, t: Value, reduction: int = MEAN, beta: Any = 1.0) -> Value:
    b = L.b
    d = _diff(L, x, t)
    a = b.unary("abs", d)
    huber = L.op is aten.huber_loss.default
    if not huber and _is_zero(beta):
        return _reduce(L, a, reduction)
    bv = _c(L, beta, d)
    half = _c(L, 0.5, d)
    quad = b.binary("multiply", b.binary("multiply", half, d), d)
    if huber:
        lin = b.binary("multiply", bv, b.binary("subtract", a, b.binary("multiply", half, bv)))
    else:
        quad = b.binary("divide", quad, bv)
        lin = b.binary("subtract", a, b.binary("multiply", half, bv))
    return _reduce(L, b.select(b.compare(a, bv, "LT"), quad, lin), reduction)


@register(aten.smooth_l1_loss_backward.default, aten.huber_loss_backward.default)
def smooth_l1_loss_backward(L: NodeLowering, grad: Value, x: Value, t: Value, reduction: int, beta: Any) -> Value:
    b = L.b
    d, g = _diff_and_grad(L, x, t, grad, reduction)
    huber = L.op is aten.huber_loss_backward.default
    if not huber and _is_zero(beta):
        r = b.unary("sign", d)
    else:
        bv = _c(L, beta, d)
        hi = bv if huber else _c(L, 1, d)
        mid = d if huber else b.binary("divide", d, bv)
        r = b.select(b.compare(d, b.unary("negate", bv), "LE"), b.unary("negate", hi), b.select(b.compare(d, bv, "GE"), hi, mid))
    r = b.binary("multiply", r, g)
    return L.broadcast_to(L.to(r, L.out[0].dtype), L.out[0].shape)


# -- binary cross entropy -------------------------------------------------------------------------------
def _weighted(L: NodeLowering, loss: Value, weight: Value | None) -> Value:
    if weight is None:
        return loss
    return L.b.binary("multiply", loss, L.broadcast_to(L.to(weight, loss.dtype), loss.shape))


@register(aten.binary_cross_entropy.default)
def binary_cross_entropy(L: NodeLowering, x: Value, t: Value, weight: Value | None = None, reduction: int = MEAN) -> Value:
    b = L.b
    acc = acc_dtype(x.dtype)
    x, t = L.to(x, acc), L.broadcast_to(L.to(t, acc), x.shape)
    floor = _c(L, -100, x)
    log_x = b.binary("maximum", b.unary("log", x), floor)
    log_1mx = b.binary("maximum", b.unary("log_plus_one", b.unary("negate", x)), floor)
    loss = b.binary(
        "subtract", b.binary("multiply", b.binary("subtract", t, _c(L, 1, t)), log_1mx), b.binary("multiply", t, log_x)
    )
    return _reduce(L, _weighted(L, loss, weight), reduction)


@register(aten.binary_cross_entropy_backward.default)
def binary_cross_entropy_backward(
    L: NodeLowering, grad: Value, x: Value, t: Value, weight: Value | None = None, reduction: int = MEAN
) -> Value:
    b = L.b
    acc = acc_dtype(x.dtype)
    x, t = L.to(x, acc), L.broadcast_to(L.to(t, acc), x.shape)
    g = _grad_scale(L, L.to(grad, acc), x.shape, reduction)
    denom = b.binary("maximum", b.binary("multiply", b.binary("subtract", _c(L, 1, x), x), x), _c(L, 1e-12, x))
    r = b.binary("multiply", b.binary("divide", b.binary("subtract", x, t), denom), g)
    return L.to(_weighted(L, r, weight), L.out[0].dtype)


@register(aten.binary_cross_entropy_with_logits.default)
def binary_cross_entropy_with_logits(
    L: NodeLowering,
    x: Value,
    t: Value,
    weight: Value | None = None,
    pos_weight: Value | None = None,
    reduction: int = MEAN,
) -> Value:
    b = L.b
    acc = acc_dtype(x.dtype)
    x, t = L.to(x, acc), L.broadcast_to(L.to(t, acc), x.shape)
    one = _c(L, 1, x)
    # log(1 + exp(-x)) computed stably: log1p(exp(-|x|)) + max(-x, 0)
    softplus_neg = b.binary(
        "add",
        b.unary("log_plus_one", b.unary("exponential", b.unary("negate", b.unary("abs", x)))),
        b.binary("maximum", b.unary("negate", x), L.zeros(x.shape, acc)),
    )
    if pos_weight is not None:
        pw = L.broadcast_to(L.to(pos_weight, acc), x.shape)
        softplus_neg = b.binary(
            "multiply", b.binary("add", b.binary("multiply", b.binary("subtract", pw, one), t), one), softplus_neg
        )
    loss = b.binary("add", b.binary("multiply", b.binary("subtract", one, t), x), softplus_neg)
    return _reduce(L, _weighted(L, loss, weight), reduction)
