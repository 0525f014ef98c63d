"""torchtpu: a PyTorch-native "tpu" device backed by XLA through PjRT.

Installed, it loads with ``import torch`` (the ``torch.backends`` entry point calls
``_autoload``); set TORCH_DEVICE_BACKEND_AUTOLOAD=0 to turn that off and
``import torchtpu`` to load it by hand. The PjRT client starts on first device use.
"""

from __future__ import annotations

import threading

from . import metrics

__all__ = ["metrics", "platform"]
__version__ = "0.1.0"

_loaded = False
_load_lock = threading.Lock()


def _autoload() -> None:
    """Entry point called by ``import torch``."""
    global _loaded
    if _loaded:
        return
    with _load_lock:
        if _loaded:
            return
        from ._registration import register_device
        from .eager.register import register_runtime_kernels

        register_device()
        register_runtime_kernels()
        _loaded = True


def platform() -> str:
    """The PjRT platform in use: "cpu", "tpu" or "cuda" (starts the client)."""
    from .runtime import pjrt

    return pjrt.get().platform


_autoload()
