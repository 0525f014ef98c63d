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


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_zeta_poles_are_inf(dtype):
    """zeta(x, q) for q a non-positive integer is +inf on the CPU (chlo.zeta gave NaN)."""
    x = torch.tensor([0.5, 1.0, 1.5, 2.0, 3.0, 4.5], dtype=dtype).repeat_interleave(8)
    q = torch.tensor([-3.0, -2.5, -1.0, 0.0, 0.5, 1.0, 2.5, -0.0], dtype=dtype).repeat(6)
    expected = torch.special.zeta(x, q)
    actual = torch.special.zeta(x.to(TPU), q.to(TPU)).cpu()
    torch.testing.assert_close(actual, expected, equal_nan=True)
    assert torch.special.zeta(torch.tensor(3.0, device=TPU), torch.tensor(-1.0, device=TPU)).item() == float("inf")


def test_native_batch_norm_legit_out_fills_every_output():
    """The out= form mutates running_mean/var and fills out/save_mean/save_invstd; the
    results went to the wrong tensors (ValueError: cannot broadcast (5, 5, 5) to (5,))."""
    x, w, b = torch.randn(5, 5, 5), torch.randn(5), torch.randn(5)
    results = {}
    for device in ("cpu", TPU):
        rm, rv = torch.zeros(5, device=device), torch.ones(5, device=device)
        outs = [torch.empty(0, device=device) for _ in range(3)]
        torch.ops.aten._native_batch_norm_legit.out(
            x.to(device), w.to(device), b.to(device), rm, rv, True, 0.1, 1e-5, out=outs[0], save_mean=outs[1], save_invstd=outs[2]
        )
        results[str(device)] = [t.cpu() for t in (*outs, rm, rv)]
    for actual, expected in zip(results["tpu"], results["cpu"]):
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_embedding_bag_bf16_accumulates_in_float32(mode):
    """bf16 embedding_bag with per_sample_weights gave 0.75 where the CPU (float32
    accumulation) gives 0.8867 and float64 0.8876."""
    weight = torch.randn(10, 4).bfloat16()
    idx = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9])
    offsets = torch.tensor([0, 4])
    psw = torch.rand(8).bfloat16() if mode == "sum" else None
    expected = torch.nn.functional.embedding_bag(idx, weight, offsets, mode=mode, per_sample_weights=psw)
    actual = torch.nn.functional.embedding_bag(
        idx.to(TPU), weight.to(TPU), offsets.to(TPU), mode=mode, per_sample_weights=None if psw is None else psw.to(TPU)
    ).cpu()
    assert torch.equal(actual, expected)


def assert_rounds_once_like_the_cpu(actual: torch.Tensor, cpu: torch.Tensor, float64: torch.Tensor) -> None:
    """``actual`` is a float32 accumulation rounded once to 16 bits, as the CPU's kernel is.

    Not bit-equal: the CPU kernel's float32 summation order depends on the host's ISA
    (oneDNN/MKL dispatch), and another order moves a result across a rounding boundary now
    and then: for the addmm below, one of 512 float16 results differs by an ulp, on one x86
    host in the CPU's favour (summed error against float64 1.2623647 vs 1.2623658) and on
    another in ours (1.2623647 is then ours, and it equals torch's own float32 addmm
    rounded); the conv's near-zero results differ by a few float16 ulps (7e-7 at 2e-4, the
    float32 sum's cancellation noise). So: PyTorch's 16-bit tolerances against the CPU, and
    the summed error against float64 no larger than the CPU's beyond summation-order noise.
    Rounding the product before adding the bias (the bug these tests pin) is 1.3-2x the
    CPU's error (test_double_rounding_fails_the_check)."""
    torch.testing.assert_close(actual, cpu)  # PyTorch's own 16-bit tolerances
    ours, theirs = (actual.double() - float64).abs().sum().item(), (cpu.double() - float64).abs().sum().item()
    assert ours <= 1.01 * theirs, f"summed error against float64 {ours} vs the CPU's {theirs}"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_double_rounding_fails_the_check(dtype):
    """The check above can fail: the product rounded to 16 bits before the bias is added."""
    x, w, b = torch.randn(16, 64).to(dtype), torch.randn(32, 64).to(dtype), torch.randn(32).to(dtype)
    rounded_twice = (x.float() @ w.float().t()).to(dtype).float().add(b.float()).to(dtype)
    float64 = torch.nn.functional.linear(x.double(), w.double(), b.double())
    with pytest.raises(AssertionError):
        assert_rounds_once_like_the_cpu(rounded_twice, torch.nn.functional.linear(x, w, b), float64)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_linear_adds_the_bias_before_rounding(dtype):
    """16-bit F.linear/addmm add the bias to the float32 product and round once (the
    bias added after rounding the matmul was ~2x farther from float64)."""
    x, w, b = torch.randn(16, 64).to(dtype), torch.randn(32, 64).to(dtype), torch.randn(32).to(dtype)
    actual = torch.nn.functional.linear(x.to(TPU), w.to(TPU), b.to(TPU)).cpu()
    float64 = torch.nn.functional.linear(x.double(), w.double(), b.double())
    assert_rounds_once_like_the_cpu(actual, torch.nn.functional.linear(x, w, b), float64)
    for mat2 in (w.t().to(TPU), w.t().contiguous().to(TPU)):  # a transposed view and a contiguous copy
        actual = torch.addmm(b.to(TPU), x.to(TPU), mat2, beta=0.5, alpha=2.0).cpu()
        float64 = torch.addmm(b.double(), x.double(), w.double().t(), beta=0.5, alpha=2.0)
        assert_rounds_once_like_the_cpu(actual, torch.addmm(b, x, w.t(), beta=0.5, alpha=2.0), float64)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_convolution_adds_the_bias_before_rounding(dtype):
    """16-bit convolutions accumulate in float32 and add the bias before the one rounding,
    as oneDNN on the CPU (bias added after rounding was one ulp off: 4.78125 vs 4.8125)."""
    x, w, b = torch.randn(2, 8, 9, 9).to(dtype), torch.randn(6, 8, 3, 3).to(dtype), torch.randn(6).to(dtype)
    actual = torch.nn.functional.conv2d(x.to(TPU), w.to(TPU), b.to(TPU)).cpu()
    float64 = torch.nn.functional.conv2d(x.double(), w.double(), b.double())
    assert_rounds_once_like_the_cpu(actual, torch.nn.functional.conv2d(x, w, b), float64)


