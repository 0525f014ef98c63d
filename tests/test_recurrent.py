"""nn.LSTM / nn.GRU / nn.RNN and their cells on tpu vs the CPU: outputs, final states,
every parameter's gradient, the inputs' gradients and one SGD step, over the options
(layers, directions, batch_first, proj_size, bias, packed sequences, initial states,
unbatched input, dropout between layers), eager and DeferAndFuse."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence
from torch.utils._pytree import tree_flatten, tree_map
from utils import TPU

import torchtpu

FWD = dict(rtol=1e-4, atol=1e-4)
GRAD = dict(rtol=1e-3, atol=1e-4)
I, H, T, B = 5, 6, 7, 3


def _tensors(x):
    return [t for t in tree_flatten(x)[0] if isinstance(t, torch.Tensor)]


def _unpack(out):
    """Outputs as tensors: a PackedSequence's data (its batch_sizes stay on the CPU)."""
    return tree_map(lambda v: v.data if isinstance(v, PackedSequence) else v, out, is_leaf=lambda v: isinstance(v, PackedSequence))


def _run(module, forward, inputs, seed):
    """Forward, backward against fixed random cotangents, one SGD step. Returns what to compare."""
    out = _unpack(forward(*inputs))
    outs = [o for o in _tensors(out) if o.requires_grad]
    gen = torch.Generator().manual_seed(seed)
    cots = [torch.randn(o.shape, generator=gen).to(o.device) for o in outs]
    torch.autograd.backward(outs, cots)
    param_grads = {n: p.grad for n, p in module.named_parameters()}
    input_grads = [t.grad for t in _tensors(inputs) if t.requires_grad]
    torch.optim.SGD(module.parameters(), lr=0.1).step()
    stepped = {n: p.detach().clone() for n, p in module.named_parameters()}
    return tree_map(lambda t: t.cpu() if isinstance(t, torch.Tensor) else t, (_tensors(out), param_grads, input_grads, stepped))


def _leaf(t, device):
    return t.detach().to(device).requires_grad_(t.is_floating_point())


def compare(module, *inputs, seed=0, lengths=None, enforce_sorted=True, fuse=False):
    """``module`` (CPU) vs a copy on tpu, on ``inputs`` (CPU tensors or None); with
    ``lengths`` the first input is padded and runs packed (the packed output is compared,
    and its padded form)."""

    def run(mod, device):
        leaves = [None if a is None else tree_map(lambda t: _leaf(t, device), a) for a in inputs]
        forward = mod
        if lengths is not None:

            def forward(padded, *rest):
                packed = pack_padded_sequence(padded, lengths, batch_first=mod.batch_first, enforce_sorted=enforce_sorted)
                out, state = mod(packed, *rest)
                return out, pad_packed_sequence(out, batch_first=mod.batch_first)[0], state

        return _run(mod, forward, leaves, seed)

    tpu_module = copy.deepcopy(module).to(TPU)
    expected = run(copy.deepcopy(module), "cpu")
    if fuse:
        with torchtpu.eager_mode("defer_and_fuse"):
            actual = run(tpu_module, TPU)
    else:
        actual = run(tpu_module, TPU)
    e_out, e_pg, e_ig, e_step = expected
    a_out, a_pg, a_ig, a_step = actual
    assert len(a_out) == len(e_out) and e_out
    for a, e in zip(a_out, e_out):
        torch.testing.assert_close(a, e, **FWD)
    assert e_pg.keys() == a_pg.keys()
    for name in e_pg:
        assert (a_pg[name] is None) == (e_pg[name] is None), name
        if e_pg[name] is not None:
            torch.testing.assert_close(a_pg[name], e_pg[name], **GRAD, msg=lambda m, n=name: f"grad of {n}: {m}")
            torch.testing.assert_close(a_step[name], e_step[name], **GRAD)
    assert len(a_ig) == len(e_ig) and all(g is not None for g in e_ig)
    for a, e in zip(a_ig, e_ig):
        torch.testing.assert_close(a, e, **GRAD)


def x_of(*shape):
    return torch.randn(*shape)


def _state(kind, layers, dirs, batch, hidden=H, proj=0):
    n = layers * dirs
    h = torch.randn(n, *batch, proj or hidden)
    if kind == "lstm":
        return (h, torch.randn(n, *batch, hidden))
    return h


