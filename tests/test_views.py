"""Shape/view ops (as lowerings, through decompositions and autograd) and the semantics
of views and in-place writes on the eager device: every alias sees every write, as on CPU."""

from __future__ import annotations

import pytest
import torch
from utils import TPU, assert_close, check

aten = torch.ops.aten
def _r(*shape, grad=True):
    return torch.randn(*shape).requires_grad_(grad)


# -- view ops as values (forward + backward) -------------------------------------------------------------
VIEW_FNS = {
    "t": lambda a: a.t() * 2,
    "T_matmul": lambda a: a.T @ a,
    "permute": lambda a: a.reshape(2, 2, 5).permute(2, 0, 1).exp(),
    "transpose_contig": lambda a: a.transpose(0, 1).contiguous(),
    "view_reshape": lambda a: a.view(-1).reshape(5, 4).exp(),
    "squeeze_unsqueeze": lambda a: a.unsqueeze(0).unsqueeze(-1).squeeze(0).squeeze().exp(),
    "expand": lambda a: a[:1].expand(3, 4, 5).exp(),
    "slice_step": lambda a: a[1:, ::2].exp(),
    "select": lambda a: a[2].exp() + a[:, -1].sum(),
    "narrow": lambda a: a.narrow(1, 1, 3).exp(),
    "diagonal": lambda a: a.diagonal(1).exp() + a.diagonal(-2).sum(),
    "unfold": lambda a: a.unfold(1, 3, 1).exp(),
    "as_strided": lambda a: a.as_strided((3, 3), (1, 2), 1).exp(),
    "split": lambda a: [s.exp() for s in a.split(2, 1)],
    "split_sizes": lambda a: [s * 3 for s in a.split([1, 3], 0)],
    "chunk": lambda a: [s.exp() for s in a.chunk(3, 0)],
    "unbind": lambda a: [s * 2 for s in a.unbind(1)],
    "cat": lambda a: torch.cat([a, a.exp(), a[:, :2]], 1),
    "cat_empty": lambda a: torch.cat([a, torch.empty(0, device=a.device)]),
    "stack": lambda a: torch.stack([a[0], a[1], a[3]], 1),
    "flip": lambda a: a.flip(0, 1) * 2,
    "roll": lambda a: a.roll((2, -1), (1, 0)) * 2,
    "roll_flat": lambda a: a.roll(3) * 2,
    "pad": lambda a: torch.nn.functional.pad(a, (1, 2, -1, 1), value=0.5),
    "tril_triu": lambda a: a.tril(1) + a.triu(-1) * 2,
    "repeat": lambda a: a.repeat(2, 1, 3),
    "movedim": lambda a: a.reshape(2, 2, 5).movedim(0, 2).exp(),
    "flatten_unflatten": lambda a: a.unflatten(1, (5, 1)).flatten(0, 1).exp(),
}


@pytest.mark.parametrize("name", list(VIEW_FNS))
def test_view_ops(name):
    check(VIEW_FNS[name], _r(4, 5))


def test_int_dtype_views():
    x = torch.arange(24, dtype=torch.int32).reshape(2, 3, 4)
    check(lambda a: torch.cat([a.flip(2), a.transpose(1, 2).reshape(2, 3, 4)], 0), x)
    check(lambda a: (a.roll(1, 1), a.tril(), a[:, 1, ::3], a.repeat(1, 2, 1)), x)
    b = x > 10
    check(lambda a: torch.stack([a, a.flip(0)]), b)


# -- the functional lowerings directly (as they appear in decomposition / compiled graphs) ---------------
@pytest.mark.parametrize(
    "op,args",
    [
        (aten.slice_scatter.default, (torch.zeros(4, 6), torch.ones(4, 2), 1, 1, 5, 2)),
        (aten.slice_scatter.default, (torch.zeros(4, 6), torch.ones(2, 6), 0, -2, None, 1)),
        (aten.select_scatter.default, (torch.zeros(4, 6), torch.ones(6), 0, -1)),
        (aten.diagonal_scatter.default, (torch.zeros(4, 6), torch.ones(4), 2)),
        (aten.diagonal_scatter.default, (torch.zeros(4, 6), torch.ones(2), -2)),
        (aten.as_strided_scatter.default, (torch.zeros(12), torch.ones(2, 3), (2, 3), (1, 4), 1)),
        (aten.expand_copy.default, (torch.ones(3, 1), [2, 3, 4])),
        (aten.permute_copy.default, (torch.randn(2, 3, 4), [2, 0, 1])),
        (aten.view_copy.default, (torch.randn(2, 3, 4), [6, 4])),
        (aten.squeeze_copy.dims, (torch.randn(2, 1, 4, 1), [1, 3])),
        (aten.unsqueeze_copy.default, (torch.randn(2, 4), -1)),
        (aten.alias_copy.default, (torch.randn(2, 4),)),
        (aten.slice_copy.Tensor, (torch.randn(5, 4), 0, 1, 100, 2)),
        (aten.select_copy.int, (torch.randn(5, 4), 1, -2)),
        (aten.diagonal_copy.default, (torch.randn(3, 4, 5), 1, 2, 0)),
        (aten.t_copy.default, (torch.randn(3, 4),)),
        (aten.transpose_copy.int, (torch.randn(3, 4, 2), 0, 2)),
        (aten.unfold_copy.default, (torch.randn(3, 8), 1, 3, 2)),
        (aten.split_with_sizes_copy.default, (torch.randn(6, 2), [1, 2, 3])),
        (aten.unbind_copy.int, (torch.randn(3, 2), 0)),
        (aten.as_strided_copy.default, (torch.randn(10), (3, 3), (2, 1), 1)),
        (aten.constant_pad_nd.default, (torch.randn(2, 3), [1, 1, 2, 0], 1.5)),
    ],
)
def test_functional_lowerings(op, args):
    check(lambda *a: op(*a), *args, grad=False)


