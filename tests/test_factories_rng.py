"""Factories on device="tpu" and the device RNG.

Random values are reproducible under torch.manual_seed but come from the device's
Philox stream, not PyTorch's CPU generator: only their distribution is compared.
"""

from __future__ import annotations

import pytest
import torch
from utils import TPU, assert_close

import torchtpu

# -- factories ---------------------------------------------------------------------------------
FACTORIES = {
    "zeros": lambda d: torch.zeros(2, 3, device=d),
    "zeros_int": lambda d: torch.zeros(4, dtype=torch.int32, device=d),
    "ones": lambda d: torch.ones(2, 3, device=d),
    "ones_bf16": lambda d: torch.ones(3, dtype=torch.bfloat16, device=d),
    "full_float": lambda d: torch.full((2, 2), 2.5, device=d),
    "full_int": lambda d: torch.full((3,), 7, device=d),
    "full_bool": lambda d: torch.full((3,), True, device=d),
    "full_f64": lambda d: torch.full((3,), 0.1, dtype=torch.float64, device=d),
    "arange_end": lambda d: torch.arange(5, device=d),
    "arange_start": lambda d: torch.arange(2, 9, device=d),
    "arange_step_float": lambda d: torch.arange(1, 5, 0.5, device=d),
    "arange_neg_step": lambda d: torch.arange(5, 0, -1.5, device=d),
    "arange_dtype": lambda d: torch.arange(0, 10, 3, dtype=torch.float32, device=d),
    "arange_f64": lambda d: torch.arange(0, 1, 0.1, dtype=torch.float64, device=d),
    "linspace": lambda d: torch.linspace(-1, 1, 7, device=d),
    "linspace_one": lambda d: torch.linspace(3, 5, 1, device=d),
    "linspace_int": lambda d: torch.linspace(0, 10, 4, dtype=torch.int64, device=d),
    "linspace_f64": lambda d: torch.linspace(0, 1, 11, dtype=torch.float64, device=d),
    "logspace": lambda d: torch.logspace(0, 2, 5, device=d),
    "logspace_base2": lambda d: torch.logspace(-2, 3, 6, base=2, device=d),
    "eye": lambda d: torch.eye(3, device=d),
    "eye_rect": lambda d: torch.eye(2, 4, dtype=torch.int64, device=d),
    "scalar_tensor": lambda d: torch.scalar_tensor(3.5, device=d),
    "tensor": lambda d: torch.tensor([[1.0, 2.0], [3.0, 4.0]], device=d),
    "tensor_int": lambda d: torch.tensor([1, 2, 3], device=d),
    "zeros_like": lambda d: torch.zeros_like(torch.ones(2, 3, device=d)),
    "ones_like": lambda d: torch.ones_like(torch.ones(2, 3, device=d), dtype=torch.int32),
    "full_like": lambda d: torch.full_like(torch.ones(2, 3, device=d), 4.5),
    "new_zeros": lambda d: torch.ones(2, device=d).new_zeros((3, 2)),
    "new_ones": lambda d: torch.ones(2, device=d).new_ones((3,)),
    "new_full": lambda d: torch.ones(2, device=d).new_full((3,), -2.5),
}


@pytest.mark.parametrize("name", list(FACTORIES))
def test_factory_matches_cpu(name):
    fn = FACTORIES[name]
    out = fn(TPU)
    assert out.device.type == "tpu"
    assert_close(out, fn("cpu"))


def test_full_value_is_an_operand():
    torch.full((4,), 2.5, device=TPU).cpu()
    before = torchtpu.metrics.snapshot()["compiles"]
    out = torch.full((4,), 3.25, device=TPU)
    assert torchtpu.metrics.snapshot()["compiles"] == before
    assert_close(out, torch.full((4,), 3.25))


def test_arange_out():
    out = torch.empty(0, device=TPU)
    torch.arange(0, 5, out=out)
    assert_close(out, torch.arange(0, 5, dtype=torch.float32))


# -- RNG: reproducibility ---------------------------------------------------------------------
@pytest.mark.parametrize("fn", [torch.tril_indices, torch.triu_indices])
@pytest.mark.parametrize("args", [(3, 3), (4, 3, 1), (3, 5, -1), (0, 3), (5, 2, -10), (3, 3, 7)])
def test_tril_triu_indices_match_cpu(fn, args):
    for dtype in (torch.int64, torch.int32):
        got = fn(*args, dtype=dtype, device=TPU)
        want = fn(*args, dtype=dtype)
        assert got.device.type == "tpu" and got.dtype == want.dtype
        assert torch.equal(got.cpu(), want)


def test_copysign_16bit_scalar():
    for dtype in (torch.float16, torch.bfloat16):
        x = torch.randn(8).to(dtype)
        assert torch.equal(torch.copysign(x.to(TPU), -1.0).cpu(), torch.copysign(x, -1.0))


