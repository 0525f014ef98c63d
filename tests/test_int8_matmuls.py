"""The int8 matrix products quantized inference calls (torchao's dynamic int8 and
weight-only int8 paths, gpt-fast): ``torch._int_mm`` exactly as on the CPU, and
``torch._weight_int8pack_mm`` at the CPU's distance from float64, in every mode."""

from __future__ import annotations

import pytest
import torch
from utils import TPU, assert_close

import torchtpu

MODES = ["eager", "defer_and_fuse", "compile"]


def _run(mode: str, fn, *args):
    if mode == "compile":
        return torch.compile(fn, backend="tpu", dynamic=False)(*(a.to(TPU) for a in args))
    with torchtpu.eager_mode(mode):
        return fn(*(a.to(TPU) for a in args)).cpu()


@pytest.mark.parametrize("mode", MODES)
def test_int_mm_is_exact(mode):
    g = torch.Generator().manual_seed(0)
    a = torch.randint(-128, 128, (32, 200), generator=g, dtype=torch.int8)
    u = torch.randint(0, 256, (32, 200), generator=g, dtype=torch.uint8)
    b = torch.randint(-128, 128, (200, 24), generator=g, dtype=torch.int8)
    for lhs in (a, u):
        got = _run(mode, torch._int_mm, lhs, b)
        assert got.dtype == torch.int32 and torch.equal(got.cpu(), torch._int_mm(lhs, b))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("mode", MODES)
def test_weight_int8pack_mm_is_as_close_as_the_cpu(mode, dtype):
    """One float32 sum per output, scaled, rounded once to the input's dtype. (PyTorch's
    CPU kernel crashes the process for some inner sizes, 200 among them: 96 here.)"""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(17, 96, generator=g).to(dtype)
    w = torch.randint(-128, 128, (24, 96), generator=g, dtype=torch.int8)
    scales = (torch.rand(24, generator=g) / 64).to(dtype)
    want = torch._weight_int8pack_mm(x, w, scales)
    got = _run(mode, torch._weight_int8pack_mm, x, w, scales).cpu()
    reference = (x.double() @ w.double().T) * scales.double()
    assert got.dtype == want.dtype
    assert (got.double() - reference).abs().max() <= (want.double() - reference).abs().max() * 1.01 + 1e-6
    assert_close(got, want)