# -- semantics of views and in-place writes on the device -------------------------------------------------
def _same(fn, *shapes, dtype=torch.float32):
    """Run ``fn`` (which mutates its inputs and returns whatever it likes) on CPU and on
    tpu copies; compare the results and the mutated bases."""
    torch.manual_seed(0)
    cpu = [torch.randn(*s).to(dtype) for s in shapes]
    tpu = [c.to(TPU) for c in cpu]
    e = fn(*cpu)
    a = fn(*tpu)
    assert_close(a, e)
    assert_close(tpu, cpu)


def test_inplace_through_select():
    def f(x):
        x[0].add_(1)
        return x

    _same(f, (3, 4))


def test_setitem_through_t():
    def f(x):
        x.t()[2, 1] = 5
        return x.t()

    _same(f, (3, 4))


def test_strided_slice_mul():
    def f(x):
        v = x[:, ::2]
        v.mul_(2)
        return v, x[:, 1::2]

    _same(f, (3, 5))


def test_flat_view_write():
    def f(x):
        x.view(-1)[3] = 0
        x.view(-1)[5:9].fill_(7)
        return x

    _same(f, (3, 4))


def test_diagonal_zero():
    def f(x):
        d = x.diagonal()
        d.zero_()
        x.diagonal(1).add_(x.diagonal(-1))
        return d

    _same(f, (4, 4))


def test_expand_reads():
    def f(x):
        e = x.unsqueeze(0).expand(3, 2, 4)
        x[1, 2] = 9  # visible through the expanded view
        return e * 1, e.sum(0)

    _same(f, (2, 4))


def test_slice_assign():
    def f(x, y):
        x[1:3] = y
        x[:, -1] = y[0, 0]
        return x

    _same(f, (4, 3), (2, 3))


def test_slice_steps_and_flip():
    def f(x):
        a = x[::2, 1::3]
        b = x.flip(0)[::2]  # negative steps via flip: a copy
        x[::3] = -1
        return a * 1, b, x.flip(1)

    _same(f, (6, 7))


def test_index_put_setitem():
    def f(x):
        idx = torch.tensor([0, 2], device=x.device)
        x[idx] = torch.arange(4.0, device=x.device)
        x[idx, idx + 1] = 7.0
        x[torch.tensor([1, 1, 3], device=x.device)] += 1  # index_put_ without accumulate
        return x

    _same(f, (4, 4))


def test_index_put_accumulate():
    def f(x):
        idx = torch.tensor([0, 2, 0], device=x.device)
        x.index_put_((idx,), torch.ones(3, 4, device=x.device), accumulate=True)
        return x

    _same(f, (4, 4))


def test_mask_setitem():
    def f(x):
        x[x > 0.5] = 0
        m = x < -0.5
        x[m] = torch.arange(float(int(m.sum())), device=x.device)
        return x

    _same(f, (5, 6))


def test_mask_getitem():
    def f(x):
        m = x > 0
        return x[m], x[m[:, 0]], x[:, m[0]], x.masked_select(m)

    _same(f, (5, 6))


def test_chained_views_write():
    def f(x):
        v = x.view(4, 6)[1:].t()[::2].unsqueeze(0)
        v.add_(100)
        x.permute(2, 0, 1)[0, 1].mul_(-1)
        return v * 1, x

    _same(f, (2, 2, 6))


def test_contiguous_of_transposed():
    def f(x):
        c = x.t().contiguous()
        x[0, 0] = 42  # the copy is independent
        return c, c.is_contiguous()

    _same(f, (3, 5))


def test_stack_cat_of_views():
    def f(x):
        return torch.stack([x[0], x[:, 1], x.diagonal()]), torch.cat([x.t(), x[::2].t()], 1)

    _same(f, (4, 4))


