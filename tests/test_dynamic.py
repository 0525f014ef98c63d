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


def test_dynamic_true_without_a_bound_runs_as_automatic_dynamic_shapes() -> None:
    """``torch.compile(model, dynamic=True)`` as written for CUDA, no bound given: the token
    count is bucketed as Dynamo's automatic dynamic shapes are (growing power-of-two
    buckets, no bound needed), with the CPU's outputs and gradients; it raised an error
    asking for ``max_size`` before. Counts 3..7 share one program per graph."""
    _assert_swiglu_token_counts_bucket_quietly(dynamic=True, counts=(5, 3, 7, 6), seed=1)


def _assert_swiglu_token_counts_bucket_quietly(dynamic: bool | None, counts: tuple[int, ...], seed: int) -> None:
    """SwiGLU compiled without a bound, run at each token count of ``counts`` (3..7): the
    CPU's outputs and gradients, no warning, and one bucket program per graph (forward
    and backward)."""
    cpu, dev = _pair(SwiGLU)
    compiled = torch.compile(dev, backend="tpu", dynamic=dynamic)  # None: automatic dynamic shapes
    older = {id(gr) for gr in _graphs()}
    g = torch.Generator().manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "runs at exact shapes" warning: nothing was asked for
        for n in counts:
            x = torch.randn(n, 8, generator=g)
            out = compiled(x.to(TPU))
            assert_close(out, cpu(x))
            out.square().sum().backward()
            cpu(x).square().sum().backward()
            for p_dev, p_cpu in zip(dev.parameters(), cpu.parameters()):
                assert_close(p_dev.grad, p_cpu.grad)
                p_dev.grad = p_cpu.grad = None
    dynamic_graphs = [gr for gr in _graphs() if id(gr) not in older and gr.dynamic]
    assert len(dynamic_graphs) == 2 and all(gr.plan is not None and len(gr.programs) == 1 for gr in dynamic_graphs)


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


@pytest.mark.parametrize(
    ("fn", "dtype", "reason"),
    [
        (lambda x, y: (x / y).sum(0), torch.float32, "divides by a tensor of dynamic size"),
        (lambda x, y: (x**y).sum(0), torch.int64, "raises integers to a power"),
        (lambda x, y: (x**3).sum(0), torch.int64, "raises integers to a power"),
    ],
    ids=["divide-by-dynamic", "int-pow-tensor", "int-pow-scalar"],
)
def test_ops_xla_cannot_compile_padded_run_at_exact_shapes(fn, dtype: torch.dtype, reason: str) -> None:
    """A dynamic divisor (behind lowering's optimization barrier) and integer pow (a while
    loop) made XLA's compile fail ("not implemented", a RET_CHECK) on a bucketed graph:
    they run at exact shapes, with the warning, and the CPU's values."""
    compiled = torch.compile(fn, backend="tpu")
    with pytest.warns(UserWarning, match=reason):
        for n in (5, 7):
            x, y = (torch.randn(n, 4) * 5).to(dtype), (torch.rand(n, 4) * 3 + 1).to(dtype)
            xt, yt = (torchtpu.mark_dynamic(t.to(TPU), 0, 16) for t in (x, y))
            assert_close(compiled(xt, yt), fn(x, y))


