"""Matmul/convolution precision: ``torch.tpu.precision`` and ``torch.set_float32_matmul_precision``.

Every dot_general and convolution we emit carries a StableHLO ``precision_config``:

==========  ===========  ==========================================================
PyTorch     StableHLO    on TPU
==========  ===========  ==========================================================
"medium"    DEFAULT      one bf16 pass, f32 accumulation (the default here)
"high"      HIGH         three bf16 passes (~3x the cost of DEFAULT)
"highest"   HIGHEST      six passes, full f32 (~6x)
==========  ===========  ==========================================================

The effective precision is, first match wins: the innermost ``torch.tpu.precision(...)``
context of this thread, then a value the user set with
``torch.set_float32_matmul_precision``, then "medium". PyTorch's own global starts at
"highest", which would make every TPU matmul 6x slower by default, so we only honour it
once the user has set it (we wrap the setter to notice). The choice is part of every
cache key, eager and compiled.
"""

from __future__ import annotations

import enum
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch


class Precision(enum.Enum):
    DEFAULT = "DEFAULT"
    HIGH = "HIGH"
    HIGHEST = "HIGHEST"
    MEDIUM = "DEFAULT"  # an alias: PyTorch's name for DEFAULT


_FROM_TORCH = {"medium": Precision.DEFAULT, "high": Precision.HIGH, "highest": Precision.HIGHEST}
_COST = {Precision.HIGH: "~3x", Precision.HIGHEST: "~6x"}


class _ThreadPrecision(threading.local):
    stack: list | None = None  # a class default: reading it on a new thread raises nothing


_local = _ThreadPrecision()
_user_global: Precision | None = None
_warned: set[Precision] = set()


def _parse(value: Any) -> Precision:
    if isinstance(value, Precision):
        return value
    if isinstance(value, str):
        key = value.strip().lower()
        if key in _FROM_TORCH:
            return _FROM_TORCH[key]
        if key.upper() in Precision.__members__:
            return Precision[key.upper()]
    raise ValueError(
        f"unknown precision {value!r}: use 'medium', 'high' or 'highest' (or torch.tpu.Precision.DEFAULT/HIGH/HIGHEST)"
    )


def _warn_cost(p: Precision) -> None:
    if p in _COST and p not in _warned:
        _warned.add(p)
        warnings.warn(
            f"torchtpu: matmul precision {p.value} costs {_COST[p]} the time of DEFAULT on TPU "
            "(bf16 passes); use 'medium' unless you need the extra float32 accuracy.",
            stacklevel=3,
        )


def current() -> str:
    """The StableHLO precision name ("DEFAULT", "HIGH" or "HIGHEST") in effect on this thread."""
    # called once per op: ``_value_`` is the plain attribute behind Enum's ``value`` property
    stack = _local.stack
    if stack:
        return stack[-1]._value_
    return "DEFAULT" if _user_global is None else _user_global._value_


@contextmanager
def precision(value: str | Precision) -> Iterator[None]:
    """Thread-local matmul/convolution precision: ``with torch.tpu.precision("high"): ...``."""
    p = _parse(value)
    _warn_cost(p)
    stack = _local.stack
    if stack is None:
        stack = _local.stack = []
    stack.append(p)
    try:
        yield
    finally:
        stack.pop()


def get_precision() -> Precision:
    return Precision(current())


def _on_set_float32_matmul_precision(value: str) -> None:
    global _user_global
    p = _parse(value)
    _user_global = p
    _warn_cost(p)


def install_torch_hook() -> None:
    """Wrap ``torch.set_float32_matmul_precision`` so we see the user's choice."""
    original = torch.set_float32_matmul_precision
    if getattr(original, "_torchtpu", False):
        return

    def set_float32_matmul_precision(precision: str) -> None:
        original(precision)  # validates and sets PyTorch's own global first
        _on_set_float32_matmul_precision(precision)

    set_float32_matmul_precision._torchtpu = True  # type: ignore[attr-defined]
    set_float32_matmul_precision.__doc__ = original.__doc__
    torch.set_float32_matmul_precision = set_float32_matmul_precision
