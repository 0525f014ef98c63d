"""float8 tensors on tpu as on the CPU and CUDA: moved and stored bit for bit, cast with
PyTorch's rounding (float8_e4m3fn saturates, the others overflow as their formats say),
``torch._scaled_mm``, and an FP8 checkpoint's block-scaled weights dequantized into a
layer, in every execution mode."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F
from utils import TPU, assert_close

import torchtpu

FLOAT8 = [torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz]
OTHERS = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int32, torch.int64, torch.bool]
EDGES = [0.0, -0.0, 1.0, -1.0, 0.5, 3.7, -3.7, 2.0**-9, 1e-12, 100.0, 300.0, 448.0, 463.0, 470.0, 500.0, 1000.0, -1000.0]
EDGES += [57344.0, 61440.0, 70000.0, 1e30, float("inf"), float("-inf"), float("nan")]


def _values() -> torch.Tensor:
    return torch.cat([torch.tensor(EDGES), torch.randn(300, generator=torch.Generator().manual_seed(0)) * 40])


def _same(got: torch.Tensor, want: torch.Tensor) -> None:
    """Equal values, NaN where the CPU has NaN (its bit pattern may differ)."""
    assert got.dtype == want.dtype
    g, w = got.double(), want.double()
    assert bool(((g == w) | (g.isnan() & w.isnan())).all()), f"{int((g != w).sum())} values differ"


@pytest.mark.parametrize("source,target", [*itertools.product(FLOAT8, OTHERS + FLOAT8), *itertools.product(OTHERS, FLOAT8)])
def test_casts_round_as_on_the_cpu(source, target):
    """float8_e4m3fn has no infinity: PyTorch's conversion saturates at +-448, where XLA's
    gives NaN; the fnuz types' NaN converts to integer 0 on the CPU."""
    x = _values()
    if source is not torch.float32:
        x = x.to(source)
    _same(x.to(TPU).to(target).cpu(), x.to(target))


@pytest.mark.parametrize("dtype", FLOAT8)
def test_float8_storage_moves_bit_for_bit(dtype):
    bits = torch.arange(256, dtype=torch.uint8).view(dtype)
    on_device = bits.to(TPU)
    assert on_device.dtype == dtype
    assert torch.equal(on_device.cpu().view(torch.uint8), torch.arange(256, dtype=torch.uint8))
    assert torch.equal(on_device.view(torch.uint8).cpu(), torch.arange(256, dtype=torch.uint8))
    assert torch.equal(torch.cat([on_device, on_device[:3]]).cpu().view(torch.uint8)[-3:], torch.arange(3, dtype=torch.uint8))


def test_a_dtype_without_a_conversion_is_refused():
    """float8_e8m0fnu (MX block scales): XLA's cpu client converts every value to it as NaN."""
    with pytest.raises(TypeError, match="float8_e8m0fnu is not supported on the tpu device"):
        torch.ones(2).to(torch.float8_e8m0fnu).to(TPU)


MODES = ["eager", "defer_and_fuse", "compile"]


def _in_mode(mode: str, fn):
    if mode == "compile":
        return torch.compile(fn, backend="tpu", dynamic=False)
    return fn


@pytest.mark.parametrize("mode", MODES)
def test_scaled_mm_matches_the_cpu(mode):
    torch.manual_seed(0)
    a = torch.randn(16, 32).to(torch.float8_e4m3fn)
    b = torch.randn(48, 32).to(torch.float8_e5m2).t()
    scale_a, scale_b, bias = torch.tensor(2.0), torch.tensor(0.25), torch.randn(48).to(torch.bfloat16)

    def product(a, b, scale_a, scale_b, bias, out_dtype):
        return torch._scaled_mm(a, b, scale_a, scale_b, bias=bias, out_dtype=out_dtype)

    run = _in_mode(mode, product)
    with torchtpu.eager_mode("defer_and_fuse" if mode == "defer_and_fuse" else "eager"):
        for out_dtype, with_bias in [(torch.bfloat16, True), (torch.float32, False), (torch.float8_e4m3fn, False)]:
            args = (a, b, scale_a, scale_b, bias if with_bias else None)
            want = product(*args, out_dtype)
            got = run(*(t.to(TPU) if t is not None else None for t in args), out_dtype)
            _same(got.cpu(), want)


def test_rowwise_scaled_mm_matches_float64():
    """One scale per row of ``a`` and per column of ``b`` (CUDA's rowwise scaling)."""
    torch.manual_seed(0)
    a, b = torch.randn(16, 32).to(torch.float8_e4m3fn), torch.randn(32, 32).to(torch.float8_e4m3fn).t()
    scale_a, scale_b = torch.rand(16, 1) + 0.5, torch.rand(1, 32) + 0.5
    got = torch._scaled_mm(a.to(TPU), b.to(TPU), scale_a.to(TPU), scale_b.to(TPU), out_dtype=torch.float32)
    want = (a.double() * scale_a.double()) @ (b.double() * scale_b.double())
    assert_close(got.cpu().double(), want, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("mode", MODES)
def test_an_fp8_checkpoint_dequantizes_into_a_linear_layer(mode):
    """DeepSeek-V3-style FP8 weights: float8_e4m3fn blocks of 16x16, one float32 scale per
    block, dequantized to bfloat16 where the layer runs."""
    torch.manual_seed(0)
    weight = torch.randn(32, 48) * 3
    scales = torch.rand(2, 3) + 0.1
    stored = (weight / scales.repeat_interleave(16, 0).repeat_interleave(16, 1)).to(torch.float8_e4m3fn)
    x = torch.randn(5, 48).to(torch.bfloat16)

    def forward(stored, scales, x):
        w = stored.to(torch.float32) * scales.repeat_interleave(16, 0).repeat_interleave(16, 1)
        return F.linear(x, w.to(torch.bfloat16))

    want = forward(stored, scales, x)
    run = _in_mode(mode, forward)
    with torchtpu.eager_mode("defer_and_fuse" if mode == "defer_and_fuse" else "eager"):
        got = run(stored.to(TPU), scales.to(TPU), x.to(TPU))
    assert_close(got.cpu(), want)


def test_a_scalar_that_overflows_the_format_raises_as_on_the_cpu():
    for dtype, value in [(torch.float8_e4m3fn, 500.0), (torch.float8_e4m3fnuz, 300.0), (torch.float8_e5m2, 1e5)]:
        with pytest.raises(RuntimeError, match="value cannot be converted to type .* without overflow"):
            torch.full((2,), value, dtype=dtype, device=TPU)
    assert torch.full((2,), 400.0, dtype=torch.float8_e4m3fn, device=TPU).cpu().float().tolist() == [384.0, 384.0]
