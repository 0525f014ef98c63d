"""Op-level regressions found by the audio/encoder model zoo (tests/models/zoo_audio_text.py),
each against PyTorch on the CPU."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from utils import TPU

GRAD_TOL = dict(rtol=1e-3, atol=1e-4)


@pytest.mark.filterwarnings("ignore:`torch.nn.utils.weight_norm` is deprecated:FutureWarning")
@pytest.mark.parametrize("dim", [0, 2])
@pytest.mark.parametrize("api", ["parametrization", "legacy"])
def test_weight_norm_gradients_match_cpu(dim, api):
    torch.manual_seed(0)
    # _weight_norm_interface_backward (EnCodec's and wav2vec2's weight-normalised convs)
    # had no lowering: the backward of a weight-normalised layer raised NotImplementedError.
    wrap = nn.utils.parametrizations.weight_norm if api == "parametrization" else nn.utils.weight_norm
    conv = nn.Conv1d(4, 6, 3)
    # the legacy hook's weight is not a leaf, so the module cannot be deep-copied: move a
    # copy of the plain layer and wrap each side
    tpu = wrap(copy.deepcopy(conv).to(TPU), dim=dim)
    cpu = wrap(conv, dim=dim)
    x = torch.randn(2, 4, 9)
    grad_out = torch.randn(2, 6, 7)
    cpu(x).backward(grad_out)
    tpu(x.to(TPU)).backward(grad_out.to(TPU))
    cpu_grads = {n: p.grad for n, p in cpu.named_parameters()}
    tpu_grads = {n: p.grad.cpu() for n, p in tpu.named_parameters()}
    assert cpu_grads.keys() == tpu_grads.keys()
    for name, expected in cpu_grads.items():
        torch.testing.assert_close(tpu_grads[name], expected, **GRAD_TOL, msg=name)


def test_weight_norm_interface_backward_op_matches_cpu():
    torch.manual_seed(0)
    v, g = torch.randn(5, 3, 4), torch.rand(1, 1, 4) + 0.5
    w, norms = torch._weight_norm_interface(v, g, 2)
    grad_w = torch.randn_like(w)
    expected = torch.ops.aten._weight_norm_interface_backward(grad_w, v, g, norms, 2)
    actual = torch.ops.aten._weight_norm_interface_backward(*(t.to(TPU) for t in (grad_w, v, g, norms)), 2)
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a.cpu(), e, rtol=1e-5, atol=1e-6)
