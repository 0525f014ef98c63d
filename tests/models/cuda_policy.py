"""CUDA's autocast policy on the CPU, for the reference side of an autocast comparison.

``torch.autocast("tpu")`` follows CUDA's policy; ``torch.autocast("cpu")`` has its own
(convolutions and matmuls in bfloat16 alike, but the CPU keeps fft, linalg and pooling in
float32 and leaves layer_norm and softmax alone, where CUDA runs them in float32). A model
under the two policies computes different things, so the CPU's rounding errors say
nothing about tpu's. Inside ``cuda_policy_on_the_cpu()`` the CPU's autocast key runs
torchtpu's own CUDA-policy kernels (torchtpu/device/amp.py, made for the CPU) and lets
every other op through: the CPU then casts exactly what tpu casts, and what differs is
only how each op rounds. On exit the CPU's own kernels are back.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator

import torch

from torchtpu.device import amp

_KEY = amp.AUTOCAST_KEYS["cpu"]


def _cpu_policy_ops() -> list[str]:
    """The aten overloads the CPU's autocast key has a kernel for ("aten::mm", ...)."""
    return [
        name.removeprefix("aten::")
        for name in torch._C._dispatch_get_all_op_names()
        if name.startswith("aten::") and torch._C._dispatch_has_kernel_for_dispatch_key(name, _KEY)
    ]


@contextlib.contextmanager
def cuda_policy_on_the_cpu() -> Iterator[None]:
    ours = amp.kernels("cpu")
    lib = torch.library.Library("aten", "IMPL")
    try:
        with warnings.catch_warnings():  # "Overriding a previously registered kernel"
            warnings.simplefilter("ignore")
            for name in _cpu_policy_ops():
                if name.removesuffix(".default") not in ours:
                    lib.impl(name, torch.library.fallthrough_kernel, _KEY)
            for name, kernel in ours.items():
                lib.impl(name, kernel, _KEY)
        yield
    finally:
        lib._destroy()
