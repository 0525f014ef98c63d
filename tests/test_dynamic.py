"""Bounded dynamism: many sequence lengths through a few bucket programs, exact results."""

from __future__ import annotations

import copy
import warnings

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


class Block(nn.Module):
    """A pre-norm transformer block on (batch, seq, d): every linear sees a 3-d input."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.ln(x)).chunk(3, dim=-1)
        p = torch.softmax(q @ k.transpose(-1, -2) / 4.0, dim=-1)
        x = x + self.proj(p @ v)
        return x + self.fc2(nn.functional.gelu(self.fc1(x)))


def _pair(cls: type[nn.Module]) -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    cpu = cls()
    dev = cls().to(TPU)
    dev.load_state_dict(cpu.state_dict())
    return cpu, dev


def _graphs() -> list:
    from torchtpu.compile import fx_lowering

    return list(fx_lowering.GRAPHS)


def _bucket_programs() -> int:
    return sum(len(g.programs) for g in _graphs())


def test_batched_transformer_20_lengths_at_most_10_programs() -> None:
    """linear on (batch, seq, d) would fold seq into batch (a reshape XLA cannot mask);
    the backend swaps in linear_nd, so the whole block is bucketed."""
    cpu, dev = _pair(Block)
    compiled = torch.compile(dev, backend="tpu")
    before = _bucket_programs()
    g = torch.Generator().manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "runs at exact shapes" fallback
        with torch.no_grad():
            for n in LENGTHS:
                x = torch.randn(2, n, 16, generator=g)
                xt = torchtpu.mark_dynamic(x.to(TPU), 1, 512)
                out = compiled(xt)
                assert tuple(out.shape) == (2, n, 16)
                assert_close(out, cpu(x), atol=1e-4, rtol=1e-4)
    assert _bucket_programs() - before <= 10


def test_batched_training_step_is_bucketed_and_matches_cpu() -> None:
    cpu, dev = _pair(Block)
    compiled = torch.compile(dev, backend="tpu")
    older = {id(g) for g in _graphs()}
    g = torch.Generator().manual_seed(1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for n in (5, 7, 12):  # buckets 8, 8, 16
            x = torch.randn(2, n, 16, generator=g)
            compiled(torchtpu.mark_dynamic(x.to(TPU), 1, 64)).square().mean().backward()
            cpu(x).square().mean().backward()
            for p_dev, p_cpu in zip(dev.parameters(), cpu.parameters()):
                assert_close(p_dev.grad, p_cpu.grad, atol=1e-5, rtol=1e-4)
                p_dev.grad = p_cpu.grad = None
    programs = [len(g.programs) for g in _graphs() if id(g) not in older]
    assert len(programs) == 2 and max(programs) == 2  # forward, backward: a program per bucket, not per length


def test_reshape_across_dynamic_dim_falls_back_to_exact_shapes() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return x.reshape(-1, 4).sum(dim=0)  # folds the dynamic dim into another one

    compiled = torch.compile(fn, backend="tpu", dynamic=True, options={"max_size": 64})
    with pytest.warns(UserWarning, match="exact shapes"):
        for n in (3, 5):
            x = torch.randn(2, n, 4)
            assert_close(compiled(x.to(TPU)), fn(x))


def test_unsafe_ops_fall_back_to_exact_shapes() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=0)  # mean divides by a size baked into the program

    compiled = torch.compile(fn, backend="tpu", dynamic=True, options={"max_size": 64})
    with pytest.warns(UserWarning, match="exact shapes"):
        for n in (3, 5):
            x = torch.randn(n, 4)
            assert_close(compiled(x.to(TPU)), fn(x))


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: x.sum(0) / x.shape[0],  # the length divides: the bucket's size gave 0.75 for 1.0
        lambda x: x * x.shape[0],
        lambda x: x + torch.full((1,), x.shape[0], device=x.device),  # a fill value
    ],
    ids=["divide", "multiply", "fill"],
)
def test_a_size_used_as_a_number_runs_at_exact_shapes(fn) -> None:
    """A bucketed program is built for the bucket's size: where the length enters the
    arithmetic, it would compute with the bucket instead (wrong values), so the graph
    runs at exact shapes, with the warning."""
    compiled = torch.compile(fn, backend="tpu", dynamic=True, options={"max_size": 64})
    with pytest.warns(UserWarning, match="used as a number"):
        for n in (3, 5, 6):
            x = torch.randn(n)  # one dimension: one dynamic size
            assert_close(compiled(x.to(TPU)), fn(x))


def test_two_dynamic_sizes_in_one_tensor_fall_back_to_exact_shapes() -> None:
    """dynamic=True makes both the batch and the length of a batched linear dynamic; XLA's
    verifier refuses a broadcast with two bounded dims (it raised a RET_CHECK), so the
    graph runs at exact shapes, with the warning."""
    torch.manual_seed(0)
    lin = nn.Linear(16, 48)
    compiled = torch.compile(copy.deepcopy(lin).to(TPU), backend="tpu", dynamic=True, options={"max_size": 128})
    with pytest.warns(UserWarning, match="two dynamic dimensions"), torch.no_grad():
        for shape in ((2, 3, 16), (3, 5, 16)):
            x = torch.randn(*shape)
            assert_close(compiled(x.to(TPU)), lin(x))


def test_a_python_int_argument_after_mark_dynamic() -> None:
    """Once a tensor was marked dynamic, Dynamo passes a changing int argument as a
    symbol: it is a number here, not a size (it raised "dynamic size ... has no bound")."""
    torchtpu.mark_dynamic(torch.randn(4, 2).to(TPU), 0, 8)
    compiled = torch.compile(lambda x, s: x * s, backend="tpu")
    x = torch.randn(8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exact-shapes warning
        for s in (2, 3, 4):
            assert_close(compiled(x.to(TPU), s), x * s)
