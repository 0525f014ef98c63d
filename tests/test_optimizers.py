"""Optimizers on tpu match the CPU run: every torch.optim optimizer, single-tensor, foreach
and fused (where PyTorch has a fused kernel; elsewhere both refuse alike);
the _foreach_* ops; and repeated steps reuse compiled programs."""

from __future__ import annotations

import pytest
import torch
from utils import TPU, assert_close

import torchtpu

STEPS = 5

CONFIGS = {
    "sgd": (torch.optim.SGD, dict(lr=0.1)),
    "sgd_momentum_wd": (torch.optim.SGD, dict(lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.01)),
    "sgd_nesterov_maximize": (torch.optim.SGD, dict(lr=0.05, momentum=0.8, nesterov=True, maximize=True)),
    "adam": (torch.optim.Adam, dict(lr=0.01)),
    "adam_wd_amsgrad": (torch.optim.Adam, dict(lr=0.01, betas=(0.8, 0.99), weight_decay=0.1, amsgrad=True)),
    "adamw": (torch.optim.AdamW, dict(lr=0.01, weight_decay=0.05)),
    "adamw_amsgrad_maximize": (torch.optim.AdamW, dict(lr=0.02, amsgrad=True, maximize=True, eps=1e-6)),
    "adagrad": (torch.optim.Adagrad, dict(lr=0.1, lr_decay=0.01, weight_decay=0.1, initial_accumulator_value=0.1)),
    "adagrad_maximize": (torch.optim.Adagrad, dict(lr=0.1, maximize=True)),
    "adadelta": (torch.optim.Adadelta, dict(lr=0.5, rho=0.8, weight_decay=0.1)),
    "adamax": (torch.optim.Adamax, dict(lr=0.02, weight_decay=0.1)),
    "asgd": (torch.optim.ASGD, dict(lr=0.05, t0=0, weight_decay=0.1)),  # averaging from step 2
    "nadam": (torch.optim.NAdam, dict(lr=0.02, momentum_decay=0.005, weight_decay=0.1)),
    "nadam_decoupled": (torch.optim.NAdam, dict(lr=0.02, weight_decay=0.1, decoupled_weight_decay=True)),
    "radam_decoupled": (torch.optim.RAdam, dict(lr=0.02, weight_decay=0.1, decoupled_weight_decay=True)),
    "rmsprop_centered_momentum": (torch.optim.RMSprop, dict(lr=0.01, centered=True, momentum=0.9, weight_decay=0.1)),
    "rprop": (torch.optim.Rprop, dict(lr=0.01, etas=(0.4, 1.3), step_sizes=(1e-4, 1))),
    "adafactor": (torch.optim.Adafactor, dict(lr=0.01)),
    "adam_capturable": (torch.optim.Adam, dict(lr=0.01, capturable=True)),
    "adamw_tensor_lr": (torch.optim.AdamW, dict(lr=torch.tensor(0.01), weight_decay=0.05)),
}
MODES = {"single": dict(foreach=False), "foreach": dict(foreach=True), "fused": dict(fused=True)}



def _model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))


def _run(opt_cls, kwargs, device, steps=STEPS, compiles=None):
    torch.manual_seed(0)
    model = _model()
    grads = [[torch.randn_like(p) for p in model.parameters()] for _ in range(steps)]
    model = model.to(device)
    kwargs = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}  # a tensor lr is state
    if device == "cpu" and kwargs.get("capturable"):
        kwargs["capturable"] = False  # a CUDA-graph option: the same math without it
    opt = opt_cls(model.parameters(), **kwargs)
    for step in range(steps):
        for p, g in zip(model.parameters(), grads[step], strict=True):
            p.grad = g.to(device)
        opt.step()
        if compiles is not None:
            compiles.append(torchtpu.metrics.snapshot()["compiles"])
    return [p.detach().cpu() for p in model.parameters()]


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("config", list(CONFIGS))
def test_optimizer_matches_cpu(config, mode):
    opt_cls, kwargs = CONFIGS[config]
    kwargs = {**kwargs, **MODES[mode]}
    compiles: list[int] = []
    try:
        _run(opt_cls, kwargs, "cpu", steps=1)
    except (RuntimeError, TypeError, ValueError) as cpu_error:  # e.g. fused=True where PyTorch has none: the same refusal
        with pytest.raises(type(cpu_error)) as tpu_error:
            _run(opt_cls, kwargs, TPU, steps=1)
        assert str(tpu_error.value) == str(cpu_error).replace("cpu", "tpu") or str(tpu_error.value) == str(cpu_error)
        return
    actual = _run(opt_cls, kwargs, TPU, compiles=compiles)
    expected = _run(opt_cls, kwargs, "cpu")
    for a, e in zip(actual, expected, strict=True):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-5)
    # steps 3..5 are the same programs as step 2 (hyper-parameters are device operands)
    assert compiles[2] == compiles[4], compiles


def test_fused_adam_grad_scale_and_found_inf():
    torch.manual_seed(0)
    params = [torch.randn(5), torch.randn(2, 3)]
    grads = [torch.randn_like(p) for p in params]

    def run(device, found_inf):
        ps = [p.clone().to(device) for p in params]
        gs = [(g * 4).to(device) for g in grads]
        ms = [torch.zeros_like(p) for p in ps]
        vs = [torch.zeros_like(p) for p in ps]
        steps = [torch.tensor(3.0, device=device) for _ in ps]
        torch._fused_adamw_(
            ps,
            gs,
            ms,
            vs,
            [],
            steps,
            lr=0.01,
            beta1=0.9,
            beta2=0.999,
            weight_decay=0.01,
            eps=1e-8,
            amsgrad=False,
            maximize=False,
            grad_scale=torch.tensor(4.0, device=device),
            found_inf=torch.tensor(found_inf, device=device),
        )
        return ps + gs + ms + vs

    for found in (0.0, 1.0):
        assert_close(run(TPU, found), run("cpu", found), rtol=1e-5, atol=1e-6)


