"""torch.nn.utils on tpu against the CPU: gradient clipping, weight and spectral norm (old
hooks and parametrizations), orthogonal parametrizations, pruning, the rnn packing
helpers, parameter vectors, functional_call and conv-bn fusion, each inside a few SGD steps
where it takes part in training."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable

import pytest
import torch
import torch.nn as nn
import torch.nn.utils as U
import torch.nn.utils.prune as prune
from torch.nn.utils import rnn as R

from tests.utils import TPU, assert_close


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))


def _first(wrap: Callable[[nn.Module], nn.Module]) -> Callable[[], nn.Module]:
    return lambda: nn.Sequential(wrap(nn.Linear(6, 6)), nn.ReLU(), nn.Linear(6, 3))


_CLIPS: dict[str, Callable[[nn.Module], torch.Tensor | None]] = {
    "none": lambda m: None,
    "norm": lambda m: U.clip_grad_norm_(m.parameters(), 0.01),
    "norm-foreach": lambda m: U.clip_grad_norm_(m.parameters(), 0.01, foreach=True),
    "norm-inf": lambda m: U.clip_grad_norm_(m.parameters(), 0.01, norm_type=float("inf")),
    "value": lambda m: U.clip_grad_value_(m.parameters(), 0.001),
}

_MODELS: dict[str, Callable[[], nn.Module]] = {
    "mlp": _mlp,
    "weight_norm-hook": _first(U.weight_norm),
    "weight_norm": _first(nn.utils.parametrizations.weight_norm),
    "spectral_norm-hook": _first(U.spectral_norm),  # power iteration updates buffers in place
    "spectral_norm": _first(nn.utils.parametrizations.spectral_norm),
    "orthogonal-matrix_exp": _first(lambda m: nn.utils.parametrizations.orthogonal(m, orthogonal_map="matrix_exp")),
    "orthogonal-cayley": _first(lambda m: nn.utils.parametrizations.orthogonal(m, orthogonal_map="cayley")),
    "orthogonal-householder": _first(lambda m: nn.utils.parametrizations.orthogonal(m, orthogonal_map="householder")),
}


def _train(make: Callable[[], nn.Module], clip: str, device: str | torch.device) -> list[torch.Tensor]:
    """Losses, clip norms, an eval output and the final state dict of 3 SGD steps."""
    torch.manual_seed(0)
    m = make().to(device)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(3):
        loss = (m(torch.randn(4, 6, generator=g).to(device)) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        norm = _CLIPS[clip](m)
        if norm is not None:
            out.append(norm.detach())
        opt.step()
        out.append(loss.detach())
    m.eval()
    with torch.no_grad():
        out.append(m(torch.randn(4, 6, generator=g).to(device)))
    return out + [t.detach() for t in m.state_dict().values()]


@pytest.mark.parametrize(
    "model,clip", [("mlp", c) for c in _CLIPS] + [(name, "none") for name in _MODELS if name != "mlp"], ids="-".join
)
def test_training_with_nn_utils_matches_cpu(model: str, clip: str) -> None:
    with pytest.warns(FutureWarning) if model == "weight_norm-hook" else contextlib.nullcontext():
        want = _train(_MODELS[model], clip, "cpu")
        got = _train(_MODELS[model], clip, TPU)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert_close(a, b)


@pytest.mark.parametrize(
    "method",
    [
        lambda m: prune.l1_unstructured(m, "weight", amount=0.3),
        lambda m: prune.ln_structured(m, "weight", amount=0.5, n=2, dim=0),
        lambda m: prune.global_unstructured([(m, "weight")], pruning_method=prune.L1Unstructured, amount=0.4),
    ],
    ids=["l1_unstructured", "ln_structured", "global_unstructured"],
)
def test_pruning_masks_and_removal_match_cpu(method: Callable[[nn.Module], object]) -> None:
    torch.manual_seed(0)
    cpu = nn.Linear(6, 3)
    tpu = copy.deepcopy(cpu).to(TPU)
    method(cpu)
    method(tpu)
    x = torch.randn(4, 6)
    assert_close(tpu.weight_mask, cpu.weight_mask)
    assert_close(tpu(x.to(TPU)), cpu(x))
    prune.remove(cpu, "weight")
    prune.remove(tpu, "weight")
    assert_close(tpu.weight, cpu.weight)


def test_rnn_packing_helpers_match_cpu() -> None:
    torch.manual_seed(0)
    seqs = [torch.randn(n, 3) for n in (5, 2, 4)]
    lengths = torch.tensor([5, 2, 4])
    on_tpu = [s.to(TPU) for s in seqs]
    for side in ("right", "left"):
        assert_close(R.pad_sequence(on_tpu, batch_first=True, padding_side=side), R.pad_sequence(seqs, batch_first=True, padding_side=side))
    padded_cpu, padded_tpu = R.pad_sequence(seqs, batch_first=True), R.pad_sequence(on_tpu, batch_first=True)
    packed_cpu = R.pack_padded_sequence(padded_cpu, lengths, batch_first=True, enforce_sorted=False)
    packed_tpu = R.pack_padded_sequence(padded_tpu, lengths, batch_first=True, enforce_sorted=False)
    assert_close(packed_tpu.data, packed_cpu.data)
    assert torch.equal(packed_tpu.batch_sizes, packed_cpu.batch_sizes)
    lstm = nn.LSTM(3, 4, batch_first=True)
    out_cpu, lengths_cpu = R.pad_packed_sequence(lstm(packed_cpu)[0], batch_first=True)
    out_tpu, lengths_tpu = R.pad_packed_sequence(copy.deepcopy(lstm).to(TPU)(packed_tpu)[0], batch_first=True)
    assert_close(out_tpu, out_cpu)
    assert torch.equal(lengths_tpu.cpu(), lengths_cpu)
    assert_close(R.unpack_sequence(R.pack_sequence(on_tpu, enforce_sorted=False))[1], seqs[1])
    assert_close(R.unpad_sequence(padded_tpu, lengths, batch_first=True)[2], seqs[2])


def test_parameter_vectors_functional_call_and_conv_bn_fusion_match_cpu() -> None:
    torch.manual_seed(0)
    cpu = _mlp()
    tpu = copy.deepcopy(cpu).to(TPU)
    vector = U.parameters_to_vector(tpu.parameters())
    assert_close(vector, U.parameters_to_vector(cpu.parameters()))
    U.vector_to_parameters(vector * 2, tpu.parameters())
    U.vector_to_parameters(U.parameters_to_vector(cpu.parameters()) * 2, cpu.parameters())
    x = torch.randn(2, 6)
    assert_close(tpu(x.to(TPU)), cpu(x))
    halves = {k: v.detach() * 0.5 for k, v in cpu.named_parameters()}
    assert_close(
        torch.func.functional_call(tpu, {k: v.to(TPU) for k, v in halves.items()}, (x.to(TPU),)),
        torch.func.functional_call(cpu, halves, (x,)),
    )
    conv, bn = nn.Conv2d(3, 4, 3).eval(), nn.BatchNorm2d(4).eval()
    bn.running_mean.uniform_()
    bn.running_var.uniform_(0.5, 2)
    fused_cpu = nn.utils.fusion.fuse_conv_bn_eval(conv, bn)
    fused_tpu = nn.utils.fusion.fuse_conv_bn_eval(copy.deepcopy(conv).to(TPU), copy.deepcopy(bn).to(TPU))
    image = torch.randn(1, 3, 8, 8)
    assert_close(fused_tpu(image.to(TPU)), fused_cpu(image))
