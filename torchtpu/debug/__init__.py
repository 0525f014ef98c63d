"""Tools for finding out what a model does on tpu and where it differs from the CPU.

- :func:`compare_with_cpu`: run a module on tpu and on a CPU copy and report the first
  submodule whose outputs (or gradients) differ (``compare.py``).
- :func:`explain`: why programs were compiled, where the host waited for the device, and
  which ops ran on the CPU (``explain.py``; ``TORCHTPU_EXPLAIN=1`` prints it at exit;
  ``explaining()`` records a block). The module is callable, so ``torchtpu.debug.explain()``
  works whether or not the submodule was imported.

Both are imported on first use, so ``import torchtpu`` does not pay for them.
"""

from __future__ import annotations

from typing import Any

_LAZY = {
    "compare_with_cpu": "compare",
    "Comparison": "compare",
    "ModuleDiff": "compare",
    "explain": "explain",
    "explaining": "explain",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'torchtpu.debug' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


__all__ = sorted(_LAZY)