# -- _foreach_* ops --------------------------------------------------------------------------------
def _lists(n=3, offset=0.0):
    torch.manual_seed(1)
    return [torch.rand(2, k + 1) + 0.5 + offset for k in range(n)]


FOREACH = {
    "add_list": lambda a, b: torch._foreach_add(a, b, alpha=0.5),
    "add_scalar": lambda a, b: torch._foreach_add(a, 2.5),
    "add_scalarlist": lambda a, b: torch._foreach_add(a, [1.5, 2.5, -3.5]),
    "add_tensor": lambda a, b: torch._foreach_add(a, b[0][0, 0], alpha=2.0),
    "sub_list": lambda a, b: torch._foreach_sub(a, b),
    "mul_scalar": lambda a, b: torch._foreach_mul(a, 0.3),
    "mul_list": lambda a, b: torch._foreach_mul(a, b),
    "mul_tensor": lambda a, b: torch._foreach_mul(a, b[1][0, 1]),
    "div_scalarlist": lambda a, b: torch._foreach_div(a, [2.0, 4.0, 8.0]),
    "div_list": lambda a, b: torch._foreach_div(a, b),
    "addcmul_scalar": lambda a, b: torch._foreach_addcmul(a, a, b, value=0.7),
    "addcdiv_scalarlist": lambda a, b: torch._foreach_addcdiv(a, a, b, [0.1, 0.2, 0.3]),
    "lerp_scalar": lambda a, b: torch._foreach_lerp(a, b, 0.3),
    "lerp_list": lambda a, b: torch._foreach_lerp(a, b, b),
    "sqrt": lambda a, b: torch._foreach_sqrt(a),
    "neg": lambda a, b: torch._foreach_neg(a),
    "abs": lambda a, b: torch._foreach_abs(torch._foreach_neg(a)),
    "exp": lambda a, b: torch._foreach_exp(a),
    "sign": lambda a, b: torch._foreach_sign(torch._foreach_sub(a, 1.0)),
    "reciprocal": lambda a, b: torch._foreach_reciprocal(a),
    "sigmoid": lambda a, b: torch._foreach_sigmoid(a),
    "maximum_list": lambda a, b: torch._foreach_maximum(a, b),
    "maximum_scalar": lambda a, b: torch._foreach_maximum(a, 1.0),
    "clamp_min_scalar": lambda a, b: torch._foreach_clamp_min(a, 0.9),
    "clamp_max_list": lambda a, b: torch._foreach_clamp_max(a, b),
    "pow_scalar": lambda a, b: torch._foreach_pow(a, 3.0),
    "pow_list": lambda a, b: torch._foreach_pow(a, b),
    "pow_scalar_tensor": lambda a, b: torch._foreach_pow(2.0, a),
    "norm": lambda a, b: torch._foreach_norm(a),
    "norm_inf": lambda a, b: torch._foreach_norm(a, float("inf")),
    "norm_1": lambda a, b: torch._foreach_norm(a, 1),
    "norm_3": lambda a, b: torch._foreach_norm(a, 3),
    "max": lambda a, b: torch._foreach_max(a),
}


@pytest.mark.parametrize("name", list(FOREACH))
def test_foreach_matches_cpu(name):
    fn = FOREACH[name]
    a, b = _lists(), _lists(offset=0.25)
    expected = fn(a, b)
    actual = fn([t.to(TPU) for t in a], [t.to(TPU) for t in b])
    assert_close(actual, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.bool, torch.int32, torch.float16])
def test_foreach_max_of_every_dtype(dtype):
    """The reduction's start value comes from the dtype (a bool has no iinfo: it raised)."""
    xs = [torch.tensor([1, 0, 1]).to(dtype), torch.tensor([0, 0]).to(dtype), torch.tensor([[5]]).to(dtype)]
    got = torch._foreach_max([x.to(TPU) for x in xs])
    for g, w in zip(got, torch._foreach_max(xs)):
        assert g.dtype == w.dtype and torch.equal(g.cpu(), w)


def test_foreach_inplace_is_one_program():
    a, b = _lists(), _lists(offset=0.25)
    ta, tb = [t.to(TPU) for t in a], [t.to(TPU) for t in b]
    torch._foreach_addcmul_(ta, ta, tb, value=0.5)
    before = torchtpu.metrics.snapshot()["executions"]
    torch._foreach_mul_(ta, 0.9)
    assert torchtpu.metrics.snapshot()["executions"] == before + 1
    torch._foreach_addcmul_(a, a, b, value=0.5)
    torch._foreach_mul_(a, 0.9)
    assert_close(ta, a)


def test_foreach_zero_and_copy():
    a, b = _lists(), _lists(offset=0.25)
    ta, tb = [t.to(TPU) for t in a], [t.to(TPU) for t in b]
    torch._foreach_copy_(ta, tb)
    assert_close(ta, b)
    torch._foreach_zero_(ta)
    assert_close(ta, [torch.zeros_like(t) for t in a])
