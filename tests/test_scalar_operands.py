"""Python numbers given where a schema says Scalar: their values are program operands, not
part of the program's key (``eager/oplower.lifted``), so a value computed on the host each
step does not compile a program per value. Bools are operands too; they must still
promote, compare and fill as bools, exactly as on the CPU, and raise where the CPU raises."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch.testing import assert_close
from utils import TPU

import torchtpu

B = torch.tensor([True, False, True])
I = torch.tensor([1, 2, 3])
F = torch.tensor([1.5, -2.0, 0.0])

BOOL_SCALAR_CALLS: dict[str, tuple[Callable[..., torch.Tensor], torch.Tensor]] = {
    "full_like": (lambda x, v: torch.full_like(x, v), I),
    "new_full": (lambda x, v: x.new_full((2,), v), F),
    "add_bool": (lambda x, v: x + v, B),
    "add_int": (lambda x, v: x + v, I),
    "mul_float": (lambda x, v: x * v, F),
    "eq_bool": (lambda x, v: x == v, B),
    "eq_int": (lambda x, v: x == v, I),
    "lt_float": (lambda x, v: x < v, F),
    "masked_fill": (lambda x, v: x.clone().masked_fill(x, v), B),
    "fill_bool": (lambda x, v: x.clone().fill_(v), B),
    "fill_float": (lambda x, v: x.clone().fill_(v), F),
    "or": (lambda x, v: x | v, B),
    "xor": (lambda x, v: x ^ v, B),
    "and_int": (lambda x, v: x & v, I),
    "clamp_min": (lambda x, v: x.clamp(min=v), F),
    "clamp_max_int": (lambda x, v: torch.clamp_max(x, v), I),
    "pow": (lambda x, v: x.pow(v), F),
    "where": (lambda x, v: torch.where(x, x.int(), v), B),
}


@pytest.mark.parametrize("value", [True, False])
@pytest.mark.parametrize("name", BOOL_SCALAR_CALLS)
def test_bool_scalar_operands_match_the_cpu(name: str, value: bool) -> None:
    fn, x = BOOL_SCALAR_CALLS[name]
    expected = fn(x, value)
    got = fn(x.to(TPU), value)
    assert got.dtype == expected.dtype
    assert torch.equal(got.cpu(), expected)


@pytest.mark.parametrize("value", [True, False])
@pytest.mark.parametrize("fn", [lambda x, v: x - v, lambda x, v: torch.rsub(x, v)], ids=["sub", "rsub"])
def test_subtracting_a_bool_scalar_raises_as_on_the_cpu(fn: Callable[..., torch.Tensor], value: bool) -> None:
    with pytest.raises(RuntimeError, match="Subtraction, the `-` operator, with a bool tensor is not supported"):
        fn(F, value)
    with pytest.raises(RuntimeError, match="Subtraction, the `-` operator, with a bool tensor is not supported"):
        fn(F.to(TPU), value)


def compiles() -> int:
    return torchtpu.metrics.snapshot()["compiles"]


@pytest.mark.parametrize("mode", ["eager", "defer_and_fuse"])
def test_a_host_flag_does_not_compile_a_program_per_value(mode: str) -> None:
    """generate()'s stopping criterion fills ``torch.full((batch,), cur_len >= max_length)``
    every step: its last step (True) must reuse the program of the others (False)."""

    def step(flag: bool) -> torch.Tensor:
        return torch.full((3,), flag, device=TPU, dtype=torch.bool) | B.to(TPU)

    with torchtpu.eager_mode(mode):
        expected_false = step(False).cpu()  # compiles (or not, from the disk cache)
        before = compiles()
        got_true = step(True).cpu()
        assert compiles() == before
    assert torch.equal(expected_false, B) and torch.equal(got_true, torch.ones(3, dtype=torch.bool))


def test_negative_zero_is_not_positive_zero_in_the_program_cache() -> None:
    """0.0 and -0.0 are equal as cache keys but not as values: x * -0.0 must not reuse
    x * 0.0's program (its constant is baked in: 0 is never a runtime operand)."""
    x = torch.tensor([1.0, -2.0, 3.0])
    t = x.to("tpu")
    for scalar in (0.0, -0.0, 0.0):
        expected = x * scalar
        got = (t * scalar).cpu()
        assert_close(got, expected)
        assert torch.equal(torch.signbit(got), torch.signbit(expected)), (scalar, got)
    got = torch.zeros(2, device="tpu").add(-0.0, alpha=-1.0).cpu()
    assert torch.equal(torch.signbit(got), torch.signbit(torch.zeros(2).add(-0.0, alpha=-1.0)))


SCALAR_LIST_CALLS: dict[str, tuple[Callable[..., list[torch.Tensor]], torch.dtype, list]] = {
    # int64 tensors: every number an int, each applied exactly (once computed in float32:
    # 9 ** 8 gave 43046720, 2 ** 40 + 1 + 3 was off by 4)
    "pow_ints": (torch._foreach_pow, torch.int64, [8, 10]),
    "add_ints": (torch._foreach_add, torch.int64, [3, -5]),
    # mixed: each number promotes with its own type, as PyTorch applies them one by one
    "add_int_and_float": (torch._foreach_add, torch.int64, [2.5, 7]),
    "mul_bool_and_float": (torch._foreach_mul, torch.float64, [True, 0.1]),
    "mul_floats": (torch._foreach_mul, torch.float64, [0.1, 0.7]),
}


@pytest.mark.parametrize("mode", ["eager", "defer_and_fuse"])
@pytest.mark.parametrize("name", list(SCALAR_LIST_CALLS))
def test_scalar_list_numbers_keep_their_types(name: str, mode: str) -> None:
    fn, dtype, numbers = SCALAR_LIST_CALLS[name]
    xs = [torch.tensor([9, -9, 2**40 + 1]).to(dtype), torch.tensor([3, 2**33, -7]).to(dtype)]
    want = fn(xs, numbers)
    with torchtpu.eager_mode(mode):
        got = [t.cpu() for t in fn([x.to(TPU) for x in xs], numbers)]
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        assert torch.equal(g, w), (g, w)


def test_a_bool_tensor_to_a_bool_power_stays_bool() -> None:
    """pow(bool tensor, True) is bool on the CPU and CUDA (their kernel's result type is
    result_type(base, exponent)); PyTorch's Python meta function said int64, and so did tpu.
    x ** y of bools is x or not y. A bool to an int power is int64 everywhere."""
    b = torch.tensor([True, False])
    for exponent in (True, False, 2, 2.5):
        want = torch.pow(b, exponent)
        got = torch.pow(b.to("tpu"), exponent)
        assert got.dtype == want.dtype, exponent
        assert torch.equal(got.cpu(), want), exponent
        (got_list,) = torch._foreach_pow([b.to("tpu")], exponent)
        assert got_list.dtype == want.dtype and torch.equal(got_list.cpu(), want), exponent
    compiled = torch.compile(lambda t: torch.pow(t, True), backend="tpu")(b.to("tpu"))
    assert compiled.dtype == torch.bool and torch.equal(compiled.cpu(), b)