MODULES = {
    "lstm": nn.LSTM,
    "gru": nn.GRU,
    "rnn_tanh": lambda *a, **k: nn.RNN(*a, nonlinearity="tanh", **k),
    "rnn_relu": lambda *a, **k: nn.RNN(*a, nonlinearity="relu", **k),
}

# (name, constructor kwargs, batch_first input?, give initial state?)
CONFIGS = {
    "plain": dict(),
    "two_layers_bidir": dict(num_layers=2, bidirectional=True),
    "batch_first_state": dict(batch_first=True, state=True),
    "no_bias_state": dict(bias=False, num_layers=2, state=True),
}


def _build(kind, seed=0, **kw):
    torch.manual_seed(seed)
    return MODULES[kind](I, H, **kw)


# the default suite runs one configuration per module (compiling every shape is what
# costs); the full product runs with the slow tests
DEFAULT_LAYERS = {("lstm", "two_layers_bidir"), ("gru", "batch_first_state"), ("rnn_tanh", "no_bias_state"), ("rnn_relu", "plain")}
LAYER_CASES = [
    pytest.param(kind, config, marks=() if (kind, config) in DEFAULT_LAYERS else pytest.mark.slow)
    for kind in MODULES
    for config in CONFIGS
]


@pytest.mark.parametrize("kind,config", LAYER_CASES)
def test_recurrent_layer(kind, config):
    kw = dict(CONFIGS[config])
    state = kw.pop("state", False)
    m = _build(kind, **kw)
    x = x_of(B, T, I) if kw.get("batch_first") else x_of(T, B, I)
    h0 = _state(kind, m.num_layers, 2 if m.bidirectional else 1, (B,)) if state else None
    compare(m, x, h0)


@pytest.mark.slow
def test_lstm_proj_size_bidir_state():
    m = _build("lstm", num_layers=2, bidirectional=True, proj_size=4)
    compare(m, x_of(T, B, I), _state("lstm", 2, 2, (B,), proj=4))


@pytest.mark.parametrize("kind", [pytest.param(k, marks=pytest.mark.slow) for k in ("lstm", "gru", "rnn_tanh")])
def test_unbatched(kind):
    m = _build(kind, num_layers=2)
    compare(m, x_of(T, I), _state(kind, 2, 1, ()))


@pytest.mark.parametrize(
    "kind,enforce_sorted",
    [("lstm", False), *(pytest.param(k, e, marks=pytest.mark.slow) for k, e in (("gru", True), ("lstm", True), ("gru", False)))],
)
def test_packed(kind, enforce_sorted):
    m = _build(kind, num_layers=2, bidirectional=True, batch_first=True)
    lengths = [7, 5, 2, 2] if enforce_sorted else [2, 7, 2, 5]
    compare(m, x_of(4, T, I), _state(kind, 2, 2, (4,)), lengths=lengths, enforce_sorted=enforce_sorted)


@pytest.mark.parametrize("kind", ["lstm", "gru", pytest.param("rnn_tanh", marks=pytest.mark.slow)])
def test_cells(kind):
    torch.manual_seed(0)
    cell = {"lstm": nn.LSTMCell, "gru": nn.GRUCell, "rnn_tanh": nn.RNNCell}[kind](I, H)
    hx = (torch.randn(B, H), torch.randn(B, H)) if kind == "lstm" else torch.randn(B, H)
    compare(cell, x_of(B, I), hx)
    compare(cell, x_of(B, I))  # no state given
    compare(cell, x_of(I))  # unbatched


@pytest.mark.slow
def test_cell_bias_false_and_relu():
    torch.manual_seed(0)
    compare(nn.LSTMCell(I, H, bias=False), x_of(B, I))
    compare(nn.GRUCell(I, H, bias=False), x_of(B, I), torch.randn(B, H))
    compare(nn.RNNCell(I, H, nonlinearity="relu"), x_of(B, I))


def test_lstm_only_cell_state_used():
    """Only c_n feeds the loss: the fused backward gets an undefined grad_hy for the last step."""
    m = _build("lstm")
    mt = copy.deepcopy(m).to(TPU)
    x = x_of(T, B, I)
    xc, xt = x.clone().requires_grad_(), x.to(TPU).requires_grad_()
    m(xc)[1][1].sum().backward()
    mt(xt)[1][1].sum().backward()
    torch.testing.assert_close(xt.grad.cpu(), xc.grad, **GRAD)
    torch.testing.assert_close(mt.weight_hh_l0.grad.cpu(), m.weight_hh_l0.grad, **GRAD)


