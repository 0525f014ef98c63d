"""Normalization: layer norm, batch norm (train/eval, running statistics), group norm,
and their backward ops. Statistics are computed in float32 for 16-bit inputs.

Rules for ops with optional outputs (``output_mask``) return None where PyTorch's meta
kernel does, so they index ``L.out_meta`` (``L.out`` skips the Nones).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ...errors import not_implemented
from ...stablehlo.builder import Value
from ..context import NodeLowering
from ..registry import register
from .reduction import acc_dtype, keep_shape, mean_keep, numel, reduce_sum, sum_keep

aten = torch.ops.aten


def _meta_out(L: NodeLowering, v: Value | None, k: int) -> Value | None:
    """Convert/reshape ``v`` to the meta kernel's output ``k`` (None stays None)."""
    metas = L.out_meta if isinstance(L.out_meta, (tuple, list)) else [L.out_meta]
    m = metas[k]
    if m is None or v is None:
        return None
    v = L.to(v, m.dtype)
    if v.shape != tuple(m.shape):
        if numel(v.shape) == numel(m.shape):
            v = L.b.reshape(v, tuple(m.shape))
        else:
            v = L.broadcast_to(v, tuple(m.shape))
    return v


def _bcast(L: NodeLowering, v: Value, shape: Sequence[int], dims: Sequence[int]) -> Value:
    """Broadcast ``v`` (whose dims are ``dims`` of ``shape``) to ``shape``."""
    v = L.b.reshape(v, [shape[d] for d in dims])
    return L.b.broadcast_in_dim(v, tuple(shape), list(dims))


def _mul(L: NodeLowering, a: Value, b: Value) -> Value:
    return L.b.binary("multiply", a, b)


def _sub(L: NodeLowering, a: Value, b: Value) -> Value:
    return L.b.binary("subtract", a, b)


def _add(L: NodeLowering, a: Value, b: Value) -> Value:
    return L.b.binary("add", a, b)


def _rstd(L: NodeLowering, var: Value, eps: Any) -> Value:
    return L.b.unary("rsqrt", _add(L, var, L.full(eps, var.shape, var.dtype)))


def _biased_var_keep(L: NodeLowering, x: Value, dims: Sequence[int]) -> tuple[Value, Value]:
    m = mean_keep(L, x, dims)
    d = _sub(L, x, L.broadcast_to(m, x.shape))
    v = mean_keep(L, _mul(L, d, d), dims)
    return v, m


def _ln_dx(L: NodeLowering, gx: Value, xf: Value, ds: Value, db: Value, mean: Value, rstd: Value, n: int) -> Value:
    """dx = rstd*gx + b*x + c with b = (db*mean - ds)*rstd^3/n, c = -b*mean - db*rstd/n
    (ds = sum(gx*x), db = sum(gx); ds/db/mean/rstd have keepdim shapes)."""
    scale = L.full(1.0 / n, ds.shape, ds.dtype)
    r3 = _mul(L, _mul(L, rstd, rstd), rstd)
    bcoef = _mul(L, _mul(L, _sub(L, _mul(L, db, mean), ds), r3), scale)
    ccoef = _sub(L, L.b.unary("negate", _mul(L, bcoef, mean)), _mul(L, _mul(L, db, rstd), scale))
    shape = xf.shape
    return _add(L, _add(L, _mul(L, L.broadcast_to(rstd, shape), gx), _mul(L, L.broadcast_to(bcoef, shape), xf)), L.broadcast_to(ccoef, shape))


# -- layer norm ----------------------------------------------------------------------------------
@register(aten.native_layer_norm.default)
def native_layer_norm(L: NodeLowering, x: Value, normalized_shape: Any, weight: Value | None, bias: Value | None, eps: Any) -> tuple:
    acc = acc_dtype(x.dtype)
    xf = L.to(x, acc)
    axis = x.rank - len(normalized_shape)
    dims = list(range(axis, x.rank))
    var, mean = _biased_var_keep(L, xf, dims)
    rstd = _rstd(L, var, eps)
    y = _mul(L, _sub(L, xf, L.broadcast_to(mean, x.shape)), L.broadcast_to(rstd, x.shape))
    if weight is not None:
        y = _mul(L, y, _bcast(L, L.to(weight, acc), x.shape, dims))
    if bias is not None:
        y = _add(L, y, _bcast(L, L.to(bias, acc), x.shape, dims))
    return _meta_out(L, y, 0), _meta_out(L, mean, 1), _meta_out(L, rstd, 2)


