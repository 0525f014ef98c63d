"""``Tensor.pin_memory()`` when the tpu device is the current accelerator, for an install
without the C++ hooks (torchtpu/csrc/hooks.cpp, which pin for real).

``DataLoader(pin_memory=True)`` (the default of Hugging Face's ``Trainer``) pins every batch
for ``torch.accelerator.current_accelerator()``. PyTorch's CPU kernel asks the PrivateUse1
hooks for a pinned-memory allocator, which only a C++ hooks object can provide; without one
the loader raises. The PjRT client copies host arrays into device buffers itself (there is
no page-locked staging buffer to hand it), so pinning for tpu means: a private contiguous
host copy, which is what ``pin_memory`` promises the caller. Pinning for any other device
(an explicit ``device="cuda"``, or another accelerator being current) runs PyTorch's kernel.
"""

from __future__ import annotations

from typing import Any

import torch

_libs: list[torch.library.Library] = []
_PIN = torch.ops.aten._pin_memory.default


def _pins_for_tpu(device: Any) -> bool:
    if device is not None:
        return torch.device(device).type == "tpu"
    accelerator = torch.accelerator.current_accelerator()
    return accelerator is not None and accelerator.type == "tpu"


def _pin_memory(x: torch.Tensor, device: Any = None) -> torch.Tensor:
    if _pins_for_tpu(device):
        return x.clone(memory_format=torch.contiguous_format)
    return _PIN._op_dk(torch._C.DispatchKey.CompositeExplicitAutograd, x, device)


def install() -> None:
    """Route ``aten::_pin_memory`` of CPU tensors through ``_pin_memory`` (once)."""
    if _libs:
        return
    lib = torch.library.Library("aten", "IMPL")
    lib.impl("_pin_memory", _pin_memory, "CPU")
    _libs.append(lib)
