"""Recurrent cells: the fused LSTM/GRU cell ops and their backwards, as decompositions.

On a PrivateUse1 device PyTorch's ``lstm``/``gru`` (and ``lstm_cell``/``gru_cell``) take
the path CUDA takes: the input and hidden projections are ``mm``s, and the gate
arithmetic is one op, ``_thnn_fused_lstm_cell`` / ``_thnn_fused_gru_cell``, whose autograd
formula calls ``_thnn_fused_lstm_cell_backward_impl`` / ``_thnn_fused_gru_cell_backward``.
Those four ops have CUDA kernels only; here each is a decomposition into elementwise ops
(one fused program each) with the CUDA kernels' semantics, including their ``workspace``
layouts (the saved activations the backward reads):

* LSTM: workspace (B, 4H) = [sigmoid(i), sigmoid(f), tanh(g), sigmoid(o)] (gate order i, f, g, o);
* GRU:  workspace (B, 5H) = [r, z, n, hx, h_n] where h_n is the hidden projection of the
  new-gate chunk plus its bias (gate order r, z, n).

As in the CUDA kernels, 16-bit operands are widened to float32 (their ``accscalar_t``) and
each output and workspace entry is rounded once; rounding every step to bfloat16 put an
autocast ``lstm_cell``'s hy 4x farther from float64 than that (summed error 0.0176 vs 0.0041).

``rnn_tanh``/``rnn_relu`` need nothing: their cells are plain ``addmm`` + activation.
"""

from __future__ import annotations

import warnings

import torch

from ..decomp import register_own
from .reduction import acc_dtype

aten = torch.ops.aten


def _acc(*ts: torch.Tensor | None) -> list[torch.Tensor | None]:
    """The operands in the kernels' accumulation type (float32 for 16-bit ones)."""
    return [None if t is None else t.to(acc_dtype(t.dtype)) for t in ts]


def _gates(input_gates: torch.Tensor, hidden_gates: torch.Tensor, input_bias: torch.Tensor | None, hidden_bias: torch.Tensor | None) -> torch.Tensor:
    gates = input_gates + hidden_gates
    if input_bias is not None:
        gates = gates + input_bias
    if hidden_bias is not None:
        gates = gates + hidden_bias
    return gates


