"""Tensors that grow, and views that move, without a program per length or position.

A view's storage offset is a runtime operand of eager programs (``ids[:, -1:]``,
``cache[i]``), a size-1 dimension's stride is not part of a program's key, and a
``torch.cat`` that lays its inputs end to end writes into a storage with spare capacity
(``torchtpu/eager/growth.py``), so a loop growing a tensor by a token compiles
O(log n) programs. Every result is compared with the same computation on the CPU.
"""

from __future__ import annotations

import pytest
import torch

import torchtpu
from tests.utils import TPU
from torchtpu.eager import growth
from torchtpu.runtime import cache


@pytest.fixture
def cold(monkeypatch: pytest.MonkeyPatch) -> None:
    """Count every program a block needs: no disk cache, an empty executable cache."""
    monkeypatch.setenv("TORCHTPU_CACHE_DIR", "")
    cache.clear_memory()


def compiles() -> int:
    return torchtpu.metrics.snapshot()["compiles"]


def test_views_at_every_offset_share_a_program(cold: None) -> None:
    x = torch.randn(6, 10)
    t = x.to(TPU)
    before = compiles()
    for i in range(1, 9):
        torch.testing.assert_close((t[:, i : i + 2] * 2).cpu(), x[:, i : i + 2] * 2, rtol=0, atol=0)  # strided
        torch.testing.assert_close((t.view(-1)[i : i + 5] + 1).cpu(), x.view(-1)[i : i + 5] + 1, rtol=0, atol=0)
    assert compiles() - before <= 2  # one program per view geometry, not one per offset


def test_in_place_writes_at_runtime_offsets() -> None:
    x = torch.randn(6, 10)
    t = x.to(TPU)
    for i in range(1, 5):
        t[:, i : i + 2].add_(1.5)
        x[:, i : i + 2].add_(1.5)
        t[i].mul_(3)
        x[i].mul_(3)
        t[i, ::3] = float(i)  # strided write through a scatter
        x[i, ::3] = float(i)
    torch.testing.assert_close(t.cpu(), x, rtol=0, atol=0)


def test_overlapping_and_reinterpreted_views_at_offsets() -> None:
    u = torch.arange(40.0).reshape(4, 10)
    v = u.to(TPU)
    for i in range(3):  # unfold with step < size overlaps: read by a gather
        torch.testing.assert_close((v.unfold(1, 3, 2)[i:] * 1).cpu(), u.unfold(1, 3, 2)[i:] * 1, rtol=0, atol=0)
    z = torch.randn(8, dtype=torch.complex64)
    tz = z.to(TPU)
    for i in range(1, 4):
        torch.testing.assert_close((tz[i:].conj() * 2).cpu(), z[i:].conj() * 2, rtol=0, atol=0)
        torch.testing.assert_close((tz.view(torch.float32)[i:] + 0).cpu(), z.view(torch.float32)[i:], rtol=0, atol=0)


def test_size_one_dims_strides_do_not_make_programs(cold: None) -> None:
    before = compiles()
    for n in range(2, 12):
        ids = torch.arange(n).reshape(1, n)
        t = ids.to(TPU)
        # each (1, 1) view has strides (n, 1); each storage has n elements (the key's
        # storage size changes too: count the programs for views of one storage size)
        torch.testing.assert_close((t[:, -1:] + 7).cpu(), ids[:, -1:] + 7, rtol=0, atol=0)
    assert compiles() - before <= 10  # one per storage size at most (not two per n)
    big = torch.arange(64).reshape(1, 64).to(TPU)
    before = compiles()
    for i in range(1, 40):
        torch.testing.assert_close((big[:, i : i + 1] + 7).cpu(), torch.tensor([[i + 7]]), rtol=0, atol=0)
    assert compiles() - before <= 1


def test_capacity() -> None:
    assert [growth.capacity(n) for n in (1, 512, 513, 1024, 1025, 1 << 16)] == [512, 512, 1024, 1024, 2048, 1 << 16]
    assert [growth.capacity(1, size) for size in (1, 2, 4, 8, 16)] == [4096, 2048, 1024, 512, 256]  # at least 4 KiB
    n = (1 << 16) + 1
    assert growth.capacity(n) == (1 << 16) + (1 << 14)  # past 64K elements: steps of an eighth
    assert all(growth.capacity(n) >= n for n in range(1, 300000, 997))


