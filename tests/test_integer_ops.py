"""Integer-only elementwise ops against the CPU: gcd / lcm (a while loop of Euclid steps)."""

from __future__ import annotations

import pytest
import torch
from utils import TPU

INT_DTYPES = [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8]


def _pair(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    lo = 0 if dtype is torch.uint8 else -100
    a = torch.randint(lo, 100, (7, 9), generator=g).to(dtype)
    b = torch.randint(lo // 3, 33, (7, 9), generator=g).to(dtype)
    a[0, :3], b[0, 1:4] = 0, 0  # gcd(0, 0) = 0, gcd(x, 0) = |x|
    return a, b


@pytest.mark.parametrize("dtype", INT_DTYPES)
@pytest.mark.parametrize("fn", [torch.gcd, torch.lcm])
def test_gcd_lcm_match_cpu(fn, dtype):
    a, b = _pair(dtype)
    got = fn(a.to(TPU), b.to(TPU))
    assert got.dtype == dtype
    assert torch.equal(got.cpu(), fn(a, b))


def test_gcd_broadcasts_and_runs_in_place():
    a, b = _pair(torch.int64)
    x = a.to(TPU)
    x.gcd_(b[0].to(TPU))
    assert torch.equal(x.cpu(), a.gcd(b[0]))


def test_out_of_range_integer_scalars_wrap_like_the_cpu():
    x = torch.tensor([0, 1, 255, 7], dtype=torch.uint8)
    assert (x.to(TPU) == -1).cpu().tolist() == (x == -1).tolist()  # -1 as uint8 is 255
    y = torch.tensor([5, -3], dtype=torch.int8)
    assert (y.to(TPU) * 300).cpu().tolist() == (y * 300).tolist()
    z = torch.zeros(4, dtype=torch.uint8)
    idx, src = torch.tensor([0, 2]), torch.tensor([3, 4], dtype=torch.uint8)
    assert z.to(TPU).index_add(0, idx.to(TPU), src.to(TPU)).cpu().tolist() == z.index_add(0, idx, src).tolist()


# floats in and out of every integer type's range, and the special values
CAST_VALUES = [1e10, -1e10, 3e9, -3e9, 1e20, float("inf"), float("-inf"), float("nan"), 300.7, -300.7, 70000.5, -1.0, -3.7]
CAST_VALUES += [-2147483648.0, 2147483647.9, -0.5, 255.9, 127.5, -128.9]


@pytest.mark.parametrize("mode", ["eager", "defer_and_fuse", "compile"])
@pytest.mark.parametrize("target", [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint16, torch.uint8])
@pytest.mark.parametrize("source", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_float_to_integer_casts_are_the_cpus(source, target, mode):
    """``.to``, ``copy_`` into an integer tensor and ``type_as``: PyTorch converts a float to
    uint8 through int64 on every device (-1.0 is 255, 300.7 is 44), and out-of-range values
    as the CPU's truncating conversion does; XLA's conversion saturated (-1.0 was 0, 300.7
    was 255)."""
    import torchtpu

    x = torch.tensor(CAST_VALUES).to(source)

    def casts(t: torch.Tensor) -> list[torch.Tensor]:
        return [t.to(target), torch.zeros(len(CAST_VALUES), dtype=target, device=t.device).copy_(t), t.type_as(torch.ones(1, dtype=target))]

    want = casts(x)
    run = torch.compile(casts, backend="tpu") if mode == "compile" else casts
    with torchtpu.eager_mode("defer_and_fuse") if mode == "defer_and_fuse" else torch.no_grad():
        got = [g.cpu() for g in run(x.to(TPU))]
    for g, w in zip(got, want):
        assert torch.equal(g, w), (g.tolist(), w.tolist())


def test_in_place_shift_operators():
    """``x <<= n`` and ``x >>= n`` (aten's ``__ilshift__``/``__irshift__``) had no tpu kernel."""
    for shift in (2, torch.tensor(1), torch.tensor([1, 2, 0])):
        for op in ("__ilshift__", "__irshift__"):
            want = torch.tensor([8, -12, 3])
            getattr(want, op)(shift)
            got = torch.tensor([8, -12, 3]).to(TPU)
            getattr(got, op)(shift.to(TPU) if isinstance(shift, torch.Tensor) else shift)
            assert torch.equal(got.cpu(), want), (op, shift)
