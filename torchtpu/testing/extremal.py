"""Extremal inputs for the conformance run: NaN, +-inf, +-0, subnormals and the dtype's limits.

``sample_inputs`` rarely holds such values, so a lowering that mishandles them (a sign of
NaN, a max that drops NaN, an integer overflow at the limit) passes the ordinary run. The
``extremal`` mode feeds these values to the elementwise ops and the reductions:

- elementwise unary and binary ops: PyTorch's own small-value, large-value and
  extremal-value generators (the ones ``reference_inputs`` uses, honouring the op's
  ``handles_large_floats`` / ``handles_complex_extremal_values``), plus every value of
  :func:`extremal_values` (binary ops: every pair of them);
- reductions: each sample of ``sample_inputs`` with its input refilled from
  :func:`extremal_values`, so the reduction sees NaN, infinities and the limits together.

Subnormals get samples of their own, named :data:`FLUSHED`: XLA's CPU runtime executes
every program with denormals flushed to zero on input and output (FTZ and DAZ, as
TensorFlow does; TPU hardware flushes them too), which no option turns off. Those samples
are compared with the CPU run under ``torch.set_flush_denormal(True)`` (float32, float64,
bfloat16 and complex; float16 subnormals survive on XLA:CPU), so the difference is stated once
instead of hiding in every op's entry. The CPU's float64 libm does not honour the flag
everywhere (log of a float64 subnormal stays finite): such entries are recorded.
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Iterator
from typing import Any

import torch

# The name of the samples that hold subnormals (compared with the CPU flushing them).
FLUSHED = "subnormals (compared with torch.set_flush_denormal(True) on the CPU)"
# The dtypes whose subnormals XLA's CPU runtime flushes: the ones its generated code handles
# as float/double, and bfloat16, which has float32's exponent range: its subnormals widen to
# float32 subnormals, which the float32 arithmetic then reads as zero (bfloat16 2^-128 == 0
# is true on tpu, as on the CPU under the flag). float16 subnormals widen to normal float32
# values and survive, so float16's subnormal samples are compared with the CPU as it is.
FLUSHED_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.complex64, torch.complex128)


def extremal_values(dtype: torch.dtype, subnormals: bool = False) -> list[Any]:
    """NaN, infinities, signed zeros, the limits and a few ordinary values; with
    ``subnormals``, the smallest normal and two subnormals too (floating dtypes)."""
    if dtype == torch.bool:
        return [False, True]
    if dtype.is_floating_point or dtype.is_complex:
        real = torch.finfo(dtype.to_real() if dtype.is_complex else dtype)
        values = [math.nan, math.inf, -math.inf, 0.0, -0.0, real.max, -real.max, 1.0, -1.0, 0.5, -2.5]
        if subnormals:
            values += [real.smallest_normal, real.smallest_normal / 4, -real.smallest_normal / 4]
        if dtype.is_complex:
            return [complex(a, b) for a, b in itertools.product(values[:7:2] + [1.0] + values[11:12], repeat=2)]
        return values
    info = torch.iinfo(dtype)
    return sorted({info.min, info.min + 1, -1, 0, 1, 2, info.max - 1, info.max})


def _tensor(values: list[Any], dtype: torch.dtype) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


def _unary(op: Any, dtype: torch.dtype) -> Iterator[Any]:
    from torch.testing._internal.opinfo import core

    kw = {"device": "cpu", "dtype": dtype, "requires_grad": False}
    if dtype not in (torch.bool,):
        yield from core.generate_elementwise_unary_small_value_tensors(op, **kw)
    if dtype not in (torch.bool, torch.uint8, torch.int8) and (op.handles_large_floats or not dtype.is_floating_point):
        if not dtype.is_complex:
            yield from core.generate_elementwise_unary_large_value_tensors(op, **kw)
    if dtype.is_floating_point or (dtype.is_complex and op.handles_complex_extremal_values):
        yield from core.generate_elementwise_unary_extremal_value_tensors(op, **kw)
    if dtype.is_complex and not op.handles_complex_extremal_values:
        return
    x = _tensor(extremal_values(dtype), dtype)
    yield core.SampleInput(x, kwargs=op.sample_kwargs("cpu", dtype, x)[0])
    if dtype.is_floating_point or dtype.is_complex:
        x = _tensor(extremal_values(dtype, subnormals=True), dtype)
        yield core.SampleInput(x, kwargs=op.sample_kwargs("cpu", dtype, x)[0], name=FLUSHED)


def _binary(op: Any, dtype: torch.dtype) -> Iterator[Any]:
    from torch.testing._internal.opinfo import core

    kw = {"device": "cpu", "dtype": dtype, "requires_grad": False}
    if dtype != torch.bool:
        yield from core.generate_elementwise_binary_small_value_tensors(op, **kw)
    if dtype not in (torch.bool, torch.uint8, torch.int8):
        yield from core.generate_elementwise_binary_large_value_tensors(op, **kw)
    if dtype.is_floating_point or dtype.is_complex:
        yield from core.generate_elementwise_binary_extremal_value_tensors(op, **kw)
    for subnormals in (False, True) if dtype.is_floating_point or dtype.is_complex else (False,):
        pairs = [p for p in itertools.product(extremal_values(dtype, subnormals), repeat=2) if not _traps(p, dtype)]
        lhs, rhs = _tensor([a for a, _ in pairs], dtype), _tensor([b for _, b in pairs], dtype)
        kwargs = op.sample_kwargs("cpu", dtype, lhs)[0]
        yield core.SampleInput(lhs, args=(rhs,), kwargs=kwargs, name=FLUSHED if subnormals else "")


def _traps(pair: tuple[Any, Any], dtype: torch.dtype) -> bool:
    """Integer pairs holding the dtype's minimum: PyTorch's CPU kernels execute x86
    divisions that trap on (min, -1) (``torch.div(min, -1, rounding_mode="trunc")`` and
    int16 ``lcm`` kill the process with SIGFPE), so no CPU reference exists for them. The
    minimum stays in the unary and reduction samples."""
    integral = not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)
    return integral and torch.iinfo(dtype).min in pair


def _refilled(sample: Any, dtype: torch.dtype, subnormals: bool) -> Any:
    """``sample`` with its input's values replaced by the extremal values, tiled."""
    x = sample.input
    if not isinstance(x, torch.Tensor) or x.numel() == 0:
        return None
    values = _tensor(extremal_values(dtype, subnormals), dtype)
    filled = values.repeat(-(-x.numel() // values.numel()))[: x.numel()].reshape(x.shape)
    return sample.__class__(filled, args=sample.args, kwargs=sample.kwargs, name=FLUSHED if subnormals else "")


def _reduction(op: Any, dtype: torch.dtype) -> Iterator[Any]:
    inexact = dtype.is_floating_point or dtype.is_complex
    for sample in op.sample_inputs("cpu", dtype):
        for subnormals in (False, True) if inexact else (False,):
            refilled = _refilled(sample, dtype, subnormals)
            if refilled is not None:
                yield refilled


def kind(op: Any) -> str | None:
    """``unary``, ``binary`` or ``reduction`` for the ops the extremal run covers; else None."""
    from torch.testing._internal.opinfo.core import BinaryUfuncInfo, ReductionOpInfo, UnaryUfuncInfo

    if isinstance(op, UnaryUfuncInfo):
        return "unary"
    if isinstance(op, BinaryUfuncInfo):
        return "binary"
    if isinstance(op, ReductionOpInfo):
        return "reduction"
    return None


_GENERATORS = {"unary": _unary, "binary": _binary, "reduction": _reduction}


@contextlib.contextmanager
def cpu_flushing_like_xla(sample: Any) -> Iterator[None]:
    """Within: the CPU flushes subnormals, as XLA's CPU runtime does, if ``sample`` is a
    :data:`FLUSHED` one."""
    x = sample.input
    if getattr(sample, "name", "") != FLUSHED or (isinstance(x, torch.Tensor) and x.dtype not in FLUSHED_DTYPES):
        yield
        return
    torch.set_flush_denormal(True)
    try:
        yield
    finally:
        torch.set_flush_denormal(False)


def samples(op: Any, dtype: torch.dtype) -> Iterator[Any]:
    """The extremal samples of ``op`` in ``dtype`` (CPU tensors, like ``sample_inputs``)."""
    family = kind(op)
    if family is None:
        return iter(())
    return _GENERATORS[family](op, dtype)