# the CPU's values for x op scalar in 16 bits; alpha variants may differ where the CPU's
# vectorised loop fuses alpha * y + x into one FMA (a float32 rounding XLA makes separately)
_SCALAR_OPS = {
    "mul": lambda a: a * 0.1,
    "div": lambda a: a / 3.3,
    "add": lambda a: a + 0.1,
    "rsub": lambda a: 0.3 - a,
    "floor_divide": lambda a: a // 0.3,
    "div_trunc": lambda a: torch.div(a, 0.3, rounding_mode="trunc"),
    "mul_": lambda a: a.clone().mul_(0.1),
    "tensor_tensor": lambda a: a * a.flip(0) + a / a.flip(0),
}


@pytest.mark.parametrize("name", sorted(_SCALAR_OPS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16bit_arithmetic_with_a_scalar_matches_the_cpu(name, dtype):
    """bf16 ``x * 0.1`` multiplied by bf16(0.1) = 0.10009765625 (1,960 of 10,000 elements
    differed from the CPU, and were farther from float64): the CPU's mul and div keep the
    scalar in float32 and round once; add and sub round the scalar to the dtype first."""
    x = torch.randn(10000, generator=torch.Generator().manual_seed(0)).to(dtype)
    op = _SCALAR_OPS[name]
    assert torch.equal(op(x.to(TPU)).cpu(), op(x))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16bit_add_with_alpha_rounds_alpha_like_the_cpu(dtype):
    """``add(x, y, alpha)`` rounds alpha to the dtype and computes in float32, as the CPU:
    at most a few elements in 10,000 may differ, by one ulp, where the CPU's FMA skips a
    float32 rounding (before: 600 differed)."""
    x = torch.randn(10000, generator=torch.Generator().manual_seed(0)).to(dtype)
    expected = x.add(x.flip(0), alpha=0.1)
    actual = x.to(TPU).add(x.flip(0).to(TPU), alpha=0.1).cpu()
    differ = actual != expected
    assert int(differ.sum()) <= 10
    ulp = torch.finfo(dtype).eps * expected[differ].float().abs()
    assert ((actual[differ].float() - expected[differ].float()).abs() <= ulp).all()


# -- 16-bit activations and their backwards: float32 inside, one rounding ----------------------
def _assert_equal_or_closer(op, *inputs: torch.Tensor) -> None:
    """tpu equals the CPU bit for bit, or its summed |error| against the inputs run in
    float64 is no larger than the CPU's (where the CPU rounds more often than we do)."""
    expected = op(*inputs)
    actual = op(*(t.to(TPU) for t in inputs)).cpu()
    if torch.equal(actual, expected):
        return
    reference = op(*(t.double() for t in inputs))
    tpu_err = (actual.double() - reference).abs().sum().item()
    cpu_err = (expected.double() - reference).abs().sum().item()
    assert tpu_err <= cpu_err, (
        f"{int((actual != expected).sum())} elements differ; error vs float64 {tpu_err:.6g}, the CPU's {cpu_err:.6g}"
    )


aten = torch.ops.aten


def _grad_y(g: torch.Generator) -> list[torch.Tensor]:
    return [torch.randn(64, 16, generator=g), torch.randn(64, 16, generator=g).tanh()]


def _grad_x(g: torch.Generator) -> list[torch.Tensor]:
    return [torch.randn(64, 16, generator=g), 4 * torch.randn(64, 16, generator=g)]


def _x(g: torch.Generator) -> list[torch.Tensor]:
    return [6 * torch.randn(64, 16, generator=g)]


def _positive(g: torch.Generator) -> list[torch.Tensor]:
    return [10 * torch.rand(64, 16, generator=g) + 1e-3]


# op, inputs; the CPU computes each in float32 for 16-bit inputs and rounds once
_OPMATH_CASES = {
    "tanh_backward": (aten.tanh_backward, _grad_y),
    "sigmoid_backward": (aten.sigmoid_backward, lambda g: [torch.randn(64, 16, generator=g), torch.rand(64, 16, generator=g)]),
    "silu": (aten.silu, _x),
    "softplus": (aten.softplus, _x),
    "softplus_beta": (lambda x: aten.softplus(x, 2.0, 5.0), _x),
    "elu": (aten.elu, _x),
    "selu": (torch.nn.functional.selu, _x),
    "celu": (lambda x: torch.nn.functional.celu(x, 0.7), _x),
    "leaky_relu": (aten.leaky_relu, _x),
    "sigmoid": (aten.sigmoid, _x),
    "expm1": (aten.expm1, lambda g: [torch.randn(64, 16, generator=g)]),
    "log2": (aten.log2, _positive),
    "log10": (aten.log10, _positive),
    "reciprocal": (aten.reciprocal, _x),
    "exp2": (aten.exp2, _x),
    "tanhshrink": (torch.nn.functional.tanhshrink, _x),
}


@pytest.mark.parametrize("name", sorted(_OPMATH_CASES))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16bit_elementwise_math_rounds_once(name, dtype):
    """These rounded every intermediate to 16 bits: bf16 tanh_backward was 1.6x farther
    from float64 than the CPU (1.06 vs 0.68 summed over 64x16), selu 3x, log2 2x, and
    fp16 sigmoid ran in half precision. Now float32 inside and one rounding, as the CPU."""
    op, make = _OPMATH_CASES[name]
    inputs = [t.to(dtype) for t in make(torch.Generator().manual_seed(0))]
    _assert_equal_or_closer(op, *inputs)


@pytest.mark.parametrize("name", ["tanh_backward", "silu", "softplus", "elu", "leaky_relu", "log2", "log10"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16bit_elementwise_math_is_the_cpus_bit_for_bit(name, dtype):
    """Where the CPU's kernel is the same float32 formula, the results are identical."""
    op, make = _OPMATH_CASES[name]
    inputs = [t.to(dtype) for t in make(torch.Generator().manual_seed(1))]
    assert torch.equal(op(*(t.to(TPU) for t in inputs)).cpu(), op(*inputs))


def test_float16_softplus_does_not_overflow():
    """fp16 softplus computed exp(x) in half precision: inf for 11.1 < x <= threshold (20)
    where the CPU gives x (log1p(exp(x)) in float32)."""
    x = torch.tensor([11.0, 12.0, 15.5, 19.0, 20.0, 25.0], dtype=torch.float16)
    actual = torch.nn.functional.softplus(x.to(TPU)).cpu()
    assert torch.isfinite(actual).all()
    assert torch.equal(actual, torch.nn.functional.softplus(x))


@pytest.mark.parametrize("op", [aten.silu_backward, aten.mish_backward], ids=["silu_backward", "mish_backward"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16bit_silu_mish_backward_round_once(op, dtype):
    """The CPU kernels compute these in float32 (PyTorch's decompositions, which we lower, do
    too); the dispatcher's composite math_silu_backward, which tpu used to run op by op,
    rounds each step: 2x farther from float64."""
    inputs = [t.to(dtype) for t in _grad_x(torch.Generator().manual_seed(0))]
    assert torch.equal(op(*(t.to(TPU) for t in inputs)).cpu(), op(*inputs))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16bit_scatter_add_sums_like_the_cpu(dtype):
    """Updates that collide on one element are summed in float32 and rounded once: summed
    in 16 bits (in XLA's order) cummax's bf16 gradient was 1.4x farther from float64 than
    the CPU's (0.0659 vs 0.0464); now scatter_add/index_add/index_put give the CPU's bits."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 8, generator=gen).to(dtype)
    src = torch.randn(4, 64, generator=gen).to(dtype)
    index = torch.randint(0, 8, (4, 64), generator=gen)
    rows = torch.randint(0, 8, (200,), generator=gen)
    updates = torch.randn(4, 200, generator=gen).to(dtype)
    t = lambda v: v.to(TPU)  # noqa: E731
    assert torch.equal(x.to(TPU).scatter_add(1, t(index), t(src)).cpu(), x.scatter_add(1, index, src))
    assert torch.equal(x.to(TPU).index_add(1, t(rows), t(updates)).cpu(), x.index_add(1, rows, updates))
    assert torch.equal(
        x.to(TPU).index_put((t(rows % 4), t(rows)), t(updates[0]), accumulate=True).cpu(),
        x.index_put((rows % 4, rows), updates[0], accumulate=True),
    )