@register(aten.native_layer_norm_backward.default)
def native_layer_norm_backward(
    L: NodeLowering, g: Value, x: Value, normalized_shape: Any, mean: Value, rstd: Value,
    weight: Value | None, bias: Value | None, output_mask: Sequence[bool],
) -> tuple:
    acc = acc_dtype(x.dtype)
    axis = x.rank - len(normalized_shape)
    dims = list(range(axis, x.rank))
    batch = list(range(axis))
    xf, gf = L.to(x, acc), L.to(g, acc)
    kshape = keep_shape(x.shape, dims)
    mean_in, rstd_in = mean, rstd
    mean = L.broadcast_to(L.b.reshape(L.to(mean, acc), kshape), x.shape)
    rstd = L.broadcast_to(L.b.reshape(L.to(rstd, acc), kshape), x.shape)
    xhat = _mul(L, _sub(L, xf, mean), rstd)
    gi = gw = gb = None
    if output_mask[0]:
        # ATen's CPU formula (a*dy*gamma + b*x + c), which rounds like PyTorch in 16-bit
        gx = _mul(L, gf, _bcast(L, L.to(weight, acc), x.shape, dims)) if weight is not None else gf
        ds = sum_keep(L, _mul(L, gx, xf), dims)
        db = sum_keep(L, gx, dims)
        m_k = L.b.reshape(L.to(mean_in, acc), kshape)
        r_k = L.b.reshape(L.to(rstd_in, acc), kshape)
        gi = _ln_dx(L, gx, xf, ds, db, m_k, r_k, numel(x.shape, dims))
    if len(output_mask) > 1 and output_mask[1] and weight is not None:
        gw = reduce_sum(L, _mul(L, gf, xhat), batch)
    if len(output_mask) > 2 and output_mask[2] and bias is not None:
        gb = reduce_sum(L, gf, batch)
    return _meta_out(L, gi, 0), _meta_out(L, gw, 1), _meta_out(L, gb, 2)


# -- batch norm ------------------------------------------------------------------------------------
def _channel_dims(x: Value) -> list[int]:
    return [d for d in range(x.rank) if d != 1]


def _per_channel(L: NodeLowering, v: Value, x: Value) -> Value:
    """A (C,) vector broadcast along dim 1 of x."""
    return L.b.broadcast_in_dim(L.b.reshape(v, (x.shape[1],)), x.shape, [1])


def _bn_apply(L: NodeLowering, xf: Value, mean: Value, rstd: Value, weight: Value | None, bias: Value | None) -> Value:
    acc = xf.dtype
    y = _mul(L, _sub(L, xf, _per_channel(L, mean, xf)), _per_channel(L, rstd, xf))
    if weight is not None:
        y = _mul(L, y, _per_channel(L, L.to(weight, acc), xf))
    if bias is not None:
        y = _add(L, y, _per_channel(L, L.to(bias, acc), xf))
    return y


def _bn_train(L: NodeLowering, x: Value, weight: Value | None, bias: Value | None, eps: Any) -> tuple[Value, Value, Value, Value]:
    """(y, mean, rstd, biased var) from batch statistics (mean/rstd/var are (C,))."""
    xf = L.to(x, acc_dtype(x.dtype))
    dims = _channel_dims(x)
    var, mean = _biased_var_keep(L, xf, dims)
    mean_c = L.b.reshape(mean, (x.shape[1],))
    var_c = L.b.reshape(var, (x.shape[1],))
    rstd = _rstd(L, var_c, eps)
    return _bn_apply(L, xf, mean_c, rstd, weight, bias), mean_c, rstd, var_c


def _bn_update(L: NodeLowering, x: Value, running: Value, stat: Value, momentum: Any, unbias: bool) -> Value:
    """momentum * stat + (1 - momentum) * running, like ATen's CPU update."""
    dtype = running.dtype
    s = L.to(stat, dtype)
    if unbias:
        n = numel(x.shape) // x.shape[1]
        s = _mul(L, s, L.full(n / (n - 1) if n > 1 else float("inf"), s.shape, dtype))
    mom = L.full(momentum, s.shape, dtype)
    one_minus = _sub(L, L.full(1, s.shape, dtype), mom)
    return _add(L, _mul(L, mom, s), _mul(L, one_minus, running))


def _bn_eval(L: NodeLowering, x: Value, weight: Value | None, bias: Value | None, rm: Value, rv: Value, eps: Any) -> tuple[Value, Value, Value]:
    acc = acc_dtype(x.dtype)
    xf = L.to(x, acc)
    mean = L.to(rm, acc)
    rstd = _rstd(L, L.to(rv, acc), eps)
    return _bn_apply(L, xf, mean, rstd, weight, bias), mean, rstd


def _empty_or(L: NodeLowering, v: Value, k: int) -> Value | None:
    metas = L.out_meta
    m = metas[k]
    if m is not None and m.numel() == 0:
        return L.zeros(tuple(m.shape), m.dtype)
    return _meta_out(L, v, k)


