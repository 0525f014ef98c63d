"""The dispatcher side of fused scaled_dot_product_attention (its lowering rules live in
``lowering/rules/attention.py``).

``aten::scaled_dot_product_attention`` is overridden for ``AutogradPrivateUse1`` and
``PrivateUse1`` by a kernel that validates the inputs as the math backend does and calls
``torchtpu::sdpa_forward``, through an autograd Function whose backward is
``torchtpu::sdpa_backward``: one program each way. ``dropout_p > 0`` runs PyTorch's math
decomposition instead.
"""

from __future__ import annotations

from typing import Any

import torch

from ..lowering.rules.attention import SDPA_BACKWARD, SDPA_FORWARD, kv_batch, sdpa_batch
from .register import _make_kernel

aten = torch.ops.aten


class _SDPA(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None,
        is_causal: bool,
        scale: float | None,
    ) -> torch.Tensor:  # noqa: ANN401
        out, lse = torch.ops.torchtpu.sdpa_forward(q, k, v, mask, is_causal, scale)
        ctx.save_for_backward(q, k, v, mask, out, lse)
        ctx.is_causal, ctx.scale = is_causal, scale
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:  # noqa: ANN401
        q, k, v, mask, out, lse = ctx.saved_tensors
        mask_grad = mask is not None and ctx.needs_input_grad[3]
        dq, dk, dv, dmask = torch.ops.torchtpu.sdpa_backward(grad, q, k, v, mask, out, lse, ctx.is_causal, ctx.scale, mask_grad)
        return dq, dk, dv, (dmask if mask_grad else None), None, None


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, enable_gqa: bool) -> None:
    """The math backend's input rules: same dtype, rank >= 2, batch dims that broadcast
    (a key/value head count other than 1 or the query's needs ``enable_gqa``), and a mask
    that broadcasts to the scores' shape."""
    if not (q.dtype == k.dtype == v.dtype):
        raise RuntimeError(
            f"scaled_dot_product_attention: expected query, key and value to have the same dtype, got {q.dtype}, {k.dtype}, {v.dtype}"
        )
    if min(q.dim(), k.dim(), v.dim()) < 2:
        raise RuntimeError("scaled_dot_product_attention: query, key and value must have at least 2 dimensions")
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise RuntimeError(
            f"scaled_dot_product_attention: shapes do not match: query {tuple(q.shape)}, key {tuple(k.shape)}, value {tuple(v.shape)}"
        )
    if q.dim() >= 3 and min(k.dim(), v.dim()) >= 3:
        hq, hk, hv = q.shape[-3], k.shape[-3], v.shape[-3]
        if enable_gqa and not (hq == hk == hv) and (hq % hk or hq % hv):
            raise RuntimeError(
                f"scaled_dot_product_attention: number of heads in key and value ({hk}, {hv}) must divide the number of heads in query ({hq})"
            )
        if not enable_gqa and any(h not in (1, hq) for h in (hk, hv)) and hq != 1:
            raise RuntimeError(
                f"scaled_dot_product_attention: query has {hq} heads and key/value {hk}/{hv}; "
                "pass enable_gqa=True with a query head count divisible by the key/value head count"
            )
    try:
        sdpa_batch(q.shape, k.shape, v.shape)
    except RuntimeError as e:
        raise RuntimeError(
            f"scaled_dot_product_attention: batch dims of query {tuple(q.shape)}, key {tuple(k.shape)}, value {tuple(v.shape)} do not broadcast: {e}"
        ) from None
    if mask is None:
        return
    if mask.dtype != torch.bool and mask.dtype != q.dtype:
        raise RuntimeError(f"scaled_dot_product_attention: expected attn_mask dtype to be bool or {q.dtype}, got {mask.dtype}")
    # the math backend adds the mask in place to the scores (batch of query and key)
    scores = (*torch.broadcast_shapes(tuple(q.shape[:-2]), kv_batch(q.shape, k.shape)), q.shape[-2], k.shape[-2])
    try:
        fits = torch.broadcast_shapes(tuple(mask.shape), scores) == scores
    except RuntimeError:
        fits = False
    if not fits:
        raise RuntimeError(
            f"scaled_dot_product_attention: attn_mask of shape {list(mask.shape)} does not broadcast to the attention scores' shape {list(scores)}"
        )


def scaled_dot_product_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    *,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """The tpu kernel of ``aten::scaled_dot_product_attention``."""
    if dropout_p > 0.0:
        return aten._scaled_dot_product_attention_math.default(
            query, key, value, attn_mask, dropout_p, is_causal, None, scale=scale, enable_gqa=enable_gqa
        )[0]
    if is_causal and attn_mask is not None:
        raise RuntimeError("scaled_dot_product_attention: explicit attn_mask should not be set when is_causal=True")
    _check(query, key, value, attn_mask, enable_gqa)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (query, key, value, attn_mask)):
        return _SDPA.apply(query, key, value, attn_mask, is_causal, scale)
    return torch.ops.torchtpu.sdpa_forward(query, key, value, attn_mask, is_causal, scale)[0]


def register_kernels() -> list[torch.library.Library]:
    """Dispatcher kernels: our two ops on the tpu key, and the sdpa override (called from
    ``register.ensure_op_kernels`` once the generic kernels are in place)."""
    ours = torch.library.Library("torchtpu", "IMPL")
    for name, op in (("sdpa_forward", SDPA_FORWARD), ("sdpa_backward", SDPA_BACKWARD)):
        ours.impl(name, _make_kernel(op), "PrivateUse1")
    lib = torch.library.Library("aten", "IMPL")
    lib.impl("scaled_dot_product_attention", scaled_dot_product_attention, "AutogradPrivateUse1")
    lib.impl("scaled_dot_product_attention", scaled_dot_product_attention, "PrivateUse1")
    return [ours, lib]