def test_padded_ops_xla_compiles_with_a_dynamic_operand_match_cpu() -> None:
    """The forms of div and pow that do compile padded stay bucketed: one program for
    two lengths of one bucket, the CPU's values."""

    def fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return (x / 2.0 + 2.0 / y + y**2.5 + y**x + x / y.sum(0)).sum(0)

    compiled = torch.compile(fn, backend="tpu")
    before = torchtpu.metrics.snapshot()["compiles"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback to exact shapes
        for n in (5, 7):
            x, y = torch.randn(n, 4), torch.rand(n, 4) + 0.5
            xt, yt = (torchtpu.mark_dynamic(t.to(TPU), 0, 16) for t in (x, y))
            assert_close(compiled(xt, yt), fn(x, y))
    assert torchtpu.metrics.snapshot()["compiles"] - before == 1


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


def test_a_number_a_bucketed_graph_computes_from_an_int_argument_is_exact() -> None:
    """A changing int argument becomes a symbol of the automatic dynamic graph, and the
    graph is bucketed: the number it returns (``n + 1``, here a counter in a dict, as
    LBFGS's ``state["func_evals"] += 1``) was computed from the bucket (7 -> 8 gave 9)."""
    counter = {"n": 0}

    def step(state: dict, x: torch.Tensor) -> torch.Tensor:
        state["n"] += 1
        return x.abs().max() <= 1e-7, x.view(-1) * 2, x.shape[0] * state["n"]

    compiled = torch.compile(step, backend="tpu")
    x = torch.randn(4, 3)
    expected = {"n": 0}
    for _ in range(6):
        counter["n"] += 3
        expected["n"] += 3
        got, want = compiled(counter, x.to(TPU)), step(expected, x)
        assert counter == expected
        assert got[2] == want[2]
        assert_close(got[1], want[1])


# -- jagged ids: embedding_bag on padded ids (bags mask the positions past the true length) --
def _bags(g: torch.Generator, n_bags: int, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Bags of 1..3 ids: the flat ids and the bags' offsets (the total varies per call)."""
    lengths = torch.randint(1, 4, (n_bags,), generator=g)
    return torch.randint(0, rows, (int(lengths.sum()),), generator=g), torch.cumsum(lengths, 0) - lengths


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(mode="sum", weighted=True),
        dict(mode="mean"),
        dict(mode="max"),
        dict(mode="sum", padding_idx=3),
        dict(mode="mean", scale_grad_by_freq=True),
    ],
    ids=["sum-weighted", "mean", "max", "padding_idx", "freq"],
)
def test_embedding_bag_on_padded_ids_matches_cpu_with_gradients(kwargs: dict) -> None:
    """Totals of 9..24 ids through buckets of 16 and 32, marked dynamic: the padded ids
    (row 0 after padding) join no bag, in the forward and in both gradients. With
    scale_grad_by_freq the reference is the same op run eagerly at exact shapes on tpu:
    the CPU kernel divides by the counts of other rows (PyTorch's own CPU quirk; e.g.
    ids [1, 2, 2, 5, 1, 1, 7, 3, 3] give row 2 the gradient 2/3 where CUDA's is 1)."""
    kwargs = dict(kwargs)
    weighted = kwargs.pop("weighted", False)
    rows = 6 if "padding_idx" in kwargs else 20  # few rows: padding_idx and repeats occur
    reference = TPU if kwargs.get("scale_grad_by_freq") else torch.device("cpu")

    def fn(w: torch.Tensor, ids: torch.Tensor, offsets: torch.Tensor, psw: torch.Tensor | None) -> torch.Tensor:
        return nn.functional.embedding_bag(ids, w, offsets, per_sample_weights=psw, **kwargs).square().sum()

    compiled = torch.compile(fn, backend="tpu")
    torch.manual_seed(0)
    w_ref = torch.randn(rows, 4).to(reference).requires_grad_()
    w_dev = w_ref.detach().to(TPU).requires_grad_()
    g = torch.Generator().manual_seed(0)
    older = {id(gr) for gr in _graphs()}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # bucketed, not the exact-shapes fallback
        for _ in range(4):
            ids, offsets = _bags(g, 8, rows)
            psw = torch.rand(len(ids), generator=g).to(reference).requires_grad_() if weighted else None
            psw_dev = torchtpu.mark_dynamic(psw.detach().to(TPU).requires_grad_(), 0, 32) if weighted else None
            loss = compiled(w_dev, torchtpu.mark_dynamic(ids.to(TPU), 0, 32), offsets.to(TPU), psw_dev)
            expected = fn(w_ref, ids.to(reference), offsets.to(reference), psw)
            loss.backward()
            expected.backward()
            assert_close(loss, expected)
            assert_close(w_dev.grad, w_ref.grad)
            if weighted:
                assert_close(psw_dev.grad, psw.grad)
            w_dev.grad = w_ref.grad = None
    assert all(gr.plan is not None for gr in _graphs() if id(gr) not in older)


