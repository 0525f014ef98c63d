"""torch.compile(backend="tpu"): compiled vs eager vs CPU, mutations, RNG, breaks, counts, precision."""

from __future__ import annotations

import copy
import os
from collections.abc import Sequence
from typing import Any

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torchtpu
from tests.utils import TPU, assert_close

torch._dynamo.config.cache_size_limit = 64


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def compiles() -> int:
    return torchtpu.metrics.snapshot()["compiles"]


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))


def test_backend_is_registered() -> None:
    assert "tpu" in torch._dynamo.list_backends()


def test_mlp_forward_backward_matches_cpu() -> None:
    cpu = mlp()
    dev = copy.deepcopy(cpu).to(TPU)
    cmodel = torch.compile(dev, backend="tpu")
    x, y = torch.randn(16, 32), torch.randint(0, 10, (16,))
    loss_c = F.cross_entropy(cpu(x), y)
    loss_c.backward()
    loss_t = F.cross_entropy(cmodel(x.to(TPU)), y.to(TPU))
    loss_t.backward()
    assert_close(loss_t, loss_c)
    for pc, pt in zip(cpu.parameters(), dev.parameters()):
        assert_close(pt.grad, pc.grad)


def test_mlp_training_steps_compiles_stop_growing() -> None:
    cpu = mlp()
    dev = copy.deepcopy(cpu).to(TPU)
    cmodel = torch.compile(dev, backend="tpu")
    opt_c = torch.optim.SGD(cpu.parameters(), lr=0.1)
    opt_t = torch.optim.SGD(dev.parameters(), lr=0.1)
    x, y = torch.randn(16, 32), torch.randint(0, 10, (16,))
    xt, yt = x.to(TPU), y.to(TPU)
    counts = []
    for _ in range(5):
        opt_c.zero_grad()
        F.cross_entropy(cpu(x), y).backward()
        opt_c.step()
        opt_t.zero_grad()
        loss = F.cross_entropy(cmodel(xt), yt)
        loss.backward()
        opt_t.step()
        counts.append(compiles())
    assert counts[-1] == counts[1], f"compiles grew after step 2: {counts}"
    for pc, pt in zip(cpu.parameters(), dev.parameters()):
        assert_close(pt, pc)


class SmallCNN(nn.Module):
    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.drop = nn.Dropout(p)
        self.fc = nn.Linear(8 * 4 * 4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.bn(self.conv(x))), 2)
        return self.fc(self.drop(x.flatten(1)))


def test_cnn_batchnorm_matches_cpu_and_writes_running_stats() -> None:
    torch.manual_seed(0)
    cpu = SmallCNN(p=0.0)
    dev = copy.deepcopy(cpu).to(TPU)
    cmodel = torch.compile(dev, backend="tpu")
    x = torch.randn(4, 3, 8, 8)
    for _ in range(2):
        out_c = cpu(x)
        out_t = cmodel(x.to(TPU))
        out_c.sum().backward()
        out_t.sum().backward()
    assert_close(out_t, out_c)
    assert_close(dev.bn.running_mean, cpu.bn.running_mean)
    assert_close(dev.bn.running_var, cpu.bn.running_var)
    assert int(dev.bn.num_batches_tracked.item()) == 2
    assert_close(dev.conv.weight.grad, cpu.conv.weight.grad)
    cpu.eval()
    dev.eval()
    assert_close(cmodel(x.to(TPU)), cpu(x))


def test_dropout_matches_eager_under_same_seed() -> None:
    torch.manual_seed(0)
    base = SmallCNN(p=0.5)  # deepcopy on the CPU: copy.deepcopy of a tpu buffer crashes (reported)
    eager, compiled = copy.deepcopy(base).to(TPU), copy.deepcopy(base).to(TPU)
    cmodel = torch.compile(compiled, backend="tpu")
    x = torch.randn(4, 3, 8, 8).to(TPU)
    torch.tpu.manual_seed(123)
    outs_e = [eager(x) for _ in range(2)]  # the second call checks that the RNG counter moved on alike
    state_e = torch.tpu.get_rng_state()
    torch.tpu.manual_seed(123)
    outs_c = [cmodel(x) for _ in range(2)]
    assert torch.equal(torch.tpu.get_rng_state(), state_e)
    assert_close(outs_c, outs_e)
    assert not torch.equal(outs_c[0].cpu(), outs_c[1].cpu())
    sum(outs_e).sum().backward()
    sum(outs_c).sum().backward()
    assert_close(compiled.conv.weight.grad, eager.conv.weight.grad)


