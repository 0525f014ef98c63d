"""Fake quantization (quantization-aware training): the ops behind
``torch.fake_quantize_per_tensor_affine``, ``torch.fake_quantize_per_channel_affine``,
``torch.ao.quantization.FakeQuantize`` and the learnable variants (LSQ).

They have CPU and CUDA kernels and no decomposition. These follow the CPU kernels
(aten/src/ATen/native/quantized/cpu/kernels/QuantizedOpKernels.cpp, fake_quant_*.cpp):

- the arithmetic is float32 whatever the input dtype (a half input is widened, the result
  stored back in its dtype), with ``inv_scale = 1.0f / scale`` multiplied, not divided;
- ``q = nearbyint(x * inv_scale) + zero_point`` (round half to even, then add) for an
  integer zero point; ``q = nearbyint(zero_point + x * inv_scale)`` for a float one;
- the mask (which elements the straight-through gradient passes) is
  ``quant_min <= q <= quant_max``, False for NaN and infinities;
- out-of-range values: the per-tensor kernel clamps ``q`` as a float (NaN goes to
  quant_min); the per-channel kernel first converts ``q`` to int64, which on x86 turns NaN,
  infinities and |q| >= 2**63 into INT64_MIN, so they come out as quant_min.

The gradients: ``fake_quantize_per_*_affine_cachemask_backward`` is ``grad * mask``
(a composite); the learnable ops' backwards are below, also as the CPU computes them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .decomp import meta_where_missing, register_own

aten = torch.ops.aten

_INT64_EDGE = 2.0**63


def _quantized(q: torch.Tensor, zero_point: Any, scale: Any, quant_min: int, quant_max: int, int64_cast: bool) -> torch.Tensor:
    """``(clamp(q, quant_min, quant_max) - zero_point) * scale`` with the kernels' handling of
    values no clamp orders (see the module docstring)."""
    if int64_cast:
        bad = ~torch.isfinite(q) | (q.abs() >= _INT64_EDGE)
    else:
        bad = torch.isnan(q)
    clamped = torch.where(bad, float(quant_min), q.clamp(quant_min, quant_max))
    return (clamped - zero_point) * scale


def _check(x: torch.Tensor, quant_min: int, quant_max: int, zero_point: int | None = None) -> None:
    """The CPU kernels' argument checks that need no tensor values."""
    if not x.is_floating_point():
        raise NotImplementedError(f"fake quantization is not implemented for {x.dtype}")
    if quant_min > quant_max:
        raise RuntimeError("`quant_min` should be less than or equal to `quant_max`.")
    if zero_point is not None and not quant_min <= zero_point <= quant_max:
        raise RuntimeError("`zero_point` must be between `quant_min` and `quant_max`.")


def _in_range(q: torch.Tensor, quant_min: int, quant_max: int) -> torch.Tensor:
    return (q >= quant_min) & (q <= quant_max)


@register_own(aten.fake_quantize_per_tensor_affine_cachemask.default)
def _fake_quantize_per_tensor_affine_cachemask(
    x: torch.Tensor, scale: float, zero_point: int, quant_min: int, quant_max: int
) -> tuple[torch.Tensor, torch.Tensor]:
    _check(x, quant_min, quant_max, zero_point)
    s = np.float32(scale)  # the kernel's float scale and 1.0f / scale, as weak float32 scalars
    q = torch.round(x.float() * float(np.float32(1.0) / s)) + float(zero_point)
    out = _quantized(q, float(zero_point), float(s), quant_min, quant_max, int64_cast=False)
    return out.to(x.dtype), _in_range(q, quant_min, quant_max)


