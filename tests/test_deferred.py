"""DeferAndFuse: same numbers as eager, every flush trigger, structural caching, view and
in-place semantics, asynchronous errors with source lines, and the modes API."""

from __future__ import annotations

import io
import threading

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torchtpu
from torchtpu.eager import deferred
from torchtpu.runner import checks

TPU = torch.device("tpu")


@pytest.fixture(autouse=True)
def _eager_after():
    yield
    torchtpu.set_eager_mode("eager")


def _flushes() -> dict:
    return torchtpu.metrics.snapshot()["flushes_by_reason"]


# -- modes API ---------------------------------------------------------------------------------
def test_modes_api_and_thread_locality():
    assert torchtpu.get_eager_mode() == "eager"
    with torchtpu.eager_mode("defer_and_fuse"):
        assert torchtpu.get_eager_mode() == "defer_and_fuse"
        seen = {}
        t = threading.Thread(target=lambda: seen.setdefault("mode", torchtpu.get_eager_mode()))
        t.start()
        t.join()
        assert seen["mode"] == "eager"
    assert torchtpu.get_eager_mode() == "eager"
    torchtpu.set_eager_mode("launch_blocking")
    assert torchtpu.get_eager_mode() == "launch_blocking"
    with pytest.raises(ValueError, match="defer_and_fuse"):
        torchtpu.set_eager_mode("lazy")


@pytest.mark.slow  # make test-all (moved out of make test's 15 minutes)
def test_env_var_selects_the_mode():
    import subprocess
    import sys

    code = "import torch, torchtpu; print(torchtpu.get_eager_mode())"
    for env, want in [("TORCHTPU_DEFER_AND_FUSE", "defer_and_fuse"), ("TORCHTPU_LAUNCH_BLOCKING", "launch_blocking")]:
        import os

        out = subprocess.run([sys.executable, "-c", code], env={**os.environ, env: "1"}, capture_output=True, text=True, timeout=120)
        assert out.stdout.strip() == want, out.stderr


# -- recording and flushing -----------------------------------------------------------------------
def test_ops_are_recorded_and_fused_into_one_program():
    x = torch.randn(8, 8, device="tpu")
    torchtpu.metrics.reset()
    with torchtpu.eager_mode("defer_and_fuse"):
        y = ((x * 2 + 1).relu() @ x).sin()
        assert deferred.pending_ops() == 5
        assert torchtpu.metrics.snapshot()["executions"] == 0
        out = y.cpu()
    m = torchtpu.metrics.snapshot()
    assert m["executions"] == 1 and m["fused_ops"] == 5 and _flushes() == {"to_cpu": 1}
    xc = x.cpu()
    torch.testing.assert_close(out, ((xc * 2 + 1).relu() @ xc).sin())


@pytest.mark.parametrize(
    "trigger,reason",
    [
        (lambda y: y.cpu(), "to_cpu"),
        (lambda y: y.sum().item(), "item"),
        (lambda y: y.tolist(), "to_cpu"),
        (lambda y: bool(y.sum() > 0), "item"),
        (lambda y: str(y), "to_cpu"),
        (lambda y: torch.save(y, io.BytesIO()), "to_cpu"),
        (lambda y: torch.tpu.synchronize(), "synchronize"),
    ],
    ids=["cpu", "item", "tolist", "bool", "print", "save", "synchronize"],
)
def test_flush_triggers(trigger, reason):
    x = torch.randn(4, 4, device="tpu")
    with torchtpu.eager_mode("defer_and_fuse"):
        y = x * 3 - 1
        torchtpu.metrics.reset()
        trigger(y)
        assert deferred.pending_ops() == 0
        assert _flushes().get(reason, 0) >= 1, _flushes()
    torch.testing.assert_close(y.cpu(), x.cpu() * 3 - 1)