@register(aten._native_batch_norm_legit_functional.default)
def batch_norm_legit_functional(
    L: NodeLowering, x: Value, weight: Value | None, bias: Value | None, rm: Value, rv: Value,
    training: bool, momentum: Any, eps: Any,
) -> tuple:
    if not training:
        y, mean, rstd = _bn_eval(L, x, weight, bias, rm, rv, eps)
        return _meta_out(L, y, 0), _empty_or(L, mean, 1), _empty_or(L, rstd, 2), rm, rv
    y, mean, rstd, var = _bn_train(L, x, weight, bias, eps)
    new_rm = _bn_update(L, x, rm, mean, momentum, False)
    new_rv = _bn_update(L, x, rv, var, momentum, True)
    return _meta_out(L, y, 0), _meta_out(L, mean, 1), _meta_out(L, rstd, 2), new_rm, new_rv


@register(aten._native_batch_norm_legit.no_stats)
def batch_norm_legit_no_stats(L: NodeLowering, x: Value, weight: Value | None, bias: Value | None, training: bool, momentum: Any, eps: Any) -> tuple:
    y, mean, rstd, _ = _bn_train(L, x, weight, bias, eps)
    return _meta_out(L, y, 0), _meta_out(L, mean, 1), _meta_out(L, rstd, 2)


@register(aten._native_batch_norm_legit_no_training.default)
def batch_norm_legit_no_training(L: NodeLowering, x: Value, weight: Value | None, bias: Value | None, rm: Value, rv: Value, momentum: Any, eps: Any) -> tuple:
    y, mean, rstd = _bn_eval(L, x, weight, bias, rm, rv, eps)
    return _meta_out(L, y, 0), _empty_or(L, mean, 1), _empty_or(L, rstd, 2)


@register(aten._batch_norm_with_update_functional.default)
def batch_norm_with_update_functional(
    L: NodeLowering, x: Value, weight: Value | None, bias: Value | None, rm: Value, rv: Value, momentum: Any, eps: Any,
) -> tuple:
    y, mean, rstd, var = _bn_train(L, x, weight, bias, eps)
    new_rm = _bn_update(L, x, rm, mean, momentum, False)
    new_rv = _bn_update(L, x, rv, var, momentum, True)
    reserve = _empty_or(L, mean, 3)
    return _meta_out(L, y, 0), _meta_out(L, mean, 1), _meta_out(L, rstd, 2), reserve, new_rm, new_rv


@register(aten._batch_norm_no_update.default)
def batch_norm_no_update(
    L: NodeLowering, x: Value, weight: Value | None, bias: Value | None, rm: Value | None, rv: Value | None, momentum: Any, eps: Any,
) -> tuple:
    if rm is None or rv is None:
        y, mean, rstd, _ = _bn_train(L, x, weight, bias, eps)
    else:
        y, mean, rstd = _bn_eval(L, x, weight, bias, rm, rv, eps)
    return _meta_out(L, y, 0), _empty_or(L, mean, 1), _empty_or(L, rstd, 2), _empty_or(L, mean, 3)


@register(aten.native_batch_norm.default)
def native_batch_norm(
    L: NodeLowering, x: Value, weight: Value | None, bias: Value | None, rm: Value | None, rv: Value | None,
    training: bool, momentum: Any, eps: Any,
) -> tuple:
    if training and rm is not None:
        # native_batch_norm updates the running statistics without saying so in its schema:
        # the eager kernel must route it to _native_batch_norm_legit, whose mutation is declared.
        raise not_implemented("aten::native_batch_norm", "training with running statistics: use _native_batch_norm_legit")
    if training or rm is None:
        y, mean, rstd, _ = _bn_train(L, x, weight, bias, eps)
        return _meta_out(L, y, 0), _meta_out(L, mean, 1), _meta_out(L, rstd, 2)
    y, mean, rstd = _bn_eval(L, x, weight, bias, rm, rv, eps)
    return _meta_out(L, y, 0), _empty_or(L, mean, 1), _empty_or(L, rstd, 2)


