"""The backward of the fused weight normalisation, as a decomposition.

``torch._weight_norm`` (``nn.utils.weight_norm`` and its parametrization) calls the fused
``_weight_norm_interface`` when ``dim`` is the first or last dimension; PyTorch decomposes
that forward but has no decomposition for its backward, ``_weight_norm_interface_backward``.
Here it follows ATen's CPU kernel (WeightNormKernel.cpp), with ``w = v * g / ||v||`` and the
norm taken over every dimension but ``dim``:

    grad_g = sum(grad_w * v) / norm
    grad_v = (g / norm) * grad_w - (g / norm) * (grad_g / norm) * v
"""

from __future__ import annotations

import torch

from ..decomp import register_own

aten = torch.ops.aten


@register_own(aten._weight_norm_interface_backward.default)
def _weight_norm_interface_backward(
    grad_w: torch.Tensor, saved_v: torch.Tensor, saved_g: torch.Tensor, saved_norms: torch.Tensor, dim: int
) -> tuple[torch.Tensor, torch.Tensor]:
    others = [d for d in range(saved_v.dim()) if d != dim]
    # reduced-precision inputs accumulate in float32, as the CPU and CUDA kernels do
    compute = torch.float32 if saved_v.dtype in (torch.float16, torch.bfloat16) else saved_v.dtype
    grad, v, g, norm = (t.to(compute) for t in (grad_w, saved_v, saved_g, saved_norms))
    per_slice = (grad * v).sum(others, keepdim=True) if others else grad * v
    grad_g = per_slice / norm
    a = g / norm
    b = a * grad_g / norm
    grad_v = a * grad - b * v
    return grad_v.to(saved_v.dtype), grad_g.to(saved_g.dtype)