def test_index_select_and_index_add_with_padded_indices_match_cpu_with_gradients() -> None:
    """Routing as a mixture of experts does it: rows picked by a dynamic number of
    indices, transformed, and added back into a static accumulator (which the graph
    may write in place). The padded indices (0 after padding) must not add into row 0,
    in the forward or in the gradients."""
    torch.manual_seed(0)
    lin_cpu = nn.Linear(4, 4)
    lin_dev = copy.deepcopy(lin_cpu).to(TPU)

    def fn(lin: nn.Module, x: torch.Tensor, idx: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        y = nn.functional.silu(lin(x.index_select(0, idx))) * scale[:, None]
        return torch.zeros_like(x).index_add(0, idx, y)

    compiled = torch.compile(fn, backend="tpu")
    g = torch.Generator().manual_seed(0)
    older = {id(gr) for gr in _graphs()}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for n in (3, 5, 7, 6):  # buckets 4, 8, 8, 8
            x = torch.randn(10, 4, generator=g, requires_grad=True)
            idx = torch.randperm(10, generator=g)[:n]  # distinct rows: sums in any order are exact
            scale = torch.rand(n, generator=g, requires_grad=True)
            x_dev = x.detach().to(TPU).requires_grad_()
            scale_dev = torchtpu.mark_dynamic(scale.detach().to(TPU).requires_grad_(), 0, 16)
            out = compiled(lin_dev, x_dev, torchtpu.mark_dynamic(idx.to(TPU), 0, 16), scale_dev)
            expected = fn(lin_cpu, x, idx, scale)
            assert_close(out, expected)
            out.square().sum().backward()
            expected.square().sum().backward()
            assert_close(x_dev.grad, x.grad)
            assert_close(scale_dev.grad, scale.grad)
            for p_dev, p_cpu in zip(lin_dev.parameters(), lin_cpu.parameters()):
                assert_close(p_dev.grad, p_cpu.grad)
                p_dev.grad = p_cpu.grad = None
    graphs = [gr for gr in _graphs() if id(gr) not in older]
    assert graphs and all(gr.plan is not None for gr in graphs)
    assert max(len(gr.programs) for gr in graphs) == 2  # a program per bucket, not per length


class SwiGLU(nn.Module):
    def __init__(self, d: int = 8, f: int = 16) -> None:
        super().__init__()
        self.gate, self.up, self.down = nn.Linear(d, f, bias=False), nn.Linear(d, f, bias=False), nn.Linear(f, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(nn.functional.silu(self.gate(x)) * self.up(x))


def test_automatic_dynamic_shapes_are_bucketed_without_a_bound() -> None:
    """No mark_dynamic, no options: Dynamo makes the token count dynamic after a second
    size (automatic dynamic shapes), as for an expert's share of a mixture of experts. The
    graphs are bucketed (to the next power of two above 1.25 n: no bound needed), and a
    symbol's bucket only grows, so counts that wander below 8 keep to one program each."""
    _assert_swiglu_token_counts_bucket_quietly(dynamic=None, counts=(3, 5, 7, 6, 4, 6, 7, 5), seed=0)


def test_uploaded_ids_of_varying_length_are_padded_on_the_device() -> None:
    """DLRM's inputs: ids and their per-sample weights uploaded at a new total each step,
    automatic dynamic. Once uploads of that bucket vary they have bucketed twins
    (eager/buckets.py), and the compiled graph reads those padded, instead of copying each
    input to the host and back to pad it: no device-to-host transfer in a step (before:
    one per padded input), one program per graph, the CPU's loss and gradients."""

    def fn(w: torch.Tensor, ids: torch.Tensor, offsets: torch.Tensor, psw: torch.Tensor) -> torch.Tensor:
        return nn.functional.embedding_bag(ids, w, offsets, per_sample_weights=psw, mode="sum").square().sum()

    compiled = torch.compile(fn, backend="tpu")
    torch.manual_seed(0)
    w_ref = torch.randn(20, 4, requires_grad=True)
    w_dev = w_ref.detach().to(TPU).requires_grad_()
    g = torch.Generator().manual_seed(0)
    older = {id(gr) for gr in _graphs()}
    for step in range(6):
        ids, offsets = _bags(g, 8, 20)
        psw = torch.rand(len(ids), generator=g, requires_grad=True)
        before = torchtpu.metrics.snapshot()["d2h_transfers"]
        psw_dev = psw.detach().to(TPU).requires_grad_()
        loss = compiled(w_dev, ids.to(TPU), offsets.to(TPU), psw_dev)
        loss.backward()
        if step >= 3:  # the first steps: one length (static), then Dynamo's recompile
            assert torchtpu.metrics.snapshot()["d2h_transfers"] == before, step
        expected = fn(w_ref, ids, offsets, psw)
        expected.backward()
        assert_close(loss, expected)
        assert_close(w_dev.grad, w_ref.grad)
        assert_close(psw_dev.grad, psw.grad)
        w_dev.grad = w_ref.grad = None
    dynamic = [gr for gr in _graphs() if id(gr) not in older and gr.dynamic]
    assert dynamic and all(gr.plan is not None and len(gr.programs) == 1 for gr in dynamic)


def test_automatic_dynamic_graph_that_is_not_padding_safe_runs_at_exact_shapes_quietly() -> None:
    """mean divides by a size baked into the program: the graph keeps exact shapes, with no
    warning (nobody asked for bounded dynamism)."""
    compiled = torch.compile(lambda x: x.mean(dim=0), backend="tpu")
    older = {id(gr) for gr in _graphs()}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for n in (3, 5, 6):
            x = torch.randn(n, 4)
            assert_close(compiled(x.to(TPU)), x.mean(dim=0))
    dynamic = [gr for gr in _graphs() if id(gr) not in older and gr.dynamic]
    assert dynamic and all(gr.plan is None for gr in dynamic)