def test_manual_seed_reproducible():
    torch.manual_seed(123)
    a1, b1 = torch.rand(64, device=TPU).cpu(), torch.randn(64, device=TPU).cpu()
    torch.manual_seed(123)
    a2, b2 = torch.rand(64, device=TPU).cpu(), torch.randn(64, device=TPU).cpu()
    assert torch.equal(a1, a2) and torch.equal(b1, b2)
    torch.manual_seed(124)
    assert not torch.equal(torch.rand(64, device=TPU).cpu(), a1)


def test_successive_calls_differ():
    a = torch.rand(256, device=TPU).cpu()
    b = torch.rand(256, device=TPU).cpu()
    assert not torch.equal(a, b)
    # streams of consecutive calls must not overlap (shifted copies of each other)
    assert len(set(a.tolist()) & set(b.tolist())) < 5


def test_rng_state_roundtrip():
    state = torch.tpu.get_rng_state()
    a = torch.randn(16, device=TPU).cpu()
    torch.tpu.set_rng_state(state)
    assert torch.equal(torch.randn(16, device=TPU).cpu(), a)


def test_random_program_is_cached():
    torch.rand(32, device=TPU).cpu()
    before = torchtpu.metrics.snapshot()["compiles"]
    for _ in range(3):
        torch.rand(32, device=TPU)
    assert torchtpu.metrics.snapshot()["compiles"] == before


# -- RNG: distributions -----------------------------------------------------------------------
N = 20000


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_rand_distribution(dtype):
    x = torch.rand(N, dtype=dtype, device=TPU)
    assert x.dtype == dtype
    x = x.cpu().double()
    assert x.min() >= 0 and x.max() < 1
    assert abs(x.mean() - 0.5) < 0.02 and abs(x.std() - (1 / 12) ** 0.5) < 0.02


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_randn_distribution(dtype):
    x = torch.randn(N, dtype=dtype, device=TPU)
    assert x.dtype == dtype
    x = x.cpu().double()
    assert abs(x.mean()) < 0.05 and abs(x.std() - 1) < 0.05
    assert torch.isfinite(x).all()


def test_uniform_and_normal_inplace():
    x = torch.empty(N, device=TPU).uniform_(-3, 5).cpu()
    assert x.min() >= -3 and x.max() < 5 and abs(x.mean() - 1) < 0.1
    y = torch.empty(N, device=TPU).normal_(2, 0.5).cpu()
    assert abs(y.mean() - 2) < 0.03 and abs(y.std() - 0.5) < 0.03


def test_normal_overloads():
    mean = torch.arange(4, dtype=torch.float32).repeat(N // 4)
    x = torch.normal(mean.to(TPU), 0.1).cpu()
    assert (x - mean).abs().max() < 1
    assert abs((x - mean).std() - 0.1) < 0.01
    y = torch.normal(torch.zeros(N, device=TPU), torch.full((N,), 2.0, device=TPU)).cpu()
    assert abs(y.std() - 2) < 0.1
    z = torch.normal(1.0, 3.0, (N,), device=TPU).cpu()
    assert abs(z.mean() - 1) < 0.1 and abs(z.std() - 3) < 0.1


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8, torch.float32])
def test_randint_range(dtype):
    x = torch.randint(-5 if dtype is not torch.uint8 else 0, 7, (N,), dtype=dtype, device=TPU)
    assert x.dtype == dtype
    x = x.cpu().long()
    lo = -5 if dtype is not torch.uint8 else 0
    assert x.min() == lo and x.max() == 6
    assert set(x.unique().tolist()) == set(range(lo, 7))


def test_randint_high_only_and_like():
    x = torch.randint(3, (1000,), device=TPU).cpu()
    assert x.dtype == torch.int64 and set(x.unique().tolist()) == {0, 1, 2}
    y = torch.randint_like(torch.empty(1000, device=TPU), 10, 13).cpu()
    assert y.dtype == torch.float32 and set(y.unique().tolist()) == {10.0, 11.0, 12.0}


def test_random_inplace():
    x = torch.empty(N, dtype=torch.int32, device=TPU).random_(7).cpu()
    assert x.min() == 0 and x.max() == 6
    y = torch.empty(N, dtype=torch.int64, device=TPU).random_(-3, 3).cpu()
    assert y.min() == -3 and y.max() == 2
    z = torch.empty(N, device=TPU).random_().cpu()
    assert z.min() >= 0 and z.max() <= 2**24 and z.mean() > 2**22
    b = torch.empty(1000, dtype=torch.bool, device=TPU).random_().cpu()
    assert 300 < b.sum() < 700