def _bn_backward(
    L: NodeLowering, g: Value, x: Value, weight: Value | None, rm: Value | None, rv: Value | None,
    save_mean: Value | None, save_invstd: Value | None, train: bool, eps: Any, output_mask: Sequence[bool],
) -> tuple:
    acc = acc_dtype(x.dtype)
    xf, gf = L.to(x, acc), L.to(g, acc)
    dims = _channel_dims(x)
    if train:
        mean, invstd = L.to(save_mean, acc), L.to(save_invstd, acc)
    else:
        mean, invstd = L.to(rm, acc), _rstd(L, L.to(rv, acc), eps)
    c = x.shape[1]
    n = numel(x.shape) // c if c else 0
    xmu = _sub(L, xf, _per_channel(L, mean, xf))
    sum_g = L.b.reshape(reduce_sum(L, gf, dims), (c,))
    dot = L.b.reshape(reduce_sum(L, _mul(L, gf, xmu), dims), (c,))
    w = L.to(weight, acc) if weight is not None else L.full(1, (c,), acc)
    gi = gw = gb = None
    if output_mask[0]:
        if train:
            proj = _mul(L, dot, _mul(L, _mul(L, invstd, invstd), L.full(1.0 / n, (c,), acc)))
            gmean = _mul(L, sum_g, L.full(1.0 / n, (c,), acc))
            inner = _sub(L, _sub(L, gf, _mul(L, xmu, _per_channel(L, proj, xf))), _per_channel(L, gmean, xf))
            gi = _mul(L, inner, _per_channel(L, _mul(L, invstd, w), xf))
        else:
            gi = _mul(L, gf, _per_channel(L, _mul(L, invstd, w), xf))
    if output_mask[1]:
        gw = _mul(L, dot, invstd)
    if output_mask[2]:
        gb = sum_g
    return _meta_out(L, gi, 0), _meta_out(L, gw, 1), _meta_out(L, gb, 2)


@register(aten.native_batch_norm_backward.default)
def native_batch_norm_backward(
    L: NodeLowering, g: Value, x: Value, weight: Value | None, rm: Value | None, rv: Value | None,
    save_mean: Value | None, save_invstd: Value | None, train: bool, eps: Any, output_mask: Sequence[bool],
) -> tuple:
    return _bn_backward(L, g, x, weight, rm, rv, save_mean, save_invstd, train, eps, output_mask)


@register(aten.batch_norm_backward.default)
def batch_norm_backward(
    L: NodeLowering, g: Value, x: Value, weight: Value, rm: Value | None, rv: Value | None,
    save_mean: Value | None, save_var: Value | None, update: bool, eps: Any, output_mask: Sequence[bool], reserve: Value,
) -> tuple:
    train = update or rm is None
    return _bn_backward(L, g, x, weight, rm, rv, save_mean, save_var, train, eps, output_mask)


# -- group norm --------------------------------------------------------------------------------------
@register(aten.native_group_norm.default)
def native_group_norm(
    L: NodeLowering, x: Value, weight: Value | None, bias: Value | None, N: int, C: int, HxW: int, group: int, eps: Any,  # noqa: N803
) -> tuple:
    acc = acc_dtype(x.dtype)
    xg = L.b.reshape(L.to(x, acc), (N, group, (C // group) * HxW))
    var, mean = _biased_var_keep(L, xg, [2])
    rstd = _rstd(L, var, eps)
    y = _mul(L, _sub(L, xg, L.broadcast_to(mean, xg.shape)), L.broadcast_to(rstd, xg.shape))
    y = L.b.reshape(y, (N, C, HxW))
    if weight is not None:
        y = _mul(L, y, L.b.broadcast_in_dim(L.to(weight, acc), y.shape, [1]))
    if bias is not None:
        y = _add(L, y, L.b.broadcast_in_dim(L.to(bias, acc), y.shape, [1]))
    return _meta_out(L, y, 0), _meta_out(L, mean, 1), _meta_out(L, rstd, 2)


@register(aten.native_group_norm_backward.default)
def native_group_norm_backward(
    L: NodeLowering, g: Value, x: Value, mean: Value, rstd: Value, weight: Value | None,
    N: int, C: int, HxW: int, group: int, output_mask: Sequence[bool],  # noqa: N803
) -> tuple:
    acc = acc_dtype(x.dtype)
    d = (C // group) * HxW
    gshape = (N, group, d)
    xg = L.b.reshape(L.to(x, acc), gshape)
    gf = L.b.reshape(L.to(g, acc), (N, C, HxW))
    mean = L.broadcast_to(L.b.reshape(L.to(mean, acc), (N, group, 1)), gshape)
    rstd = L.broadcast_to(L.b.reshape(L.to(rstd, acc), (N, group, 1)), gshape)
    xhat = _mul(L, _sub(L, xg, mean), rstd)
    gi = gw = gb = None
    if output_mask[0]:
        gx = _mul(L, gf, L.b.broadcast_in_dim(L.to(weight, acc), gf.shape, [1])) if weight is not None else gf
        gx = L.b.reshape(gx, gshape)
        t1 = L.broadcast_to(mean_keep(L, gx, [2]), gshape)
        t2 = L.broadcast_to(mean_keep(L, _mul(L, gx, xhat), [2]), gshape)
        gi = _mul(L, rstd, _sub(L, _sub(L, gx, t1), _mul(L, xhat, t2)))
    if output_mask[1] and weight is not None:
        gw = reduce_sum(L, _mul(L, gf, L.b.reshape(xhat, (N, C, HxW))), [0, 2])
    if output_mask[2]:
        gb = reduce_sum(L, gf, [0, 2])
    return _meta_out(L, gi, 0), _meta_out(L, gw, 1), _meta_out(L, gb, 2)
