"""Differences from the CPU found by the strict full conformance run (issue 17). Each test
rebuilds the input that showed the difference and compares with the CPU."""

from __future__ import annotations

import pytest
import torch
from utils import TPU

aten = torch.ops.aten


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("ignore_index", [-100, 1])
@pytest.mark.parametrize("reduction", [0, 1, 2])  # none, mean, sum
def test_nll_loss_total_weight_matches_the_cpu(reduction, ignore_index, weighted):
    """nll_loss_forward's second output: the CPU's batched kernel leaves total_weight at 0
    for reduction='none' (tpu returned the summed target weights, 8.0 for 8 unweighted
    rows: linear_cross_entropy's bf16 sample 32 showed it); mean and sum report the sum."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 4, generator=g).log_softmax(1)
    t = torch.randint(0, 4, (8,), generator=g)
    t[0] = 1
    w = torch.rand(4, generator=g) + 0.5 if weighted else None
    loss, total = aten.nll_loss_forward(x, t, w, reduction, ignore_index)
    got_loss, got_total = aten.nll_loss_forward(x.to(TPU), t.to(TPU), None if w is None else w.to(TPU), reduction, ignore_index)
    torch.testing.assert_close(got_loss.cpu(), loss)
    torch.testing.assert_close(got_total.cpu(), total)


@pytest.mark.parametrize("ignore_index", [-100, 2])
@pytest.mark.parametrize("reduction", [0, 1, 2])
def test_nll_loss_total_weight_1d_and_2d(reduction, ignore_index):
    """A 1-d input (one sample) reports its target's weight even for reduction='none';
    nll_loss2d's 'none' reports 0, as the batched 1-d kernel."""
    w = torch.tensor([0.5, 2.0, 3.0, 4.0])
    x1 = torch.randn(4, generator=torch.Generator().manual_seed(1)).log_softmax(0)
    t1 = torch.tensor(2)
    expected = aten.nll_loss_forward(x1, t1, w, reduction, ignore_index)
    got = aten.nll_loss_forward(x1.to(TPU), t1.to(TPU), w.to(TPU), reduction, ignore_index)
    for a, e in zip(got, expected):
        torch.testing.assert_close(a.cpu(), e, equal_nan=True)
    g = torch.Generator().manual_seed(2)
    x2 = torch.randn(2, 4, 3, 3, generator=g).log_softmax(1)
    t2 = torch.randint(0, 4, (2, 3, 3), generator=g)
    expected = aten.nll_loss2d_forward(x2, t2, None, reduction, ignore_index)
    got = aten.nll_loss2d_forward(x2.to(TPU), t2.to(TPU), None, reduction, ignore_index)
    for a, e in zip(got, expected):
        torch.testing.assert_close(a.cpu(), e)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("op", [torch.log_softmax, torch.softmax, torch.logsumexp])
@pytest.mark.parametrize("dim", [0, 1])
def test_16bit_softmax_family_rounds_once(op, dim, dtype):
    """The conformance entries _LOG_SOFTMAX_CHAIN_16BIT and _SOFTMAX_OTHER_DIM_16BIT rest on
    this: tpu computes log_softmax, softmax and logsumexp of 16-bit inputs in float32 and
    rounds once (the CPU rounds intermediates to 16 bits), so each is within half a 16-bit
    ulp of the float32 result and at least as close to float64 as the CPU's."""
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(64, 33, generator=g) * 4).to(dtype)
    got = op(x.to(TPU), dim).cpu()
    exact = op(x.double(), dim)
    assert _within_half_ulp(got, exact, dtype)
    assert (got.double() - exact).abs().sum() <= (op(x, dim).double() - exact).abs().sum()


@pytest.mark.xfail(
    strict=True,
    reason="PyTorch resolves LinearCrossEntropyOptions' 'auto' per device type: the CPU accumulates in float32, "
    "tpu (not in its table) in the input's 16-bit dtype; see _LCE_CHUNKED_POLICY in expected_failures.py",
)
def test_chunked_linear_cross_entropy_float16_accumulates_like_the_cpu():
    """OpInfo's linear_cross_entropy.chunked float16 sample 126: the loss is 0.027924 on tpu,
    0.027557 on the CPU (float64 0.027558), because tpu gets acc_policy='compact' with
    float16 accumulation where the CPU gets 'accurate' with float32."""
    import torch.nn.functional as F
    from torch.nn import LinearCrossEntropyOptions

    x = torch.tensor([-0.048370361328125, -1.302734375, 1.2958984375], dtype=torch.half)
    w = torch.tensor(
        [[-0.623046875, 1.0625, 0.5810546875], [-1.9853515625, -1.8388671875, -1.94921875]]
        + [[1.794921875, 1.82421875, 0.68408203125], [-0.8310546875, 0.65771484375, -1.5107421875]],
        dtype=torch.half,
    )
    bias = torch.tensor([1.4609, -1.2295, 6.1680, 0.5654], dtype=torch.half)
    t = torch.tensor(2)
    kw = dict(ignore_index=1, options=LinearCrossEntropyOptions(batch_chunk_size=2, allow_retain_graph=True))
    expected = F.linear_cross_entropy(x, w, t, linear_bias=bias, **kw)
    got = F.linear_cross_entropy(x.to(TPU), w.to(TPU), t.to(TPU), linear_bias=bias.to(TPU), **kw).cpu()
    torch.testing.assert_close(got, expected)