def generate_like(device: str, steps: int) -> torch.Tensor:
    """A decode loop's bookkeeping: append a token, read the last one, check it."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 100, (1, 8), generator=g).to(device)
    pos = torch.arange(8).reshape(1, 8).to(device)
    for _ in range(steps):
        new = torch.randint(0, 100, (1,), generator=g).to(device)
        ids = torch.cat([ids, new[:, None]], dim=-1)
        pos = torch.cat([pos, pos[:, -1:] + 1], dim=-1)
        done = torch.isin(ids[:, -1:], torch.tensor([5], device=device)).any(dim=-1)
        ids = ids.clone() if bool(done) else ids
    return torch.cat([ids, pos])


@pytest.mark.parametrize("mode", ["eager", "defer_and_fuse"])
def test_growing_tensor_compiles_per_capacity_not_per_length(cold: None, mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(growth, "_MIN_BYTES", 512)  # int64 storages of 64, 128, 256: 100 tokens cross two
    expected = generate_like("cpu", 100)
    before = compiles()
    with torchtpu.eager_mode(mode):
        got = generate_like(TPU, 100)
    torch.testing.assert_close(got.cpu(), expected, rtol=0, atol=0)
    # 100 lengths crossing the capacities 64 and 128: a handful of programs per op (measured:
    # eager 13, DeferAndFuse 6), where exact shapes made about 4 per token
    assert compiles() - before <= (15 if mode == "eager" else 8), compiles() - before


def test_appended_result_is_an_ordinary_contiguous_tensor() -> None:
    a = torch.randn(1, 5)
    t = torch.cat([a.to(TPU), a.to(TPU)], dim=1)
    assert t.shape == (1, 10) and t.stride() == (10, 1) and t.is_contiguous()
    assert t.untyped_storage().nbytes() == growth.capacity(10, 4) * 4  # the spare capacity
    torch.testing.assert_close(t.cpu(), torch.cat([a, a], dim=1), rtol=0, atol=0)
    torch.testing.assert_close(t.view(2, 5).cpu(), torch.cat([a, a], dim=1).view(2, 5), rtol=0, atol=0)
    saved = t.cpu()
    t.add_(1)  # in place on the appended storage
    torch.testing.assert_close(t.cpu(), saved + 1, rtol=0, atol=0)


@pytest.mark.parametrize(
    "pieces, dim",
    [
        ([(3, 4, 5), (3, 4, 5)], 0),  # an append along dim 0
        ([(3, 4, 5), (3, 2, 5)], 1),  # not an append: rows interleave
        ([(1, 3, 5), (1, 2, 5)], 1),  # an append: the leading dim has size 1
        ([(1, 3, 5), (1, 3, 5), (1, 1, 5)], -2),
        ([(7,), (0,), (4,)], 0),  # an empty piece: the ordinary op
    ],
)
def test_cat_appends_match_the_cpu(pieces: list[tuple[int, ...]], dim: int) -> None:
    xs = [torch.randn(s) for s in pieces]
    torch.testing.assert_close(torch.cat([x.to(TPU) for x in xs], dim).cpu(), torch.cat(xs, dim), rtol=0, atol=0)


def test_cat_of_views_with_offsets_and_of_itself() -> None:
    a = torch.randn(50)
    ta = a.to(TPU)
    got = torch.cat([ta[3:10], ta[20:25], ta[:4], ta[3:10]])
    torch.testing.assert_close(got.cpu(), torch.cat([a[3:10], a[20:25], a[:4], a[3:10]]), rtol=0, atol=0)
    big = torch.randn(1000)
    tb = big.to(TPU)  # a small view of a storage larger than the result's capacity
    torch.testing.assert_close(torch.cat([tb[990:], tb[:3]]).cpu(), torch.cat([big[990:], big[:3]]), rtol=0, atol=0)


def test_cat_mixed_dtypes_and_devices_as_the_cpu() -> None:
    a, b = torch.randn(1, 3), torch.arange(2).reshape(1, 2)
    got = torch.cat([a.to(TPU), b.to(TPU)], dim=1)  # promotion: the ordinary op
    torch.testing.assert_close(got.cpu(), torch.cat([a, b], dim=1), rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="same device"):
        torch.cat([a.to(TPU), a], dim=1)


def test_cat_gradients_through_an_append() -> None:
    g = torch.randn(1, 4, requires_grad=True)
    tg = g.detach().to(TPU).requires_grad_()
    (torch.cat([g, g * 2], 1) ** 2).sum().backward()
    (torch.cat([tg, tg * 2], 1) ** 2).sum().backward()
    torch.testing.assert_close(tg.grad.cpu(), g.grad)


def test_strided_view_at_an_offset_keeps_nan_payloads() -> None:
    """A strided 16-bit view at a runtime offset is read through a padded window; XLA:CPU
    pads bfloat16 through float32, which rewrote NaN payloads (0xFFFF read back 0xFFC0)."""
    bits = torch.tensor([-2, -1, -64, -1, -2, -1, 0, 1, 2, 3, 4, 5], dtype=torch.int16)
    for dtype in (torch.bfloat16, torch.float16):
        got = bits.to(TPU).view(dtype)[1::2].clone().view(torch.int16).cpu()
        assert torch.equal(got, bits.view(dtype)[1::2].clone().view(torch.int16)), got
