"""Convolutions in compiled graphs take eager tpu's memory formats (CUDA's).

FakeTensorMode picks a convolution's output format from the convolution backend PyTorch
would select for the device (``torch._C._select_conv_backend``). For a PrivateUse1 tensor
that is the "Overrideable" backend, whose format is always contiguous, while eager tpu
follows CUDA (channels-last when the input or the weight is: ``eager/plan.py``). So under
``torch.compile`` a channels-last model's activations turned contiguous after its first
convolution: a compiled ResNet returned other strides than eager's, the gradients of its
channels-last weights too, and user code that views an activation
(``x.permute(0, 2, 3, 1).view(n, -1)``) traced differently from how it runs eagerly. Here
the fake convolution of tpu tensors gets eager's metadata: the eager plan's meta function
on the same sizes and strides.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode, unset_fake_temporarily

from ..eager.plan import plan_for

_CONVOLUTIONS = (torch.ops.aten.convolution.default, torch.ops.aten.convolution_backward.default)


def install() -> None:
    """Wrap PyTorch's fake implementations of the convolution ops (once)."""
    from torch._subclasses import fake_impls

    for op in _CONVOLUTIONS:
        pytorch_impl = fake_impls.op_implementations_dict[op]
        if not isinstance(pytorch_impl, functools.partial):  # not wrapped yet
            fake_impls.op_implementations_dict[op] = functools.partial(_as_eager, pytorch_impl)


def _as_eager(pytorch_impl: Any, fake_mode: FakeTensorMode, func: torch._ops.OpOverload, *args: Any, **kwargs: Any) -> Any:
    """PyTorch's fake result, restrided as eager tpu lays it out when the call is on tpu
    with static sizes (symbolic ones keep PyTorch's: the meta run needs concrete sizes)."""
    out = pytorch_impl(fake_mode, func, *args, **kwargs)
    tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, FakeTensor)]
    if not tensors or tensors[0].fake_device.type != "tpu" or not all(_static(t) for t in tensors):
        return out
    plan = plan_for(func)
    with unset_fake_temporarily():
        metas = plan.functional_meta(plan.bind(args, kwargs))
    results = list(out) if isinstance(out, tuple) else [out]
    with fake_mode:
        laid_out = [_like(r, m) for r, m in zip(results, metas)]
    return tuple(laid_out) if isinstance(out, tuple) else laid_out[0]


def _static(t: torch.Tensor) -> bool:
    return all(isinstance(n, int) for n in (*t.shape, *t.stride()))


def _like(fake: Any, meta: Any) -> Any:
    """``fake`` with ``meta``'s strides (a new fake tensor when they differ)."""
    if not isinstance(fake, FakeTensor) or not isinstance(meta, torch.Tensor) or fake.stride() == meta.stride():
        return fake
    return torch.empty_strided(fake.shape, meta.stride(), dtype=fake.dtype, device=fake.fake_device)
