"""Gather/scatter/indexing ops against CPU, forward and backward, plus the host-synced
ops with data-dependent shapes (nonzero, masked_select, bool-mask indexing)."""

from __future__ import annotations

import pytest
import torch
from utils import TPU, assert_close, check

import torchtpu

aten = torch.ops.aten
def _r(*shape):
    return torch.randn(*shape).requires_grad_()


def _i(*vals):
    return torch.tensor(vals)


def _dev(t, like):
    return t.to(like.device)


# -- advanced indexing ---------------------------------------------------------------------------------------
INDEX_FNS = {
    "rows": lambda a, i: a[i],
    "cols": lambda a, i: a[:, i],
    "neg": lambda a, i: a[-i - 1],
    "pair": lambda a, i: a[i, i.flip(0)],
    "broadcast": lambda a, i: a[i.unsqueeze(1), i.unsqueeze(0)],
    "none_between": lambda a, i: a.reshape(2, 2, 5)[i % 2, :, i],  # non-adjacent: result dims first
    "middle": lambda a, i: a.reshape(2, 2, 5)[:, i % 2],
    "newaxis": lambda a, i: a[None, i, None],
    "int_and_tensor": lambda a, i: a[1, i],
    "2d_index": lambda a, i: a[i.reshape(3, 1).expand(3, 2)],
}


@pytest.mark.parametrize("name", list(INDEX_FNS))
def test_index(name):
    check(INDEX_FNS[name], _r(4, 5), _i(2, 0, 3))


def test_index_int_dtype_and_int32_index():
    x = torch.arange(20).reshape(4, 5)
    check(lambda a, i: a[i, 1:], x, torch.tensor([3, 1], dtype=torch.int32))


def test_index_put_functional():
    check(lambda a, i, v: torch.index_put(a, (i,), v), _r(4, 5), _i(2, 0), _r(2, 5))
    check(lambda a, i, v: aten.index_put.default(a, [None, i], v, True), _r(4, 5), _i(2, 0, 2), _r(3))
    check(lambda a, i, v: torch.index_put(a, (i, i), v, accumulate=True), _r(4, 5), _i(1, 1, 3), _r(1))
    x = torch.randn(2, 3, 4)
    check(lambda a, i, v: aten.index_put.default(a, [i, None, i], v), x, _i(1, 0), torch.randn(2, 3), grad=False)
    check(lambda a, i, v: aten.index_put.default(a, [None, i], v), x, _i(2, 0), torch.randn(2, 1, 4), grad=False)


def test_index_put_bool_mask_static():
    x = torch.randn(4, 5)
    m = x > 0
    check(lambda a, m, v: torch.index_put(a, (m,), v), x, m, torch.tensor(3.0), grad=False)
    n = int(m.sum())
    check(lambda a, m, v: torch.index_put(a, (m,), v, accumulate=True), x, m, torch.randn(n), grad=False)
    rm = torch.tensor([True, False, True, True])
    check(lambda a, m, v: torch.index_put(a, (m,), v), x, rm, torch.randn(3, 5), grad=False)
    check(lambda a, m, v: torch.index_put(a, (m,), v), x, rm, torch.randn(5), grad=False)


