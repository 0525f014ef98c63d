"""Samplers that loop until they accept (torchtpu/lowering/rules/rng_samplers.py): Gamma,
Dirichlet, Poisson, Binomial, and the reparameterized Gamma and Dirichlet gradients, which
``torch.distributions`` (Gamma, Beta, Dirichlet, Chi2, StudentT, Poisson, Binomial) needs. The device draws from its own
Philox stream, so samples are compared with the CPU's as distributions (two-sample
Kolmogorov-Smirnov on fixed seeds), and edge values, errors and gradients exactly."""

from __future__ import annotations

import contextlib

import pytest
import torch
from utils import TPU

import torchtpu

N = 20000
# the two-sample KS statistic's critical value at p = 1e-6 for N and N samples
KS_CRITICAL = (-0.5 * torch.log(torch.tensor(0.5e-6)).item()) ** 0.5 * (2 / N) ** 0.5


def ks_statistic(a: torch.Tensor, b: torch.Tensor) -> float:
    """sup |F_a - F_b| over the pooled sample (ties counted on both sides)."""
    a, b = a.double().sort().values, b.double().sort().values
    grid = torch.cat([a, b]).unique()
    fa = torch.searchsorted(a, grid, right=True).double() / len(a)
    fb = torch.searchsorted(b, grid, right=True).double() / len(b)
    return (fa - fb).abs().max().item()


def _mode(mode: str) -> contextlib.AbstractContextManager:
    return torchtpu.eager_mode("defer_and_fuse") if mode == "defer_and_fuse" else contextlib.nullcontext()


SAMPLERS = {
    **{f"gamma-{a}": (torch._standard_gamma, torch.full((N,), a)) for a in (0.1, 0.5, 1.0, 2.5, 30.0)},
    **{f"poisson-{r}": (torch.poisson, torch.full((N,), r)) for r in (0.3, 4.0, 9.9, 10.0, 55.0, 1000.0)},
    "dirichlet": (lambda a: torch._sample_dirichlet(a)[:, 0], torch.tensor([0.3, 1.0, 4.0]).expand(N, 3).contiguous()),
    "beta": (lambda a: torch.distributions.Beta(a, a * 2).sample(), torch.full((N,), 0.7)),
    "student-t": (lambda a: torch.distributions.StudentT(a).sample(), torch.full((N,), 3.0)),
    "chi2": (lambda a: torch.distributions.Chi2(a).sample(), torch.full((N,), 5.0)),
    # inversion (count * p < 10) and BTRS, with prob above 1/2 too (count - a sample of 1 - prob)
    **{
        f"binomial-{n}-{p}": (lambda c, p=p: torch.binomial(c, torch.full_like(c, p)), torch.full((N,), float(n)))
        for n, p in ((5, 0.3), (30, 0.9), (100, 0.2), (1000, 0.5), (1e6, 0.3), (50, 0.95))
    },
    "distributions.Binomial": (lambda c: torch.distributions.Binomial(c, probs=torch.full_like(c, 0.4)).sample(), torch.full((N,), 12.0)),
}


@pytest.mark.parametrize("mode", ["eager", "defer_and_fuse"])
@pytest.mark.parametrize("name", SAMPLERS)
def test_samples_follow_the_cpus_distribution(name: str, mode: str) -> None:
    fn, arg = SAMPLERS[name]
    torch.manual_seed(0)
    want = fn(arg)
    with _mode(mode):
        got = fn(arg.to(TPU)).cpu()
    assert got.dtype == want.dtype and got.shape == want.shape
    assert ks_statistic(got, want) < KS_CRITICAL, name


def test_a_compiled_sampler_follows_the_cpus_distribution() -> None:
    f = torch.compile(lambda a: torch.distributions.Gamma(a, 2.0).rsample() + torch.poisson(a), backend="tpu")
    a = torch.full((N,), 3.0)
    torch.manual_seed(0)
    want = torch.distributions.Gamma(a, 2.0).rsample() + torch.poisson(a)
    assert ks_statistic(f(a.to(TPU)).cpu(), want) < KS_CRITICAL


