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
# empty* are runtime kernels (tensor/minimal.py) that allocate without running anything
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
    after. For an integer result the CPU first converts start and end to it (truncating)."""
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
    # the divisor goes through an optimization barrier: XLA would turn the division by a
    # constant into a multiplication by its rounded reciprocal, and linspace(50, 1, 50) in
    # int64 would truncate 1 + 24 * 0.999... to 24 where the CPU's exact step gives 25
    (n,) = b.op("stablehlo.optimization_barrier", [b.constant(steps - 1, cdt)], [((), cdt)])
    step = b.binary("divide", b.binary("subtract", e, s), b.broadcast_in_dim(n, shape, []))
    idx = b.iota(shape, 0, cdt)
    lo = b.binary("add", s, b.binary("multiply", step, idx))
    rev = b.binary("subtract", L.full(steps - 1, shape, cdt), idx)
    hi = b.binary("subtract", e, b.binary("multiply", step, rev))
    first_half = b.compare(idx, L.full(steps // 2, shape, cdt), "LT")
    return b.select(first_half, lo, hi)


@register(aten.linspace.default, aten.linspace.Tensor_Tensor, aten.linspace.Tensor_Scalar, aten.linspace.Scalar_Tensor)
def linspace(L: NodeLowering, start: Any, end: Any, steps: int, **kwargs: Any) -> Value:
    out = L.out[0]
    if steps == 0:
        return L.zeros(out.shape, out.dtype)
    cdt = torch.float64 if L.ctx.supports_f64 else torch.float32
    # integer linspace: PyTorch also computes in double and truncates on conversion
    return L.to(_linspace_values(L, start, end, steps, cdt), out.dtype)


@register(aten.logspace.default, aten.logspace.Tensor_Tensor, aten.logspace.Tensor_Scalar, aten.logspace.Scalar_Tensor)
def logspace(L: NodeLowering, start: Any, end: Any, steps: int, base: Any = 10.0, **kwargs: Any) -> Value:
    out = L.out[0]
    if steps == 0:
        return L.zeros(out.shape, out.dtype)
    cdt = torch.float64 if L.ctx.supports_f64 else torch.float32
    exps = _linspace_values(L, start, end, steps, cdt)
    if isinstance(base, Value):
        base_v = L.broadcast_to(L.to(base, cdt), exps.shape)
    else:
        base_v = L.full(base, exps.shape, cdt)
    return L.to(L.b.binary("power", base_v, exps), out.dtype)


@register(aten.eye.default, aten.eye.m)
def eye(L: NodeLowering, n: int, m: int | None = None, **kwargs: Any) -> Value:
    out = L.out[0]
    rows = L.b.iota(out.shape, 0, torch.int64)
    cols = L.b.iota(out.shape, 1, torch.int64)
    return L.to(L.b.compare(rows, cols, "EQ"), out.dtype)