@pytest.mark.parametrize("mode", ["eager", "defer_and_fuse"])
def test_masked_assignment_needs_one_row_per_true_element(mode):
    """``x[mask] = rows`` with as many rows as True elements (none included: the empty
    ``mode[mask] = ...`` in ``Dirichlet.mode`` failed to compile), and the CPU's errors for
    the wrong number of rows and for a masked_scatter source that is too short (before,
    the last row filled the remaining positions silently)."""
    x = torch.randn(4, 3)
    none, some = torch.zeros(4, dtype=torch.bool), torch.tensor([True, False, True, True])
    with torchtpu.eager_mode(mode):
        for mask, rows in [(none, 0), (some, 3)]:
            want, got, v = x.clone(), x.to(TPU), torch.randn(rows, 3)
            want[mask] = v
            got[mask.to(TPU)] = v.to(TPU)
            assert_close(got, want)
        for rows in [0, 2, 4]:
            with pytest.raises(RuntimeError, match=rf"value tensor of shape \[{rows}, 3\] cannot be broadcast to indexing result of shape \[3, 3\]"):
                got = x.to(TPU)
                got[some.to(TPU)] = torch.ones(rows, 3).to(TPU)
                got.cpu()
        with pytest.raises(RuntimeError, match="Number of elements of source < number of ones in mask"):
            torch.zeros(4).to(TPU).masked_scatter(some.to(TPU), torch.ones(2).to(TPU)).cpu()
        assert_close(torch.zeros(4).to(TPU).masked_scatter(some.to(TPU), torch.arange(5.0).to(TPU)), torch.tensor([0.0, 0, 1, 2]))


def test_index_with_bool_masks_eager():
    x = torch.randn(4, 5)
    m = x > 0
    rm = torch.tensor([True, False, True, True])
    check(lambda a, m: a[m], x, m, grad=False)
    check(lambda a, m: (a[m, 1:], a[1:, m[0]]), x, rm, grad=False)
    check(lambda a, m: a[m, torch.tensor([0, 1, 4], device=a.device)], x, rm, grad=False)


def test_index_put_mixed_mask_eager():
    def f(a):
        a[1:, torch.tensor([True, False, True, False, True], device=a.device)] = 5.0
        a[torch.tensor([0, 3], device=a.device), torch.tensor([True, False, True, False, False], device=a.device)] = -1.0
        return a

    check(f, torch.randn(4, 5), grad=False)


def test_nonzero_masked_select():
    x = torch.randn(4, 5)
    check(lambda a: (a > 0).nonzero(), x, grad=False)
    check(lambda a: torch.nonzero(a > 0, as_tuple=True), x, grad=False)
    check(lambda a: torch.argwhere(a > 0.5), x, grad=False)
    check(lambda a: a.masked_select(a > 0), _r(4, 5))
    check(lambda a: a.masked_select(a[0] > 0), _r(4, 5))  # broadcast mask
    check(lambda a: (a > 100).nonzero(), x, grad=False)  # empty


# -- index_select / gather / scatter --------------------------------------------------------------------------
def test_index_select_gather_take():
    check(lambda a, i: a.index_select(1, i), _r(4, 5), _i(4, 0, 0))
    check(lambda a, i: a.index_select(0, i), _r(4, 5), torch.tensor(2))
    g = torch.tensor([[0, 1, 0], [2, 3, 4], [4, 4, 4], [1, 0, 2]])
    check(lambda a, i: a.gather(1, i), _r(4, 5), g)
    check(lambda a, i: a.gather(0, i[:3, :2] % 4), _r(4, 5), g)
    check(lambda a, i: a.take(i), _r(4, 5), torch.tensor([[0, 19], [-1, 7]]))


@pytest.mark.filterwarnings("ignore:The reduce argument")
def test_scatter_variants():
    idx = torch.tensor([[0, 1, 2, 0, 0], [2, 2, 0, 1, 1]])
    check(lambda a, i, s: a.scatter(0, i, s), _r(3, 5), idx, _r(2, 5))
    check(lambda a, i: a.scatter(0, i, 2.5), _r(3, 5), idx)
    check(lambda a, i, s: a.scatter_add(0, i, s), _r(3, 5), idx, _r(2, 5))
    check(lambda a, i, s: a.scatter_add(0, i, s), _r(3, 5), idx[:, :3], _r(4, 6), grad=False)  # src larger than index
    check(lambda a, i, s: a.scatter(0, i, s, reduce="multiply"), torch.randn(3, 5), idx, torch.randn(2, 5), grad=False)
    check(lambda a, i: a.scatter(1, i, 2.0, reduce="add"), torch.randn(3, 5), idx[:, :2] + 1, grad=False)


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce(reduce, include_self):
    idx = torch.tensor([[0, 1, 2, 0, 0], [2, 2, 0, 0, 0]])
    check(
        lambda a, i, s: a.scatter_reduce(0, i, s, reduce, include_self=include_self),
        torch.randn(4, 5),
        idx,
        torch.randn(2, 5),
        grad=False,
    )