def test_edge_values_are_the_cpus() -> None:
    """The CPU's clamp to the smallest normal number (zero, tiny and NaN concentrations),
    infinity, a zero rate, and Dirichlet rows of zeros."""
    alpha = torch.tensor([0.0, 1e-30, float("inf"), float("nan")])
    torch.testing.assert_close(torch._standard_gamma(alpha.to(TPU)).cpu(), torch._standard_gamma(alpha), equal_nan=True)
    torch.testing.assert_close(torch.poisson(torch.zeros(5, device=TPU)).cpu(), torch.zeros(5))
    rows = torch.tensor([[0.0, 0.0, 0.0], [1e-30, 1e-30, 1e-30], [0.0, 0.0, 1.0], [float("nan"), 0.0, 2.0]])
    torch.testing.assert_close(torch._sample_dirichlet(rows.to(TPU)).cpu()[:3], torch._sample_dirichlet(rows)[:3])
    mixed = torch._sample_dirichlet(rows.to(TPU)).cpu()[3]
    assert mixed[:2].tolist() == [torch.finfo(torch.float32).tiny] * 2 and mixed[2].item() == pytest.approx(1.0)


def test_binomial_edge_values_and_errors_are_the_cpus() -> None:
    """count <= 0 or prob <= 0: 0; prob >= 1: count; a NaN prob: NaN (with count > 0)."""
    count = torch.tensor([0.0, -1, 5, 5, 5, 5, 7, 7, 0, 4])
    prob = torch.tensor([0.5, 0.5, 0.0, 1.0, float("nan"), 1.5, -0.2, 1.0, float("nan"), float("inf")])
    torch.testing.assert_close(torch.binomial(count.to(TPU), prob.to(TPU)).cpu(), torch.binomial(count, prob), equal_nan=True)
    with pytest.raises(ValueError, match="binomial only supports floating-point dtypes for count, got: Long"):
        torch.binomial(torch.full((3,), 5, device=TPU), torch.full((3,), 0.5, device=TPU))


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16])
def test_other_float_dtypes(dtype: torch.dtype) -> None:
    for fn in (torch._standard_gamma, torch.poisson, lambda c: torch.binomial(c * 4, torch.full_like(c, 0.25))):
        x = fn(torch.full((2000,), 3.0, dtype=dtype, device=TPU)).cpu()
        assert x.dtype == dtype and (x >= 0).all() and abs(x.double().mean().item() - 3.0) < 0.3


@pytest.mark.parametrize("rate", [-1.0, float("nan")])
def test_an_invalid_poisson_rate_raises_like_the_cpu(rate: float) -> None:
    with pytest.raises(RuntimeError, match="invalid Poisson rate, expected rate to be non-negative"):
        torch.poisson(torch.tensor([rate]))
    with pytest.raises(RuntimeError, match="invalid Poisson rate, expected rate to be non-negative"):
        torch.poisson(torch.tensor([1.0, rate], device=TPU)).cpu()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gamma_gradient_is_the_cpus(dtype: torch.dtype) -> None:
    """The reparameterized gradient in each of its three regimes (x < 0.8, alpha > 8 near
    and far from x, the rational fit between), and through autograd: rsample's gradient
    from the tpu's own sample is the CPU kernel's for that sample."""
    torch.manual_seed(0)
    alpha = torch.tensor([0.05, 0.3, 0.9, 1.5, 3.0, 7.0, 9.0, 20.0, 50.0, 200.0], dtype=dtype).repeat_interleave(40)
    x = torch._standard_gamma(alpha)
    torch.testing.assert_close(torch._standard_gamma_grad(alpha.to(TPU), x.to(TPU)).cpu(), torch._standard_gamma_grad(alpha, x))
    a = alpha.to(TPU).requires_grad_()
    sample = torch._standard_gamma(a)
    weight = torch.linspace(-1, 1, len(alpha), dtype=dtype)
    sample.backward(weight.to(TPU))
    want = torch._standard_gamma_grad(alpha, sample.detach().cpu()) * weight
    torch.testing.assert_close(a.grad.cpu(), want)


