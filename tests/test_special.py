"""Special functions (torchtpu/lowering/rules/special.py) on tpu against the CPU: the Bessel
family, Airy Ai, erfcx, log_ndtr and ndtri over wide ranges (tails, range edges of the
piecewise approximations, zeros, negatives, +-inf, NaN), their gradients, 16-bit and
integer inputs and the out= form."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
from utils import TPU, assert_close, check

S = torch.special
F32, F64 = torch.float32, torch.float64

# Points where the CPU kernels switch formulas, plus the IEEE specials.
_EDGES = [0.0, -0.0, 1e-30, 1e-5, 0.5, 2.0, 2.09, -2.09, 5.0, 8.0, 50.0, 5e7, 1e9, -6.1, -26.7, 103.892, 104.0, 700.0, 750.0, -750.0]
_SPECIALS = [math.inf, -math.inf, math.nan]


def _wide(dtype: torch.dtype) -> torch.Tensor:
    """Dense over [-60, 60], log-spaced magnitudes 1e-8..1e8 of both signs, edges and specials."""
    mags = torch.logspace(-8, 8, 400, dtype=F64)
    x = torch.cat([torch.linspace(-60, 60, 6001, dtype=F64), mags, -mags, torch.tensor(_EDGES + _SPECIALS, dtype=F64)])
    return x.to(dtype)


def _probabilities(dtype: torch.dtype) -> torch.Tensor:
    """ndtri's domain [0, 1] densely, both tails down to the smallest normal numbers, and outside it."""
    tiny = torch.logspace(-300 if dtype is F64 else -37, -1, 400, dtype=F64)
    p = torch.cat([torch.linspace(0, 1, 2001, dtype=F64), tiny])
    p = torch.cat([p, 1 - p, torch.tensor([-0.5, 1.5, 0.0, 1.0] + _SPECIALS, dtype=F64)])
    return p.to(dtype)


FUNCTIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "i0": torch.i0,
    "special.i0e": S.i0e,
    "special.i1": S.i1,
    "special.i1e": S.i1e,
    "special.erfcx": S.erfcx,
    "special.log_ndtr": S.log_ndtr,
    "special.airy_ai": S.airy_ai,
    "special.bessel_j0": S.bessel_j0,
    "special.bessel_j1": S.bessel_j1,
    "special.bessel_y0": S.bessel_y0,
    "special.bessel_y1": S.bessel_y1,
    "special.modified_bessel_i0": S.modified_bessel_i0,
    "special.modified_bessel_i1": S.modified_bessel_i1,
    "special.modified_bessel_k0": S.modified_bessel_k0,
    "special.modified_bessel_k1": S.modified_bessel_k1,
    "special.scaled_modified_bessel_k0": S.scaled_modified_bessel_k0,
    "special.scaled_modified_bessel_k1": S.scaled_modified_bessel_k1,
    "special.spherical_bessel_j0": S.spherical_bessel_j0,
}


@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_matches_cpu_over_wide_range(name: str, dtype: torch.dtype) -> None:
    fn = FUNCTIONS[name]
    x = _wide(dtype)
    assert_close(fn(x.to(TPU)), fn(x))


@pytest.mark.parametrize("dtype", [F32, F64])
def test_ndtri_matches_cpu_including_tails(dtype: torch.dtype) -> None:
    p = _probabilities(dtype)
    assert_close(S.ndtri(p.to(TPU)), S.ndtri(p))


def test_edge_values_are_exact() -> None:
    """The values the CPU defines at the domain edges, bit for bit."""
    x = torch.tensor([0.0, -1.0, math.inf, -math.inf, math.nan])
    for fn in (S.bessel_y0, S.bessel_y1, S.modified_bessel_k0, S.modified_bessel_k1, S.airy_ai, S.spherical_bessel_j0):
        torch.testing.assert_close(fn(x.to(TPU)).cpu(), fn(x), equal_nan=True, rtol=0, atol=0)
    x = torch.tensor([-math.inf, -30.0, math.inf, math.nan])
    torch.testing.assert_close(S.erfcx(x.to(TPU)).cpu(), S.erfcx(x), equal_nan=True, rtol=0, atol=0)
    p = torch.tensor([0.0, 1.0, -0.1, 1.1, math.nan])
    torch.testing.assert_close(S.ndtri(p.to(TPU)).cpu(), S.ndtri(p), equal_nan=True, rtol=0, atol=0)


@pytest.mark.parametrize(
    "fn, dtype",
    [(torch.i0, torch.float16), (S.i1, torch.bfloat16), (S.erfcx, torch.bfloat16), (S.ndtri, torch.float16)],
    ids=["i0-float16", "i1-bfloat16", "erfcx-bfloat16", "ndtri-float16"],
)
def test_16bit_inputs_compute_in_float32(fn: Callable[[torch.Tensor], torch.Tensor], dtype: torch.dtype) -> None:
    """The float32 result rounded once (the CPU has no 16-bit erfcx or ndtri kernel: the
    reference is the float32 CPU value rounded to 16 bits)."""
    x = torch.linspace(0.01, 0.99, 97) if fn is S.ndtri else torch.linspace(-12, 12, 97)
    x = x.to(dtype)
    out = fn(x.to(TPU))
    assert out.dtype == dtype
    assert_close(out, fn(x.float()).to(dtype))
    if fn in (torch.i0, S.i1):
        assert_close(out, fn(x))


def test_integer_input_promotes_to_float() -> None:
    x = torch.arange(-20, 21)
    out = torch.i0(x.to(TPU))
    assert out.dtype == F32
    assert_close(out, torch.i0(x))
    assert_close(S.bessel_j0(x.to(TPU)), S.bessel_j0(x))


@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize(
    "name, fn",
    [("i0", torch.i0), ("i0e", S.i0e), ("i1", S.i1), ("i1e", S.i1e), ("erfcx", S.erfcx), ("log_ndtr", S.log_ndtr)],
)
def test_gradients(name: str, fn: Callable[[torch.Tensor], torch.Tensor], dtype: torch.dtype) -> None:
    check(fn, (torch.linspace(-9, 9, 37, dtype=dtype) + 0.1).requires_grad_())


@pytest.mark.parametrize("dtype", [F32, F64])
def test_ndtri_gradient(dtype: torch.dtype) -> None:
    check(S.ndtri, torch.linspace(1e-3, 1 - 1e-3, 41, dtype=dtype).requires_grad_())


def test_out_variant_and_shapes() -> None:
    x = torch.linspace(0.1, 30, 24).reshape(2, 3, 4)
    out = torch.empty(2, 3, 4, device=TPU)
    S.bessel_y1(x.to(TPU), out=out)
    assert_close(out, S.bessel_y1(x))
    assert_close(S.modified_bessel_k1(torch.tensor(1.5).to(TPU)), S.modified_bessel_k1(torch.tensor(1.5)))
    empty = torch.empty(0, 3)
    assert S.erfcx(empty.to(TPU)).shape == (0, 3)