def test_scatter_reduce_int_mean():
    idx = torch.tensor([[0, 1, 2, 0, 0], [2, 2, 0, 0, 0]])
    x = torch.randint(-9, 9, (3, 5))
    s = torch.randint(-9, 9, (2, 5))
    check(lambda a, i, s: (a.scatter_reduce(0, i, s, "mean"), a.scatter_reduce(0, i, s, "amax", include_self=False)), x, idx, s)


def test_index_add_copy_fill():
    i = _i(2, 0, 2)
    check(lambda a, i, s: a.index_add(0, i, s, alpha=2.0), _r(4, 5), i, _r(3, 5))
    check(lambda a, i, s: a.index_add(1, i, s), _r(4, 5), i, _r(4, 3))
    check(lambda a, i, s: a.index_copy(1, i[:2], s), _r(4, 5), i, _r(4, 2))
    check(lambda a, i: a.index_fill(1, i, -3.0), _r(4, 5), i)
    check(lambda a, i, v: a.index_fill(0, i, v), _r(4, 5), i, torch.tensor(7.0))


# The backward of an in-place op on a view (CopySlices) calls new_empty_strided, which has
# no tpu kernel yet (its decomposition needs prims.empty_strided).
def test_index_add_copy_fill_inplace_grad():
    i = _i(2, 0, 2)

    def inplace(a, i, s):
        a = a.clone()
        a.index_add_(0, i, s)
        a[:, 1:].index_fill_(1, i[:1], 0.5)
        a.index_copy_(0, i[1:2], s[:1])
        return a

    check(inplace, _r(4, 5), i, _r(3, 5))


def test_masked_scatter_and_fill():
    x = torch.randn(4, 5)
    m = x > 0
    check(lambda a, m, s: a.masked_scatter(m, s), _r(4, 5), m, _r(20))
    check(lambda a, m, s: a.masked_scatter(m[0], s), _r(4, 5), m, _r(4, 5))  # broadcast mask


def test_embedding_and_backward():
    w = _r(10, 3)
    idx = torch.tensor([[0, 2, 2], [9, 0, 1]])
    check(lambda w, i: torch.nn.functional.embedding(i, w), w, idx)
    check(lambda w, i: torch.nn.functional.embedding(i, w, padding_idx=2), w, idx)
    check(lambda w, i: torch.nn.functional.embedding(i, w, scale_grad_by_freq=True), w, idx)
    emb = torch.nn.Embedding(10, 3, padding_idx=0)
    check(lambda w, i: torch.nn.functional.embedding(i, w, padding_idx=0), emb.weight.detach().clone().requires_grad_(), idx)


def test_one_hot():
    check(lambda i: torch.nn.functional.one_hot(i, 6), torch.tensor([0, 5, 2]))
    check(lambda i: torch.nn.functional.one_hot(i), torch.tensor([[0, 3], [2, 1]]))


def test_setitem_tensor_index_on_view():
    x = torch.zeros(4, 6)
    t = x.to(TPU)
    for a in (x, t):
        v = a[:, ::2]
        v[torch.tensor([1, 3], device=a.device)] = torch.tensor([1.0, 2.0, 3.0], device=a.device)
        v[v > 1.5] += 10
    assert_close(t, x)


def test_nonzero_static():
    x = torch.randn(4, 5)
    for size in (3, 20, 25):
        check(lambda a, size=size: torch.nonzero_static(a > 0, size=size), x, grad=False)
    check(lambda a: torch.nonzero_static(a > 0, size=30, fill_value=7), x, grad=False)


