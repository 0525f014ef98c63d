"""Matrix products: mm, bmm, addmm, baddbmm, addbmm, dot/vdot, mv, addmv, outer products,
and torchtpu's batched linear (linear_nd), which keeps a dynamic dimension apart."""

from __future__ import annotations

from typing import Any

import torch

from ...stablehlo.builder import Value
from ...stablehlo.types import FLOAT8
from ..context import NodeLowering
from ..registry import register, register_meta

aten = torch.ops.aten

_LOW_PRECISION = (torch.bfloat16, torch.float16)


def dot(L: NodeLowering, lhs: Value, rhs: Value, lc: list[int], rc: list[int], lb: list[int] = (), rb: list[int] = ()) -> Value:
    """dot_general with the program's precision, in the output dtype."""
    out = L.out[0].dtype if L.out and L.out[0] is not None else lhs.dtype
    return L.to(dot_acc(L, lhs, rhs, lc, rc, lb, rb), out)


def dot_acc(L: NodeLowering, lhs: Value, rhs: Value, lc: list[int], rc: list[int], lb: list[int] = (), rb: list[int] = ()) -> Value:
    """dot_general with the program's precision, left in its accumulation dtype: 16-bit
    inputs accumulate in f32 (XLA CPU's bf16-result dot is 2x slower, and f32
    accumulation is what PyTorch does), so that a bias can be added before rounding."""
    if lhs.dtype in FLOAT8 or rhs.dtype in FLOAT8:  # exact in float32, which accumulates (as on the CPU)
        lhs, rhs = L.to(lhs, torch.float32), L.to(rhs, torch.float32)
    if lhs.dtype != rhs.dtype:
        common = torch.promote_types(lhs.dtype, rhs.dtype)
        lhs, rhs = L.to(lhs, common), L.to(rhs, common)
    acc = torch.float32 if lhs.dtype in _LOW_PRECISION else lhs.dtype
    if lhs.dtype is torch.bool:
        lhs, rhs, acc = L.to(lhs, torch.int32), L.to(rhs, torch.int32), torch.int32
    if lb and acc != lhs.dtype and all(lhs.shape[d] == 1 for d in lb):
        return _dot_without_unit_batch(L, lhs, rhs, lc, rc, lb, rb, acc)
    return L.b.dot_general(lhs, rhs, lc, rc, lb, rb, out_dtype=acc, precision=L.ctx.precision)


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
    """beta * base + alpha * prod, computed in the product's accumulation dtype and
    rounded once to the output dtype, as the CPU's BLAS does for 16-bit addmm/linear
    (adding a bf16 bias after rounding the product was ~2x farther from float64)."""
    b = L.b
    out = L.out[0]
    if alpha is not None and (isinstance(alpha, Value) or alpha != 1):
        prod = b.binary("multiply", prod, L.full(alpha, prod.shape, prod.dtype))
    if base is None or (not isinstance(beta, Value) and beta == 0):
        return L.to(prod, out.dtype)
    base = L.broadcast_to(L.to(base, prod.dtype), out.shape)
    if isinstance(beta, Value) or beta != 1:
        base = b.binary("multiply", base, L.full(beta, base.shape, base.dtype))
    return L.to(b.binary("add", base, prod), out.dtype)


@register(aten.mm.default)
def mm(L: NodeLowering, a: Value, b: Value) -> Value:
    return dot(L, a, b, [1], [0])


@register(aten._scaled_mm.default)
def scaled_mm(
    L: NodeLowering,
    a: Value,
    b: Value,
    scale_a: Value,
    scale_b: Value,
    bias: Value | None = None,
    scale_result: Value | None = None,
    out_dtype: torch.dtype | None = None,
    use_fast_accum: bool = False,
) -> Value:
    """A float8 product as the CPU computes it: each input in float32 times its scale (one
    per tensor, or, as CUDA's rowwise scaling, one per row of ``a`` and per column of
    ``b``), a float32 product, plus the bias, rounded to ``out_dtype``. ``scale_result``
    scales the result first (float8 outputs); ``use_fast_accum`` is a CUDA speed hint."""
    bld, f32 = L.b, torch.float32
    a = bld.binary("multiply", L.to(a, f32), L.broadcast_to(L.to(scale_a, f32), a.shape))
    b = bld.binary("multiply", L.to(b, f32), L.broadcast_to(L.to(scale_b, f32), b.shape))
    prod = dot_acc(L, a, b, [1], [0])
    if bias is not None:
        prod = bld.binary("add", prod, L.broadcast_to(L.to(bias, f32), prod.shape))
    if scale_result is not None:
        prod = bld.binary("multiply", prod, L.broadcast_to(L.to(scale_result, f32), prod.shape))
    return L.to(prod, L.out[0].dtype)


@register(aten._int_mm.default)
def int_mm(L: NodeLowering, a: Value, b: Value) -> Value:
    """int8 (or uint8) times int8, summed exactly in int32 (torchao's dynamic int8
    quantization)."""
    i32 = torch.int32
    return L.b.dot_general(L.to(a, i32), L.to(b, i32), [1], [0], [], [], out_dtype=i32, precision=L.ctx.precision)


