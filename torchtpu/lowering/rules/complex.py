"""Complex numbers: building them (complex, polar, view_as_complex), taking them apart
(view_as_real, angle) and conjugating. The element types come from the dtype table
(complex64 = ``complex<f32>``, complex128 = ``complex<f64>``)."""

from __future__ import annotations

import math

import torch

from ...stablehlo.builder import Value
from ...stablehlo.types import is_complex
from ..context import NodeLowering
from ..registry import register

aten = torch.ops.aten

_PART = {torch.complex64: torch.float32, torch.complex128: torch.float64}
_COMPLEX = {v: k for k, v in _PART.items()}


def part_dtype(dtype: torch.dtype) -> torch.dtype:
    """The real dtype of a complex dtype's parts (complex64 -> float32)."""
    return _PART[dtype]


def real(L: NodeLowering, x: Value) -> Value:
    return L.b.op1("stablehlo.real", [x], x.shape, _PART[x.dtype])


def imag(L: NodeLowering, x: Value) -> Value:
    return L.b.op1("stablehlo.imag", [x], x.shape, _PART[x.dtype])


def make_complex(L: NodeLowering, re: Value, im: Value) -> Value:
    return L.b.op1("stablehlo.complex", [re, im], re.shape, _COMPLEX[re.dtype])


def conj(L: NodeLowering, x: Value) -> Value:
    if not is_complex(x.dtype):
        return x
    return make_complex(L, real(L, x), L.b.unary("negate", imag(L, x)))


@register(aten.complex.default)
def complex_(L: NodeLowering, re: Value, im: Value) -> Value:
    out = L.out[0]
    re, im = L.promote(re, im, dtype=_PART[out.dtype], shape=out.shape)
    return make_complex(L, re, im)


@register(aten.polar.default)
def polar(L: NodeLowering, r: Value, theta: Value) -> Value:
    out = L.out[0]
    r, theta = L.promote(r, theta, dtype=_PART[out.dtype], shape=out.shape)
    b = L.b
    return make_complex(L, b.binary("multiply", r, b.unary("cosine", theta)), b.binary("multiply", r, b.unary("sine", theta)))


@register(aten.angle.default)
def angle(L: NodeLowering, x: Value) -> Value:
    out = L.out[0].dtype
    b = L.b
    if is_complex(x.dtype):
        return b.binary("atan2", imag(L, x), real(L, x))
    # real input: pi for negative numbers, 0 otherwise, NaN stays NaN (as on the CPU)
    x = L.to(x, out)
    pi = b.select(b.compare(x, L.zeros(x.shape, out), "LT"), L.full(math.pi, x.shape, out), L.zeros(x.shape, out))
    return b.select(b.compare(x, x, "NE"), x, pi)


@register(aten.conj_physical.default, aten._conj_physical.default)
def conj_physical(L: NodeLowering, x: Value) -> Value:
    # A lazy conj bit on the input is already applied when its view is read, so this
    # conjugates the values it receives.
    return conj(L, x)


@register(aten.view_as_real.default, aten.view_as_real_copy.default)
def view_as_real(L: NodeLowering, x: Value) -> Value:
    """Inside a program (compiled graphs, decompositions) the view is a fresh value; eager
    views share storage through the runtime's view kernels instead."""
    b = L.b
    parts = [b.reshape(p, x.shape + (1,)) for p in (real(L, x), imag(L, x))]
    return b.concatenate(parts, x.rank)


@register(aten.view_as_complex.default, aten.view_as_complex_copy.default)
def view_as_complex(L: NodeLowering, x: Value) -> Value:
    b = L.b
    lead = x.shape[:-1]
    re = b.reshape(b.slice(x, [0] * x.rank, lead + (1,)), lead)
    im = b.reshape(b.slice(x, [0] * (x.rank - 1) + [1], lead + (2,)), lead)
    return make_complex(L, re, im)