@pytest.mark.filterwarnings("ignore:indexing with dtype torch.uint8")
def test_index_edge_cases():
    x = torch.randn(4, 5)
    y = torch.arange(60.0).reshape(3, 4, 5)
    check(lambda a, m: a[m], x, (x > 0).to(torch.uint8), grad=False)
    check(lambda a, i: a[i], x, torch.tensor(2), grad=False)  # 0-d index
    check(lambda a, i: a[i], x, torch.tensor([], dtype=torch.long), grad=False)
    check(lambda a, i, j: (a[:, i, j], a[i, :, j]), y, torch.tensor([1, 2]), torch.tensor([0, 4]), grad=False)
    check(lambda a, i: (a > 0).index_put((i,), torch.tensor(True, device=a.device), accumulate=True), x, _i(0, 1), grad=False)
    check(lambda w, i: torch.nn.functional.embedding(i, w), x, torch.tensor([1, 3], dtype=torch.int32), grad=False)
    check(lambda a, i: a.clone().index_put_((i,), torch.ones(3, 5, device=a.device), accumulate=True), x, _i(0, 0, 1), grad=False)
    check(lambda a, i: torch.zeros(5, device=a.device).scatter(0, i, a[0, 0]), x, torch.tensor(2), grad=False)


@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.0, float("inf")])
def test_embedding_renorm_matches_cpu(norm_type):
    w = torch.randn(10, 4) * 3
    idx = torch.tensor([[1, 3, 3], [7, 0, 1]])  # duplicates renormalize once
    got = w.clone().to(TPU)
    torch.embedding_renorm_(got, idx.to(TPU), 1.5, norm_type)
    want = w.clone()
    torch.embedding_renorm_(want, idx, 1.5, norm_type)
    assert_close(got, want)


def test_embedding_max_norm_module():
    torch.manual_seed(0)
    cpu = torch.nn.Embedding(10, 4, max_norm=1.0)
    dev = torch.nn.Embedding(10, 4, max_norm=1.0)
    dev.load_state_dict(cpu.state_dict())
    dev = dev.to(TPU)
    x = torch.tensor([1, 2, 2, 5])
    assert_close(dev(x.to(TPU)), cpu(x))
    assert_close(dev.weight.detach(), cpu.weight.detach())


def test_bincount_and_out_forms_of_data_dependent_ops():
    x = torch.randint(0, 7, (20,))
    w = torch.randn(20)
    assert torch.equal(torch.bincount(x.to(TPU)).cpu(), torch.bincount(x))
    assert_close(torch.bincount(x.to(TPU), w.to(TPU), minlength=10), torch.bincount(x, w, minlength=10))
    out = torch.empty(0, dtype=torch.int64).to(TPU)
    torch.nonzero(x.to(TPU) > 3, out=out)
    assert torch.equal(out.cpu(), torch.nonzero(x > 3))
    out = torch.empty(0).to(TPU)
    torch.masked_select(w.to(TPU), x.to(TPU) > 3, out=out)
    assert torch.equal(out.cpu(), torch.masked_select(w, x > 3))


def test_histogram_and_histogramdd_match_cpu():
    w = torch.randn(50)
    hist, edges = torch.histogram(w.to(TPU), bins=5)
    want_hist, want_edges = torch.histogram(w, bins=5)
    assert hist.device.type == "tpu"
    assert_close(hist, want_hist)
    assert_close(edges, want_edges)
    pts = torch.randn(30, 2)
    assert_close(torch.histogramdd(pts.to(TPU), bins=[3, 4]).hist, torch.histogramdd(pts, bins=[3, 4]).hist)


def test_repeat_interleave_with_tensor_repeats():
    x, r = torch.randn(4, 3), torch.tensor([1, 0, 3, 2])  # output length sum(r): a host sync
    assert torch.equal(torch.repeat_interleave(x.to(TPU), r.to(TPU), dim=0).cpu(), torch.repeat_interleave(x, r, dim=0))
    assert torch.equal(torch.repeat_interleave(r.to(TPU)).cpu(), torch.repeat_interleave(r))
