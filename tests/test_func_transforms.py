"""torch.func on tpu against the CPU: per-sample gradients (vmap of grad over
functional_call), model ensembles (stack_module_state), forward-mode AD (jvp, jacfwd) and
reverse (jacrev, hessian). jacfwd called tanh_backward with a batched gradient and an
unbatched output (XLA refused the unbroadcast multiply), and every jvp failed on
is_same_size (a bool-returning op the device had claimed)."""

from __future__ import annotations

import copy

import torch
import torch.nn as nn
from torch.func import functional_call, grad, hessian, jacfwd, jacrev, jvp, stack_module_state, vmap
from utils import TPU


def _close(a, b, **tol) -> None:
    torch.testing.assert_close(a.cpu() if isinstance(a, torch.Tensor) else a, b, **tol)


def test_per_sample_gradients_of_a_cnn() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(36, 5), nn.LogSoftmax(-1))
    x, y = torch.randn(6, 1, 8, 8), torch.randint(0, 5, (6,))

    def per_sample(device: str) -> dict[str, torch.Tensor]:
        m = copy.deepcopy(model).to(device)
        params = {k: v.detach() for k, v in m.named_parameters()}

        def loss(p, xi, yi):
            return nn.functional.nll_loss(functional_call(m, p, (xi.unsqueeze(0),)), yi.unsqueeze(0))

        return vmap(grad(loss), in_dims=(None, 0, 0))(params, x.to(device), y.to(device))

    got, want = per_sample(TPU), per_sample("cpu")
    for k in want:
        _close(got[k], want[k])


def test_an_ensemble_in_one_vmap() -> None:
    torch.manual_seed(0)
    models = [nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 3)) for _ in range(4)]
    x = torch.randn(5, 8)

    def ensemble(device: str) -> torch.Tensor:
        params, buffers = stack_module_state([copy.deepcopy(m).to(device) for m in models])
        base = copy.deepcopy(models[0]).to("meta")
        return vmap(lambda p, b, xx: functional_call(base, (p, b), (xx,)), in_dims=(0, 0, None))(params, buffers, x.to(device))

    _close(ensemble(TPU), ensemble("cpu"))


def _f(z: torch.Tensor) -> torch.Tensor:
    w = torch.linspace(-1, 1, 12, device=z.device).view(4, 3)
    return (torch.tanh(z @ w).sin() + torch.sigmoid(z[:3])) * nn.functional.mse_loss(z, z.flip(0), reduction="none")[:3]


def test_forward_and_reverse_mode_derivatives() -> None:
    z, t = torch.randn(4), torch.randn(4)
    _close(jacfwd(_f)(z.to(TPU)), jacfwd(_f)(z))
    _close(jacrev(_f)(z.to(TPU)), jacrev(_f)(z))
    _close(jvp(_f, (z.to(TPU),), (t.to(TPU),))[1], jvp(_f, (z,), (t,))[1])
    _close(hessian(lambda v: _f(v).sum())(z.to(TPU)), hessian(lambda v: _f(v).sum())(z))


def test_pointwise_backwards_broadcast_like_the_cpu() -> None:
    """The CPU kernels broadcast their operands (TensorIterator); vmapped backwards rely on it."""
    aten = torch.ops.aten
    torch.manual_seed(0)
    g, y, x, t = torch.rand(4, 3), torch.rand(3), torch.rand(3), torch.rand(3)
    calls = [
        (aten.tanh_backward.default, (g, y)),
        (aten.sigmoid_backward.default, (g, y)),
        (aten.mse_loss_backward.default, (g, x, t, 0)),
        (aten.mse_loss_backward.default, (g, x, t, 1)),
        (aten.huber_loss_backward.default, (g, x, t, 0, 0.3)),
        # a mean divides by the input's numel, even where the target broadcasts it
        (aten.mse_loss_backward.default, (torch.rand(4, 1), torch.rand(1, 3), torch.rand(4, 3), 1)),
        (aten.smooth_l1_loss_backward.default, (torch.rand(4, 1), torch.rand(1, 3), torch.rand(4, 3), 1, 0.3)),
        (aten.smooth_l1_loss_backward.default, (g, x, t, 1, 0.3)),
        (aten.tanh_backward.default, (g.double(), y)),  # and promote them
        (aten.sigmoid_backward.default, (g.bfloat16(), y)),
        (aten.native_dropout_backward.default, (g, torch.rand(3) > 0.5, 2.0)),
        (aten.native_dropout_backward.default, (g, torch.rand(4, 3), 2.0)),  # a float mask multiplies
    ]
    for op, args in calls:
        _close(op(*[a.to(TPU) if isinstance(a, torch.Tensor) else a for a in args]), op(*args))
    assert torch.ones(2, device=TPU).is_same_size(torch.ones(2, device=TPU))
    assert not torch.ones(2, device=TPU).is_same_size(torch.ones(3, device=TPU))