def test_forward_backward_and_optimizer_step_run_as_one_program():
    """backward() records into the forward's graph and leaves it pending: the SGD update
    after it fuses into the same program, run once at synchronize."""
    w = torch.randn(6, 3, device="tpu", requires_grad=True)
    x = torch.randn(5, 6, device="tpu")
    opt = torch.optim.SGD([w], lr=0.5)
    wc = w.detach().cpu().requires_grad_()
    with torchtpu.eager_mode("defer_and_fuse"):
        torchtpu.metrics.reset()
        (x @ w).tanh().sum().backward()
        assert deferred.pending_ops() > 0
        opt.step()
        torch.tpu.synchronize()
        assert deferred.pending_ops() == 0
        assert _flushes() == {"synchronize": 1}
        assert torchtpu.metrics.snapshot()["executions"] == 1
    (x.cpu() @ wc).tanh().sum().backward()
    torch.testing.assert_close(w.grad.cpu(), wc.grad)
    torch.testing.assert_close(w.detach().cpu(), wc.detach() - 0.5 * wc.grad)


def test_backward_recorded_into_its_own_graph_runs_when_it_ends():
    """With the autograd engine's device threads on, and nothing backward reads pending
    (the forward ran, the gradient seed is given), the engine's thread records into a
    graph of its own, which nothing else would run: it runs when backward() ends."""
    w = torch.randn(6, 3, device="tpu", requires_grad=True)
    x = torch.randn(5, 6, device="tpu")
    seed = torch.ones((), device="tpu")
    with torchtpu.eager_mode("defer_and_fuse"), torch.autograd.set_multithreading_enabled(True):
        loss = (x @ w).tanh().sum()
        loss.item()
        torchtpu.metrics.reset()
        loss.backward(seed)
        assert _flushes() == {"backward": 1}
        assert torchtpu.metrics.snapshot()["executions"] == 1
    wc = w.detach().cpu().requires_grad_()
    (x.cpu() @ wc).tanh().sum().backward()
    torch.testing.assert_close(w.grad.cpu(), wc.grad)


def test_backward_on_the_calling_thread_stays_in_its_graph():
    """By default the backward runs on the thread that calls it (torchtpu turns the
    engine's device threads off there): its ops stay pending in that thread's graph, for
    the optimizer step to join, until something needs a value."""
    assert not torch.autograd.is_multithreading_enabled()
    w = torch.randn(6, 3, device="tpu", requires_grad=True)
    x = torch.randn(5, 6, device="tpu")
    seed = torch.ones((), device="tpu")
    with torchtpu.eager_mode("defer_and_fuse"):
        loss = (x @ w).tanh().sum()
        loss.item()
        torchtpu.metrics.reset()
        loss.backward(seed)
        assert deferred.pending_ops() > 0
        assert _flushes() == {}
        grad = w.grad.cpu()
        assert _flushes() == {"to_cpu": 1}
    wc = w.detach().cpu().requires_grad_()
    (x.cpu() @ wc).tanh().sum().backward()
    torch.testing.assert_close(grad, wc.grad)


def test_leaving_the_mode_runs_pending_work():
    x = torch.ones(3, device="tpu")
    with torchtpu.eager_mode("defer_and_fuse"):
        y = x + 1
        assert deferred.pending_ops() == 1
    assert deferred.pending_ops() == 0
    assert y.cpu().tolist() == [2.0, 2.0, 2.0]


def test_repeated_sequence_ends_a_graph():
    x = torch.randn(4, device="tpu")
    ys, compiles = [], []
    with torchtpu.eager_mode("defer_and_fuse"):
        torchtpu.metrics.reset()
        for _ in range(4):  # a loop that never reads a value: graphs end where it repeats
            before = torchtpu.metrics.snapshot()["compiles"]
            y = x
            for _ in range(deferred.MIN_REPEAT):
                y = y * 1.5 + 0.5
            ys.append(y)
            compiles.append(torchtpu.metrics.snapshot()["compiles"] - before)
        flushes = _flushes()
        assert flushes.get("repeat", 0) >= 3 and set(flushes) == {"repeat"}, flushes
        assert deferred.pending_ops() <= 2 * deferred.MIN_REPEAT
    assert compiles[1:] == [0, 0, 0], compiles
    ref = x.cpu()
    for _ in range(deferred.MIN_REPEAT):
        ref = ref * 1.5 + 0.5
    for y in ys:
        torch.testing.assert_close(y.cpu(), ref)


