"""Loss functions on tpu vs CPU (forward and gradients)."""

import pytest
import torch
import torch.nn.functional as F
from utils import TPU, assert_close, check

REDUCTIONS = ["mean", "sum", "none"]


def _logits(*shape, dtype=torch.float32):
    return torch.randn(shape).to(dtype).requires_grad_()


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_nll_loss(reduction):
    x = _logits(5, 4)
    t = torch.tensor([0, 3, 1, -100, 2])
    w = torch.rand(4) + 0.1
    check(lambda x, t: F.nll_loss(x, t, reduction=reduction), x, t)
    check(lambda x, t, w: F.nll_loss(x, t, w, reduction=reduction), x, t, w)
    check(lambda x, t: F.nll_loss(x, t, ignore_index=1, reduction=reduction), x, t.clamp_min(0))


def test_nll_loss_unbatched_and_2d():
    check(lambda x, t: F.nll_loss(x, t), _logits(4), torch.tensor(2))
    x = _logits(2, 3, 4, 5)
    t = torch.randint(0, 3, (2, 4, 5))
    t[0, 0, 0] = -100
    check(lambda x, t: F.nll_loss(x, t), x, t)
    check(lambda x, t, w: F.nll_loss(x, t, w, reduction="none"), x, t, torch.rand(3))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_cross_entropy(dtype):
    x = _logits(6, 5, dtype=dtype)
    t = torch.randint(0, 5, (6,))
    check(lambda x, t: F.cross_entropy(x, t), x, t)


def test_cross_entropy_variants():
    x = _logits(6, 5)
    t = torch.randint(0, 5, (6,))
    w = torch.rand(5) + 0.1
    check(lambda x, t, w: F.cross_entropy(x, t, w, reduction="sum"), x, t, w)
    check(lambda x, t: F.cross_entropy(x, t, label_smoothing=0.1), x, t)
    check(lambda x, t, w: F.cross_entropy(x, t, w, label_smoothing=0.2, reduction="sum"), x, t, w)
    check(lambda x, p: F.cross_entropy(x, p), x, torch.rand(6, 5).softmax(1))
    x4 = _logits(2, 3, 4, 4)
    check(lambda x, t: F.cross_entropy(x, t), x4, torch.randint(0, 3, (2, 4, 4)))


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_regression_losses(reduction):
    x = _logits(4, 5)
    y = torch.randn(4, 5).requires_grad_()
    check(lambda x, y: F.mse_loss(x, y, reduction=reduction), x, y)
    check(lambda x, y: F.l1_loss(x, y, reduction=reduction), x, y)
    check(lambda x, y: F.smooth_l1_loss(x, y, reduction=reduction, beta=0.5), x, y)
    check(lambda x, y: F.huber_loss(x, y, reduction=reduction, delta=0.7), x, y)


def test_regression_losses_misc():
    x = _logits(4, 5)
    y = torch.randn(4, 5)
    check(lambda x, y: F.smooth_l1_loss(x, y, beta=0.0), x, y)
    check(lambda x, y: F.mse_loss(x, y), _logits(3, 8, dtype=torch.bfloat16), torch.randn(3, 8).to(torch.bfloat16))
    check(lambda x, y: F.mse_loss(x, y), _logits(7), torch.randn(7, dtype=torch.float64))


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_binary_cross_entropy(reduction):
    p = torch.rand(4, 5).clamp(0.05, 0.95).requires_grad_()
    t = torch.rand(4, 5)
    w = torch.rand(4, 5)
    check(lambda p, t: F.binary_cross_entropy(p, t, reduction=reduction), p, t)
    check(lambda p, t, w: F.binary_cross_entropy(p, t, w, reduction=reduction), p, t, w)


