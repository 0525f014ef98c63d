"""torchtpu: a PyTorch-native "tpu" device backed by XLA through PjRT.

Installed, it loads with ``import torch`` (the ``torch.backends`` entry point calls
``_autoload``); set TORCH_DEVICE_BACKEND_AUTOLOAD=0 to turn that off and
``import torchtpu`` to load it by hand. The PjRT client starts on first device use.
"""

from __future__ import annotations

import threading
from typing import Any

from . import metrics

__all__ = ["eager_mode", "get_eager_mode", "mark_dynamic", "metrics", "platform", "set_eager_mode"]
__version__ = "0.1.0"

_loaded = False
_load_lock = threading.Lock()


def _autoload() -> None:
    """Entry point called by ``import torch``."""
    global _loaded
    if _loaded:
        return
    # When torchtpu is imported before torch, importing torch runs its backend autoload,
    # which calls back into _autoload: let that inner call do the work, outside the lock.
    import torch  # noqa: F401

    with _load_lock:
        if _loaded:
            return
        from ._registration import register_device
        from .eager.register import register_runtime_kernels

        register_device()
        register_runtime_kernels()
        from .distributed import register_backend

        register_backend()
        from .op_report import enable_from_env

        enable_from_env()  # TORCHTPU_OP_REPORT=1
        from . import config

        if config.flag("TORCHTPU_EXPLAIN"):
            from .debug.explain import enable_from_env as explain_from_env

            explain_from_env()
        _loaded = True


# The mode API is imported lazily: torchtpu may be imported before torch, and importing
# torch runs the autoload entry point, which needs this module to be defined first.
def set_eager_mode(mode: str) -> None:
    """Set the execution mode: "eager", "defer_and_fuse" or "launch_blocking"."""
    from .eager.modes import set_eager_mode as _set

    _set(mode)


def get_eager_mode() -> str:
    """The calling thread's execution mode."""
    from .eager.modes import get_eager_mode as _get

    return _get()


def eager_mode(mode: str) -> Any:
    """Context manager: ``with torchtpu.eager_mode("defer_and_fuse"): ...`` (this thread)."""
    from .eager.modes import eager_mode as _ctx

    return _ctx(mode)


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


_SUBMODULES = ("debug", "kernels", "library", "profiler")


def __getattr__(name: str) -> Any:
    """``torchtpu.debug``, ``.kernels``, ``.library`` and ``.profiler`` without importing them
    first (imported on first use, so ``import torch`` does not pay for them)."""
    if name in _SUBMODULES:
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'torchtpu' has no attribute {name!r}")
