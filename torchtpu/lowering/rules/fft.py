"""FFTs through ``stablehlo.fft``: PyTorch's three primitives ``_fft_c2c``, ``_fft_r2c``
and ``_fft_c2r`` (every ``torch.fft`` function and their backwards reduce to them).

``stablehlo.fft`` transforms the trailing 1-3 dims, so the requested dims are moved to
the end (and back), and more than three are done in groups (the transform is separable).
XLA's inverse transforms divide by the signal size; PyTorch's primitives take the
normalization as an argument (0: none, 1: 1/sqrt(n), 2: 1/n), so one final multiply
applies the difference.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ...stablehlo.builder import Value, prod
from ...stablehlo.types import is_complex
from ..context import NodeLowering
from ..registry import register
from .complex import part_dtype

aten = torch.ops.aten
_COMPLEX_OF = {torch.float32: torch.complex64, torch.float64: torch.complex128}


def _over(L: NodeLowering, x: Value, dims: Sequence[int], fft_type: str, last: int | None = None) -> Value:
    """One ``stablehlo.fft`` over ``dims`` (at most 3), moved to the trailing position.
    ``last`` is the real signal length of the last dim for IRFFT."""
    b = L.b
    others = [d for d in range(x.rank) if d not in dims]
    perm = others + list(dims)
    xt = b.transpose(x, perm)
    lengths = list(xt.shape[len(others) :])
    shape = list(xt.shape)
    dtype = x.dtype
    if fft_type == "RFFT":
        shape[-1] = lengths[-1] // 2 + 1
        dtype = _COMPLEX_OF[x.dtype]
    elif fft_type == "IRFFT":
        lengths[-1] = last
        shape[-1] = last
        dtype = part_dtype(x.dtype)
    y = b.fft(xt, fft_type, lengths, shape, dtype)
    inverse = sorted(range(len(perm)), key=lambda i: perm[i])
    return b.transpose(y, inverse)


def _groups(dims: Sequence[int]) -> list[list[int]]:
    dims = list(dims)
    return [dims[max(0, i - 3) : i] for i in range(len(dims), 0, -3)]


def _scale(L: NodeLowering, y: Value, n: int, normalization: int, xla_divided: bool) -> Value:
    factor = {0: 1.0, 1: 1.0 / math.sqrt(n), 2: 1.0 / n}[int(normalization)] if n else 1.0
    if xla_divided:
        factor *= n
    if factor == 1.0:
        return y
    return L.b.binary("multiply", y, L.full(factor, y.shape, y.dtype))


def _norm_dims(dims: Sequence[int], rank: int) -> list[int]:
    return [int(d) % rank for d in dims]


@register(aten._fft_c2c.default)
def fft_c2c(L: NodeLowering, x: Value, dim: Sequence[int], normalization: int, forward: bool) -> Value:
    dims = _norm_dims(dim, x.rank)
    if not dims:
        return x
    y = x
    for group in _groups(dims):
        y = _over(L, y, group, "FFT" if forward else "IFFT")
    n = prod(x.shape[d] for d in dims)
    return _scale(L, y, n, normalization, xla_divided=not forward)


@register(aten._fft_r2c.default)
def fft_r2c(L: NodeLowering, x: Value, dim: Sequence[int], normalization: int, onesided: bool) -> Value:
    dims = _norm_dims(dim, x.rank)
    n = prod(x.shape[d] for d in dims)
    if not onesided:  # the full spectrum: a complex transform of the real input
        y = L.to(x, _COMPLEX_OF[x.dtype])
        for group in _groups(dims):
            y = _over(L, y, group, "FFT")
        return _scale(L, y, n, normalization, xla_divided=False)
    groups = _groups(dims)  # groups[0] holds the last dim: the halved one
    y = _over(L, x, groups[0], "RFFT")
    for group in groups[1:]:
        y = _over(L, y, group, "FFT")
    return _scale(L, y, n, normalization, xla_divided=False)


@register(aten._fft_c2r.default)
def fft_c2r(L: NodeLowering, x: Value, dim: Sequence[int], normalization: int, last_dim_size: int) -> Value:
    dims = _norm_dims(dim, x.rank)
    last = int(last_dim_size)
    need = last // 2 + 1
    d = dims[-1]
    if x.shape[d] > need:  # only the first n//2+1 bins carry the Hermitian half
        limit = list(x.shape)
        limit[d] = need
        x = L.b.slice(x, [0] * x.rank, limit)
    elif x.shape[d] < need:
        high = [0] * x.rank
        high[d] = need - x.shape[d]
        x = L.b.pad(x, L.b.constant(0, x.dtype), [0] * x.rank, high)
    groups = _groups(dims)
    y = x
    for group in groups[1:]:
        y = _over(L, y, group, "IFFT")
    y = _over(L, y, groups[0], "IRFFT", last=last)
    n = prod(y.shape[k] for k in dims)
    out = _scale(L, y, n, normalization, xla_divided=True)
    assert not is_complex(out.dtype)
    return out