def test_a_gamma_policy_trains_like_on_the_cpu() -> None:
    """A network whose output parameterizes a Gamma: one step of a reparameterized loss.
    The tpu's gradients equal the CPU's computed from the tpu's samples."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2), torch.nn.Softplus())
    obs = torch.randn(64, 4)
    net_tpu = __import__("copy").deepcopy(net).to(TPU)
    conc, rate = net_tpu(obs.to(TPU)).unbind(-1)
    sample = torch.distributions.Gamma(conc, rate).rsample()
    ((sample - 1.0) ** 2).mean().backward()

    standard = (sample * rate).detach().cpu()  # the Gamma(conc, 1) draw rsample scaled

    class ReplayGamma(torch.autograd.Function):  # the CPU's rsample, with tpu's draw
        @staticmethod
        def forward(ctx, c: torch.Tensor) -> torch.Tensor:
            ctx.save_for_backward(c)
            return standard.clone()

        @staticmethod
        def backward(ctx, g: torch.Tensor) -> torch.Tensor:
            (c,) = ctx.saved_tensors
            return g * torch._standard_gamma_grad(c, standard)

    conc_c, rate_c = net(obs).unbind(-1)
    ((ReplayGamma.apply(conc_c) / rate_c - 1.0) ** 2).mean().backward()
    for p_tpu, p_cpu in zip(net_tpu.parameters(), net.parameters()):
        torch.testing.assert_close(p_tpu.grad.cpu(), p_cpu.grad, rtol=1e-4, atol=1e-6)


def _dirichlet_grad_points() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Beta samples over the four regimes: x near 0, x near 1, both parameters above 6, the rest."""
    torch.manual_seed(0)
    n = 2000
    alpha = torch.cat([torch.rand(n) * 0.5 + 0.01, torch.rand(n) * 5 + 0.5, torch.rand(n) * 40 + 6.5, torch.rand(n) * 3 + 0.2])
    beta = torch.cat([torch.rand(n) * 0.5 + 0.01, torch.rand(n) * 5 + 0.5, torch.rand(n) * 40 + 6.5, torch.rand(n) * 60 + 0.5])
    x = torch.distributions.Beta(alpha, beta).sample().clamp(1e-6, 1 - 1e-6)
    return x, alpha, alpha + beta


def test_dirichlet_gradient_is_the_cpus() -> None:
    """torch._dirichlet_grad (Beta and Dirichlet rsample's backward): float64 as the CPU's
    to 1e-10; float32 within 1e-6 of the CPU's float64 (the formulas run in float64 here:
    the CPU's own float32 Taylor series is up to 7e-5 off)."""
    x, alpha, total = _dirichlet_grad_points()
    ref = torch._dirichlet_grad(x.double(), alpha.double(), total.double())
    got64 = torch._dirichlet_grad(x.double().to(TPU), alpha.double().to(TPU), total.double().to(TPU)).cpu()
    torch.testing.assert_close(got64, ref, rtol=1e-10, atol=0)
    got32 = torch._dirichlet_grad(x.to(TPU), alpha.to(TPU), total.to(TPU)).cpu()
    assert got32.dtype == torch.float32
    torch.testing.assert_close(got32.double(), ref, rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize("mode", ["eager", "defer_and_fuse"])
def test_beta_rsample_gradient_is_the_derivative_of_the_mean(mode: str) -> None:
    """The pathwise gradient's mean over many Beta(a, b) samples is d E[x] / d a = b / (a + b)^2
    (and -a / (a + b)^2 for b): the whole rsample backward against a float64 formula."""
    a = torch.tensor([0.3, 1.5, 8.0, 20.0], dtype=torch.float64)
    b = torch.tensor([2.0, 0.4, 9.0, 3.0], dtype=torch.float64)
    ta = a.float().to(TPU).expand(N, 4).contiguous().requires_grad_()
    tb = b.float().to(TPU).expand(N, 4).contiguous().requires_grad_()
    with _mode(mode):
        torch.distributions.Beta(ta, tb).rsample().sum().backward()
    da, db = ta.grad.cpu().double(), tb.grad.cpu().double()
    for grad, want in ((da, b / (a + b) ** 2), (db, -a / (a + b) ** 2)):
        mean, sem = grad.mean(0), grad.std(0) / N**0.5
        assert ((mean - want).abs() < 6 * sem + 1e-6).all(), (mean, want, sem)