def test_graph_breaks_run_as_several_programs() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        y = torch.sin(x) * 2
        print("graph break", end="")  # Dynamo breaks the graph here
        s = float(y.sum().item())  # and here (data-dependent Python value)
        return torch.cos(y) + s

    x = torch.randn(8, 8)
    before = torchtpu.metrics.snapshot().get("compiled_graphs", 0)
    out = torch.compile(fn, backend="tpu")(x.to(TPU))
    assert torchtpu.metrics.snapshot()["compiled_graphs"] - before >= 2
    assert_close(out, fn(x))


@pytest.mark.parametrize("guard", [torch.no_grad, torch.inference_mode])
def test_no_grad_and_inference_mode(guard) -> None:
    cpu = mlp()
    dev = copy.deepcopy(cpu).to(TPU)
    x = torch.randn(8, 32)
    with guard():
        out = torch.compile(dev, backend="tpu")(x.to(TPU))
        expected = cpu(x)
    assert_close(out, expected)


def test_input_mutation_is_written_back_and_donated() -> None:
    def fn(x: torch.Tensor, buf: torch.Tensor) -> torch.Tensor:
        buf.mul_(0.5).add_(x)
        x[0].zero_()  # mutation through a view
        return buf.sum()

    x, buf = torch.randn(4, 6), torch.randn(4, 6)
    xc, bc = x.clone(), buf.clone()
    xt, bt = x.to(TPU), buf.to(TPU)
    view = bt[1:]  # an alias sees the new value
    earlier = _live_graphs()  # compiled graphs of other tests this process still holds
    cfn = torch.compile(fn, backend="tpu")
    for _ in range(3):
        expected = fn(xc, bc)
        out = cfn(xt, bt)
        assert_close(out, expected)
    assert_close(xt, xc)
    assert_close(bt, bc)
    assert_close(view, bc[1:])
    prog = _programs_with_mutations(exclude=earlier)
    assert prog and all("tf.aliasing_output" in p.storage.text for p in prog)
    # the storages keep the shape they were moved to the device with, so XLA updates them
    # in place (a flat buffer updated through a reshape costs XLA a copy)
    mine = [p for p in prog if "tensor<4x6xf32>" in p.storage.text]
    assert mine and all(p.storage.text.count("tensor<4x6xf32> {tf.aliasing_output") == 2 for p in mine)
    from torchtpu.tensor.storage import cell_of

    assert cell_of(bt).shape == (4, 6) and cell_of(xt).shape == (4, 6)


def _live_graphs() -> list:
    from torchtpu.compile.fx_lowering import GRAPHS

    return list(GRAPHS)  # held until the test ends: an id of a freed graph could be reused


def _programs_with_mutations(exclude: Sequence[Any] = ()) -> list:
    from torchtpu.compile.fx_lowering import GRAPHS

    graphs = [g for g in list(GRAPHS) if not any(g is e for e in exclude)]
    return [p for g in graphs for p in g.programs.values() if p.storage is not None and p.storage.updates]


def test_training_step_does_not_double_memory() -> None:
    model = mlp().to(TPU)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(16, 32).to(TPU), torch.randint(0, 10, (16,)).to(TPU)

    @torch.compile(backend="tpu")
    def opt_step() -> None:
        opt.step()

    for _ in range(3):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt_step()
    torch.tpu.synchronize()
    steady = torch.tpu.memory_allocated()
    for _ in range(2):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt_step()
    torch.tpu.synchronize()
    assert torch.tpu.memory_allocated() == steady


