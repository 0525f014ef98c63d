"""Matrix products: mm, bmm, addmm, baddbmm, addbmm, dot/vdot, mv, addmv, outer products."""

from __future__ import annotations

from typing import Any

import torch

from ...stablehlo.builder import Value
from ..context import NodeLowering
from ..registry import register

aten = torch.ops.aten

_LOW_PRECISION = (torch.bfloat16, torch.float16)


def dot(L: NodeLowering, lhs: Value, rhs: Value, lc: list[int], rc: list[int], lb: list[int] = (), rb: list[int] = ()) -> Value:
    """dot_general with the program's precision. 16-bit inputs accumulate in f32 and
    convert after (XLA CPU's bf16-result dot is 2x slower, and f32 accumulation is what
    PyTorch does)."""
    out = L.out[0].dtype if L.out and L.out[0] is not None else lhs.dtype
    if lhs.dtype != rhs.dtype:
        common = torch.promote_types(lhs.dtype, rhs.dtype)
        lhs, rhs = L.to(lhs, common), L.to(rhs, common)
    acc = torch.float32 if lhs.dtype in _LOW_PRECISION else lhs.dtype
    if lhs.dtype is torch.bool:
        lhs, rhs, acc = L.to(lhs, torch.int32), L.to(rhs, torch.int32), torch.int32
    if lb and acc != lhs.dtype and all(lhs.shape[d] == 1 for d in lb):
        return L.to(_dot_without_unit_batch(L, lhs, rhs, lc, rc, lb, rb, acc), out)
    r = L.b.dot_general(lhs, rhs, lc, rc, lb, rb, out_dtype=acc, precision=L.ctx.precision)
    return L.to(r, out)


def _dot_without_unit_batch(L: NodeLowering, lhs: Value, rhs: Value, lc: list[int], rc: list[int], lb: list[int], rb: list[int], acc: torch.dtype) -> Value:
    """The same dot with its size-1 batch dimensions squeezed out. XLA's CPU runtime
    rewrites such a dot itself and, for bf16 x bf16 -> f32 with a transposed operand,
    reaches a DotThunk that cannot run it ("Unsupported element type"); a plain 2-D dot
    takes the fast bf16 path."""
    b = L.b

    def squeeze(x: Value, batch: list[int], contract: list[int]) -> tuple[Value, list[int]]:
        keep = [d for d in range(x.rank) if d not in batch]
        return b.reshape(x, [x.shape[d] for d in keep]), [keep.index(d) for d in contract]

    l2, lc2 = squeeze(lhs, list(lb), list(lc))
    r2, rc2 = squeeze(rhs, list(rb), list(rc))
    r = b.dot_general(l2, r2, lc2, rc2, [], [], out_dtype=acc, precision=L.ctx.precision)
    return b.reshape(r, [1] * len(lb) + list(r.shape))


def _beta_alpha(L: NodeLowering, base: Value | None, prod: Value, beta: Any, alpha: Any) -> Value:
    b = L.b
    out = L.out[0]
    if alpha is not None and (isinstance(alpha, Value) or alpha != 1):
        prod = b.binary("multiply", prod, L.full(alpha, prod.shape, prod.dtype))
    if base is None or (not isinstance(beta, Value) and beta == 0):
        return prod
    base = L.broadcast_to(L.to(base, out.dtype), out.shape)
    if isinstance(beta, Value) or beta != 1:
        base = b.binary("multiply", base, L.full(beta, base.shape, base.dtype))
    return b.binary("add", base, prod)


@register(aten.mm.default)
def mm(L: NodeLowering, a: Value, b: Value) -> Value:
    return dot(L, a, b, [1], [0])


@register(aten.bmm.default)
def bmm(L: NodeLowering, a: Value, b: Value) -> Value:
    return dot(L, a, b, [2], [1], [0], [0])


@register(aten.addmm.default)
def addmm(L: NodeLowering, x: Value, a: Value, b: Value, beta: Any = 1, alpha: Any = 1) -> Value:
    return _beta_alpha(L, x, dot(L, a, b, [1], [0]), beta, alpha)


@register(aten.baddbmm.default)
def baddbmm(L: NodeLowering, x: Value, a: Value, b: Value, beta: Any = 1, alpha: Any = 1) -> Value:
    return _beta_alpha(L, x, dot(L, a, b, [2], [1], [0], [0]), beta, alpha)


@register(aten.addbmm.default)
def addbmm(L: NodeLowering, x: Value, a: Value, b: Value, beta: Any = 1, alpha: Any = 1) -> Value:
    # sum over the batch: contract batch and k together
    return _beta_alpha(L, x, dot(L, a, b, [0, 2], [0, 1]), beta, alpha)


@register(aten.mv.default)
def mv(L: NodeLowering, a: Value, v: Value) -> Value:
    return dot(L, a, v, [1], [0])


@register(aten.addmv.default)
def addmv(L: NodeLowering, x: Value, a: Value, v: Value, beta: Any = 1, alpha: Any = 1) -> Value:
    return _beta_alpha(L, x, dot(L, a, v, [1], [0]), beta, alpha)


@register(aten.dot.default, aten.vdot.default)
def vector_dot(L: NodeLowering, a: Value, b: Value) -> Value:
    return dot(L, a, b, [0], [0])


@register(aten.addr.default)
def addr(L: NodeLowering, x: Value, v1: Value, v2: Value, beta: Any = 1, alpha: Any = 1) -> Value:
    return _beta_alpha(L, x, dot(L, L.b.reshape(v1, (v1.shape[0], 1)), L.b.reshape(v2, (1, v2.shape[0])), [1], [0]), beta, alpha)
