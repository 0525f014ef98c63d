"""CPU tensors in compiled graphs, as the CUDA backend treats them: a CPU tensor the
compiled code moves to the device (a module-level table, a mask built on the host), an
output the code moves to the host (``x.cpu()``) or computes on a CPU input, and tensor
constants of any dtype and size folded into the program. Found by running the model
zoo compiled (GPT-2's forward folded a bool constant)."""

from __future__ import annotations

import torch

import torchtpu  # noqa: F401

TPU = "tpu"
TABLE = torch.tensor([0.5, -1.0, 2.0])  # a global read by the compiled functions
COUNTER = torch.zeros(3)


def _compiled(fn):
    torch._dynamo.reset()
    return torch.compile(fn, backend="tpu")


def _assert_same(actual, expected) -> None:
    actual = actual if isinstance(actual, tuple) else (actual,)
    expected = expected if isinstance(expected, tuple) else (expected,)
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert a.device == e.device, (a.device, e.device)
        assert a.dtype == e.dtype and a.shape == e.shape
        torch.testing.assert_close(a.cpu(), e.cpu())


def test_a_cpu_tensor_moved_inside_the_compiled_code_is_read() -> None:
    def f(x):
        return x * TABLE.to(x.device) + TABLE[1:].to(x.device).sum()

    x = torch.randn(4, 3)
    _assert_same(_compiled(f)(x.to(TPU)), f(x.to(TPU)))
    torch.testing.assert_close(_compiled(f)(x.to(TPU)).cpu(), f(x))


def test_outputs_on_the_cpu_come_back_on_the_cpu() -> None:
    def f(x):
        y = x * 2
        return y, y.sum().cpu(), TABLE * 3, TABLE  # TABLE: the caller's own tensor, returned as it is

    x = torch.randn(4, 3)
    out = _compiled(f)(x.to(TPU))
    _assert_same(out, f(x.to(TPU)))
    assert out[3] is TABLE


def test_a_cpu_tensor_written_by_the_compiled_code_is_updated() -> None:
    def f(x):
        COUNTER.add_(1)
        return x + COUNTER.to(x.device)

    COUNTER.zero_()
    g = _compiled(f)
    x = torch.randn(3)
    g(x.to(TPU))
    out = g(x.to(TPU))
    torch.testing.assert_close(COUNTER, torch.full((3,), 2.0))
    torch.testing.assert_close(out.cpu(), x + 2)


def test_bool_and_empty_tensor_constants_fold_into_the_program() -> None:
    def f(x):
        mask = torch.tensor([[True, False, True], [False, True, True]], device=x.device)
        empty = torch.tensor([], device=x.device).reshape(0, 3)
        return torch.where(mask, x, -x), torch.cat([x, empty])

    x = torch.randn(2, 3)
    _assert_same(_compiled(f)(x.to(TPU)), f(x.to(TPU)))
    torch.testing.assert_close(_compiled(f)(x.to(TPU))[0].cpu(), f(x)[0])


def test_bfloat16_tensor_constants_fold_into_the_program() -> None:
    """numpy has no bfloat16 of its own (GPT-2 under autocast folded one: "Got unsupported
    ScalarType BFloat16")."""

    def f(x):
        scale = torch.tensor([[0.5, -2.0, 3.25]], dtype=torch.bfloat16, device=x.device)
        return x * scale

    x = torch.randn(2, 3, dtype=torch.bfloat16)
    out = _compiled(f)(x.to(TPU))
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.cpu(), f(x), rtol=0, atol=0)
