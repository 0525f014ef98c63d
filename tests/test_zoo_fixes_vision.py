"""Op-level regressions found by the vision model zoo (tests/models/zoo_vision.py)."""

from __future__ import annotations

import torch

DEVICE = "tpu"


def test_index_with_cpu_index_tensors():
    # DETR's Hungarian matcher returns CPU index tensors (from scipy) and indexes the tpu
    # logits with them; PyTorch accepts CPU indices for a tensor on any device
    x = torch.randn(2, 5, 4)
    batch, query = torch.tensor([0, 0, 1]), torch.tensor([3, 1, 4])
    assert torch.equal(x.to(DEVICE)[batch, query].cpu(), x[batch, query])
    assert torch.equal(x.to(DEVICE)[:, query].cpu(), x[:, query])
    mask = x[..., 0] > 0
    assert torch.equal(x.to(DEVICE)[mask].cpu(), x[mask])


def test_index_put_with_cpu_index_tensors():
    x = torch.zeros(2, 5)
    rows, cols = torch.tensor([0, 1, 1]), torch.tensor([2, 0, 2])
    values = torch.tensor([1.0, 2.0, 3.0])
    expected = x.clone().index_put_((rows, cols), values, accumulate=True)
    actual = x.to(DEVICE).index_put_((rows, cols), values.to(DEVICE), accumulate=True)
    assert torch.equal(actual.cpu(), expected)
    expected[rows] = 7.0
    actual[rows] = 7.0
    assert torch.equal(actual.cpu(), expected)


def test_index_gradient_with_cpu_index_tensors():
    base = torch.randn(4, 7)
    idx = torch.tensor([[0, 6, 6], [2, 3, 0]])
    cpu = base.clone().requires_grad_()
    tpu = base.to(DEVICE).requires_grad_()
    weight = torch.randn(4, 2, 3)
    (cpu[:, idx] * weight).sum().backward()
    (tpu[:, idx] * weight.to(DEVICE)).sum().backward()
    torch.testing.assert_close(tpu.grad.cpu(), cpu.grad)