@register_own(aten._thnn_fused_lstm_cell.default)
def _fused_lstm_cell(
    input_gates: torch.Tensor, hidden_gates: torch.Tensor, cx: torch.Tensor,
    input_bias: torch.Tensor | None = None, hidden_bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    dtype = cx.dtype
    input_gates, hidden_gates, cx, input_bias, hidden_bias = _acc(input_gates, hidden_gates, cx, input_bias, hidden_bias)
    i, f, g, o = _gates(input_gates, hidden_gates, input_bias, hidden_bias).chunk(4, 1)
    i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()
    cy = f * cx + i * g
    hy = o * cy.tanh()
    return hy.to(dtype), cy.to(dtype), torch.cat([i, f, g, o], 1).to(dtype)


@register_own(aten._thnn_fused_lstm_cell_backward_impl.default)
def _fused_lstm_cell_backward(
    grad_hy: torch.Tensor | None, grad_cy: torch.Tensor | None, cx: torch.Tensor, cy: torch.Tensor,
    workspace: torch.Tensor, has_bias: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    dtype = cx.dtype
    grad_hy, grad_cy, cx, cy, workspace = _acc(grad_hy, grad_cy, cx, cy, workspace)
    i, f, g, o = workspace.chunk(4, 1)
    tanh_cy = cy.tanh()
    # an undefined output gradient (that output unused) counts as zeros, as in the CUDA kernel
    ghy = torch.zeros_like(cy) if grad_hy is None else grad_hy
    gcy = ghy * o * (1 - tanh_cy * tanh_cy)
    if grad_cy is not None:
        gcy = gcy + grad_cy
    grad_gates = torch.cat(
        [gcy * g * i * (1 - i), gcy * cx * f * (1 - f), gcy * i * (1 - g * g), ghy * tanh_cy * o * (1 - o)], 1
    ).to(dtype)
    # the bias gradient sums the rounded gate gradients, as CUDA's grad_gates.sum(0)
    grad_bias = grad_gates.sum(0) if has_bias else grad_gates.new_empty((0,))
    return grad_gates, (gcy * f).to(dtype), grad_bias


@register_own(aten._thnn_fused_gru_cell.default)
def _fused_gru_cell(
    input_gates: torch.Tensor, hidden_gates: torch.Tensor, hx: torch.Tensor,
    input_bias: torch.Tensor | None = None, hidden_bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    dtype = hx.dtype
    input_gates, hidden_gates, hx, input_bias, hidden_bias = _acc(input_gates, hidden_gates, hx, input_bias, hidden_bias)
    if input_bias is not None:
        input_gates = input_gates + input_bias
    if hidden_bias is not None:
        hidden_gates = hidden_gates + hidden_bias
    ir, iz, in_ = input_gates.chunk(3, 1)
    hr, hz, hn = hidden_gates.chunk(3, 1)
    r = (ir + hr).sigmoid()
    z = (iz + hz).sigmoid()
    n = (in_ + r * hn).tanh()
    hy = n + z * (hx - n)
    return hy.to(dtype), torch.cat([r, z, n, hx, hn], 1).to(dtype)


@register_own(aten._thnn_fused_gru_cell_backward.default)
def _fused_gru_cell_backward(
    grad_hy: torch.Tensor, workspace: torch.Tensor, has_bias: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    dtype = grad_hy.dtype
    grad_hy, workspace = _acc(grad_hy, workspace)
    r, z, n, hx, hn = workspace.chunk(5, 1)
    gz = grad_hy * (hx - n) * z * (1 - z)
    gn = grad_hy * (1 - z) * (1 - n * n)
    gr = gn * hn * r * (1 - r)
    grad_input_gates = torch.cat([gr, gz, gn], 1).to(dtype)
    grad_hidden_gates = torch.cat([gr, gz, gn * r], 1).to(dtype)
    # the bias gradients sum the rounded gate gradients, as CUDA's grad_input_gates.sum(0)
    if has_bias:
        grad_input_bias, grad_hidden_bias = grad_input_gates.sum(0), grad_hidden_gates.sum(0)
    else:
        grad_input_bias = grad_hidden_bias = grad_hy.new_empty((0,))
    return grad_input_gates, grad_hidden_gates, (grad_hy * z).to(dtype), grad_input_bias, grad_hidden_bias


# -- Meta kernels (the eager path reads output shapes from them; PyTorch has none for GRU) ----------
def _gru_cell_meta(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):  # noqa: ANN001, ANN202
    return hx.new_empty(hx.shape), hx.new_empty((hx.shape[0], 5 * hx.shape[1]))


def _gru_cell_backward_meta(grad_hy, workspace, has_bias):  # noqa: ANN001, ANN202
    b, h = grad_hy.shape
    bias = (3 * h,) if has_bias else (0,)
    gates = grad_hy.new_empty((b, 3 * h))
    return gates, gates.new_empty(gates.shape), grad_hy.new_empty(grad_hy.shape), grad_hy.new_empty(bias), grad_hy.new_empty(bias)


def _lstm_cell_meta(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):  # noqa: ANN001, ANN202
    return cx.new_empty(cx.shape), cx.new_empty(cx.shape), cx.new_empty((cx.shape[0], 4 * cx.shape[1]))


_META = torch.library.Library("aten", "IMPL")
for _name, _fn in (("_thnn_fused_gru_cell", _gru_cell_meta), ("_thnn_fused_gru_cell_backward", _gru_cell_backward_meta)):
    if not torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{_name}", "Meta"):
        _META.impl(_name, _fn, "Meta")
# PyTorch's own Meta kernel for the LSTM cell reads ``input_bias.device`` even when the
# biases are None (nn.LSTM(bias=False)) and raises: replace it.
with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # "overriding a previously registered kernel"
    _META.impl("_thnn_fused_lstm_cell", _lstm_cell_meta, "Meta")
