"""What the C++ hooks (torchtpu/csrc/hooks.cpp) give: ``torch.Generator(device="tpu")``,
pinned host memory and storage resizing (``untyped_storage().resize_``), as on CUDA.

A tpu generator holds its own Philox state ``[seed, offset]``: seeded with s it draws what
``torch.tpu.manual_seed(s)`` draws, and drawing from it leaves the device's state alone.
Pinned memory is host memory that ``is_pinned()`` knows it allocated.
"""

from __future__ import annotations

import shutil

import pytest
import torch
from test_factories_rng import GENERATOR_CALLS
from utils import TPU

import torchtpu
from torchtpu import _registration

pytestmark = pytest.mark.skipif(not _registration.NATIVE_HOOKS, reason="torchtpu was installed without its C++ hooks")

# the ops that take generator= only through their in-place form (and PyTorch's refs refuse one)
DRAWS = {
    **GENERATOR_CALLS,
    "exponential_": lambda g: torch.empty(4, device=TPU).exponential_(generator=g),
    "geometric_": lambda g: torch.empty(4, device=TPU).geometric_(0.3, generator=g),
    "cauchy_": lambda g: torch.empty(4, device=TPU).cauchy_(generator=g),
    "log_normal_": lambda g: torch.empty(4, device=TPU).log_normal_(generator=g),
    "random_": lambda g: torch.empty(4, device=TPU).random_(0, 100, generator=g),
    "poisson": lambda g: torch.poisson(torch.full((4,), 3.0, device=TPU), generator=g),
    "_standard_gamma": lambda g: torch._standard_gamma(torch.full((4,), 0.7, device=TPU), generator=g),
    "binomial": lambda g: torch.binomial(torch.full((4,), 30.0, device=TPU), torch.full((4,), 0.6, device=TPU), generator=g),
}


def test_the_hooks_are_built_where_a_compiler_is() -> None:
    """setup.py builds them with the Makefile's install; a silent fallback to Python hooks
    would turn every test here into a skip."""
    if shutil.which("c++") is None:
        pytest.skip("no C++ compiler on this machine")
    assert _registration.NATIVE_HOOKS


@pytest.mark.parametrize("mode", ["eager", "defer_and_fuse"])
@pytest.mark.parametrize("name", DRAWS)
def test_a_tpu_generator_draws_its_own_reproducible_stream(name: str, mode: str) -> None:
    draw = DRAWS[name]
    with torchtpu.eager_mode(mode):
        torch.tpu.manual_seed(7)
        device_draw = draw(None).cpu()
        torch.tpu.manual_seed(123)  # the device's state does not matter to a generator
        state = torch.tpu.get_rng_state()
        g = torch.Generator(device=TPU).manual_seed(7)
        first = draw(g).cpu()
        assert torch.equal(torch.tpu.get_rng_state(), state), "drawing from a generator moved the device's state"
        saved = g.get_state()
        second = draw(g).cpu()
        g.set_state(saved)
        replay = draw(g).cpu()
    assert torch.equal(first, device_draw)  # seed s: what torch.tpu.manual_seed(s) gives
    assert not torch.equal(first, second)  # the generator moved on
    assert torch.equal(second, replay)


def test_generators_are_independent_and_clone() -> None:
    a, b = torch.Generator(TPU).manual_seed(0), torch.Generator(TPU).manual_seed(0)
    x = torch.randn(8, device=TPU, generator=a)
    torch.randn(8, device=TPU, generator=a)
    assert torch.equal(x.cpu(), torch.randn(8, device=TPU, generator=b).cpu())
    c = a.clone_state()
    assert torch.equal(torch.rand(5, device=TPU, generator=a).cpu(), torch.rand(5, device=TPU, generator=c).cpu())
    assert a.device == torch.device("tpu", 0) and a.initial_seed() == 0


def test_generator_errors_are_cudas() -> None:
    with pytest.raises(RuntimeError, match="Invalid device index 1"):
        torch.Generator(device="tpu:1")
    with pytest.raises(RuntimeError, match="Expected a 'cpu' device type for generator but found 'tpu'"):
        torch.rand(3, generator=torch.Generator(TPU))
    with pytest.raises(RuntimeError, match="RNG state must be a torch.ByteTensor of 16 bytes"):
        torch.Generator(TPU).set_state(torch.zeros(8, dtype=torch.uint8))