def test_binary_cross_entropy_edges():
    p = torch.tensor([0.0, 1.0, 0.5, 1e-30])
    t = torch.tensor([0.0, 1.0, 1.0, 1.0])
    check(lambda p, t: F.binary_cross_entropy(p, t, reduction="none"), p, t, grad=False)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_bce_with_logits(reduction):
    x = (torch.randn(4, 5) * 5).requires_grad_()
    t = torch.rand(4, 5)
    w = torch.rand(5)
    pw = torch.rand(5) + 0.5
    check(lambda x, t: F.binary_cross_entropy_with_logits(x, t, reduction=reduction), x, t)
    check(lambda x, t, w, pw: F.binary_cross_entropy_with_logits(x, t, w, pos_weight=pw, reduction=reduction), x, t, w, pw)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_margin_losses_forward_and_backward_match_cpu(reduction):
    x = torch.randn(4, 5)
    target = torch.tensor([[1, 3, -1, 0, 0], [0, -1, 2, 2, 2], [4, 3, 2, 1, 0], [-1, 0, 0, 0, 0]])  # -1 ends a row's labels
    cases = [
        (torch.nn.functional.multilabel_margin_loss, (target,), {}),
        (torch.nn.functional.multi_margin_loss, (torch.tensor([1, 0, 4, 2]),), {"p": 2, "margin": 0.7, "weight": torch.rand(5)}),
    ]
    for fn, args, kwargs in cases:
        xc = x.clone().requires_grad_()
        xt = x.clone().to(TPU).requires_grad_()
        want = fn(xc, *args, reduction=reduction, **kwargs)
        dev_kwargs = {k: v.to(TPU) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
        got = fn(xt, *[a.to(TPU) for a in args], reduction=reduction, **dev_kwargs)
        assert_close(got, want)
        g = torch.randn(want.shape)
        want.backward(g)
        got.backward(g.to(TPU))
        assert_close(xt.grad, xc.grad)



@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_targets_all_ignored_give_zero_gradients_like_the_cpu(reduction, compiled):
    """A batch whose every target is ignore_index (a padding-only batch): the mean divides
    by a total weight of 0, so its loss is NaN on the CPU too, but the CPU kernel writes no
    gradient for an ignored target and the logits' gradient stays 0. Before: NaN (inf * 0),
    spread over every logit by log_softmax's backward. Bitwise, signs of zeros included."""
    x, target = torch.randn(4, 5), torch.tensor([1, 1, 1, 1])

    def loss(x, t):
        return F.cross_entropy(x, t, ignore_index=1, reduction=reduction)

    xc, xt = x.clone().requires_grad_(), x.to(TPU).requires_grad_()
    want = loss(xc, target)
    got = (torch.compile(loss, backend="tpu") if compiled else loss)(xt, target.to(TPU))
    cotangent = torch.full(want.shape, float("inf"))  # no finite gradient may leak into ignored targets
    want.backward(cotangent)
    got.backward(cotangent.to(TPU))
    for a, e in ((got.detach().cpu(), want.detach()), (xt.grad.cpu(), xc.grad)):
        assert torch.equal(a.isnan(), e.isnan()) and torch.equal(a.nan_to_num(), e.nan_to_num()), (a, e)
        assert torch.equal(a.signbit(), e.signbit()), (a, e)

@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_compiled_multilabel_margin_loss_stops_at_the_first_minus_one(reduction):
    """Compiled, PyTorch's decomposition (applied at the Autograd key whatever the backend)
    also counted the target slots after the first -1 (pytorch/pytorch#141017; inductor on
    the CPU has it too): the loss and the gradient were wrong. Ours is traced for tpu."""
    torch._dynamo.reset()
    x = torch.randn(3, 5)
    target = torch.tensor([[3, -1, 1, 1, 0], [0, 2, -1, 4, 4], [1, 0, 2, 4, -1]])
    xc, xt = x.clone().requires_grad_(), x.to(TPU).requires_grad_()
    want = F.multilabel_margin_loss(xc, target, reduction=reduction)
    got = torch.compile(lambda a, t: F.multilabel_margin_loss(a, t, reduction=reduction), backend="tpu")(xt, target.to(TPU))
    assert_close(got, want)
    want.sum().backward()
    got.sum().backward()
    assert_close(xt.grad, xc.grad)


@pytest.mark.parametrize("loss", [F.multi_margin_loss, F.multilabel_margin_loss])
def test_compiled_margin_loss_of_a_vector_is_0_dim_like_the_cpus(loss):
    torch._dynamo.reset()
    target = torch.tensor(2) if loss is F.multi_margin_loss else torch.tensor([2, -1, 0, 0, 0])
    x = torch.randn(5)
    got = torch.compile(lambda a, t: loss(a, t, reduction="none"), backend="tpu")(x.to(TPU), target.to(TPU))
    want = loss(x, target, reduction="none")
    assert got.shape == want.shape == ()
    assert_close(got, want)


@pytest.mark.parametrize("target_shape", [(), (1,)])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_multi_margin_loss_of_a_vector_has_the_cpus_shape(reduction, target_shape):
    """A vector input with a 0-dim class index: the CPU's unreduced loss is 0-dim ([1] for a
    1-element target). PyTorch's meta function and decomposition give [1] for both."""
    x, target = torch.randn(5), torch.tensor(3).reshape(target_shape)
    xc, xt = x.clone().requires_grad_(), x.to(TPU).requires_grad_()
    want = F.multi_margin_loss(xc, target, reduction=reduction)
    got = F.multi_margin_loss(xt, target.to(TPU), reduction=reduction)
    assert got.shape == want.shape
    assert_close(got, want)
    g = torch.full(want.shape, 0.7)
    want.backward(g)
    got.backward(g.to(TPU))
    assert_close(xt.grad, xc.grad)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_multilabel_margin_loss_of_a_vector_is_0_dim_like_the_cpus(reduction):
    """An unbatched input's loss has no dimensions on the CPU whatever the reduction.
    PyTorch's meta function gave reduction='none' the shape [1], which the tpu result took;
    its backward then failed (grad_output [1] against output [])."""
    x, target = torch.randn(5), torch.tensor([3, 0, -1, 1, 1])
    xc, xt = x.clone().requires_grad_(), x.to(TPU).requires_grad_()
    want = F.multilabel_margin_loss(xc, target, reduction=reduction)
    got = F.multilabel_margin_loss(xt, target.to(TPU), reduction=reduction)
    assert got.shape == want.shape == ()
    assert_close(got, want)
    want.backward(torch.tensor(0.7))
    got.backward(torch.tensor(0.7).to(TPU))
    assert_close(xt.grad, xc.grad)
