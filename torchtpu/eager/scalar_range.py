"""Scalar arguments that do not fit the tensor's dtype: refused as the CPU refuses them.

The CPU kernels of ``fill_``, ``masked_fill``, ``full``, ``clamp``, ``index_fill``,
``hardtanh``, ``addcmul(value=)``, ``add(alpha=)`` and many more convert their ``Scalar``
arguments with ``c10::checked_convert``, which raises ``RuntimeError: value cannot be
converted to type c10::BFloat16 without overflow`` for ``masked_fill(mask,
torch.finfo(torch.float32).min)`` on a bfloat16 tensor (DeBERTa under autocast), 300 into
uint8, NaN into an integer tensor. Our programs take scalars as device operands and would
silently store inf, a wrapped integer or a saturated one instead.

Which op converts which argument to which type (the tensor's dtype, or float for a
bfloat16 tensor's opmath) is the kernels' business, so the CPU decides: a call whose
``Scalar`` arguments could overflow one of its dtypes (``suspect``; cheap, per call) runs
once on CPU stand-ins of its arguments, and the CPU's exception is raised. A call the CPU
accepts is remembered (by its eager cache key and its scalar values), so a loop that
fills with -inf or 1e9 asks the CPU once.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch

from ..runner.bounded import BoundedCache
from . import cpu_errors
from .plan import KIND_TENSOR, OpPlan

# every value in [-FITS_EVERY_FLOAT, FITS_EVERY_FLOAT] fits every floating dtype (the max of
# float8_e4m3fnuz, the narrowest; torch.full(..., 500.0, dtype=torch.float8_e4m3fn) is the
# CPU's overflow error), every integer in [-128, 127] every integer dtype the CPU checks (int8; uint8 takes -1
# as 255, as the CPU's conversion does)
FITS_EVERY_FLOAT = 240.0
_ACCEPTED = BoundedCache("scalar arguments the CPU accepted", limit=4096)


def suspect(plan: OpPlan, values: list[Any]) -> bool:
    """Whether a ``Scalar`` argument of this call may not fit a dtype of the call."""
    dtypes = None  # the call's dtypes, found once a value needs them
    for i in plan.scalar_positions:
        v = values[i]
        if type(v) is int and -128 <= v <= 127:
            continue
        if type(v) is float and -FITS_EVERY_FLOAT <= v <= FITS_EVERY_FLOAT:
            continue
        if v is None or isinstance(v, bool):
            continue
        dtypes = dtypes or _dtypes(plan, values)
        if not all(_fits(v, dtype) for dtype in dtypes):
            return True
    return False


def check(plan: OpPlan, values: list[Any], args: tuple, kwargs: dict, key: tuple) -> None:
    """Raise the CPU's exception for this call's scalars, if it has one (``suspect`` calls)."""
    accepted = (key, tuple(values[i] for i in plan.scalar_positions))
    try:
        if accepted in _ACCEPTED:
            return
    except TypeError:  # an unhashable scalar (a SymFloat): no memory, ask every time
        accepted = None
    error = cpu_errors.cpu_error(plan.op, args, kwargs, uninitialized_floats=True)
    if error is not None:
        error.torchtpu_as_cpu = True  # type: ignore[attr-defined]
        raise error
    if accepted is not None:
        _ACCEPTED[accepted] = True


def _dtypes(plan: OpPlan, values: list[Any]) -> list[torch.dtype]:
    """The dtypes a scalar may be converted to: the tensors' (not bool: the CPU converts
    any number to True), a dtype= argument, or (a factory without either) the default."""
    found = [v.dtype for k, v in zip(plan.kinds, values) if k == KIND_TENSOR and isinstance(v, torch.Tensor) and v.dtype is not torch.bool]
    found.extend(v for v in values if isinstance(v, torch.dtype) and v is not torch.bool)
    return found or [torch.get_default_dtype()]


def _fits(v: Any, dtype: torch.dtype) -> bool:
    if isinstance(v, complex):
        return dtype.is_complex and _fits(v.real, dtype) and _fits(v.imag, dtype)
    if not isinstance(v, (int, float)):
        return False  # a symbolic number: let the CPU decide
    if dtype.is_floating_point or dtype.is_complex:
        return math.isinf(v) or math.isnan(v) or abs(v) <= _max(dtype)
    if isinstance(v, float) and not math.isfinite(v):
        return False
    info = _iinfo(dtype)
    return info.min <= v <= info.max


@functools.cache
def _max(dtype: torch.dtype) -> float:
    real = {torch.complex32: torch.float16, torch.complex64: torch.float32, torch.complex128: torch.float64}.get(dtype, dtype)
    return float(torch.finfo(real).max)


@functools.cache
def _iinfo(dtype: torch.dtype) -> torch.iinfo:
    return torch.iinfo(dtype)