@register(aten._weight_int8pack_mm.default)
def weight_int8pack_mm(L: NodeLowering, x: Value, w: Value, scales: Value) -> Value:
    """``x @ w.T * scales`` for int8 weights with one scale per output row (weight-only int8
    inference): in float32, rounded once to ``x``'s dtype, as the CPU's kernel computes it."""
    f32 = torch.float32
    prod = dot_acc(L, L.to(x, f32), L.to(w, f32), [1], [1])
    scaled = L.b.binary("multiply", prod, L.broadcast_to(L.to(scales, f32), prod.shape))
    return L.to(scaled, L.out[0].dtype)


@register(aten.bmm.default)
def bmm(L: NodeLowering, a: Value, b: Value) -> Value:
    return dot(L, a, b, [2], [1], [0], [0])


@register(aten.addmm.default)
def addmm(L: NodeLowering, x: Value, a: Value, b: Value, beta: Any = 1, alpha: Any = 1) -> Value:
    return _beta_alpha(L, x, dot_acc(L, a, b, [1], [0]), beta, alpha)


@register(aten.baddbmm.default)
def baddbmm(L: NodeLowering, x: Value, a: Value, b: Value, beta: Any = 1, alpha: Any = 1) -> Value:
    return _beta_alpha(L, x, dot_acc(L, a, b, [2], [1], [0], [0]), beta, alpha)


@register(aten.addbmm.default)
def addbmm(L: NodeLowering, x: Value, a: Value, b: Value, beta: Any = 1, alpha: Any = 1) -> Value:
    # sum over the batch: contract batch and k together
    return _beta_alpha(L, x, dot_acc(L, a, b, [0, 2], [0, 1]), beta, alpha)


@register(aten.mv.default)
def mv(L: NodeLowering, a: Value, v: Value) -> Value:
    return dot(L, a, v, [1], [0])


@register(aten.addmv.default)
def addmv(L: NodeLowering, x: Value, a: Value, v: Value, beta: Any = 1, alpha: Any = 1) -> Value:
    return _beta_alpha(L, x, dot_acc(L, a, v, [1], [0]), beta, alpha)


@register(aten.dot.default, aten.vdot.default)
def vector_dot(L: NodeLowering, a: Value, b: Value) -> Value:
    if L.op is aten.vdot.default:  # conjugates its first argument (complex)
        from .complex import conj

        a = conj(L, a)
    return dot(L, a, b, [0], [0])


@register(aten.addr.default)
def addr(L: NodeLowering, x: Value, v1: Value, v2: Value, beta: Any = 1, alpha: Any = 1) -> Value:
    return _beta_alpha(L, x, dot_acc(L, L.b.reshape(v1, (v1.shape[0], 1)), L.b.reshape(v2, (1, v2.shape[0])), [1], [0]), beta, alpha)


