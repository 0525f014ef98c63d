"""Bridges to libraries that choose a device themselves (Hugging Face accelerate,
PyTorch Lightning) or that check device names (flex_attention)."""

from __future__ import annotations

import torch


def tpu_is_current_accelerator() -> bool:
    """Whether ``torch.accelerator`` names tpu: where the bridges make tpu a library's
    default, as the library makes CUDA its default where CUDA is the accelerator."""
    accelerator = torch.accelerator.current_accelerator()
    return accelerator is not None and accelerator.type == "tpu"