def test_size_cap_keeps_graphs_compilable(monkeypatch):
    monkeypatch.setattr(deferred, "MAX_NODES", 10)
    monkeypatch.setattr(deferred, "MIN_REPEAT", 1000)  # only the cap ends graphs here
    x = torch.zeros(2, device="tpu")
    with torchtpu.eager_mode("defer_and_fuse"):
        torchtpu.metrics.reset()
        for i in range(25):
            x = x + (i % 3)  # varying numbers are operands: one structure
        assert _flushes().get("size") == 2
    assert x.cpu().tolist() == [float(sum(i % 3 for i in range(25)))] * 2


def test_python_numbers_are_operands_not_part_of_the_graph_key():
    x = torch.randn(16, device="tpu")
    with torchtpu.eager_mode("defer_and_fuse"):
        (x * 0.5 + 0.25).cpu()
        torchtpu.metrics.reset()
        outs = [(x * s + s / 2).cpu() for s in (0.3, 0.7, 1.9)]
    assert torchtpu.metrics.snapshot()["compiles"] == 0
    for s, o in zip((0.3, 0.7, 1.9), outs):
        torch.testing.assert_close(o, x.cpu() * s + s / 2)


# -- in-place and views ---------------------------------------------------------------------------
def test_in_place_through_views_keeps_pytorch_semantics():
    base_cpu = torch.arange(12.0).reshape(3, 4)
    base = base_cpu.to("tpu")
    with torchtpu.eager_mode("defer_and_fuse"):
        row = base[1]
        col = base[:, 2]
        row.mul_(10)
        col.add_(1)
        alias = base.view(4, 3)
        alias[0, 0] = -5
        t = base.t()
        s = (t * 2).sum(0)
        base.relu_()
    for v in (base_cpu[1],):
        v.mul_(10)
    base_cpu[:, 2].add_(1)
    base_cpu.view(4, 3)[0, 0] = -5
    s_cpu = (base_cpu.t() * 2).sum(0)
    base_cpu.relu_()
    torch.testing.assert_close(base.cpu(), base_cpu)
    torch.testing.assert_close(s.cpu(), s_cpu)
    torch.testing.assert_close(row.cpu(), base_cpu[1])
    torch.testing.assert_close(col.cpu(), base_cpu[:, 2])


def test_reads_before_a_write_see_the_old_value():
    x = torch.ones(4, device="tpu")
    with torchtpu.eager_mode("defer_and_fuse"):
        before = x * 1
        x.add_(5)
        after = x * 1
    assert before.cpu().tolist() == [1.0] * 4 and after.cpu().tolist() == [6.0] * 4


def test_copy_from_cpu_into_a_pending_tensor():
    x = torch.zeros(3, device="tpu")
    with torchtpu.eager_mode("defer_and_fuse"):
        y = x + 1
        y.copy_(torch.tensor([7.0, 8.0, 9.0]))
        z = y * 2
    assert z.cpu().tolist() == [14.0, 16.0, 18.0]


def test_dead_intermediates_are_not_outputs():
    x = torch.randn(64, 64, device="tpu")
    with torchtpu.eager_mode("defer_and_fuse"):
        y = x.exp().sin().cos().sum()
        graph = deferred._graph()
        n_cells = len(graph.cells)
        y.cpu()
    # a graph's description holds each node's op key, whose first entry is the op's plan (a
    # compiled graph recorded by another test holds a name there)
    described = [c.described for c in deferred._GRAPHS.values()]
    live = [k for k in described if len(k[0]) == 4 and getattr(k[0][0][0][0], "op", None) is torch.ops.aten.exp.default]
    assert live and all(len(k[2]) == 1 for k in live)  # only ``y`` comes out
    assert n_cells == 5