@pytest.mark.parametrize("n", [1, 7, 100])
def test_randperm_is_permutation(n):
    p = torch.randperm(n, device=TPU)
    assert p.dtype == torch.int64
    assert sorted(p.cpu().tolist()) == list(range(n))
    if n == 100:
        assert p.cpu().tolist() != list(range(n))
        assert sorted(torch.randperm(n, dtype=torch.int32, device=TPU).cpu().tolist()) == list(range(n))


def test_bernoulli():
    x = torch.empty(N, device=TPU).bernoulli_(0.3).cpu()
    assert set(x.unique().tolist()) <= {0.0, 1.0} and abs(x.mean() - 0.3) < 0.02
    probs = torch.tensor([0.0, 1.0, 0.5, 0.9]).repeat(N // 4)
    y = torch.bernoulli(probs.to(TPU)).cpu()
    assert y.dtype == torch.float32
    assert (y[probs == 0] == 0).all() and (y[probs == 1] == 1).all()
    assert abs(y[probs == 0.5].mean() - 0.5) < 0.04 and abs(y[probs == 0.9].mean() - 0.9) < 0.03
    z = torch.bernoulli(torch.ones(N, device=TPU), 0.7).cpu()
    assert abs(z.mean() - 0.7) < 0.02


def test_bernoulli_inplace_tensor_p():
    p = torch.full((N,), 0.25, device=TPU)
    x = torch.empty(N, device=TPU).bernoulli_(p).cpu()
    assert abs(x.mean() - 0.25) < 0.02


def test_exponential_and_friends():
    x = torch.empty(N, device=TPU).exponential_(2.0).cpu()
    assert x.min() >= 0 and abs(x.mean() - 0.5) < 0.03
    g = torch.empty(N, device=TPU).geometric_(0.25).cpu()
    assert g.min() >= 1 and abs(g.mean() - 4) < 0.2
    ln = torch.empty(N, device=TPU).log_normal_(0.0, 0.5).cpu()
    assert abs(ln.log().mean()) < 0.03 and abs(ln.log().std() - 0.5) < 0.03
    c = torch.empty(N, device=TPU).cauchy_(1.0, 2.0).cpu()
    assert abs(c.median() - 1) < 0.15


def test_dropout_scaling_and_backward():
    p = 0.25
    x = torch.ones(N, device=TPU, requires_grad=True)
    y = torch.nn.functional.dropout(x, p, training=True)
    y.backward(torch.full((N,), 2.0, device=TPU))
    yc, gc = y.detach().cpu(), x.grad.cpu()
    kept = yc != 0
    assert abs(kept.float().mean() - (1 - p)) < 0.02
    torch.testing.assert_close(yc[kept], torch.full_like(yc[kept], 1 / (1 - p)))
    torch.testing.assert_close(gc, kept.float() * 2 / (1 - p))
    # eval mode and p=0 are the identity
    assert torch.equal(torch.nn.functional.dropout(x, p, training=False).detach().cpu(), torch.ones(N))


def test_native_dropout_mask_dtype():
    x = torch.randn(64, dtype=torch.bfloat16, device=TPU)
    out, mask = torch.ops.aten.native_dropout(x, 0.5, True)
    assert out.dtype == torch.bfloat16 and mask.dtype == torch.bool
    oc, mc, xc = out.cpu().float(), mask.cpu(), x.cpu().float()
    torch.testing.assert_close(oc, torch.where(mc, xc * 2, torch.zeros_like(xc)))


def test_multinomial():
    w = torch.tensor([[0.0, 1.0, 3.0], [1.0, 0.0, 0.0]])
    s = torch.multinomial(w.to(TPU), 4000, replacement=True).cpu()
    assert s.dtype == torch.int64 and s.shape == (2, 4000)
    assert (s[0] != 0).all() and (s[1] == 0).all()
    assert abs((s[0] == 2).float().mean() - 0.75) < 0.03
    s2 = torch.multinomial(torch.tensor([1.0, 2.0, 3.0, 4.0, 0.0], device=TPU), 4).cpu()
    assert sorted(s2.tolist()) == [0, 1, 2, 3]


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8])
def test_integer_linspace_logspace_truncate_like_the_cpu(dtype):
    # the CPU converts start/end to the integer dtype first, and divides exactly
    for fn, args in ((torch.linspace, (50, 1, 50)), (torch.linspace, (4.3, 40.9, 13)), (torch.logspace, (4.3, 2, 4, 3.0))):
        got = fn(*args, dtype=dtype, device=TPU)
        assert torch.equal(got.cpu(), fn(*args, dtype=dtype)), (fn, args)


