"""Eager in-place ops update a storage in place when nothing else holds its buffer.

Without donation, every in-place op's program writes a whole new buffer: writing a slice
of a large tensor (DDP copying a gradient into its bucket, a KV-cache update) copied all
of it. The buffer is donated only when the storage cell is its sole holder.
"""

from __future__ import annotations

import torch
from torch.testing import assert_close

from torchtpu.eager import dispatch
from torchtpu.runtime import pjrt
from torchtpu.tensor.storage import cell_of


def _programs(op_name: str) -> list[str]:
    return [p.storage.text for k, p in dispatch._CACHE.items() if str(k[0]) == op_name]


def test_a_slice_write_donates_the_base_buffer_and_keeps_values() -> None:
    base_cpu = torch.arange(50_000, dtype=torch.float32)
    src_cpu = torch.randn(10)
    base, src = base_cpu.to("tpu"), src_cpu.to("tpu")
    view = base[100:200]
    base[-10:].copy_(src)
    base_cpu[-10:].copy_(src_cpu)
    assert_close(base.cpu(), base_cpu)
    assert_close(view.cpu(), base_cpu[100:200])  # every alias sees the update
    texts = _programs("aten.copy_.default")
    assert any("tf.aliasing_output" in t and "tensor<50000xf32>" in t for t in texts)


def test_a_buffer_held_elsewhere_is_not_donated() -> None:
    x = torch.arange(7.0).to("tpu")
    held = cell_of(x)._buf  # another holder (as a collective in flight keeps one)
    x.mul_(3)
    assert_close(x.cpu(), torch.arange(7.0) * 3)
    assert not held.is_deleted()
    assert_close(torch.from_numpy(pjrt.get().to_numpy(held).copy()), torch.arange(7.0))


def test_out_variant_donates_and_matches_cpu() -> None:
    a, b = torch.randn(64, 32), torch.randn(64, 32)
    out = torch.empty(64, 32).to("tpu")
    torch.add(a.to("tpu"), b.to("tpu"), alpha=2.0, out=out)
    torch.add(a.to("tpu"), b.to("tpu"), alpha=3.0, out=out)  # out's buffer is its cell's alone now
    assert_close(out.cpu(), torch.add(a, b, alpha=3.0))


def test_defer_and_fuse_donates_a_storage_it_rewrites() -> None:
    """The fused graph's in-place update reuses the storage's buffer (tracked results are
    weak references, so they do not count as another holder)."""
    import torchtpu
    from torchtpu.eager import deferred

    w_cpu, g_cpu = torch.zeros(1234), torch.randn(1234)
    w, g = w_cpu.to("tpu"), g_cpu.to("tpu")
    with torchtpu.eager_mode("defer_and_fuse"):
        for _ in range(4):
            w.add_(g * 0.5)
            w_cpu.add_(g_cpu * 0.5)
            torch.tpu.synchronize()
    assert_close(w.cpu(), w_cpu)
    texts = [c.program.text for c in deferred._GRAPHS.values() if "tensor<1234xf32>" in c.program.text]
    assert texts and any("tf.aliasing_output" in t for t in texts)


def test_a_result_keeps_its_tensors_shape_and_shares_the_programs_of_uploads() -> None:
    """An eager result's buffer has its tensor's shape where it fills its storage row-major
    with no dim of size 1 (as uploads, DeferAndFuse and compiled results do), else it is flat:
    a linear layer's input computed by the previous layer then keys the same program as the
    uploaded batch (the first eager MLP step compiled 18 programs, now 16)."""
    x_cpu, w_cpu = torch.randn(48, 40), torch.randn(40, 24)
    x, w = x_cpu.to("tpu"), w_cpu.to("tpu")
    h = torch.relu(x)
    assert cell_of(h).shape == (48, 40) == cell_of(x).shape
    assert cell_of(torch.relu(x[:1, :1])).shape == (1,)  # a size-1 dim: flat, as a (1,) upload
    assert cell_of(x.t().contiguous()).shape == (40, 48)
    before = len(_programs("aten.mm.default"))
    assert_close((x @ w).cpu(), x_cpu @ w_cpu)
    assert_close((h @ w).cpu(), torch.relu(x_cpu) @ w_cpu)
    assert len(_programs("aten.mm.default")) == before + 1
