"""The fast paths of ``nn.MultiheadAttention`` and ``nn.TransformerEncoderLayer``.

In eval mode without autograd (inference, ``torch.no_grad()``), PyTorch runs self-attention
and encoder layers through two fused ops for "cpu", "cuda" and the PrivateUse1 device:
``_native_multi_head_attention`` and ``_transformer_encoder_layer_fwd``. They have CPU and
CUDA kernels and no decomposition. These are that math in ATen ops, in the CPU kernel's
order (attention.cpp, transformer.cpp): one input projection, the query scaled by
1/sqrt(head_dim), a masked softmax where a True mask element is left out (a row with
nothing left is NaN, as the CPU's ``_masked_softmax`` gives), the output projection; the
encoder layer adds residuals and layer norms before or after each block.
"""

from __future__ import annotations

import math

import torch

from .decomp import register_own

aten = torch.ops.aten

_PADDING, _SRC, _GENERIC = 1, 0, 2  # mask_type: (B, T) key padding, (T, T), (B, H, T, T)


def _projections(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v: the three slices of the packed in-projection applied to query, key, value."""
    if query is key and key is value:  # self-attention: one product, as the kernel makes it
        return torch.nn.functional.linear(query, weight, bias).chunk(3, dim=-1)
    w, b = weight.chunk(3), bias.chunk(3)
    return tuple(torch.nn.functional.linear(x, wi, bi) for x, wi, bi in zip((query, key, value), w, b))


def _heads(x: torch.Tensor, num_head: int) -> torch.Tensor:
    """[B, T, D] -> [B, H, T, D / H]."""
    b, t, d = x.shape
    return x.view(b, t, num_head, d // num_head).transpose(1, 2)


def _mask_for_scores(mask: torch.Tensor, mask_type: int | None, scores: torch.Tensor) -> torch.Tensor:
    """The boolean mask broadcast over the [B, H, T, S] scores (True: left out)."""
    mask = mask if mask.dtype == torch.bool else mask != 0
    if mask_type == _PADDING:
        mask = mask.view(mask.shape[0], 1, 1, mask.shape[-1])
    return mask.expand(scores.shape)


@register_own(aten._native_multi_head_attention.default)
def _native_multi_head_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    embed_dim: int,
    num_head: int,
    qkv_weight: torch.Tensor,
    qkv_bias: torch.Tensor,
    proj_weight: torch.Tensor,
    proj_bias: torch.Tensor,
    mask: torch.Tensor | None = None,
    need_weights: bool = True,
    average_attn_weights: bool = True,
    mask_type: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    q, k, v = (_heads(x, num_head) for x in _projections(query, key, value, qkv_weight, qkv_bias))
    q = q / math.sqrt(embed_dim // num_head)
    scores = q @ k.transpose(-2, -1)
    if mask is not None:
        scores = scores.masked_fill(_mask_for_scores(mask, mask_type, scores), float("-inf"))
    weights = scores.softmax(-1)
    context = (weights @ v).transpose(1, 2).reshape(query.shape[0], query.shape[1], embed_dim)
    out = torch.nn.functional.linear(context, proj_weight, proj_bias)
    if not need_weights:
        return out, None
    if average_attn_weights:
        weights = weights.sum(1) / num_head
    return out, weights


@register_own(aten._transformer_encoder_layer_fwd.default)
def _transformer_encoder_layer_fwd(
    src: torch.Tensor,
    embed_dim: int,
    num_heads: int,
    qkv_weight: torch.Tensor,
    qkv_bias: torch.Tensor,
    proj_weight: torch.Tensor,
    proj_bias: torch.Tensor,
    use_gelu: bool,
    norm_first: bool,
    eps: float,
    norm_weight_1: torch.Tensor,
    norm_bias_1: torch.Tensor,
    norm_weight_2: torch.Tensor,
    norm_bias_2: torch.Tensor,
    ffn_weight_1: torch.Tensor,
    ffn_bias_1: torch.Tensor,
    ffn_weight_2: torch.Tensor,
    ffn_bias_2: torch.Tensor,
    mask: torch.Tensor | None = None,
    mask_type: int | None = None,
) -> torch.Tensor:
    F = torch.nn.functional

    def norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (embed_dim,), weight, bias, eps)

    x = norm(src, norm_weight_1, norm_bias_1) if norm_first else src
    x = _native_multi_head_attention(
        x, x, x, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, mask, False, True, mask_type
    )[0]
    x = x + src
    if not norm_first:
        x = norm(x, norm_weight_1, norm_bias_1)
    residual = x
    if norm_first:
        x = norm(x, norm_weight_2, norm_bias_2)
    hidden = F.linear(x, ffn_weight_1, ffn_bias_1)
    hidden = F.gelu(hidden) if use_gelu else F.relu(hidden)
    x = F.linear(hidden, ffn_weight_2, ffn_bias_2) + residual
    if not norm_first:
        x = norm(x, norm_weight_2, norm_bias_2)
    return x
