"""The per-device halves of ``nn.SyncBatchNorm``: the five ops its autograd function
calls around its collectives (``torch/nn/modules/_functions.py``), which PyTorch has for
CUDA only, and ``batch_norm_update_stats``. Each is written with tpu ops, in CUDA's arithmetic: statistics in float32 for
16-bit inputs, the variance biased, ``invstd = 1 / sqrt(var + eps)``, the running
variance updated with the unbiased variance of all ranks' elements.

Kernels, not lowering rules: ``batch_norm_gather_stats_with_counts`` updates the running
statistics in place although its schema does not say so (CUDA's kernel writes them), and
the rest are short compositions that run as their ops in every eager mode.
"""

from __future__ import annotations

from typing import Any

import torch

aten = torch.ops.aten


def _accumulation_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype


def _reduced_dims(x: torch.Tensor) -> list[int]:
    """Every dim but the channels (dim 1)."""
    return [0, *range(2, x.dim())]


def _per_channel(v: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """A (C,) vector shaped to broadcast along ``x``'s channels."""
    return v.reshape(1, -1, *([1] * (x.dim() - 2)))


def _move_running_stats(
    running_mean: torch.Tensor | None, running_var: torch.Tensor | None, mean: torch.Tensor, unbiased_var: torch.Tensor, momentum: float
) -> None:
    """The running statistics moved toward this batch's, in place (CUDA's kernels write
    them although the ops' schemas do not say so)."""
    if running_mean is not None:
        running_mean.copy_(momentum * mean + (1 - momentum) * running_mean)
    if running_var is not None:
        running_var.copy_(momentum * unbiased_var + (1 - momentum) * running_var)


def batch_norm_stats(x: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's per-channel mean and ``1 / sqrt(biased variance + eps)``."""
    var, mean = torch.var_mean(x.to(_accumulation_dtype(x)), _reduced_dims(x), correction=0)
    return mean, (var + eps).rsqrt()


def batch_norm_gather_stats_with_counts(
    x: torch.Tensor,
    mean: torch.Tensor,
    invstd: torch.Tensor,
    running_mean: torch.Tensor | None,
    running_var: torch.Tensor | None,
    momentum: float,
    eps: float,
    counts: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """All ranks' statistics merged (``mean``/``invstd`` are (ranks, C), ``counts`` the
    elements per channel of each rank): the mean and invstd of the whole batch, and the
    running statistics moved toward them in place."""
    n = counts.to(mean.dtype).unsqueeze(1)
    total = n.sum(0)
    whole_mean = (n * mean).sum(0) / total
    rank_var = invstd.reciprocal().square() - eps
    spread = (n * (rank_var + (mean - whole_mean).square())).sum(0)  # n * the whole batch's biased variance
    _move_running_stats(running_mean, running_var, whole_mean, spread / (total - 1), momentum)
    return whole_mean, (spread / total + eps).rsqrt()


def batch_norm_gather_stats(
    x: torch.Tensor,
    mean: torch.Tensor,
    invstd: torch.Tensor,
    running_mean: torch.Tensor | None,
    running_var: torch.Tensor | None,
    momentum: float,
    eps: float,
    count: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The same with every rank holding ``count`` elements per channel."""
    counts = torch.full((mean.shape[0],), count, dtype=mean.dtype, device=mean.device)
    return batch_norm_gather_stats_with_counts(x, mean, invstd, running_mean, running_var, momentum, eps, counts)


def batch_norm_update_stats(
    x: torch.Tensor, running_mean: torch.Tensor | None, running_var: torch.Tensor | None, momentum: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """This batch's per-channel mean and biased variance, and the running statistics moved
    toward the mean and the unbiased variance in place (the CPU's and CUDA's kernel)."""
    dims = _reduced_dims(x)
    var, mean = torch.var_mean(x.to(_accumulation_dtype(x)), dims, correction=0)
    n = x.numel() // max(x.shape[1], 1)
    _move_running_stats(running_mean, running_var, mean, var * (n / max(n - 1, 1)), momentum)
    return mean, var


def batch_norm_elemt(
    x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, mean: torch.Tensor, invstd: torch.Tensor, eps: float
) -> torch.Tensor:
    """``(x - mean) * invstd * weight + bias`` per channel, in float32 for 16-bit ``x``."""
    y = (x.to(_accumulation_dtype(x)) - _per_channel(mean, x)) * _per_channel(invstd, x)
    if weight is not None:
        y = y * _per_channel(weight, x)
    if bias is not None:
        y = y + _per_channel(bias, x)
    return y.to(x.dtype)


def batch_norm_backward_reduce(
    grad_out: torch.Tensor,
    x: torch.Tensor,
    mean: torch.Tensor,
    invstd: torch.Tensor,
    weight: torch.Tensor | None,
    input_g: bool,
    weight_g: bool,
    bias_g: bool,
) -> tuple[Any, Any, Any, Any]:
    """This rank's ``sum(dy)`` and ``sum(dy * (x - mean))`` per channel (summed over the
    ranks before ``batch_norm_backward_elemt``), and the weight's and bias's gradients
    from them; None where not asked for, as CUDA leaves them undefined."""
    acc, dims = mean.dtype, _reduced_dims(x)
    dy = grad_out.to(acc)
    sum_dy = dy.sum(dims)
    sum_dy_xmu = (dy * (x.to(acc) - _per_channel(mean, x))).sum(dims)
    param_dtype = weight.dtype if weight is not None else x.dtype
    return (
        sum_dy if input_g else None,
        sum_dy_xmu if input_g else None,
        (sum_dy_xmu * invstd).to(param_dtype) if weight_g else None,
        sum_dy.to(param_dtype) if bias_g else None,
    )


def batch_norm_backward_elemt(
    grad_out: torch.Tensor,
    x: torch.Tensor,
    mean: torch.Tensor,
    invstd: torch.Tensor,
    weight: torch.Tensor | None,
    sum_dy: torch.Tensor,
    sum_dy_xmu: torch.Tensor,
    count: torch.Tensor,
) -> torch.Tensor:
    """The input's gradient from the sums over every rank (``count``: each rank's elements
    per channel)."""
    acc = mean.dtype
    total = count.sum().to(acc)
    grad_mean = sum_dy / total
    projection = sum_dy_xmu / total * invstd.square()
    scale = invstd if weight is None else invstd * weight.to(acc)
    centered = x.to(acc) - _per_channel(mean, x)
    dx = (grad_out.to(acc) - _per_channel(grad_mean, x) - centered * _per_channel(projection, x)) * _per_channel(scale, x)
    return dx.to(x.dtype)


def kernels() -> dict[Any, Any]:
    return {
        aten.batch_norm_stats.default: batch_norm_stats,
        aten.batch_norm_gather_stats_with_counts.default: batch_norm_gather_stats_with_counts,
        aten.batch_norm_gather_stats.default: batch_norm_gather_stats,
        aten.batch_norm_update_stats.default: batch_norm_update_stats,
        aten.batch_norm_elemt.default: batch_norm_elemt,
        aten.batch_norm_backward_reduce.default: batch_norm_backward_reduce,
        aten.batch_norm_backward_elemt.default: batch_norm_backward_elemt,
    }