def test_matmul_transposed():
    def f(x, y):
        return x.T @ y, x.t().mm(y[:, :2])

    _same(f, (3, 4), (3, 5))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("batch", [1, 3])
def test_batched_matmul_of_transposed_16bit_views(dtype, batch):
    # XLA CPU cannot run some bf16 x bf16 -> f32 dots it rewrites from unit-batch ones
    a = torch.randn(batch, 8, 3).to(dtype)
    b = torch.randn(batch, 8, 4).to(dtype)
    got = torch.bmm(a.to("tpu").transpose(1, 2), b.to("tpu")).cpu()
    torch.testing.assert_close(got, torch.bmm(a.transpose(1, 2), b))


def test_copy_into_view_from_view():
    def f(x, y):
        x[:, 1:3].copy_(y.t()[:, ::2])
        x.t()[0].copy_(y[0, :4])
        return x

    _same(f, (4, 5), (3, 4))


def test_int_inplace_views():
    def f(x):
        x[1::2].mul_(3)
        x.t()[0].sub_(1)
        return x

    _same(f, (4, 3), dtype=torch.int64)


def test_view_of_base_after_write():
    x = torch.zeros(3, 4, device=TPU)
    v = x[1]
    x.fill_(2)
    v.add_(1)
    assert_close(x, torch.tensor([[2.0] * 4, [3.0] * 4, [2.0] * 4]))
    assert v._base is x


def test_unsafe_view_shares_storage_so_kron_out_writes_through():
    x = torch.zeros(4, 6).to(TPU)
    u = torch.ops.aten._unsafe_view(x, [2, 12])
    u.add_(1)
    assert x.cpu().sum().item() == 24.0
    a, b = torch.randn(2, 3), torch.randn(4, 5)
    for out in (torch.empty(0).to(TPU), torch.empty(8, 15).to(TPU)):
        torch.kron(a.to(TPU), b.to(TPU), out=out)  # kron_out multiplies into an _unsafe_view of out
        assert_close(out, torch.kron(a, b))


# -- reading views back (.cpu(), .item()) -------------------------------------------------------------------
READ_BACK = {
    "whole": lambda a: a,
    "transposed": lambda a: a.transpose(0, 2),
    "sliced_strided": lambda a: a[1:, ::2, 3],
    "selected": lambda a: a[:, 2],
    "one_element": lambda a: a[4, 5, 6],
    "empty": lambda a: a[0:0],
    "empty_at_the_end": lambda a: a.flatten()[210:],
    "last_element": lambda a: a.flatten()[-1:],
    "expanded": lambda a: a[:1].expand(3, 6, 7),
    "permuted_slice": lambda a: a.permute(2, 0, 1)[1:],
    "as_strided_overlapping": lambda a: a.flatten().as_strided((4, 3), (2, 1), 5),
    "bytes": lambda a: a[1].view(torch.uint8),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool, torch.complex64])
@pytest.mark.parametrize("name", list(READ_BACK))
def test_a_view_reads_back_as_the_cpu_view(name: str, dtype: torch.dtype) -> None:
    """.cpu() and .item() of a view copy exactly the elements its geometry addresses (a
    read through numpy's strided view of the storage's buffer), laid out as PyTorch's
    preserve_format lays a copy out (a clone's strides: an expanded view's copy is contiguous)."""
    host = (torch.randn(5, 6, 7) * 4).to(dtype)
    view = READ_BACK[name]
    if name == "bytes" and dtype is torch.bool:
        pytest.skip("a bool storage is one byte per element already")
    expected, got = view(host), view(host.to(TPU)).cpu()
    assert got.shape == expected.shape and got.dtype == expected.dtype and got.stride() == expected.clone().stride()
    assert torch.equal(got, expected)
    if expected.numel() == 1:
        assert view(host.to(TPU)).item() == expected.item()


def test_is_set_to_answers_as_on_the_cpu() -> None:
    """``Tensor.is_set_to``: same storage, offset, sizes and strides (a metadata query)."""

    def answers(dev: str) -> list[bool]:
        x = torch.arange(6.0, device=dev)
        same = torch.empty(0, device=dev).set_(x)
        at_offset = torch.empty(0, device=dev).set_(x.untyped_storage(), 2, (2,), (2,))
        strided = x[2::2]
        empty_a, empty_b = torch.empty(0, device=dev), torch.empty(0, device=dev)
        pairs = [(x, x), (same, x), (x.view(2, 3), x), (x[1:], x), (x.clone(), x), (at_offset, strided), (empty_a, empty_b)]
        return [a.is_set_to(b) for a, b in pairs]

    assert answers("tpu") == answers("cpu") == [True, True, False, False, False, True, False]