@register_own(aten._fake_quantize_per_tensor_affine_cachemask_tensor_qparams.default)
def _fake_quantize_per_tensor_affine_cachemask_tensor_qparams(
    x: torch.Tensor,
    scale: torch.Tensor,
    zero_point: torch.Tensor,
    fake_quant_enabled: torch.Tensor,
    quant_min: int,
    quant_max: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel reads element 0 of each parameter tensor; with fake quantization off it
    passes ``x`` through with an all-True mask. The zero point is read as an int32 (a float
    one truncated), the scale as a float."""
    _check(x, quant_min, quant_max)
    s = scale.reshape(-1)[0].float()
    z = zero_point.reshape(-1)[0].to(torch.int32).float()
    on = fake_quant_enabled.reshape(-1)[0] != 0
    q = torch.round(x.float() * (1.0 / s)) + z
    out = _quantized(q, z, s, quant_min, quant_max, int64_cast=False).to(x.dtype)
    return torch.where(on, out, x), torch.where(on, _in_range(q, quant_min, quant_max), True)


def _per_channel(t: torch.Tensor, x: torch.Tensor, axis: int) -> torch.Tensor:
    """A per-channel parameter shaped to broadcast along ``axis`` of ``x``."""
    shape = [1] * x.dim()
    shape[axis] = -1
    return t.reshape(shape)


def _fake_quantize_per_channel(
    x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor, axis: int, quant_min: int, quant_max: int
) -> tuple[torch.Tensor, torch.Tensor]:
    _check(x, quant_min, quant_max)
    if scale.dtype not in (torch.float32, torch.bfloat16):
        raise RuntimeError(f"Scale must be Float or BFloat16, found {scale.dtype}")
    if zero_point.dtype not in (torch.int32, torch.float32, torch.float16):
        raise RuntimeError(f"Zero-point must be Int32, Float or Half, found {zero_point.dtype}")
    if scale.dim() != 1 or zero_point.dim() != 1:
        raise RuntimeError("scale and zero point should be 1-D tensors")
    if scale.numel() != zero_point.numel():
        raise RuntimeError("scale and zero-point need to have the same dimensions")
    if not 0 <= axis < max(x.dim(), 1):
        raise RuntimeError("`axis` must be between 0 and number of dimensions of input")
    if scale.numel() != (x.shape[axis] if x.dim() else 1):
        raise RuntimeError("dimensions of scale and zero-point are not consistent with input tensor")
    # (an int32 zero point outside [quant_min, quant_max], which the CPU refuses after
    # reading its values, is not checked: that would wait for the device)
    s = _per_channel(scale.float(), x, axis)
    z = _per_channel(zero_point.float(), x, axis)
    t = x.float() * (1.0 / s)
    q = torch.round(z + t) if zero_point.is_floating_point() else torch.round(t) + z
    out = _quantized(q, z, s, quant_min, quant_max, int64_cast=True)
    return out.to(x.dtype), _in_range(q, quant_min, quant_max)


register_own(aten.fake_quantize_per_channel_affine_cachemask.default)(_fake_quantize_per_channel)


# -- learnable scale and zero point (LSQ): the fake quantization above, and its gradients --
def _learnable_zero_point(zero_point: torch.Tensor, quant_min: int, quant_max: int, forward: bool) -> torch.Tensor:
    """``_get_zero_point_from_tensor``: the forward rounds half to even, the backward adds
    0.5 and truncates; both clamp to [quant_min, quant_max] first."""
    z = zero_point[0].float()
    z = torch.round(z) if forward else z + 0.5
    return torch.trunc(z.clamp(quant_min, quant_max))


@register_own(aten._fake_quantize_learnable_per_tensor_affine.default)
def _fake_quantize_learnable_per_tensor_affine(
    x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor, quant_min: int, quant_max: int, grad_factor: float = 1.0
) -> torch.Tensor:
    s = scale[0].float()
    z = _learnable_zero_point(zero_point, quant_min, quant_max, forward=True)
    q = torch.round(x.float() * (1.0 / s)) + z
    return _quantized(q, z, s, quant_min, quant_max, int64_cast=False).to(x.dtype)


def _learnable_grads(
    dy: torch.Tensor, x: torch.Tensor, s: torch.Tensor, z: torch.Tensor, quant_min: int, quant_max: int, grad_factor: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Elementwise dX, dScale, dZeroPoint of the CPU's learnable-fake-quant gradient kernels
    (``q = nearbyint(zero_point + x * inv_scale)``; the straight-through estimator for x;
    LSQ's gradients for scale and zero point)."""
    inv = 1.0 / s
    xf, dyf = x.float(), dy.float()
    q = torch.round(z + xf * inv)
    low, high = q < quant_min, q > quant_max
    inside = ~(low | high)
    dx = dyf * inside
    xfq = (q.clamp(quant_min, quant_max) - z) * s
    d_scale = (
        torch.where(inside, dyf * (xfq - xf) * inv, torch.where(low, dyf * (quant_min - z), dyf * (quant_max - z))) * grad_factor
    )
    d_zero = torch.where(inside, 0.0, dyf * -1 * s * grad_factor)
    return dx, d_scale, d_zero


@register_own(aten._fake_quantize_learnable_per_tensor_affine_backward.default)
def _fake_quantize_learnable_per_tensor_affine_backward(
    dy: torch.Tensor,
    x: torch.Tensor,
    scale: torch.Tensor,
    zero_point: torch.Tensor,
    quant_min: int,
    quant_max: int,
    grad_factor: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    s = scale[0].float()
    z = _learnable_zero_point(zero_point, quant_min, quant_max, forward=False)
    dx, d_scale, d_zero = _learnable_grads(dy, x, s, z, quant_min, quant_max, grad_factor)
    # the CPU sums in X's dtype (float32, which it requires of X, scale and the gradient)
    return dx.to(x.dtype), d_scale.sum().reshape(1).to(x.dtype), d_zero.sum().reshape(1).to(x.dtype)


@register_own(aten._fake_quantize_learnable_per_channel_affine.default)
def _fake_quantize_learnable_per_channel_affine(
    x: torch.Tensor,
    scale: torch.Tensor,
    zero_point: torch.Tensor,
    axis: int,
    quant_min: int,
    quant_max: int,
    grad_factor: float = 1.0,
) -> torch.Tensor:
    """The CPU rounds the zero points (half to even), clamps them and casts them to int32."""
    z = torch.round(zero_point).clamp(quant_min, quant_max).to(torch.int32)
    return _fake_quantize_per_channel(x, scale, z, axis, quant_min, quant_max)[0]


@register_own(aten._fake_quantize_learnable_per_channel_affine_backward.default)
def _fake_quantize_learnable_per_channel_affine_backward(
    dy: torch.Tensor,
    x: torch.Tensor,
    scale: torch.Tensor,
    zero_point: torch.Tensor,
    axis: int,
    quant_min: int,
    quant_max: int,
    grad_factor: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """As the per-tensor backward, per channel: the zero points are rounded as
    ``nearbyint`` then clamped (``zero_point.round().clamp(...)``), and the per-element
    gradients of scale and zero point are summed over every axis but ``axis``."""
    s = _per_channel(scale.float(), x, axis)
    z = _per_channel(torch.round(zero_point.float()).clamp(quant_min, quant_max), x, axis)
    dx, d_scale, d_zero = _learnable_grads(dy, x, s, z, quant_min, quant_max, grad_factor)
    others = [d for d in range(x.dim()) if d != axis]
    d_scale, d_zero = (d_scale.sum(others), d_zero.sum(others)) if others else (d_scale, d_zero)
    return dx.to(x.dtype), d_scale.to(x.dtype), d_zero.to(x.dtype)


# -- Meta kernels (output shapes for eager dispatch and torch.compile), where PyTorch has none
def _like_and_mask(x: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(x), torch.empty_like(x, dtype=torch.bool)


def _like(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    return torch.empty_like(x)


def _learnable_per_tensor_backward_meta(
    dy: torch.Tensor, x: torch.Tensor, scale: torch.Tensor, *args: Any, **kwargs: Any
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.empty_like(x), x.new_empty((1,)), x.new_empty((1,))


def _learnable_per_channel_backward_meta(
    dy: torch.Tensor, x: torch.Tensor, scale: torch.Tensor, *args: Any, **kwargs: Any
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.empty_like(x), x.new_empty(scale.shape), x.new_empty(scale.shape)


for _name, _fn in (
    ("fake_quantize_per_tensor_affine_cachemask", _like_and_mask),
    ("_fake_quantize_per_tensor_affine_cachemask_tensor_qparams", _like_and_mask),
    ("fake_quantize_per_channel_affine_cachemask", _like_and_mask),
    ("_fake_quantize_learnable_per_tensor_affine", _like),
    ("_fake_quantize_learnable_per_channel_affine", _like),
    ("_fake_quantize_learnable_per_tensor_affine_backward", _learnable_per_tensor_backward_meta),
    ("_fake_quantize_learnable_per_channel_affine_backward", _learnable_per_channel_backward_meta),
):
    meta_where_missing(_name, _fn)
