"""Hugging Face: make ``accelerate`` pick the tpu device, as transformers already does.

transformers (>= 5.23) selects "tpu" by itself: ``TrainingArguments.device`` asks
``torch.accelerator.current_accelerator()``, and pipelines accept ``device="tpu"``. The
``Trainer`` also hands the model to accelerate's ``Accelerator``, which moves it to
``PartialState().device``; accelerate (1.15) knows a fixed list of device types and
answers "cpu" for any other, so the Trainer would train on the CPU and then fail on the
tpu inputs. accelerate's own switch for other devices, ``ACCELERATE_TORCH_DEVICE``, would
also override ``use_cpu=True``; so torchtpu extends ``PartialState.default_device``
instead: where accelerate found no device it knows and tpu is the current accelerator, the
default device is tpu. ``use_cpu=True`` (``cpu=True``) and ``ACCELERATE_TORCH_DEVICE`` keep
their meaning, and an accelerate that learns ``torch.accelerator`` itself (its PR #4278)
makes this a no-op.

accelerate is not imported here: the extension is applied when ``accelerate.state`` is
first imported (or at once, if it already was).
"""

from __future__ import annotations

import importlib.abc
import sys
from typing import Any

import torch

_STATE_MODULE = "accelerate.state"


def _tpu_is_current_accelerator() -> bool:
    accelerator = torch.accelerator.current_accelerator()
    return accelerator is not None and accelerator.type == "tpu"


def extend_default_device(state_module: Any) -> None:
    """Wrap ``state_module.PartialState.default_device`` (once)."""
    cls = getattr(state_module, "PartialState", None)
    original = getattr(cls, "default_device", None) if cls is not None else None
    if not isinstance(original, property) or getattr(original.fget, "_torchtpu", False):
        return  # an accelerate without this property: leave it alone

    def default_device(self: Any) -> torch.device:
        device = original.fget(self)
        if device.type == "cpu" and _tpu_is_current_accelerator():
            return torch.device("tpu", torch.accelerator.current_device_index())
        return device

    default_device._torchtpu = True  # type: ignore[attr-defined]
    cls.default_device = property(default_device, doc=original.__doc__)


class _ExtendOnImport(importlib.abc.MetaPathFinder):
    """Finds ``accelerate.state`` through the other finders and extends it once loaded."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != _STATE_MODULE:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module

        def exec_and_extend(module: Any) -> None:
            exec_module(module)
            extend_default_device(module)

        loader.exec_module = exec_and_extend  # this spec's loader only
        return spec


def install() -> None:
    """Extend accelerate now if it is loaded, else when it is first imported."""
    if _STATE_MODULE in sys.modules:
        extend_default_device(sys.modules[_STATE_MODULE])
        return
    if not any(isinstance(f, _ExtendOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _ExtendOnImport())