def test_a_compiled_function_given_a_generator_draws_its_stream() -> None:
    def noisy(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        return x + torch.rand(3, device=TPU, generator=g)

    compiled = torch.compile(noisy, backend="tpu")
    x = torch.zeros(3, device=TPU)
    g_eager, g_compiled = torch.Generator(TPU).manual_seed(5), torch.Generator(TPU).manual_seed(5)
    for _ in range(2):
        assert torch.equal(compiled(x, g_compiled).cpu(), noisy(x, g_eager).cpu())


def test_pinned_host_memory() -> None:
    x = torch.arange(6.0).reshape(2, 3).t()
    pinned = x.pin_memory()
    assert pinned.is_pinned() and not x.is_pinned()
    assert pinned.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    assert torch.equal(pinned, x)
    assert torch.empty(3, pin_memory=True).is_pinned()
    assert torch.zeros(2, 2, pin_memory=True).pin_memory().is_pinned()
    assert torch.equal(pinned.to(TPU, non_blocking=True).cpu(), x)


def test_a_data_loader_pins_its_batches() -> None:
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.arange(8.0)), batch_size=4, pin_memory=True)
    batches = list(loader)
    assert all(b.is_pinned() for (b,) in batches)
    assert [b.to(TPU, non_blocking=True).cpu().tolist() for (b,) in batches] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_activations_saved_on_pinned_host_memory_keep_the_gradients() -> None:
    """``save_on_cpu(pin_memory=True)``: the offload of activation checkpointing."""
    torch.manual_seed(0)
    layer = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).to(TPU)
    x = torch.randn(5, 8, device=TPU)
    layer(x).square().sum().backward()
    plain = [p.grad.cpu() for p in layer.parameters()]
    layer.zero_grad()
    with torch.autograd.graph.save_on_cpu(pin_memory=True):
        layer(x).square().sum().backward()
    for want, p in zip(plain, layer.parameters()):
        torch.testing.assert_close(p.grad.cpu(), want, rtol=0, atol=0)


def _view(storage: torch.UntypedStorage, n: int, device: str) -> torch.Tensor:
    return torch.tensor([], device=device).set_(storage, 0, (n,))


def test_a_storage_resizes_keeping_its_first_bytes_as_on_the_cpu() -> None:
    """FSDP's FullyShardedDataParallel frees an unsharded parameter with ``resize_(0)``
    and restores it with ``resize_(n)``, telling the two apart by the storage's size.
    Before, PyTorch raised "implement `resizePrivateUse1Bytes`". Grown, the new elements
    are zeros on tpu (uninitialized on the CPU: only the kept ones are compared)."""
    for n_bytes, kept in ((40, 6), (12, 3), (0, 0)):
        cpu, tpu = torch.arange(6.0), torch.arange(6.0, device=TPU)
        for t in (cpu, tpu):
            t.untyped_storage().resize_(n_bytes)
            assert t.untyped_storage().size() == n_bytes
        assert torch.equal(_view(tpu.untyped_storage(), kept, TPU).cpu(), _view(cpu.untyped_storage(), kept, "cpu"))
        if n_bytes == 40:
            assert torch.equal(_view(tpu.untyped_storage(), 10, TPU).cpu()[6:], torch.zeros(4))
    freed = torch.arange(4.0, device=TPU)
    storage = freed.untyped_storage()
    storage.resize_(0)
    storage.resize_(16)  # back to its size: the tensor reads its (zeroed) storage again
    freed.copy_(torch.full((4,), 7.0))
    assert torch.equal(freed.cpu(), torch.full((4,), 7.0)) and storage.data_ptr() != 0


def test_a_storage_resize_that_splits_an_element_is_refused() -> None:
    with pytest.raises(RuntimeError, match="multiple of 4 bytes"):
        torch.arange(6.0, device=TPU).untyped_storage().resize_(10)
