"""layer_norm, batch_norm (train/eval, running statistics), group_norm on tpu vs CPU."""

import pytest
import torch
import torch.nn.functional as F
from utils import assert_close, check, check_refereed

TPU = torch.device("tpu")


def _p(*shape, dtype=torch.float32):
    return torch.randn(shape).to(dtype).requires_grad_()


@pytest.mark.parametrize("shape,normalized", [((4, 6), (6,)), ((2, 3, 5), (3, 5)), ((3, 7), (7,))])
def test_layer_norm(shape, normalized):
    check(lambda x, w, b: F.layer_norm(x, normalized, w, b, eps=1e-5), _p(*shape), _p(*normalized), _p(*normalized))


def test_layer_norm_no_affine():
    check(lambda x: F.layer_norm(x, (5,)), _p(3, 5))


# the CPU's 16-bit backward rounds intermediates: where the results differ by more than
# PyTorch's default tolerance, ours must be the closer to float64
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_layer_norm_dtypes(dtype):
    check_refereed(lambda x, w, b: F.layer_norm(x, (8,), w, b), _p(4, 8, dtype=dtype), _p(8, dtype=dtype), _p(8, dtype=dtype))


def test_layer_norm_module():
    m = torch.nn.LayerNorm(6)
    mt = torch.nn.LayerNorm(6).to(TPU)
    mt.load_state_dict(m.state_dict())
    x = torch.randn(2, 3, 6)
    assert_close(mt(x.to(TPU)), m(x))


@pytest.mark.parametrize("shape", [(4, 3), (4, 3, 5), (2, 3, 4, 4)])
def test_batch_norm_train_no_stats(shape):
    check(lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True), _p(*shape), _p(3), _p(3))


@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 4, 4)])
def test_batch_norm_eval(shape):
    rm = torch.randn(3)
    rv = torch.rand(3) + 0.5
    check(lambda x, rm, rv, w, b: F.batch_norm(x, rm, rv, w, b, training=False, eps=1e-3), _p(*shape), rm, rv, _p(3), _p(3))


def test_batch_norm_train_running_stats():
    rm, rv = torch.zeros(3), torch.ones(3)
    rmt, rvt = rm.to(TPU), rv.to(TPU)
    w, b = torch.randn(3), torch.randn(3)
    for _ in range(3):
        x = torch.randn(4, 3, 5) * 2 + 1
        y = F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.3)
        yt = F.batch_norm(x.to(TPU), rmt, rvt, w.to(TPU), b.to(TPU), training=True, momentum=0.3)
        assert_close(yt, y)
    assert_close(rmt, rm)
    assert_close(rvt, rv)


def test_batch_norm_train_grad_with_stats():
    check(
        lambda x, rm, rv, w, b: F.batch_norm(x, rm, rv, w, b, training=True),
        _p(4, 3, 2),
        torch.zeros(3),
        torch.ones(3),
        _p(3),
        _p(3),
    )


def test_batch_norm_module():
    m = torch.nn.BatchNorm2d(3)
    mt = torch.nn.BatchNorm2d(3).to(TPU)
    for _ in range(3):
        x = torch.randn(4, 3, 2, 2)
        assert_close(mt(x.to(TPU)), m(x))
    assert_close(mt.running_mean, m.running_mean)
    assert_close(mt.running_var, m.running_var)
    assert int(mt.num_batches_tracked.cpu()) == int(m.num_batches_tracked) == 3
    m.eval()
    mt.eval()
    x = torch.randn(2, 3, 2, 2)
    assert_close(mt(x.to(TPU)), m(x))


def test_batch_norm_low_precision():
    check_refereed(lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True), _p(8, 4, dtype=torch.bfloat16), _p(4), _p(4))


@pytest.mark.parametrize("shape,groups", [((2, 6), 3), ((2, 6, 5), 2), ((2, 4, 3, 3), 4)])
def test_group_norm(shape, groups):
    c = shape[1]
    check(lambda x, w, b: F.group_norm(x, groups, w, b), _p(*shape), _p(c), _p(c))


def test_group_norm_no_affine():
    check(lambda x: F.group_norm(x, 2), _p(3, 4, 5))


def test_group_norm_bf16():
    bf = torch.bfloat16
    check_refereed(lambda x, w, b: F.group_norm(x, 2, w, b), _p(2, 4, 6, dtype=bf), _p(4, dtype=bf), _p(4, dtype=bf))