def test_a_storage_rewritten_outside_the_graph_is_read_anew_by_later_ops():
    """A pending graph that read ``x`` kept ``x``'s buffer in its slot; ``x.copy_(cpu)``
    swaps the storage's buffer outside the graph, and the ops recorded after it read the
    old slot: ``x + 0`` gave the value before the copy (a loop refilling an input buffer
    from the host without a sync between steps would train on its first batch)."""
    with torchtpu.eager_mode("defer_and_fuse"):
        x = torch.zeros(4, device=TPU) + 0
        torch.tpu.synchronize()
        before = x * 2  # pending: reads x
        x.copy_(torch.arange(4.0))  # the whole storage, from the host
        after = x + 0
        halves = x[:2] * 1  # a view of the new buffer too
        assert deferred.pending_ops() > 0  # nothing ran in between
        assert before.cpu().tolist() == [0.0, 0.0, 0.0, 0.0]
        assert after.cpu().tolist() == [0.0, 1.0, 2.0, 3.0]
        assert halves.cpu().tolist() == [0.0, 1.0]


HOST_WRITES = {
    "copy_": lambda x: x.copy_(torch.full((4,), 2.0)),
    "copy_ of a strided source": lambda x: x.copy_(torch.arange(8.0)[::2]),
    "setitem": lambda x: x.__setitem__(slice(None), torch.tensor([5.0, 6, 7, 8])),
    "data.copy_": lambda x: x.data.copy_(torch.ones(4)),
    "detach().copy_": lambda x: x.detach().copy_(torch.full((4,), 2.0)),
    "view().copy_": lambda x: x.view(2, 2).copy_(torch.full((2, 2), 3.0)),
    "resize_": lambda x: x.resize_(6).copy_(torch.arange(6.0)),
    "index_put_": lambda x: x.index_put_((torch.tensor([1]),), torch.tensor(9.0)),  # CPU index, 0-d CPU value
}


@pytest.mark.parametrize("write", list(HOST_WRITES), ids=list(HOST_WRITES))
def test_every_form_of_host_write_is_seen_by_the_ops_recorded_after_it(write):
    """Each way a user writes host values into a whole tpu storage, while a pending graph
    read it: the first six forms read the old value before the fix."""
    with torchtpu.eager_mode("defer_and_fuse"):
        x = torch.arange(4.0, device=TPU) + 0
        torch.tpu.synchronize()
        before = x * 2
        HOST_WRITES[write](x)
        after = x + 0
    expected = torch.arange(4.0) + 0
    HOST_WRITES[write](expected)
    assert before.cpu().tolist() == [0.0, 2.0, 4.0, 6.0]
    assert torch.equal(after.cpu(), expected)


