"""torchtpu.debug.compare.compare_with_cpu: finds the first module (forward) and the first module in
backward order (gradients) whose values differ from a CPU copy, and leaves the model untouched."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import pytest
import torch
from torch import nn

from torchtpu.debug.compare import Comparison, compare_with_cpu


class PlantedForward(nn.Module):
    """Adds 1e-3 on tpu only: a forward difference the tool must pin here."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 1e-3 if x.device.type == "tpu" else x


class _SkewedGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.on_tpu = x.device.type == "tpu"
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return g + 1e-3 if ctx.on_tpu else g


class PlantedBackward(nn.Module):
    """Identity forward; its backward adds 1e-3 on tpu only."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _SkewedGrad.apply(x)


class InplaceDouble(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mul_(2)  # in place on the previous module's output


def _mlp() -> nn.Sequential:
    return nn.Sequential(nn.Linear(8, 16), InplaceDouble(), nn.ReLU(inplace=True), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4))


def _convnet() -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1),
        nn.BatchNorm2d(4),  # train mode: the forward updates running statistics, which must be undone
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(4 * 4 * 4, 5),
    )


def _kinds(rows, status="ok"):
    return [(d.module, d.kind) for d in rows if d.status == status]


def test_mlp_matches():
    model = _mlp().to("tpu")
    r = compare_with_cpu(model, torch.randn(6, 8), show=False)
    assert isinstance(r, Comparison)
    assert r.ok, r.report()
    assert [d.module for d in r.forward] == ["0", "1", "2", "3", "4", "5", "(root)"]
    kinds = {d.kind for d in r.backward}
    assert kinds == {"grad out", "grad in", "grad param"}
    assert len([d for d in r.backward if d.kind == "grad param"]) == 6
    assert r.verdict().startswith("verdict: no difference from the CPU: 7 module outputs and")


def test_convnet_matches_and_input_grad():
    model = _convnet().to("tpu")
    x = torch.randn(2, 3, 8, 8, requires_grad=True)
    r = compare_with_cpu(model, x, show=False)
    assert r.ok, r.report()
    root_in = [d for d in r.backward if d.module == "(root)" and d.kind == "grad in"]
    assert len(root_in) == 1 and root_in[0].ok  # the gradient w.r.t. the model's input
    assert r.backward[-1] is root_in[0]  # the model's input gradient is the last one computed
    assert x.grad is None  # the caller's input was copied, not used


def test_planted_forward_difference(capsys):
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), PlantedForward(), nn.Linear(16, 4)).to("tpu")
    r = compare_with_cpu(model, torch.randn(5, 8))
    out = capsys.readouterr().out
    print(out)  # shown with pytest -s: the report pasted in docs/debugging.md
    first = r.first_forward
    assert first is not None and (first.module, first.module_type, first.kind, first.status) == (
        "2",
        "PlantedForward",
        "output",
        "DIFF",
    )
    assert [d.ok for d in r.forward] == [True, True, False, False, False]
    assert first.max_abs == pytest.approx(1e-3, rel=1e-3)
    assert ">> 2 (PlantedForward)" in out and "<- first difference" in out
    assert "verdict: first difference from the CPU in the forward at 2 (PlantedForward) output" in out
    assert "the 2 module outputs before it match" in out
    assert out.strip().splitlines()[-1].startswith("verdict:")


def test_caller_tolerance():
    model = nn.Sequential(nn.Linear(8, 16), PlantedForward(), nn.Linear(16, 4)).to("tpu")
    assert compare_with_cpu(model, torch.randn(5, 8), rtol=0.0, atol=1e-2, show=False).ok
    assert not compare_with_cpu(model, torch.randn(5, 8), rtol=0.0, atol=1e-4, show=False).ok


def test_planted_gradient_difference():
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), PlantedBackward(), nn.Linear(16, 4)).to("tpu")
    r = compare_with_cpu(model, torch.randn(5, 8), show=False)
    assert r.first_forward is None and all(d.ok for d in r.forward)
    first = r.first_backward
    assert first is not None and (first.module, first.module_type, first.kind) == ("2", "PlantedBackward", "grad in")
    i = r.backward.index(first)
    # nearer the loss everything matches: the root's and layer 3's gradients, layer 3's parameters
    assert _kinds(r.backward[:i]) == [
        ("(root)", "grad out"),
        ("3", "grad out"),
        ("3", "grad param"),
        ("3", "grad param"),
        ("3", "grad in"),
        ("2", "grad out"),
    ]
    assert not any(d.ok for d in r.backward[i:])  # everything below it inherits the difference
    assert "forward matches (5 module outputs); first gradient difference at 2 (PlantedBackward) grad in" in r.verdict()


def test_backward_off():
    model = nn.Sequential(nn.Linear(8, 4), PlantedBackward()).to("tpu")
    r = compare_with_cpu(model, torch.randn(2, 8), backward=False, show=False)
    assert r.ok and r.backward == []
    with torch.no_grad():
        assert compare_with_cpu(model, torch.randn(2, 8), show=False).backward == []  # default: no grad, no backward


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(8, 24)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        scores = q @ k.transpose(-1, -2) / 8**0.5
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = scores.softmax(-1)
        return weights @ v, weights  # a tuple, as Hugging Face attention layers return


class Head(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 3)

    def forward(self, h: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"logits": self.proj(h), "hidden": h}


def _hf_style(output_cls):
    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attn = Attention()
            self.head = Head()

        def forward(self, x, attention_mask=None, labels=None):
            h, w = self.attn(x, mask=attention_mask)
            logits = self.head(h)["logits"]
            loss = nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
            return output_cls(loss=loss, logits=logits, attentions=(w,))

    return Model()


@pytest.mark.parametrize("flavour", ["dict", "ModelOutput"])
def test_hf_style_outputs(flavour):
    if flavour == "dict":
        output_cls = dict
    else:
        modeling_outputs = pytest.importorskip("transformers.utils")

        @dataclass
        class Output(modeling_outputs.ModelOutput):
            loss: torch.Tensor | None = None
            logits: torch.Tensor | None = None
            attentions: tuple[torch.Tensor, ...] | None = None

        output_cls = Output
    model = _hf_style(output_cls).to("tpu")
    x = torch.randn(2, 5, 8)
    mask = torch.ones(2, 5, 5, dtype=torch.bool).tril()
    labels = torch.randint(0, 3, (2, 5))
    r = compare_with_cpu(model, x, attention_mask=mask, labels=labels, show=False)
    assert r.ok, r.report()
    assert [d.module for d in r.forward] == ["attn.qkv", "attn", "head.proj", "head", "(root)"]
    grads_in = {d.module for d in r.backward if d.kind == "grad in"}
    assert grads_in == {"head", "head.proj"}  # attn and attn.qkv take x (no grad) and a bool mask
    # a difference planted in the head's projection: the tuple-returning attention still matches
    model.head.proj.register_forward_hook(lambda m, a, o: o + 1e-3 if o.device.type == "tpu" else o)
    r = compare_with_cpu(model, x, attention_mask=mask, labels=labels, show=False)
    assert (r.first_forward.module, r.first_forward.kind) == ("head.proj", "output")
    assert [d.ok for d in r.forward] == [True, True, False, False, False]
    # the loss is the first output but matches (cross entropy ignores a constant shift of the logits)
    assert r.forward[-1].detail.startswith("output['logits']: 30 of 30 elements differ")


class Twice(nn.Module):
    """Calls ``shared`` twice; ``planted`` differs on tpu on its second call only."""

    def __init__(self) -> None:
        super().__init__()
        self.shared = nn.Linear(4, 4)
        self.planted = PlantedOnSecondCall()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.planted(self.shared(self.planted(self.shared(x))))


class PlantedOnSecondCall(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return x + 1e-3 if x.device.type == "tpu" and self.calls % 2 == 0 else x


def test_module_called_twice():
    model = Twice().to("tpu")
    r = compare_with_cpu(model, torch.randn(3, 4), show=False)
    assert [d.module for d in r.forward] == ["shared#1", "planted#1", "shared#2", "planted#2", "(root)"]
    assert (r.first_forward.module, r.first_forward.module_type) == ("planted#2", "PlantedOnSecondCall")
    assert [d.ok for d in r.forward] == [True, True, True, False, False]
    params = [(d.module, d.param) for d in r.backward if d.kind == "grad param"]
    assert params == [("shared#1", "weight"), ("shared#1", "bias")]  # the total gradient, once


def _hooks_of(model: nn.Module) -> list:
    found = []
    for m in model.modules():
        for attr in (
            "_forward_hooks",
            "_forward_pre_hooks",
            "_backward_hooks",
            "_backward_pre_hooks",
            "_forward_hooks_with_kwargs",
            "_forward_pre_hooks_with_kwargs",
            "_forward_hooks_always_called",
        ):
            found += list(getattr(m, attr))
    for p in model.parameters():
        found += list(p._backward_hooks or {})
    return found


def test_model_unchanged():
    model = _convnet().to("tpu")
    model[5].weight.grad = torch.full_like(model[5].weight, 7.0)  # a gradient the user already has
    grad_before = model[5].weight.grad
    state_before = {k: v.cpu().clone() for k, v in model.state_dict().items()}
    x = torch.randn(2, 3, 8, 8)
    cpu_rng, tpu_rng = torch.get_rng_state(), torch.tpu.get_rng_state()
    r = compare_with_cpu(model, x, show=False)
    assert r.ok, r.report()
    assert _hooks_of(model) == []
    assert model[5].weight.grad is grad_before and bool((grad_before.cpu() == 7).all())
    assert all(p.grad is None for n, p in model.named_parameters() if n != "5.weight")
    state_after = model.state_dict()
    for k, v in state_before.items():  # parameters and batch-norm statistics (num_batches_tracked too)
        assert torch.equal(state_after[k].cpu(), v), k
    assert model.training and all(m.training for m in model.modules())
    assert torch.equal(torch.get_rng_state(), cpu_rng) and torch.equal(torch.tpu.get_rng_state(), tpu_rng)


def test_model_on_cpu():
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 2))
    before = [p.detach().clone() for p in model.parameters()]
    r = compare_with_cpu(model, torch.randn(4, 8), show=False)
    assert r.ok, r.report()
    assert all(p.device.type == "cpu" for p in model.parameters())
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert _hooks_of(model) == [] and all(p.grad is None for p in model.parameters())


def test_dropout_in_train_mode_warns():
    model = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5), nn.Linear(8, 2)).to("tpu")
    with pytest.warns(UserWarning, match=r"dropout module\(s\) with p>0 are in train mode \(1\).*model.eval\(\)"):
        r = compare_with_cpu(model, torch.randn(4, 8), show=False)
    assert len(r.warnings) == 1 and "(1)" in r.warnings[0]
    model.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert compare_with_cpu(model, torch.randn(4, 8), show=False).ok