def test_float64_referee_starts_from_the_inputs_both_sides_were_given():
    """The harness's float64 reference must not start from inputs the CPU run has written:
    embedding_bag with max_norm renormalises its weight in place, so a reference taken after
    the CPU run reproduced the CPU's 16-bit renormalisation and judged tpu's more accurate
    result (float32 norms) the farther one (bf16 fwd samples 9, 25, 38 were listed)."""
    from torch.testing._internal.opinfo.core import SampleInput

    from torchtpu.testing import opinfo

    op = opinfo._ops_by_id()["nn.functional.embedding_bag"]
    g = torch.Generator().manual_seed(0)
    weight = (torch.randn(5, 5, generator=g) * 3).bfloat16()
    original = weight.clone()
    idx, offsets = torch.tensor([1, 2, 4, 1, 3, 0]), torch.tensor([0, 3])
    sample = SampleInput(weight, args=(idx,), kwargs=dict(offsets=offsets, max_norm=1.0, mode="sum"))
    out = opinfo._run_fwd(op, sample)
    assert not torch.equal(weight, original)  # the CPU run renormalised the sample's weight
    reference = torch.nn.functional.embedding_bag(idx, original.double(), offsets, max_norm=1.0, mode="sum")
    torch.testing.assert_close(opinfo._host(out.precise())[0], reference, rtol=0, atol=0)


def _within_half_ulp(got: torch.Tensor, exact: torch.Tensor, dtype: torch.dtype) -> bool:
    """Each element within half a ``dtype`` ulp of ``exact`` (plus float32's own error)."""
    ulp = torch.finfo(dtype).eps * torch.exp2(torch.floor(torch.log2(exact.abs().clamp_min(torch.finfo(dtype).tiny))))
    return bool(((got.double() - exact).abs() <= 0.5 * ulp + 1e-6 * exact.abs()).all())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize(
    "shape,pads",
    [((1, 3, 3, 3, 3), (1, 1, 1, 1, 1, 1)), ((1, 2, 5, 6), (1, 2, 3, 4)), ((1, 2, 5, 6), (4, 0, -1, 2)), ((4, 3, 9), (3, 5))],
)
def test_reflect_pad_16bit_gradient_rounds_once(shape, pads, dtype):
    """reflection_pad's backward went through PyTorch's decomposition, which adds up to 2^d
    masked gathers in the 16-bit dtype: OpInfo's float16 pad.reflect sample 10 (a 3x3x3
    volume padded by 1) was 2 ulps off (2.5098 where float64 gives 2.51418). The rule adds
    in float32 and rounds once: correctly rounded, and closer to float64 than the CPU's
    16-bit accumulation (correctly rounded on ~75% of the elements)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
    y = torch.nn.functional.pad(x, pads, mode="reflect")
    cot = torch.randn(y.shape, generator=g, dtype=torch.float64).to(dtype)
    (cpu,) = torch.autograd.grad(y, x, cot)
    x64 = x.detach().double().requires_grad_()
    (exact,) = torch.autograd.grad(torch.nn.functional.pad(x64, pads, mode="reflect"), x64, cot.double())
    xt = x.detach().to(TPU).requires_grad_()
    (got,) = torch.autograd.grad(torch.nn.functional.pad(xt, pads, mode="reflect"), xt, cot.to(TPU))
    got = got.cpu()
    assert got.dtype == dtype
    assert _within_half_ulp(got, exact, dtype)
    assert (got.double() - exact).abs().sum() <= (cpu.double() - exact).abs().sum()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_reflect_pad_gradient_wide_dtypes(dtype):
    for shape, pads in [((2, 3, 7), (2, 3)), ((2, 3, 7), (-2, 3)), ((1, 2, 5, 6), (4, 0, -1, 2)), ((1, 3, 3, 3, 3), (1,) * 6)]:
        x = torch.randn(shape, dtype=dtype, requires_grad=True)
        y = torch.nn.functional.pad(x, pads, mode="reflect")
        cot = torch.randn(y.shape, dtype=dtype)
        (cpu,) = torch.autograd.grad(y, x, cot)
        xt = x.detach().to(TPU).requires_grad_()
        (got,) = torch.autograd.grad(torch.nn.functional.pad(xt, pads, mode="reflect"), xt, cot.to(TPU))
        torch.testing.assert_close(got.cpu(), cpu)