# -- linear without the reshape -------------------------------------------------------------
# aten's linear on a (batch, seq, d) input views it as (batch*seq, d). Under bounded
# dynamism (compile/dynamic.py) ``seq`` is padded and masked by XLA, and a reshape that
# folds it into ``batch`` gives wrong masks; these two ops contract over the last and
# over the leading dims directly, so the torch.compile backend swaps them in for batched
# linears before AOTAutograd traces (their backward uses them too).
@torch.library.custom_op("torchtpu::linear_nd", mutates_args=())
def _linear_nd(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.nn.functional.linear(x, weight, bias)


@torch.library.custom_op("torchtpu::contract_leading", mutates_args=())
def _contract_leading(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(…, m) x (…, n) -> (m, n), summed over every leading dim: a linear's weight gradient."""
    lead = list(range(a.dim() - 1))
    return torch.tensordot(a, b, dims=(lead, lead))


@_linear_nd.register_fake
def _linear_nd_fake(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


@_contract_leading.register_fake
def _contract_leading_fake(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a.new_empty((a.shape[-1], b.shape[-1]))


def _linear_nd_setup(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
    x, weight, bias = inputs
    ctx.save_for_backward(x, weight)
    ctx.has_bias = bias is not None


def _linear_nd_backward(ctx: Any, grad: torch.Tensor) -> tuple:
    x, weight = ctx.saved_tensors
    need_x, need_w, need_b = ctx.needs_input_grad
    grad_x = LINEAR_ND(grad, weight.t(), None) if need_x else None
    grad_w = CONTRACT_LEADING(grad, x) if need_w else None
    grad_b = grad.sum(dim=tuple(range(grad.dim() - 1))) if need_b and ctx.has_bias else None
    return grad_x, grad_w, grad_b


_linear_nd.register_autograd(_linear_nd_backward, setup_context=_linear_nd_setup)
LINEAR_ND = torch.ops.torchtpu.linear_nd.default
CONTRACT_LEADING = torch.ops.torchtpu.contract_leading.default


@register(LINEAR_ND)
def linear_nd(L: NodeLowering, x: Value, weight: Value, bias: Value | None = None) -> Value:
    return _beta_alpha(L, bias, dot_acc(L, x, weight, [x.rank - 1], [1]), 1, 1)


@register(CONTRACT_LEADING)
def contract_leading(L: NodeLowering, a: Value, b: Value) -> Value:
    lead = list(range(a.rank - 1))
    return dot(L, a, b, lead, lead)


# -- grouped matrix products (mixtures of experts) ---------------------------------------------
@register_meta(aten._grouped_mm.default)
def grouped_mm_meta(
    a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor | None = None, bias: torch.Tensor | None = None, out_dtype: Any = None
) -> torch.Tensor:
    """``_grouped_mm``'s result: PyTorch's Meta kernel demands bfloat16 (the CUDA fast
    path's dtype), but the CPU kernel and CUDA's fallback take every floating dtype, and
    transformers calls it with float32 on tpu under torch.compile (its MoE experts)."""
    torch._check(a.dim() in (2, 3) and b.dim() in (2, 3), lambda: f"Multiplicands must be 2D or 3D but got mat_a.dim()={a.dim()} and mat_b.dim()={b.dim()}")
    torch._check(a.dtype == b.dtype, lambda: f"Expected mat_a and mat_b of the same dtype, got {a.dtype} and {b.dtype}")
    torch._check(a.dtype.is_floating_point, lambda: f"Expected floating point inputs, got {a.dtype}")
    torch._check(a.size(-1) == b.size(-2), lambda: "contraction dimension of mat_a and mat_b must match")
    ragged = a.dim() == 2 or b.dim() == 2
    torch._check((offs is not None) == ragged, lambda: "Offsets tensor must be given exactly when a multiplicand is 2D")
    if offs is not None:
        torch._check(offs.dim() == 1 and offs.dtype == torch.int32, lambda: f"Offsets tensor must be a 1D int32 tensor, got {offs.dtype}")
    torch._check(bias is None, lambda: "Bias tensor provided, but it is not supported yet.")
    torch._check(out_dtype in (None, a.dtype), lambda: f"out_dtype {out_dtype} differs from the inputs' {a.dtype}")
    # the result's size per layout, from PyTorch's own Meta kernel (minus its dtype check)
    from torch._meta_registrations import _create_grouped_mm_output_tensor

    return _create_grouped_mm_output_tensor(a, b, offs, out_dtype)


def _group_masks(L: NodeLowering, offs: Value, length: int) -> Value:
    """(groups, length) bool: position p of the ragged dimension belongs to group g when
    ``offs[g-1] <= p < offs[g]`` (``offs`` holds each group's end; the first starts at 0).
    Positions past the last end belong to no group and give zeros."""
    b = L.b
    groups = offs.shape[0]
    ends = L.to(offs, torch.int32)
    starts = b.concatenate([b.constant(0, torch.int32, (1,)), b.slice(ends, [0], [groups - 1])], 0) if groups > 1 else b.constant(0, torch.int32, (1,))
    pos = b.iota((groups, length), 1, torch.int32)
    lo = b.broadcast_in_dim(starts, (groups, length), [0])
    hi = b.broadcast_in_dim(ends, (groups, length), [0])
    return b.binary("and", b.compare(pos, lo, "GE"), b.compare(pos, hi, "LT"))


def _masked(L: NodeLowering, x: Value, masks: Value, ragged_dim: int) -> Value:
    """(groups, *x.shape): x with the positions outside each group zeroed."""
    b = L.b
    shape = (masks.shape[0], *x.shape)
    keep = b.broadcast_in_dim(masks, shape, [0, 1 + ragged_dim])
    return b.select(keep, b.broadcast_in_dim(x, shape, list(range(1, x.rank + 1))), L.zeros(shape, x.dtype))


@register(aten._grouped_mm.default)
def grouped_mm(L: NodeLowering, a: Value, b: Value, offs: Value | None = None, bias: Any = None, out_dtype: Any = None) -> Value:
    """Each group's product as one dense product over masked operands: the operand with
    the ragged dimension is replicated per group with the other groups' positions zeroed,
    and the group axis is contracted (or kept, for groups along the contraction). Adding
    exact zeros changes no sum, so every result is its group's own product; the cost is
    groups x one product (XLA's ragged dot, native on TPU, is not available on its CPU).
    """
    if a.rank == 3 and b.rank == 3:
        return dot(L, a, b, [2], [1], [0], [0])
    if a.rank == 2 and b.rank == 3:  # rows of a in groups: out[r] = a[r] @ b[group(r)]
        masked = _masked(L, a, _group_masks(L, offs, a.shape[0]), 0)  # (G, rows, k)
        return dot(L, masked, b, [0, 2], [0, 1])
    if a.rank == 3:  # columns of b in groups: out[:, c] = a[group(c)] @ b[:, c]
        masked = _masked(L, b, _group_masks(L, offs, b.shape[1]), 1)  # (G, k, cols)
        return dot(L, a, masked, [0, 2], [0, 1])
    masked = _masked(L, a, _group_masks(L, offs, a.shape[1]), 1)  # (G, m, k): the contraction in groups
    return dot(L, masked, b, [2], [0])