def test_state_a_compiled_step_creates_keeps_its_shape_and_matches_cpu() -> None:
    """SGD's momentum, created inside the compiled step's first run, is a buffer of the
    parameter's own shape, not a flat one: XLA updates such a donated buffer in place in
    later steps, where a flat one costs a copy per step (lowering/strided.py: buffer_shape)."""
    from torchtpu.tensor.storage import cell_of

    cpu = mlp()
    dev = copy.deepcopy(cpu).to(TPU)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-2) for m in (cpu, dev)]

    def step(model, opt, x, y):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()

    cstep = torch.compile(step, backend="tpu")
    x, y = torch.randn(16, 32), torch.randint(0, 10, (16,))
    for _ in range(3):
        step(cpu, opts[0], x, y)
        cstep(dev, opts[1], x.to(TPU), y.to(TPU))
    for pc, pt in zip(cpu.parameters(), dev.parameters()):
        assert_close(pt, pc)
        assert_close(opts[1].state[pt]["momentum_buffer"], opts[0].state[pc]["momentum_buffer"])
        assert cell_of(opts[1].state[pt]["momentum_buffer"]).shape == tuple(pt.shape)


def test_whole_training_step_compiled_matches_cpu() -> None:
    cpu = mlp()
    dev = copy.deepcopy(cpu).to(TPU)
    opt_c = torch.optim.AdamW(cpu.parameters(), lr=1e-2)
    opt_t = torch.optim.AdamW(dev.parameters(), lr=1e-2)

    def step(model, opt, x, y):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    cstep = torch.compile(step, backend="tpu")
    x, y = torch.randn(16, 32), torch.randint(0, 10, (16,))
    counts = []
    for _ in range(4):
        lc = step(cpu, opt_c, x, y)
        lt = cstep(dev, opt_t, x.to(TPU), y.to(TPU))
        assert_close(lt, lc)
        counts.append(compiles())
    assert counts[-1] == counts[1]
    for pc, pt in zip(cpu.parameters(), dev.parameters()):
        assert_close(pt, pc)
    # as on CUDA, Dynamo made the fresh optimizer capturable: its step counts live on tpu,
    # so a step moves nothing between host and device (it moved two per parameter before)
    assert all(state["step"].device.type == "tpu" for state in opt_t.state.values())
    before = torchtpu.metrics.snapshot()
    cstep(dev, opt_t, x.to(TPU), y.to(TPU))
    torch.tpu.synchronize()
    after = torchtpu.metrics.snapshot()
    assert after.get("h2d_transfers", 0) - before.get("h2d_transfers", 0) == 2  # x and y
    assert after.get("d2h_transfers", 0) == before.get("d2h_transfers", 0)


def test_functional_whole_step_is_one_program() -> None:
    cpu = mlp()
    dev = copy.deepcopy(cpu).to(TPU)
    params = {k: v.detach() for k, v in dev.named_parameters()}

    def loss_fn(p, x, y):
        return F.cross_entropy(torch.func.functional_call(dev, p, (x,)), y)

    def step(p, x, y):
        grads, loss = torch.func.grad_and_value(loss_fn)(p, x, y)
        return {k: p[k] - 0.1 * grads[k] for k in p}, loss

    cstep = torch.compile(step, backend="tpu", fullgraph=True)
    x, y = torch.randn(16, 32), torch.randint(0, 10, (16,))
    opt = torch.optim.SGD(cpu.parameters(), lr=0.1)
    before = torchtpu.metrics.snapshot().get("compiled_graphs", 0)
    for _ in range(3):
        opt.zero_grad()
        lc = F.cross_entropy(cpu(x), y)
        lc.backward()
        opt.step()
        params, lt = cstep(params, x.to(TPU), y.to(TPU))
        assert_close(lt, lc)
    assert torchtpu.metrics.snapshot()["compiled_graphs"] - before == 1
    for name, pc in cpu.named_parameters():
        assert_close(params[name], pc)


@pytest.mark.parametrize("mode,expected", [("medium", "DEFAULT"), ("high", "HIGH"), ("highest", "HIGHEST")])
def test_precision_is_part_of_the_program_key(mode: str, expected: str) -> None:
    from torchtpu.compile.fx_lowering import CompiledGraph

    seen: list[CompiledGraph] = []
    import torchtpu.compile.backend as backend

    orig = backend.CompiledGraph

    def recording(*a, **k):
        g = orig(*a, **k)
        seen.append(g)
        return g

    backend.CompiledGraph = recording
    try:
        fn = torch.compile(lambda a, b: (a @ b).relu(), backend="tpu")
        a, b = torch.randn(8, 8).to(TPU), torch.randn(8, 8).to(TPU)
        with torch.tpu.precision("medium"):
            fn(a, b)
        with torch.tpu.precision(mode):
            out = fn(a, b)
    finally:
        backend.CompiledGraph = orig
    assert_close(out, (a.cpu() @ b.cpu()).relu())
    texts = [p.storage.text for g in seen for k, p in g.programs.items() if k[-1] == expected]
    assert texts and all(f"precision_config = [#stablehlo<precision {expected}>" in t for t in texts), texts


