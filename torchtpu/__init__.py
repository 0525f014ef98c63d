"""torchtpu: a PyTorch-native "tpu" device backed by XLA through PjRT.

Installed, it loads with ``import torch`` (the ``torch.backends`` entry point calls
``_autoload``); set TORCH_DEVICE_BACKEND_AUTOLOAD=0 to turn that off and
``import torchtpu`` to load it by hand. The PjRT client starts on first device use.
"""

from __future__ import annotations

import threading
from typing import Any

from . import metrics
from .eager.modes import eager_mode, get_eager_mode, set_eager_mode

__all__ = ["eager_mode", "get_eager_mode", "mark_dynamic", "metrics", "platform", "set_eager_mode"]
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
        from .distributed import register_backend

        register_backend()
        _loaded = True


def mark_dynamic(t: Any, dim: int, max_size: int) -> Any:
    """Mark ``t.shape[dim]`` dynamic up to ``max_size`` for torch.compile(backend="tpu"):
    lengths run through a few padded bucket programs (see torchtpu.compile.dynamic)."""
    from .compile.dynamic import mark_dynamic as _mark

    return _mark(t, dim, max_size)


def platform() -> str:
    """The PjRT platform in use: "cpu", "tpu" or "cuda" (starts the client)."""
    from .runtime import pjrt

    return pjrt.get().platform


_autoload()