def test_a_cpu_state_dict_loaded_after_a_pending_forward_is_what_the_next_forward_uses():
    """The model-level form of the test above: resuming from a checkpoint on the host (or
    swapping in other weights) while a forward pass is still pending. ``load_state_dict``
    copies each CPU tensor into its parameter; the second forward ran with the old weights
    (0.40 from the CPU's output)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    other = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    x = torch.randn(3, 8)
    on_tpu = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4)).to(TPU)
    on_tpu.load_state_dict(model.state_dict())
    with torch.no_grad(), torchtpu.eager_mode("defer_and_fuse"):
        first = on_tpu(x.to(TPU))  # pending: reads the weights
        on_tpu.load_state_dict(other.state_dict())
        second = on_tpu(x.to(TPU))
        torch.testing.assert_close(first.cpu(), model(x))
        torch.testing.assert_close(second.cpu(), other(x))


# -- training loops: identical numbers, no compiles after warm-up --------------------------------------
def _train(model_fn, data_fn, steps: int, mode: str, opt_fn, device: str = "tpu") -> tuple[list[float], list[int]]:
    torch.manual_seed(0)
    model = model_fn().to(device)
    opt = opt_fn(model.parameters())
    x, y = (t.to(device) for t in data_fn())
    losses, compiles = [], []
    with torchtpu.eager_mode(mode):
        for _ in range(steps):
            torchtpu.metrics.reset()
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
            compiles.append(torchtpu.metrics.snapshot()["compiles"])
    return losses, compiles


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))


def _mlp_data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(16, 32, generator=g), torch.randint(0, 10, (16,), generator=g)


class _CNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.bn(self.conv(x))), 2)
        return self.fc(x.flatten(1))


def _cnn_data():
    g = torch.Generator().manual_seed(2)
    return torch.randn(4, 3, 8, 8, generator=g), torch.randint(0, 10, (4,), generator=g)


class _TinyGPT(nn.Module):
    def __init__(self, vocab: int = 10, dim: int = 32, seq: int = 8) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(seq, dim) * 0.02)
        self.block = nn.TransformerEncoderLayer(dim, 4, 64, dropout=0.0, batch_first=True, norm_first=True)
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        h = self.tok(idx) + self.pos
        mask = nn.Transformer.generate_square_subsequent_mask(idx.shape[1], device=idx.device)
        h = self.block(h, src_mask=mask, is_causal=True)
        return self.head(self.ln(h)).mean(1)


def _gpt_data():
    g = torch.Generator().manual_seed(3)
    return torch.randint(0, 10, (4, 8), generator=g), torch.randint(0, 10, (4,), generator=g)


@pytest.mark.parametrize(
    "model_fn,data_fn,opt_fn",
    [
        (_mlp, _mlp_data, lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9)),
        (_CNN, _cnn_data, lambda p: torch.optim.SGD(p, lr=0.05)),
        pytest.param(
            _TinyGPT, _gpt_data, lambda p: torch.optim.AdamW(p, lr=1e-2), marks=pytest.mark.slow, id="gpt_adamw"
        ),  # make test-all (time budget; the minGPT example trains under every mode in make test-examples)
    ],
    ids=["mlp", "cnn_batchnorm", "gpt_adamw"],
)
def test_training_matches_eager_and_stops_compiling(model_fn, data_fn, opt_fn):
    steps = 5
    eager, _ = _train(model_fn, data_fn, steps, "eager", opt_fn)
    deferred_losses, compiles = _train(model_fn, data_fn, steps, "defer_and_fuse", opt_fn)
    cpu, _ = _train(model_fn, data_fn, steps, "eager", opt_fn, device="cpu")
    torch.testing.assert_close(deferred_losses, eager, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(deferred_losses, cpu, rtol=1e-4, atol=1e-4)
    assert compiles[-2:] == [0, 0], compiles


def test_dropout_matches_eager_under_the_same_seed():
    x = torch.ones(1000, device="tpu")
    torch.manual_seed(7)
    eager = F.dropout(x, 0.3).cpu()
    torch.manual_seed(7)
    with torchtpu.eager_mode("defer_and_fuse"):
        fused = F.dropout(x, 0.3).cpu()
    assert torch.equal(eager, fused)


# -- asynchronous errors ----------------------------------------------------------------------------
def test_out_of_range_index_surfaces_at_the_next_wait_with_the_source_line():
    x = torch.arange(5.0, device="tpu")
    bad = torch.tensor([1, 7], device="tpu")
    y = x[bad]  # enqueued: no error yet
    line = test_out_of_range_index_surfaces_at_the_next_wait_with_the_source_line.__code__.co_firstlineno + 3
    with pytest.raises(checks.TpuAsyncError, match=rf"index 7 is out of bounds for dimension 0 with size 5.*test_deferred.py:{line}\b"):
        y.cpu()
    # the device stays usable
    assert x[torch.tensor([1, -1], device="tpu")].cpu().tolist() == [1.0, 4.0]


def test_async_error_under_defer_and_fuse_names_op_and_line():
    w = torch.randn(4, 3, device="tpu")
    idx = torch.tensor([0, 4], device="tpu")
    with torchtpu.eager_mode("defer_and_fuse"):
        for _ in range(2):  # the second time the op's program is already known
            z = F.embedding(idx, w) * 2
            line = test_async_error_under_defer_and_fuse_names_op_and_line.__code__.co_firstlineno + 5
            with pytest.raises(checks.TpuAsyncError, match=rf"aten::embedding.*test_deferred.py:{line}\b"):
                z.sum().item()
        assert (F.embedding(torch.tensor([3], device="tpu"), w).cpu() == w[3].cpu()).all()


def test_launch_blocking_raises_at_the_failing_call():
    x = torch.arange(5.0, device="tpu")
    with torchtpu.eager_mode("launch_blocking"):
        line = test_launch_blocking_raises_at_the_failing_call.__code__.co_firstlineno + 5
        with pytest.raises(checks.TpuAsyncError, match=rf"index_select.*test_deferred.py:{line}\b") as e:
            x.index_select(0, torch.tensor([9], device="tpu"))
        assert "asynchronously" not in str(e.value)
        assert (x * 2).cpu().tolist() == [0.0, 2.0, 4.0, 6.0, 8.0]


def test_missing_op_raises_at_record_time_under_defer():
    x = torch.randn(8, device="tpu")
    with torchtpu.eager_mode("defer_and_fuse"):
        y = x + 1
        with pytest.raises(NotImplementedError, match="aten::_foobar"):
            torch.ops.aten._foobar(y)  # PyTorch's test op: no tpu lowering
        assert (y.cpu() == x.cpu() + 1).all()


def test_a_failed_flush_poisons_its_tensors_instead_of_returning_stale_data(monkeypatch):
    from torchtpu.errors import TpuError, TpuRuntimeError
    from torchtpu.runtime import cache

    x = torch.randn(5, device="tpu")

    def broken(text, what):
        raise TpuRuntimeError("torchtpu: XLA could not compile the program (simulated)")

    with torchtpu.eager_mode("defer_and_fuse"):
        y = x.exp().mul(3.25).add(1.5).neg()  # a structure no other test compiled
        monkeypatch.setattr(cache, "compile_keyed", broken)
        with pytest.raises(TpuRuntimeError, match="simulated"):
            y.cpu()
        monkeypatch.undo()
        with pytest.raises(TpuError, match="failed earlier"):
            y.cpu()
        with pytest.raises(TpuError, match="failed earlier"):
            (y + 1).cpu()
        assert (x * 2).cpu().tolist() == (x.cpu() * 2).tolist()  # the device is fine


def test_16bit_chain_rounds_like_eager_in_every_mode():
    """A fused program rounds each 16-bit op's result as eager does (XLA's excess
    precision is off): DeferAndFuse and torch.compile give eager's bits. With it on, one
    element of this chain differed by a bf16 ulp (0.0078)."""
    torch.manual_seed(0)
    args = [torch.randn(4, 8), torch.randn(16, 8), torch.randn(16), torch.randn(3, 16), torch.randn(3)]

    def f(x, w1, b1, w2, b2):
        h = torch.tanh(torch.nn.functional.linear(x, w1, b1) * 0.7 + 0.1)
        return torch.nn.functional.linear(h, w2, b2).sigmoid() * 3.0

    on_tpu = [t.to(TPU).bfloat16() for t in args]
    eager = f(*on_tpu).cpu()
    with torchtpu.eager_mode("defer_and_fuse"):
        deferred = f(*on_tpu).cpu()
    compiled = torch.compile(f, backend="tpu")(*on_tpu).cpu()
    assert torch.equal(deferred, eager)
    assert torch.equal(compiled, eager)
    assert torch.equal(eager, f(*[t.bfloat16() for t in args]))  # and the CPU's


def test_state_created_under_defer_keeps_its_shape_and_matches_cpu():
    """SGD's momentum, created by the first step's recorded clone, is a buffer of the
    parameter's own shape: later fused steps update it in place where a flat buffer costs
    XLA a copy per step (lowering/strided.py: buffer_shape); values as on the CPU."""
    from torchtpu.tensor.storage import cell_of

    torch.manual_seed(0)
    cpu = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    dev = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    dev.load_state_dict(cpu.state_dict())
    dev.to("tpu")
    opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-2) for m in (cpu, dev)]
    x, y = torch.randn(6, 8), torch.randint(0, 4, (6,))
    with torchtpu.eager_mode("defer_and_fuse"):
        for _ in range(3):
            for model, opt, (xb, yb) in zip((cpu, dev), opts, ((x, y), (x.to("tpu"), y.to("tpu")))):
                opt.zero_grad()
                F.cross_entropy(model(xb), yb).backward()
                opt.step()
    for pc, pt in zip(cpu.parameters(), dev.parameters()):
        torch.testing.assert_close(pt.cpu(), pc)
        buf = opts[1].state[pt]["momentum_buffer"]
        torch.testing.assert_close(buf.cpu(), opts[0].state[pc]["momentum_buffer"])
        assert cell_of(buf).shape == (tuple(pt.shape) if pt.dim() >= 2 else (pt.numel(),))


@pytest.mark.parametrize(
    "pool",
    [
        lambda t: torch.nn.functional.avg_pool1d(t, 2, 2),
        lambda t: torch.nn.functional.max_pool1d(t, 2, 2),
        lambda t: torch.nn.functional.avg_pool1d(t, 3, 2),
    ],
    ids=["avg_pool1d", "max_pool1d", "avg_pool1d_k3"],
)
def test_pooling_a_transposed_view_matches_the_cpu(pool):
    """SEW's encoder pools ``hidden.transpose(1, 2)``. PyTorch lays the result out
    channels-last (its meta kernel reads the input's strides); the recorded call's key
    normalizes a size-1 dimension's stride, which made the fused program lay the result out
    row-major under the channels-last strides its tensor already had: every value out of
    place (max error 4.0)."""
    x = torch.randn(2, 39, 32)
    want = pool(x.transpose(1, 2))
    eager = pool(x.to("tpu").transpose(1, 2))  # the layout the eager op gives its result
    with torchtpu.eager_mode("defer_and_fuse"):
        got = pool(x.to("tpu").transpose(1, 2))
        assert got.stride() == eager.stride()
        torch.testing.assert_close(got.cpu(), want)


def test_one_op_key_with_other_numbers_in_one_graph_matches_the_cpu() -> None:
    """A node lowers with the arguments its op key's first call recorded: a number passed
    as an operand (a multiplier, alpha, a clamp bound) must come from each call's own
    operand, a static one (the dim, keepdim) from the key. Two calls of the same four op
    keys with other numbers, recorded into one graph, each get their own values."""
    x = torch.randn(4, 6)
    for d in (0, 1):
        calls = ((2.5, 0.5, -0.3), (-1.5, 7.0, 0.7))
        with torchtpu.eager_mode("defer_and_fuse"):
            t = x.to(TPU)
            torch.tpu.synchronize()
            outs = [torch.add(t, t * k, alpha=a).clamp(min=lo).sum(d, keepdim=True) for k, a, lo in calls]
            assert deferred.pending_ops() == 8  # both calls' four ops, in one graph
            assert len({uid for uid, _ in deferred._local.graph.keys}) == 4  # the same four op keys twice
            got = [o.cpu() for o in outs]
        for (k, a, lo), g in zip(calls, got):
            torch.testing.assert_close(g, torch.add(x, x * k, alpha=a).clamp(min=lo).sum(d, keepdim=True))