def test_batch_norm_with_update_ops():
    # the ops torch.export / compile paths use; mutation goes through _batch_norm_with_update_functional
    aten = torch.ops.aten
    x, w, b, g = torch.randn(4, 3, 5), torch.randn(3), torch.randn(3), torch.randn(4, 3, 5)
    rm, rv = torch.randn(3), torch.rand(3) + 0.5
    rmt, rvt = rm.to(TPU), rv.to(TPU)
    y = aten._batch_norm_with_update(x, w, b, rm, rv, 0.1, 1e-5)
    yt = aten._batch_norm_with_update(x.to(TPU), w.to(TPU), b.to(TPU), rmt, rvt, 0.1, 1e-5)
    assert_close(yt[:3], y[:3])
    assert_close(rmt, rm)
    assert_close(rvt, rv)
    ge = aten.batch_norm_backward(g, x, w, rm, rv, y[1], y[2], True, 1e-5, [True, True, True], y[3])
    ga = aten.batch_norm_backward(g.to(TPU), x.to(TPU), w.to(TPU), rmt, rvt, yt[1], yt[2], True, 1e-5, [True, True, True], yt[3])
    assert_close(ga, ge)
    assert_close(
        aten._batch_norm_no_update(x.to(TPU), w.to(TPU), b.to(TPU), rmt, rvt, 0.1, 1e-5)[0],
        aten._batch_norm_no_update(x, w, b, rm, rv, 0.1, 1e-5)[0],
    )


@pytest.mark.parametrize("channels_last", [False, True])
def test_sync_batch_norm_ops_merge_slices_as_one_batch_norm(channels_last):
    """nn.SyncBatchNorm's per-device ops, with two slices of one batch in one process as two
    ranks would hold them (the sums that the ranks all-reduce added here): the output,
    running statistics and gradients of F.batch_norm over the whole batch on the CPU."""
    torch.manual_seed(0)
    eps, momentum, split = 1e-5, 0.1, [3, 5]
    x, dy = torch.randn(8, 4, 5, 6) * 2 + 1, torch.randn(8, 4, 5, 6)
    weight, bias = torch.rand(4) + 0.5, torch.randn(4)
    if channels_last:
        x, dy = x.contiguous(memory_format=torch.channels_last), dy.contiguous(memory_format=torch.channels_last)
    xr = x.clone().requires_grad_()
    wr, br = weight.clone().requires_grad_(), bias.clone().requires_grad_()
    running_mean, running_var = torch.zeros(4), torch.ones(4)
    want = F.batch_norm(xr, running_mean, running_var, wr, br, training=True, momentum=momentum, eps=eps)
    want.backward(dy)

    parts = [s.to(TPU) for s in x.split(split)]
    grads = [g.to(TPU) for g in dy.split(split)]
    w, b = weight.to(TPU), bias.to(TPU)
    stats = [torch.batch_norm_stats(p, eps) for p in parts]
    counts = torch.tensor([n * 30 for n in split], device=TPU)
    rm, rv = torch.zeros(4, device=TPU), torch.ones(4, device=TPU)
    mean, invstd = torch.batch_norm_gather_stats_with_counts(
        parts[0], torch.stack([m for m, _ in stats]), torch.stack([s for _, s in stats]), rm, rv, momentum, eps, counts.float()
    )
    out = torch.cat([torch.batch_norm_elemt(p, w, b, mean, invstd, eps) for p in parts])
    assert_close(out, want.detach())
    assert_close(rm, running_mean)
    assert_close(rv, running_var)

    reduced = [torch.batch_norm_backward_reduce(g, p, mean, invstd, w, True, True, True) for g, p in zip(grads, parts)]
    sum_dy, sum_dy_xmu, grad_w, grad_b = (sum(r[i] for r in reduced) for i in range(4))
    dx = torch.cat(
        [torch.batch_norm_backward_elemt(g, p, mean, invstd, w, sum_dy, sum_dy_xmu, counts.int()) for g, p in zip(grads, parts)]
    )
    assert_close(dx, xr.grad)
    assert_close(grad_w, wr.grad)
    assert_close(grad_b, br.grad)


def test_batch_norm_update_stats_as_on_the_cpu():
    x = torch.randn(2, 3, 4, 5) * 3 + 1
    rm, rv = torch.zeros(3), torch.ones(3)
    rm_t, rv_t = rm.to(TPU), rv.to(TPU)
    want = torch.batch_norm_update_stats(x, rm, rv, 0.1)
    got = torch.batch_norm_update_stats(x.to(TPU), rm_t, rv_t, 0.1)
    assert_close(got, want)
    assert_close(rm_t, rm)
    assert_close(rv_t, rv)