@pytest.mark.parametrize("kind", ["lstm", pytest.param("gru", marks=pytest.mark.slow)])
def test_defer_and_fuse(kind):
    m = _build(kind, num_layers=2, bidirectional=True)
    compare(m, x_of(T, B, I), _state(kind, 2, 2, (B,)), fuse=True)


@pytest.mark.slow
def test_defer_and_fuse_packed_lstm():
    m = _build("lstm", batch_first=True)
    compare(m, x_of(3, T, I), lengths=[3, 7, 5], enforce_sorted=False, fuse=True)


# -- dropout between layers -------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["lstm", pytest.param("gru", marks=pytest.mark.slow)])
def test_dropout_zero_and_eval_match_cpu(kind):
    compare(_build(kind, num_layers=2, dropout=0.0), x_of(T, B, I))
    m = _build(kind, num_layers=2, dropout=0.5).eval()  # eval: no dropout
    compare(m, x_of(T, B, I))


def test_dropout_is_applied_between_layers():
    """Train mode with dropout: random (two runs differ, and differ from eval), the first
    layer is untouched (the last layer's output changes, a 1-layer module's does not)."""
    m = _build("lstm", num_layers=2, dropout=0.5).to(TPU)
    x = torch.randn(T, B, I, device=TPU)
    a, b = m(x)[0].detach().cpu(), m(x)[0].detach().cpu()
    ref = m.eval()(x)[0].detach().cpu()
    assert not torch.equal(a, b) and not torch.allclose(a, ref) and not torch.allclose(b, ref)
    # the layer-0 final state is computed before any dropout: the same in train and eval
    m.train()
    torch.testing.assert_close(m(x)[1][0][0].cpu(), m.eval()(x)[1][0][0].cpu(), **FWD)


def test_dropout_mask_statistics():
    """Layer 1 of a relu RNN with identity input weights, no recurrence and no bias passes
    the dropped layer-0 output straight through (layer 0's outputs are positive): the
    train/eval ratio is 0 on a fraction p of the elements and 1/(1-p) elsewhere."""
    p, hidden = 0.3, 64
    torch.manual_seed(0)
    m = nn.RNN(I, hidden, num_layers=2, nonlinearity="relu", bias=False, dropout=p)
    with torch.no_grad():
        m.weight_ih_l0.uniform_(0.0, 0.1)
        m.weight_hh_l0.uniform_(0.0, 0.01)
        m.weight_ih_l1.copy_(torch.eye(hidden))
        m.weight_hh_l1.zero_()
    m = m.to(TPU)
    x = torch.rand(20, 16, I, device=TPU) + 0.1  # positive: every layer-0 output is > 0
    with torch.no_grad():
        train = m(x)[0].cpu()
        ref = m.eval()(x)[0].cpu()
    assert (ref > 0).all()
    ratio = train / ref
    dropped = ratio == 0
    assert abs(dropped.float().mean().item() - p) < 0.02  # 19200 draws: 5 sigma is 0.017
    kept = ratio[~dropped]
    torch.testing.assert_close(kept, torch.full_like(kept, 1 / (1 - p)), **FWD)


# -- a bigger option grid (slow) -------------------------------------------------------------------
GRID = [
    dict(num_layers=nl, bidirectional=bd, batch_first=bf, bias=bias)
    for nl in (1, 3)
    for bd in (False, True)
    for bf in (False, True)
    for bias in (False, True)
]


@pytest.mark.slow
@pytest.mark.parametrize("kw", GRID, ids=str)
@pytest.mark.parametrize("kind", list(MODULES))
def test_grid(kind, kw):
    m = _build(kind, **kw)
    x = x_of(B, T, I) if kw["batch_first"] else x_of(T, B, I)
    compare(m, x, _state(kind, kw["num_layers"], 2 if kw["bidirectional"] else 1, (B,)))


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(MODULES))
@pytest.mark.parametrize("enforce_sorted", [True, False])
def test_grid_packed(kind, enforce_sorted):
    kw = dict(proj_size=3) if kind == "lstm" else {}
    m = _build(kind, num_layers=2, bidirectional=True, **kw)
    lengths = [7, 6, 3, 1] if enforce_sorted else [3, 1, 7, 6]
    compare(m, x_of(T, 4, I), lengths=lengths, enforce_sorted=enforce_sorted)
