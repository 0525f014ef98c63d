"""Ops whose CPU kernels compute in float32 ("opmath") for 16-bit inputs, or pick a
formula per element: tpu must give the CPU's values, not a cheaper formula's."""

from __future__ import annotations

import pytest
import torch
from utils import TPU

FLOATS = (torch.float32, torch.bfloat16, torch.float16)


@pytest.mark.parametrize("dtype", FLOATS)
def test_lerp_end_points_are_exact(dtype):
    """start + w * (end - start) at w = 1 loses the end point (float32 lerp(3, 1e-8, 1)
    gave 0.0, lerp(1e4, 1e-3, 1) 0.0009765625); PyTorch switches formula at |w| = 0.5."""
    start = torch.tensor([3.0, 1e4, 1.0, -2.0], dtype=dtype)
    end = torch.tensor([1e-8, 1e-3, 5.0, 7.0], dtype=dtype)
    for weight in (0.0, 0.3, 0.5, 0.7, 1.0):
        expected = torch.lerp(start, end, weight)
        assert torch.equal(torch.lerp(start.to(TPU), end.to(TPU), weight).cpu(), expected), weight
    assert torch.equal(torch.lerp(start.to(TPU), end.to(TPU), 1.0).cpu(), end)
    weights = torch.tensor([1.0, 0.2, 0.9, 0.5], dtype=dtype)
    assert torch.equal(torch.lerp(start.to(TPU), end.to(TPU), weights.to(TPU)).cpu(), torch.lerp(start, end, weights))


@pytest.mark.parametrize("op", [torch.addcmul, torch.addcdiv])
@pytest.mark.parametrize("dtype", FLOATS)
def test_addcmul_addcdiv_round_once_like_the_cpu(op, dtype):
    """The CPU computes self + value * t1 * t2 (or / t2) in float32 for 16-bit inputs and
    rounds once; rounding each step in bfloat16 was 10-40x farther from float64."""
    g = torch.Generator().manual_seed(0)
    x, t1 = (torch.randn(256, generator=g).to(dtype) for _ in range(2))
    t2 = (torch.rand(256, generator=g) + 0.5).to(dtype)
    expected = op(x, t1, t2, value=0.37)
    actual = op(x.to(TPU), t1.to(TPU), t2.to(TPU), value=0.37).cpu()
    assert torch.equal(actual, expected)


UINT8_RESAMPLING = [
    ("bilinear", {}),
    ("bilinear", {"align_corners": True}),
    ("bicubic", {}),
    ("bilinear", {"antialias": True}),
    ("bicubic", {"antialias": True}),
]


@pytest.mark.parametrize("mode,kwargs", UINT8_RESAMPLING, ids=lambda v: str(v))
@pytest.mark.parametrize("size", [(7, 7), (45, 51)])
def test_uint8_interpolate_matches_the_cpu_exactly(mode, kwargs, size):
    """uint8 images were all zeros (weights built in uint8 truncated to 0; CPU mean
    125.6). The CPU resamples uint8 one dim at a time with int16 fixed-point weights."""
    x = torch.randint(0, 256, (2, 3, 32, 32), dtype=torch.uint8)
    expected = torch.nn.functional.interpolate(x, size=size, mode=mode, **kwargs)
    actual = torch.nn.functional.interpolate(x.to(TPU), size=size, mode=mode, **kwargs).cpu()
    assert actual.float().mean() > 50
    assert torch.equal(actual, expected)
