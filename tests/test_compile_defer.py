"""torch.compile graphs under DeferAndFuse: recorded into the pending graph like eager ops,
so a stock compiled training step (forward, backward, optimizer: five programs when run
directly) and eager code around a compiled block run as fused programs, with the numbers
of the CPU and of the same graphs run directly."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torchtpu
from tests.utils import TPU, assert_close
from torchtpu.runner import checks


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class TinyGPT(nn.Module):
    """Embedding, one attention block (SDPA, causal), LayerNorm, a head: the ops of a
    language model's step, small enough for the default suite."""

    def __init__(self, vocab: int = 17, d: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.emb = nn.Embedding(vocab, d)
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.head = nn.Linear(d, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        b, n = idx.shape
        h = self.emb(idx)
        q, k, v = self.qkv(self.ln1(h)).view(b, n, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        h = h + self.proj(a.transpose(1, 2).reshape(b, n, -1))
        h = h + self.mlp(self.ln2(h))
        return self.head(h)


def _stock_step(model: nn.Module, opt: torch.optim.Optimizer):
    def step(idx: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        loss = F.cross_entropy(model(idx).flatten(0, 1), target.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    return step


def _train(model: nn.Module, device: str, mode: str | None, steps: int) -> tuple[list[float], list[dict]]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    step = _stock_step(model, opt)
    if device == "tpu":
        step = torch.compile(step, backend="tpu")
    g = torch.Generator().manual_seed(0)
    losses, counts = [], []
    for _ in range(steps):
        idx, target = torch.randint(0, 17, (2, 2, 8), generator=g)
        before = torchtpu.metrics.snapshot()
        if mode is None:
            loss = step(idx.to(device), target.to(device))
        else:
            with torchtpu.eager_mode(mode):
                loss = step(idx.to(device), target.to(device))
        losses.append(float(loss))  # a host read: the step's programs have all run
        after = torchtpu.metrics.snapshot()
        counts.append({k: after.get(k, 0) - before.get(k, 0) for k in ("executions", "compiles")})
    return losses, counts


def test_stock_compiled_step_under_defer_is_one_program_with_the_cpu_numbers():
    """loss.backward(); opt.step() inside torch.compile: Dynamo breaks the graph around
    backward and the optimizer, so a direct run is four programs (forward, the gradient
    seed, backward, AdamW; ``loss.detach()`` is a view, no program); recorded, forward,
    backward, AdamW and the detach fuse into one program (backward leaves the forward's
    graph pending). Losses and weights after six steps: the CPU's and the direct run's.
    (Compiled, AdamW is capturable, as on CUDA: its formula rounds differently from the
    CPU's eager AdamW -- 1.4e-7 against 2.6e-8 from float64 on LayerNorm weights after one
    step -- well inside the default tolerance here; a key bias would not be: its gradient
    is zero but for round-off, which Adam scales up to steps of size lr, so the attention
    has none, as in most GPTs.)"""
    torch.manual_seed(0)
    cpu = TinyGPT()
    direct, deferred = copy.deepcopy(cpu).to(TPU), copy.deepcopy(cpu).to(TPU)
    expected, _ = _train(cpu, "cpu", None, 6)
    direct_losses, direct_counts = _train(direct, "tpu", None, 6)
    losses, counts = _train(deferred, "tpu", "defer_and_fuse", 6)
    assert_close(torch.tensor(losses), torch.tensor(expected))
    assert_close(torch.tensor(losses), torch.tensor(direct_losses))  # fusion may round an op differently
    for p, q in zip(deferred.parameters(), cpu.parameters()):
        assert_close(p, q)
    assert [c["executions"] for c in counts[2:]] == [1] * 4, counts
    assert [c["executions"] for c in direct_counts[2:]] == [4] * 4, direct_counts
    assert [c["compiles"] for c in counts[2:]] == [0] * 4, counts


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, scale: float) -> torch.Tensor:
        return F.dropout(torch.relu(self.lin(x)), 0.25) * scale


def test_compiled_block_between_eager_ops_is_one_fused_program():
    """Eager ops, a compiled block (dropout, a Python float argument), eager ops again:
    nothing runs until the value is read, then one program; the values (dropout's mask
    included) are those of the same code run without DeferAndFuse under the same seed."""
    torch.manual_seed(0)
    block = Block().to(TPU)
    compiled = torch.compile(block, backend="tpu")
    x = torch.randn(4, 8, device=TPU)

    def run(scale: float) -> torch.Tensor:
        h = x * 2 + 1
        return (compiled(h, scale).sin() + h).sum(0)

    results = {}
    for mode in ("eager", "defer_and_fuse"):
        torch.manual_seed(1)
        with torchtpu.eager_mode(mode):
            out = [run(0.5), run(0.25)]
            before = torchtpu.metrics.snapshot()["executions"]
            results[mode] = torch.stack(out).cpu()
            ran = torchtpu.metrics.snapshot()["executions"] - before
        if mode == "defer_and_fuse":
            assert ran == 1  # everything was pending: both calls' graphs and eager ops, one program
    assert torch.equal(results["eager"], results["defer_and_fuse"])


def test_device_check_in_a_recorded_graph_names_the_graph_and_line():
    """An out-of-range index inside a recorded graph fails at the next wait, naming the
    compiled graph and the compiled function's line, as a direct run does."""

    def gather(t: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
        return t.index_select(0, i) * 2

    compiled = torch.compile(gather, backend="tpu")
    t, bad = torch.arange(5.0, device=TPU), torch.tensor([1, 7], device=TPU)
    with torchtpu.eager_mode("defer_and_fuse"):
        for _ in range(2):  # the second time, the fused program is known
            result = compiled(t, bad)
            line = gather.__code__.co_firstlineno
            with pytest.raises(
                checks.TpuAsyncError, match=rf"^index out of range in self.*compiled graph .*test_compile_defer.py:{line}\b"
            ):
                result.cpu()
        assert compiled(t, torch.tensor([4, 0], device=TPU)).cpu().tolist() == [8.0, 0.0]


def test_a_graph_run_directly_waits_for_pending_reads_of_what_it_donates():
    """A graph that is not recorded (here: it takes a CPU scalar tensor) and rewrites ``p``
    donates ``p``'s old buffer; a pending graph that reads ``p`` runs first, so it reads
    the old value. Before, the fused program failed: "Buffer has been deleted or donated"."""

    @torch.compile(backend="tpu")
    def update(p: torch.Tensor, s: torch.Tensor) -> None:
        p.add_(s)

    p = torch.ones(4, device=TPU)
    update(p, torch.tensor(0.0))  # compiled outside the mode
    with torchtpu.eager_mode("defer_and_fuse"):
        y = p * 2
        before = torchtpu.metrics.snapshot()["flushes_by_reason"].get("donation", 0)
        update(p, torch.tensor(1.0))
        assert torchtpu.metrics.snapshot()["flushes_by_reason"].get("donation", 0) == before + 1
        assert y.cpu().tolist() == [2.0] * 4
        assert p.cpu().tolist() == [2.0] * 4
