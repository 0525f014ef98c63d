"""Padding-mode gradients PyTorch's decomposition tables lack.

Forward constant/reflect/replicate padding comes from PyTorch's decompositions; circular
padding is ``aten::_pad_circular`` (CompositeImplicit: the dispatcher decomposes it into
slices and copies before we see it). Here:
``replication_pad{1,2,3}d_backward`` -- each input edge element collects the gradient of
every output element that copied it, built from slices, one reduction and pads;
``reflection_pad{1,2,3}d_backward`` -- the centre, and the two edge runs reversed, added.
Both add 16-bit gradients in float32 and round once, as the CPU's kernels do (PyTorch's
reflect decomposition adds up to 2^d masked gathers in the 16-bit dtype, each rounding:
float16 reflection_pad3d's gradient was 2 ulps off where the CPU's is correctly rounded).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ...stablehlo.builder import Value, i64_array
from ..context import NodeLowering
from ..registry import register

aten = torch.ops.aten


def _slice_dim(L: NodeLowering, x: Value, dim: int, start: int, stop: int) -> Value:
    lo, hi = [0] * x.rank, list(x.shape)
    lo[dim], hi[dim] = start, stop
    return L.b.slice(x, lo, hi)


def _pad_dim(L: NodeLowering, x: Value, dim: int, low: int, high: int) -> Value:
    if low == 0 and high == 0:
        return x
    lo, hi = [0] * x.rank, [0] * x.rank
    lo[dim], hi[dim] = low, high
    return L.b.pad(x, L.b.constant(0, x.dtype), lo, hi)


def _sum_keep(L: NodeLowering, x: Value, dim: int) -> Value:
    b = L.b
    s = b.reduce([x], [b.constant(0, x.dtype)], [dim], lambda a, c: [b.binary("add", a, c)])[0]
    shape = list(x.shape)
    shape[dim] = 1
    return b.reshape(s, shape)


def _replicate_grad_dim(L: NodeLowering, g: Value, dim: int, n: int, lo: int, hi: int) -> Value:
    """Gradient of ``x[clamp(o - lo, 0, n - 1)]`` along ``dim`` (output size n + lo + hi)."""
    b = L.b
    m = g.shape[dim]
    start, stop = max(lo, 0), min(lo + n, m)
    out = _pad_dim(L, _slice_dim(L, g, dim, start, stop), dim, max(0, -lo), max(0, -hi))
    if lo > 0:
        out = b.binary("add", out, _pad_dim(L, _sum_keep(L, _slice_dim(L, g, dim, 0, lo), dim), dim, 0, n - 1))
    if hi > 0:
        out = b.binary("add", out, _pad_dim(L, _sum_keep(L, _slice_dim(L, g, dim, lo + n, m), dim), dim, n - 1, 0))
    return out


@register(
    aten.replication_pad1d_backward.default, aten.replication_pad2d_backward.default, aten.replication_pad3d_backward.default
)
def replication_pad_backward(L: NodeLowering, grad: Value, x: Value, padding: Sequence[int]) -> Value:
    return _pad_backward(L, grad, x, padding, _replicate_grad_dim)


def _pad_backward(L: NodeLowering, grad: Value, x: Value, padding: Sequence[int], grad_dim: Any) -> Value:
    """A padding's gradient, one padded dim at a time (the last dim first, as ``padding``
    lists them), summed in float32 for 16-bit gradients and rounded once."""
    acc = torch.float32 if grad.dtype in (torch.float16, torch.bfloat16) else grad.dtype
    g = L.to(grad, acc)
    for i in range(len(padding) // 2):
        dim = x.rank - 1 - i
        g = grad_dim(L, g, dim, x.shape[dim], int(padding[2 * i]), int(padding[2 * i + 1]))
    return L.to(g, L.out[0].dtype)


def _reverse(L: NodeLowering, x: Value, dim: int) -> Value:
    return L.b.op1("stablehlo.reverse", [x], x.shape, x.dtype, f"dimensions = {i64_array([dim])}")


def _reflect_grad_dim(L: NodeLowering, g: Value, dim: int, n: int, lo: int, hi: int) -> Value:
    """Gradient of ``x[reflect(o - lo)]`` along ``dim`` (output size n + lo + hi), where
    reflect(j) = -j for j < 0 and 2(n - 1) - j for j > n - 1. A negative pad crops."""
    b = L.b
    m = g.shape[dim]
    start, stop = max(lo, 0), min(lo + n, m)
    out = _pad_dim(L, _slice_dim(L, g, dim, start, stop), dim, max(0, -lo), max(0, -hi))
    if lo > 0:  # outputs 0..lo-1 read x[lo], ..., x[1]
        left = _reverse(L, _slice_dim(L, g, dim, 0, lo), dim)
        out = b.binary("add", out, _pad_dim(L, left, dim, 1, n - 1 - lo))
    if hi > 0:  # outputs lo+n..m-1 read x[n-2], ..., x[n-1-hi]
        right = _reverse(L, _slice_dim(L, g, dim, lo + n, m), dim)
        out = b.binary("add", out, _pad_dim(L, right, dim, n - 1 - hi, 1))
    return out


@register(aten.reflection_pad1d_backward.default, aten.reflection_pad2d_backward.default, aten.reflection_pad3d_backward.default)
def reflection_pad_backward(L: NodeLowering, grad: Value, x: Value, padding: Sequence[int]) -> Value:
    return _pad_backward(L, grad, x, padding, _reflect_grad_dim)
