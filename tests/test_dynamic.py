"""Bounded dynamism: many sequence lengths through a few bucket programs, exact results."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import torchtpu
from tests.utils import TPU, assert_close


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class Attn(nn.Module):
    def __init__(self, vocab: int = 50, d: int = 16) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, 3)

    def forward(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.emb(idx)  # (n, d): one sequence; the dynamic dim stays its own dimension
        q, k, v = self.qkv(h).chunk(3, dim=-1)
        p = torch.softmax(q @ k.transpose(-1, -2) / 4.0, dim=-1)  # over the dynamic key dim
        a = p @ v
        return self.out(a), a.sum(dim=0)  # per-token output, and a reduction over the dynamic dim


LENGTHS = [1, 2, 3, 5, 7, 9, 16, 17, 31, 33, 60, 64, 65, 100, 127, 129, 200, 256, 300, 512]


def _run(compiled, cpu: nn.Module, lengths: list[int], mark: bool) -> None:
    g = torch.Generator().manual_seed(0)
    for n in lengths:
        idx = torch.randint(0, 50, (n,), generator=g)
        it = idx.to(TPU)
        if mark:
            torchtpu.mark_dynamic(it, 0, 512)
        out, red = compiled(it)
        exp_out, exp_red = cpu(idx)
        assert tuple(out.shape) == (n, 3)
        assert_close(out, exp_out, atol=1e-4, rtol=1e-4)
        assert_close(red, exp_red, atol=1e-4, rtol=1e-4)


def test_mark_dynamic_20_lengths_at_most_10_compiles() -> None:
    torch.manual_seed(0)
    cpu = Attn()
    dev = Attn().to(TPU)
    dev.load_state_dict(cpu.state_dict())
    compiled = torch.compile(dev, backend="tpu")
    before = torchtpu.metrics.snapshot()["compiles"]
    with torch.no_grad():
        _run(compiled, cpu, LENGTHS, mark=True)
    used = torchtpu.metrics.snapshot()["compiles"] - before
    assert used <= 10, f"{used} compiles for {len(LENGTHS)} lengths"


def test_dynamic_true_with_max_size_option() -> None:
    torch.manual_seed(0)
    cpu = Attn()
    dev = Attn().to(TPU)
    dev.load_state_dict(cpu.state_dict())
    compiled = torch.compile(dev, backend="tpu", dynamic=True, options={"max_size": 512})
    before = torchtpu.metrics.snapshot()["compiles"]
    with torch.no_grad():
        _run(compiled, cpu, LENGTHS[2:12], mark=False)
    assert torchtpu.metrics.snapshot()["compiles"] - before <= 6


def test_dynamic_true_without_bound_is_a_clear_error(monkeypatch) -> None:
    from torchtpu.compile import dynamic

    monkeypatch.setattr(dynamic, "_marked", [False])  # as in a process that never called mark_dynamic
    compiled = torch.compile(lambda x: x * 2, backend="tpu", dynamic=True)
    with pytest.raises(Exception, match="max_size"):
        compiled(torch.randn(5).to(TPU))


def test_reshape_across_dynamic_dim_falls_back_to_exact_shapes() -> None:
    lin = nn.Linear(16, 4)
    dev = nn.Linear(16, 4).to(TPU)
    dev.load_state_dict(lin.state_dict())
    compiled = torch.compile(dev, backend="tpu", dynamic=True, options={"max_size": 64})
    with pytest.warns(UserWarning, match="exact shapes"), torch.no_grad():
        for n in (3, 5):
            x = torch.randn(2, n, 16)
            assert_close(compiled(x.to(TPU)), lin(x), atol=1e-5, rtol=1e-5)


def test_unsafe_ops_fall_back_to_exact_shapes() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=0)  # mean divides by a size baked into the program

    compiled = torch.compile(fn, backend="tpu", dynamic=True, options={"max_size": 64})
    with pytest.warns(UserWarning, match="exact shapes"):
        for n in (3, 5):
            x = torch.randn(n, 4)
            assert_close(compiled(x.to(TPU)), fn(x))