# every random op that takes generator=, on tpu (the CPU's own ops take a CPU generator)
GENERATOR_CALLS = {
    "randn": lambda g: torch.randn(3, device=TPU, generator=g),
    "rand": lambda g: torch.rand(3, device=TPU, generator=g),
    "randint": lambda g: torch.randint(0, 5, (3,), device=TPU, generator=g),
    "randperm": lambda g: torch.randperm(5, device=TPU, generator=g),
    "uniform_": lambda g: torch.zeros(4, device=TPU).uniform_(generator=g),
    "normal_": lambda g: torch.zeros(4, device=TPU).normal_(generator=g),
    "normal": lambda g: torch.normal(torch.zeros(3, device=TPU), 1.0, generator=g),
    "bernoulli": lambda g: torch.bernoulli(torch.full((3,), 0.5, device=TPU), generator=g),
    "multinomial": lambda g: torch.multinomial(torch.ones(4, device=TPU), 2, generator=g),
    "init.trunc_normal_": lambda g: torch.nn.init.trunc_normal_(torch.zeros(3, device=TPU), generator=g),
}


@pytest.mark.parametrize("mode", ["eager", "defer_and_fuse"])
@pytest.mark.parametrize("name", GENERATOR_CALLS)
def test_a_generator_of_another_device_raises_like_cuda(name, mode):
    """CUDA refuses a CPU generator for a cuda op ("Expected a 'cuda' device type for
    generator but found 'cpu'"); tpu drew from its own state and ignored it, so two draws
    from one seeded generator differed with no error."""
    g = torch.Generator().manual_seed(0)
    with torchtpu.eager_mode(mode), pytest.raises(RuntimeError, match="Expected a 'tpu' device type for generator but found 'cpu'"):
        GENERATOR_CALLS[name](g)
    GENERATOR_CALLS[name](None)  # generator=None draws from the device state


PINNED_FACTORIES = {
    "empty": lambda: torch.empty(2, device=TPU, pin_memory=True),
    "empty_strided": lambda: torch.empty_strided((2,), (1,), device=TPU, pin_memory=True),
    "zeros": lambda: torch.zeros(2, device=TPU, pin_memory=True),
    "full": lambda: torch.full((2,), 1.0, device=TPU, pin_memory=True),
    "arange": lambda: torch.arange(3, device=TPU, pin_memory=True),
    "randn": lambda: torch.randn(3, device=TPU, pin_memory=True),
    "ones_like": lambda: torch.ones_like(torch.ones(2, device=TPU), pin_memory=True),
    "linspace": lambda: torch.linspace(0, 1, 3, device=TPU, pin_memory=True),
}


@pytest.mark.parametrize("mode", ["eager", "defer_and_fuse"])
@pytest.mark.parametrize("name", PINNED_FACTORIES)
def test_pinning_device_memory_raises_like_cuda(name, mode):
    """CUDA's factories refuse pin_memory=True for device tensors; tpu ignored it."""
    with torchtpu.eager_mode(mode), pytest.raises(RuntimeError, match="Only dense CPU tensors can be pinned"):
        PINNED_FACTORIES[name]()


@pytest.mark.parametrize("mode", ["eager", "defer_and_fuse"])
def test_rrelu_like_the_cpu(mode):
    """nn.RReLU raised NotImplementedError (rrelu_with_noise), even in eval: eval is the
    mean slope, exactly the CPU's; training draws each negative element's slope from
    U(lower, upper) and the gradient is that slope."""
    x = torch.randn(4000)
    with torchtpu.eager_mode(mode):
        evaluated = torch.nn.functional.rrelu(x.to(TPU), 0.1, 0.3, training=False).cpu()
        xt = x.to(TPU).requires_grad_()
        trained = torch.nn.functional.rrelu(xt, 0.1, 0.3, training=True)
        trained.sum().backward()
    assert torch.equal(evaluated, torch.nn.functional.rrelu(x, 0.1, 0.3, training=False))
    slopes = (trained.detach().cpu() / x)[x < 0]
    assert slopes.min() >= 0.1 and slopes.max() <= 0.3 and abs(slopes.mean() - 0.2) < 0.005
    assert torch.equal(trained.detach().cpu()[x >= 0], x[x >= 0])
    torch.testing.assert_close(xt.grad.cpu()[x < 0], slopes)
    assert (xt.grad.cpu()[x >= 0] == 1).all()


def test_torch_range_includes_the_end_as_on_the_cpu():
    """``torch.range`` (deprecated, still in older code) had no tpu kernel."""
    for args, kwargs in [((0, 4, 0.5), {}), ((1, 5), {}), ((0, 1, 0.1), {}), ((5, 1, -1), {}), ((0, 3), {"dtype": torch.int64})]:
        with pytest.warns(UserWarning, match="deprecated"):
            got = torch.range(*args, device=TPU, **kwargs)
        want = torch.range(*args, **kwargs)
        assert got.device.type == "tpu" and got.dtype == want.dtype and torch.equal(got.cpu(), want)
    with pytest.raises(RuntimeError, match="step must be nonzero"):
        torch.range(0, 4, 0, device=TPU)
