"""F.ctc_loss on tpu vs the CPU: loss and gradient w.r.t. log_probs, over reductions,
zero_infinity, the blank index, padded and concatenated targets, lengths as tensors and
as lists, float32 and float64."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from utils import TPU

import torchtpu.metrics as metrics

T, B, C = 12, 4, 6


def _case(dtype, blank=0, seed=0, repeats=False):
    gen = torch.Generator().manual_seed(seed)
    lp = torch.randn(T, B, C, dtype=dtype, generator=gen).log_softmax(-1)
    labels = [c for c in range(C) if c != blank]
    padded = torch.tensor(labels)[torch.randint(0, len(labels), (B, 5), generator=gen)]
    if repeats:
        padded[:, 1] = padded[:, 0]  # l'(s) == l'(s-2): no skip over the blank between them
    target_lengths = torch.tensor([5, 0, 3, 4])
    input_lengths = torch.tensor([12, 7, 10, 9])
    return lp, padded, input_lengths, target_lengths


def _concatenated(padded, target_lengths):
    return torch.cat([padded[b, : target_lengths[b]] for b in range(len(target_lengths))])


def compare(lp, targets, input_lengths, target_lengths, tol, **kw):
    out = []
    for dev in ("cpu", TPU):
        x = lp.detach().to(dev).requires_grad_()
        lengths = [t.to(dev) if isinstance(t, torch.Tensor) else t for t in (input_lengths, target_lengths)]
        loss = F.ctc_loss(x, targets.to(dev), *lengths, **kw)
        torch.manual_seed(0)
        cot = torch.rand(loss.shape, dtype=loss.dtype).to(dev)
        (g,) = torch.autograd.grad(loss, x, cot)
        out.append((loss.detach().cpu(), g.cpu()))
    (e_loss, e_grad), (a_loss, a_grad) = out
    torch.testing.assert_close(a_loss, e_loss, equal_nan=True, **tol)
    torch.testing.assert_close(a_grad, e_grad, equal_nan=True, **tol)


TOL = {torch.float32: dict(rtol=1e-4, atol=1e-5), torch.float64: dict(rtol=1e-10, atol=1e-12)}


def _default(dtype, layout, lengths, reduction):
    """Every program once in the default suite: each dtype x layout (mean, tensor lengths),
    the list path and the other reductions in float32; the full product is slow."""
    if lengths == "tensor" and reduction == "mean":
        return True
    return dtype == torch.float32 and layout == "padded" and (lengths == "list") != (reduction != "mean")


GRID = [
    pytest.param(dtype, layout, lengths, reduction, marks=() if _default(dtype, layout, lengths, reduction) else pytest.mark.slow)
    for dtype in (torch.float32, torch.float64)
    for layout in ("padded", "concatenated")
    for lengths in ("tensor", "list")
    for reduction in ("none", "mean", "sum")
]


@pytest.mark.parametrize("dtype,layout,lengths,reduction", GRID)
def test_ctc_loss(dtype, layout, lengths, reduction):
    lp, padded, il, tl = _case(dtype)
    targets = padded if layout == "padded" else _concatenated(padded, tl)
    if lengths == "list":
        il, tl = il.tolist(), tl.tolist()
    compare(lp, targets, il, tl, TOL[dtype], reduction=reduction)


@pytest.mark.parametrize("blank", [3, pytest.param(C - 1, marks=pytest.mark.slow)])
def test_blank_index_and_repeated_labels(blank):
    lp, padded, il, tl = _case(torch.float64, blank=blank, seed=1, repeats=True)
    compare(lp, padded, il, tl, TOL[torch.float64], blank=blank, reduction="none")


@pytest.mark.parametrize("zero_infinity", [False, True])
@pytest.mark.parametrize("reduction", ["none", pytest.param("mean", marks=pytest.mark.slow), "sum"])
def test_impossible_alignment(zero_infinity, reduction):
    """Input shorter than its target needs (repeats need a blank between): the loss is inf
    (and the gradient NaN, as on the CPU), or 0 with a zero gradient under zero_infinity."""
    lp, padded, _, tl = _case(torch.float32, repeats=True)
    il = torch.tensor([5, 7, 2, 9])  # 5 frames for 5 labels with a repeat; 2 for 3
    compare(lp, padded, il, tl, TOL[torch.float32], zero_infinity=zero_infinity, reduction=reduction)


def test_empty_input_and_unbatched():
    lp, padded, il, tl = _case(torch.float64)
    il = torch.tensor([12, 0, 0, 9])  # an empty input with an empty target (loss 0) and with one (inf)
    compare(lp, padded, il, tl, TOL[torch.float64], zero_infinity=True, reduction="none")
    compare(lp[:, 0], padded[0], il[:1].reshape(()), tl[:1].reshape(()), TOL[torch.float64], reduction="sum")


def test_new_lengths_do_not_recompile():
    lp, padded, il, tl = _case(torch.float32)
    x = lp.to(TPU).requires_grad_()
    targets = padded.to(TPU)
    F.ctc_loss(x, targets, il.to(TPU), tl.to(TPU)).backward()
    F.ctc_loss(x, targets, il.tolist(), tl.tolist()).backward()  # the list path's own small programs
    metrics.reset()
    F.ctc_loss(x, targets, torch.tensor([11, 8, 12, 6], device=TPU), torch.tensor([2, 3, 5, 1], device=TPU)).backward()
    F.ctc_loss(x, targets, [9, 9, 9, 9], [1, 1, 1, 1]).backward()
    assert metrics.snapshot()["compiles"] == 0


def test_input_length_past_the_end_is_reported():
    lp, padded, _, tl = _case(torch.float32)
    with pytest.raises(Exception, match="input_lengths"):
        F.ctc_loss(lp.to(TPU), padded.to(TPU), torch.tensor([13, 7, 10, 9], device=TPU), tl.to(TPU)).cpu()