def test_recompile_is_explained(capsys, monkeypatch) -> None:
    monkeypatch.setenv("TORCHTPU_LOG_RECOMPILES", "1")
    fn = torch.compile(lambda a, b: a @ b, backend="tpu")
    a, b = torch.randn(8, 8).to(TPU), torch.randn(8, 8).to(TPU)
    fn(a, b)
    with torch.tpu.precision("highest"):
        fn(a, b)
    err = capsys.readouterr().err
    assert "recompiling" in err and "precision DEFAULT -> HIGHEST" in err


def test_dump_dir_writes_stablehlo_and_fx(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TORCHTPU_DUMP_DIR", str(tmp_path))
    fn = torch.compile(lambda a: torch.tanh(a) * 3, backend="tpu")
    fn(torch.randn(5).to(TPU))
    files = sorted(os.listdir(tmp_path))
    mlir = [f for f in files if f.endswith(".stablehlo.mlir")]
    fx = [f for f in files if f.endswith(".fx.py")]
    assert mlir and fx
    assert "stablehlo.tanh" in (tmp_path / mlir[0]).read_text()
    assert "aten.tanh" in (tmp_path / fx[0]).read_text()


def test_cpu_compile_still_uses_inductor(monkeypatch) -> None:
    """Installing torchtpu changes nothing for CPU models: the default backend stays inductor
    (spied on here, so the test does not pay for inductor's C++ build; see the slow test)."""
    import torch._inductor.compile_fx as cfx

    seen = []

    def spy(gm, example_inputs, **kwargs):
        seen.append([t.device.type for t in example_inputs if isinstance(t, torch.Tensor)])
        return gm.forward

    monkeypatch.setattr(cfx, "compile_fx", spy)
    before = torchtpu.metrics.snapshot().get("compiled_graphs", 0)
    fn = torch.compile(lambda a: torch.sin(a) + 1)
    x = torch.randn(16)
    assert_close(fn(x), torch.sin(x) + 1)
    assert seen == [["cpu"]]
    assert torchtpu.metrics.snapshot().get("compiled_graphs", 0) == before


@pytest.mark.slow
def test_cpu_compile_with_real_inductor() -> None:
    before = torchtpu.metrics.snapshot().get("compiled_graphs", 0)
    fn = torch.compile(lambda a: torch.sin(a) + 1)
    x = torch.randn(16)
    assert_close(fn(x), torch.sin(x) + 1)
    assert torchtpu.metrics.snapshot().get("compiled_graphs", 0) == before


def test_outputs_that_are_views_of_inputs_alias_them_and_run_no_program() -> None:
    """``x.detach()`` and ``x.view(2, 3).t()`` returned by a compiled function are views of
    ``x``, as in eager (writing through one shows in ``x``), and a graph that computes
    nothing else runs no program."""

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x.detach(), x.view(2, 3).t()

    compiled = torch.compile(fn, backend="tpu")
    x = torch.arange(6.0, device=TPU)
    compiled(x)  # compiles
    before = torchtpu.metrics.snapshot()["executions"]
    d, v = compiled(x)
    assert torchtpu.metrics.snapshot()["executions"] == before
    assert v.shape == (3, 2) and v.stride() == (1, 3)
    d[0] = 10.0
    v[1, 0] = 20.0
    assert x.cpu().tolist() == [10.0, 20.0, 2.0, 3.0, 4.0, 5.0]


def test_view_outputs_with_a_dynamic_length_in_their_sizes() -> None:
    """``x.view(-1, d)`` of an input once the length is dynamic: the view's size list holds
    a graph node (the length), so the output is computed, not rebuilt from constants
    (SwitchTransformers' and NLLB-MoE's expert layers failed compiled on this)."""

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, n, d = x.shape
        return x.view(-1, d), x.view(b, n * d)

    compiled = torch.compile(fn, backend="tpu")
    for n in (5, 7, 9):  # the second length makes it dynamic
        x = torch.randn(2, n, 4)
        for got, want in zip(compiled(x.to(TPU)), fn(x)):
            assert got.shape == want.shape
            assert torch.equal(got.cpu(), want)


def test_as_strided_of_a_view_addresses_the_storage() -> None:
    """LED/Longformer's overlapping chunks: ``as_strided`` of a view that a reshape made
    without copying reads the storage under the view, not the view's values row-major (the
    compiled LED encoder's attention was off by up to 5e-3 before)."""

    def chunks(q: torch.Tensor) -> torch.Tensor:
        v = (q / 2.0).view(8, 2, 4, 8).transpose(0, 1)
        h = v.transpose(1, 2).reshape(8, 8, 8).view(8, 2, 4, 8)  # a view: strides (8, 256, 64, 1)
        size, stride = list(h.size()), list(h.stride())
        size[1], stride[1] = size[1] * 2 - 1, stride[1] // 2
        return h.as_strided(size=size, stride=stride) * 1.0

    q = torch.randn(8, 2, 32)
    assert torch.equal(torch.compile(chunks, backend="tpu")(q.to(TPU)).cpu(), chunks(q))


def test_as_strided_outside_the_view_raises() -> None:
    def outside(x: torch.Tensor) -> torch.Tensor:
        return (x * 2).t().as_strided((4, 4), (4, 1), 8)  # the transpose covers all 24 positions

    def beyond(x: torch.Tensor) -> torch.Tensor:
        return (x * 2)[:, :2].as_strided((3, 4), (4, 1))  # reads positions the view skips

    x = torch.randn(4, 6)
    assert torch.equal(torch.compile(outside, backend="tpu")(x.to(TPU)).cpu(), outside(x))
    with pytest.raises(Exception, match="reads storage outside that view"):
        torch.compile(beyond, backend="tpu")(x.to(TPU))


def test_complex_rope_gradients_with_the_conjugate_saved_for_backward() -> None:
    """Llama 4's RoPE multiplies by complex frequencies: the forward saves ``_conj(freqs)``
    (a lazy-conjugate view of an input) for its backward. It had no lowering, and once it
    had, the backward read the view's storage without its conjugate bit (gradients off by
    up to 2)."""

    def rope(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
        xc = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(xc * freqs).flatten(-2)

    x = torch.randn(2, 4, 8, requires_grad=True)
    freqs = torch.polar(torch.ones(4, 4), torch.randn(4, 4))
    rope(x, freqs).pow(2).sum().backward()
    xt = x.detach().to(TPU).requires_grad_()
    out = torch.compile(rope, backend="tpu")(xt, freqs.to(TPU))
    out.pow(2).sum().backward()
    assert_close(out, rope(x, freqs))
    assert_close(xt.grad, x.grad)


def test_inputs_with_the_lazy_conjugate_bit_are_read_conjugated() -> None:
    def f(z: torch.Tensor) -> torch.Tensor:
        return z * 2

    z = torch.randn(3, 4, dtype=torch.complex64)
    got = torch.compile(f, backend="tpu")(z.to(TPU).conj())
    assert torch.equal(got.cpu(), f(z.conj()))


def test_bucketed_outputs_take_in_place_ops_with_gradients() -> None:
    """Outputs of a graph with a dynamic (bucketed) length are trimmed to their true length
    over the padded storage; as views made under AOTAutograd's no_grad they refused an
    in-place op that records gradients (SwitchTransformers' ``index_add_`` into a compiled
    ``zeros_like``)."""

    def f(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.zeros_like(x), x * 2

    compiled = torch.compile(f, backend="tpu")
    for n in (5, 7, 9):  # the second length makes it dynamic
        x = torch.randn(n, 4)
        xt = x.to(TPU).requires_grad_()
        z, y = compiled(xt)
        z.index_add_(0, torch.arange(n, device=TPU).flip(0), y)
        z.pow(2).sum().backward()
        assert_close(z, (2 * x).flip(0))
        assert_close(xt.grad, 8 * x)


def _storage_of(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def test_outputs_aliasing_inputs_stay_aliases_when_shapes_turn_dynamic() -> None:
    """A compiled in-place op returns its input (``copy_(v, ...)`` in the graph), and a
    compiled view returns a view, also once Dynamo recompiles with symbolic sizes: a new
    tensor with the same values there (what tpu returned) left every later write through
    the result out of the caller's tensor — wrong values, found by a random-program fuzzer."""

    def clamp_(v: torch.Tensor) -> torch.Tensor:
        return v.masked_fill_(v > 1.0, -1.0)

    def head(v: torch.Tensor) -> torch.Tensor:
        return v[:, : max(v.shape[1] - 1, 1)]  # a size computed from the input's

    def program(x: torch.Tensor, clamp, head) -> list[torch.Tensor]:
        results = []
        for view in (x.select(0, 0), x.t()[1:], x[1:, ::2]):  # new shapes: symbolic recompiles
            r = clamp(view)
            r.neg_()
            h = head(x[2:] if view.dim() == 1 else view)
            h.mul_(0.5)
            results += [r, h]
        return results

    base = torch.arange(48, dtype=torch.float32).reshape(6, 8) / 5
    want_x = base.clone()
    want = program(want_x, clamp_, head)
    x = base.to(TPU)
    got = program(x, torch.compile(clamp_, backend="tpu"), torch.compile(head, backend="tpu"))
    assert_close(x.cpu(), want_x)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.stride() == w.stride() and g.storage_offset() == w.storage_offset()
        assert _storage_of(g) == _storage_of(x)
        assert_close(g.cpu(), w)


def test_compiled_single_tensor_adam_step() -> None:
    """Dynamo writes ``exp_avg_sq.mul_(b2).addcmul_(grad, grad, value=1 - b2)`` as inductor's
    ``prims.fma`` whatever the backend: Adam(foreach=False) compiled raised NotImplementedError."""

    def run(device: str, compiled: bool) -> list[torch.Tensor]:
        model = mlp().to(device)
        opt = torch.optim.Adam(model.parameters(), lr=0.01, foreach=False)
        step = torch.compile(opt.step, backend="tpu") if compiled else opt.step
        x = torch.randn(8, 32, generator=torch.Generator().manual_seed(1)).to(device)
        for _ in range(3):
            model(x).square().mean().backward()
            step()
            opt.zero_grad()
        return [p.detach().cpu() for p in model.parameters()]

    for got, want in zip(run(TPU, True), run("cpu", False)):
        assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode,dims", [("bilinear", 2), ("nearest", 3)])
def test_grid_sample_backward_compiled_matches_cpu(mode: str, dims: int) -> None:
    """grid_sample's backward in a compiled graph: its decomposition runs autograd (a
    torch.func transform), which failed inside AOTAutograd's trace ("Please convert all
    Tensors to FakeTensors first", torchvision's RAFT). It now keeps its node and is lowered
    as in eager."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    spatial = (3, 5, 6)[-dims:]
    x = torch.randn(2, 3, *spatial, requires_grad=True)
    grid = (torch.rand(2, *spatial[:-1], 4, dims) * 2.4 - 1.2).requires_grad_()

    def loss(x: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        return (F.grid_sample(x, grid, mode=mode, padding_mode="border", align_corners=True) ** 2).sum()

    loss(x, grid).backward()
    xt, gt = x.detach().to(TPU).requires_grad_(), grid.detach().to(TPU).requires_grad_()
    torch.compile(loss, backend="tpu")(xt, gt).backward()
    assert_close(xt.grad, x.grad)
    assert_close(gt.grad, grid.grad)


def test_channels_last_convolutions_keep_eager_strides() -> None:
    """A channels-last model compiled returns eager's strides, its gradients too, and code
    that views a channels-last activation traces: FakeTensorMode gave a PrivateUse1
    convolution a contiguous output (PyTorch's "Overrideable" conv backend), where eager
    tpu, like CUDA, keeps channels-last."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, groups=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 3, groups=8), nn.Conv2d(8, 4, 1))
    model = model.to(memory_format=torch.channels_last)
    x = torch.randn(2, 3, 7, 7).contiguous(memory_format=torch.channels_last)

    def features(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
        y = m(x)
        return y.permute(0, 2, 3, 1).view(y.shape[0], -1)  # a view only channels-last allows

    on_tpu = copy.deepcopy(model).to(TPU)
    eager_out = features(model, x)
    out = torch.compile(features, backend="tpu", fullgraph=True)(on_tpu, x.to(TPU))
    assert out.stride() == eager_out.stride()
    assert_close(out, eager_out)
    eager_out.square().sum().backward()
    out.square().sum().backward()
    for p, q in zip(model.parameters(), on_tpu.parameters()):
        assert q.grad.stride() == p.grad.stride()
        assert_close(q.grad, p.grad)


def test_control_flow_operators_run_op_by_op_with_the_cpu_numbers() -> None:
    """``torch.cond`` and ``while_loop`` in a compiled function: the lowering has no rule for
    higher-order operators yet, so their graphs run op by op (said once, with a warning)
    instead of failing inside the lowering; values and gradients are the CPU's."""
    from torch._higher_order_ops import while_loop

    import torchtpu.compile.backend as backend

    def losses_and_grads(dev: str) -> list[torch.Tensor]:
        torch.manual_seed(0)
        lin = nn.Linear(4, 4).to(dev)

        def f(x: torch.Tensor) -> torch.Tensor:
            h = lin(x)
            y = torch.cond(h.sum() > 0, lambda t: (t.sin() * 2,), lambda t: (t.cos() - 1,), (h,))[0]
            return y.square().mean()

        def doubled_until(x: torch.Tensor) -> torch.Tensor:
            return while_loop(lambda i, t: i < 3, lambda i, t: (i + 1, t * 2), (torch.tensor(0, device=x.device), x))[1]

        if dev == TPU:
            f, doubled_until = torch.compile(f, backend="tpu"), torch.compile(doubled_until, backend="tpu")
        out = []
        for sign in (1.0, -1.0):  # both branches
            x = (torch.randn(3, 4, generator=torch.Generator().manual_seed(1)) * sign).to(dev)
            loss = f(x)
            loss.backward()
            out += [loss.detach().cpu(), lin.weight.grad.cpu(), doubled_until(x).cpu()]
            lin.weight.grad = None
        return out

    backend.WARNED.discard("operators")
    with pytest.warns(UserWarning, match="calls cond.*op by op"):
        got = losses_and_grads(TPU)
    for g, w in zip(got, losses_and_grads("cpu")):
        assert_close(g, w)


@torch.library.custom_op("torchtpu_test::scaled_tanh", mutates_args=())
def _scaled_tanh(x: torch.Tensor, k: float) -> torch.Tensor:
    return torch.tanh(x) * k


@_scaled_tanh.register_fake
def _(x: torch.Tensor, k: float) -> torch.Tensor:
    return torch.empty_like(x)


def test_a_custom_op_without_a_lowering_runs_its_own_implementation() -> None:
    """A ``torch.library.custom_op`` is opaque to compilers: without a tpu lowering its
    graph runs op by op, the op as its own implementation (as in eager), where the lowering
    raised NotImplementedError; the same graph compiled on the CPU is the reference."""
    import torchtpu.compile.backend as backend

    def f(x: torch.Tensor) -> torch.Tensor:
        return _scaled_tanh(x * 2, 3.0).sum(0)

    x = torch.randn(4, 3)
    backend.WARNED.discard("operators")
    with pytest.warns(UserWarning, match="torchtpu_test::scaled_tanh.*own implementation"):
        got = torch.compile(f, backend="tpu")(x.to(TPU))
    assert_close(got, f(x))


def test_a_data_dependent_shape_in_the_graph_runs_op_by_op() -> None:
    """With ``capture_dynamic_output_shape_ops``, Dynamo keeps a boolean mask's selection
    (an unbacked size) inside the graph; an XLA program cannot have that shape, so the graph
    runs op by op (said with a warning), where the lowering failed with a
    GuardOnDataDependentSymNode."""
    import torchtpu.compile.backend as backend

    def f(x: torch.Tensor) -> torch.Tensor:
        return x[x > 0].sum() * 2 + x.mean()

    x = torch.randn(6, 3)
    backend.WARNED.discard("data-dependent shape")
    torch._dynamo.reset()
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        with pytest.warns(UserWarning, match="shape depends on tensor values"):
            got = torch.compile(f, backend="tpu")(x.to(TPU))
    torch._dynamo.reset()
    assert_close(got, f(x))


def test_ops_eager_runs_through_their_explicit_composite_compile_too() -> None:
    """``nn.Bilinear`` (``aten::_trilinear``), ``cholesky_solve`` and ``linalg.pinv`` have no
    lowering of their own: eager runs them on tpu through PyTorch's CompositeExplicitAutograd
    kernel, as CUDA does, but AOTAutograd keeps them whole in a compiled graph, whose lowering
    raised "operator 'aten::_trilinear' is not implemented for the tpu device". The lowering
    now traces the kernel eager runs. Found by running OpInfo's samples through torch.compile."""
    torch.manual_seed(0)
    bilinear = nn.Bilinear(3, 4, 5)
    x1, x2 = torch.randn(6, 3), torch.randn(6, 4)
    on_tpu = copy.deepcopy(bilinear).to(TPU)
    bilinear(x1, x2).square().sum().backward()
    torch.compile(on_tpu, backend="tpu")(x1.to(TPU), x2.to(TPU)).square().sum().backward()
    for name, p in bilinear.named_parameters():
        assert_close(dict(on_tpu.named_parameters())[name].grad, p.grad)

    a = torch.randn(4, 4)
    factor = torch.linalg.cholesky(a @ a.T + 4 * torch.eye(4))
    b, m = torch.randn(4, 2), torch.randn(5, 3)

    def solve_and_pinv(factor: torch.Tensor, b: torch.Tensor, m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.cholesky_solve(b, factor), torch.linalg.pinv(m)

    got = torch.compile(solve_and_pinv, backend="tpu")(factor.to(TPU), b.to(TPU), m.to(TPU))
    for g, e in zip(got, solve_and_pinv(factor, b, m)):
        assert_close(g, e)


def test_a_compiled_sgn_backward_returns_its_zero_gradient_on_tpu() -> None:
    """Autograd's zero gradient for a real ``torch.sgn`` is ``_efficientzerotensor``; its
    decomposition for the lowering's traces leaves the device out (the program's is tpu),
    and AOTAutograd used it too: the compiled backward returned a CPU tensor and autograd
    raised "CompiledFunctionBackward returned an invalid gradient at index 0 - expected
    device tpu:0 but got cpu". Found by OpInfo's gradient samples run through torch.compile."""
    w = torch.randn(5)

    def loss(w: torch.Tensor) -> torch.Tensor:
        return (torch.sgn(w) * 3 + w.square()).sum()

    on_tpu = w.to(TPU).requires_grad_()
    torch.compile(loss, backend="tpu")(on_tpu).backward()
    on_cpu = w.clone().requires_grad_()
    loss(on_cpu).backward()
    assert on_tpu.grad.device.type == "tpu"
    assert_close(on_tpu.grad, on_cpu.grad)


@pytest.mark.parametrize("mode", ["eager", "defer_and_fuse", "compile"])
def test_masked_scatter_backward_gives_the_cpus_source_gradient(mode: str) -> None:
    """What a vision-language model does to merge image features into its text embeddings
    (``inputs_embeds.masked_scatter(image_mask, features)``), trained: the source's gradient
    is PyTorch's ``masked_scatter_backward``, which selects the gradient under the mask
    (``masked_select``: a size that depends on the mask's values). A compiled LLaVA's
    backward failed to lower it; it is now a static scatter in every mode, bit for bit the
    CPU's, the mask broadcast over a batch dimension included."""
    torch.manual_seed(0)
    embeds, features, weights = torch.randn(2, 3, 4), torch.randn(30), torch.randn(2, 3, 4)
    mask = torch.rand(3, 4) > 0.4

    def loss(embeds: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        return (embeds.masked_scatter(mask.to(embeds.device), features) * weights.to(embeds.device)).sum()

    leaves = [t.clone().requires_grad_() for t in (embeds, features)]
    loss(*leaves).backward()
    on_tpu = [t.to(TPU).requires_grad_() for t in (embeds, features)]
    with torchtpu.eager_mode("eager" if mode == "compile" else mode):
        (torch.compile(loss, backend="tpu") if mode == "compile" else loss)(*on_tpu).backward()
    for got, expected in zip(on_tpu, leaves):
        assert torch.equal(got.grad.cpu(), expected.grad)
