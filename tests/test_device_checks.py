"""Data-dependent errors raise what the CPU raises: integer division by zero, integers to
negative powers, class targets out of range, bad multinomial probabilities and failed
factorizations. The check runs on the device (``L.check``) and surfaces at the next wait
(at the call under launch_blocking) as a TpuAsyncError that is also the CPU's exception
type, whose message starts with the CPU's text; a static case (a Python 0 divisor) raises
at the call, as on the CPU. Valid inputs keep the CPU's values and the device stays usable."""

from __future__ import annotations

import pickle
import re
import sys
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.utils._pytree import tree_map

import torchtpu
from torchtpu.eager import deferred
from torchtpu.runner import checks

Fn = Callable[[str], Any]
MODES = ["eager", "launch_blocking", "defer_and_fuse"]
pytestmark = pytest.mark.filterwarnings("ignore:torch.cholesky is deprecated")
nan, inf = float("nan"), float("inf")


@pytest.fixture(autouse=True)
def _eager_after():
    yield
    torchtpu.set_eager_mode("eager")


def T(d: str, v: Any, dtype: torch.dtype | None = None) -> torch.Tensor:
    return torch.tensor(v, dtype=dtype, device=d)


def _wait(out: Any) -> Any:
    """Bring every result to the host: the wait where an asynchronous check surfaces."""
    return tree_map(lambda t: t.cpu() if isinstance(t, torch.Tensor) else t, out)


def _cpu_error(fn: Fn) -> BaseException:
    with pytest.raises(Exception) as e:
        _wait(fn("cpu"))
    return e.value


def _raises_like_cpu(fn: Fn, on_device: bool = True) -> BaseException:
    """tpu raises the CPU's type with the CPU's text first; ``on_device``: as a TpuAsyncError
    (a device-side check), else at the call itself."""
    want = _cpu_error(fn)
    with pytest.raises(type(want), match=re.escape(str(want))) as got:
        _wait(fn("tpu"))
    assert str(got.value).startswith(str(want))
    assert isinstance(got.value, checks.TpuAsyncError) == on_device, type(got.value).__mro__
    if on_device:
        assert "test_device_checks.py:" in str(got.value)
    return got.value


def _device_still_works() -> None:
    x = torch.arange(6, device="tpu")
    assert (x // 2).cpu().tolist() == [0, 0, 1, 1, 2, 2]
    assert not checks.has_pending()


# -- integer division by zero -----------------------------------------------------------------------
DIV_BY_ZERO_TENSOR = {
    "floor_divide": lambda d: T(d, [5, -6]) // T(d, [2, 0]),
    "div_floor": lambda d: torch.div(T(d, [5, -6]), T(d, [2, 0]), rounding_mode="floor"),
    "div_trunc": lambda d: torch.div(T(d, [5, -6]), T(d, [0, 3]), rounding_mode="trunc"),
    "remainder": lambda d: T(d, [5, -6]) % T(d, [[1, 2], [0, 3]]),
    "fmod": lambda d: torch.fmod(T(d, [5, -6]), T(d, [0, 3])),
    "remainder_scalar_tensor": lambda d: torch.remainder(5, T(d, [1, 0])),
    "floor_divide_uint8": lambda d: T(d, [5, 6], torch.uint8) // T(d, [1, 0], torch.uint8),
    "fmod_int32_by_bool": lambda d: torch.fmod(T(d, [5, 6], torch.int32), T(d, [True, False])),
    "remainder_inplace": lambda d: T(d, [5, 6]).remainder_(T(d, [0, 1])),
    "div_0d_divisor": lambda d: torch.div(T(d, [5, 6], torch.int16), T(d, 0, torch.int16), rounding_mode="floor"),
}
DIV_BY_ZERO_SCALAR = {
    "floor_divide": lambda d: T(d, [5, 6]) // 0,
    "div_trunc": lambda d: torch.div(T(d, [5, 6]), 0, rounding_mode="trunc"),
    "remainder": lambda d: T(d, [5, 6]) % 0,
    "fmod": lambda d: torch.fmod(T(d, [5, 6], torch.int8), 0),
    "floor_divide_inplace": lambda d: T(d, [5, 6]).floor_divide_(0),
}


@pytest.mark.parametrize("case", DIV_BY_ZERO_TENSOR)
def test_integer_division_by_a_zero_element(case: str):
    _raises_like_cpu(DIV_BY_ZERO_TENSOR[case])
    _device_still_works()


@pytest.mark.parametrize("case", DIV_BY_ZERO_SCALAR)
def test_integer_division_by_a_python_zero_raises_at_the_call(case: str):
    _raises_like_cpu(DIV_BY_ZERO_SCALAR[case], on_device=False)
    _device_still_works()


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int8, torch.uint8])
def test_integer_division_without_zeros_keeps_the_cpu_values(dtype: torch.dtype):
    lo = 0 if dtype is torch.uint8 else -7
    a = torch.arange(lo, 8).to(dtype)
    b = torch.tensor([3, 1, 2, 5, 7, 4, 6, 1, 2, 3, 5, 7, 2, 9, 4])[: a.numel()].to(dtype)
    if dtype is not torch.uint8:
        b = b * torch.tensor([1, -1]).repeat(8)[: a.numel()].to(dtype)
    fns = [
        lambda x, y: x // y,
        lambda x, y: torch.div(x, y, rounding_mode="trunc"),
        lambda x, y: x % y,
        lambda x, y: torch.fmod(x, y),
        lambda x, y: x // 3,
        lambda x, y: x % 5,
        lambda x, y: torch.remainder(7, y),
    ]
    for fn in fns:
        assert torch.equal(fn(a.to("tpu"), b.to("tpu")).cpu(), fn(a, b))
    assert not checks.has_pending()


def test_float_division_by_zero_is_not_an_error():
    for fn in (lambda x: x // 0, lambda x: x % 0.0, lambda x: torch.fmod(x, torch.zeros_like(x))):
        got, want = fn(torch.tensor([1.0, -2.0, 0.0], device="tpu")).cpu(), fn(torch.tensor([1.0, -2.0, 0.0]))
        torch.testing.assert_close(got, want, equal_nan=True)
    assert (torch.tensor([3], device="tpu") // 0.0).cpu().tolist() == [inf]


# -- integers to negative integer powers ----------------------------------------------------------
NEG_POWERS_STATIC = {
    "int64_-1": lambda d: torch.pow(T(d, [1, 2]), -1),
    "int64_-1_inplace": lambda d: T(d, [1, 2]).pow_(-1),
}
NEG_POWERS_OPERAND = {  # exponents other than 0/1/-1 are device operands: checked on the device
    "int64_-2": lambda d: T(d, [1, 2]) ** -2,
    "int8_-3": lambda d: torch.pow(T(d, [1, 2], torch.int8), -3),
    "uint8_-2": lambda d: torch.pow(T(d, [2], torch.uint8), -2),
    "bool_-2": lambda d: torch.pow(T(d, [True]), -2),
    "inplace_-5": lambda d: T(d, [2, 3]).pow_(-5),
}


@pytest.mark.parametrize("case", NEG_POWERS_STATIC)
def test_integer_to_a_static_negative_power_raises_at_the_call(case: str):
    _raises_like_cpu(NEG_POWERS_STATIC[case], on_device=False)
    _device_still_works()


@pytest.mark.parametrize("case", NEG_POWERS_OPERAND)
def test_integer_to_a_negative_power_operand(case: str):
    _raises_like_cpu(NEG_POWERS_OPERAND[case])
    _device_still_works()


def test_powers_the_cpu_accepts_keep_its_values():
    x = torch.tensor([-3, -1, 0, 2, 5])
    fns = [
        lambda a: a**2,
        lambda a: a**3,
        lambda a: torch.pow(a, 0),
        lambda a: a ** torch.tensor([-1, -2, 1, 2, 0], device=a.device),  # a tensor exponent: no check on the CPU
        lambda a: torch.pow(2, torch.tensor([1, -2, 3], device=a.device)),
        lambda a: a ** torch.tensor(-2, device=a.device),
        lambda a: a**-2.0,  # a float exponent gives a float result
        lambda a: a.float() ** -3,
    ]
    for fn in fns:
        got, want = fn(x.to("tpu")).cpu(), fn(x)
        torch.testing.assert_close(got, want, equal_nan=True)
    assert not checks.has_pending()


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int8, torch.uint8])
def test_integer_powers_wrap_like_the_cpu(dtype: torch.dtype):
    # XLA's integer power read only the exponent's low 6 bits: 5 ** 64 gave 1, 2 ** 64 gave 1
    info = torch.iinfo(dtype)
    vals = [v for v in (info.min, -3, -1, 0, 1, 2, 5, 7, info.max) if info.min <= v <= info.max]
    exps = [e for e in (0, 1, 3, 8, 31, 63, 64, 65, 100, info.max, -1, -2, info.min) if info.min <= e <= info.max]
    x = torch.tensor([v for v in vals for _ in exps], dtype=dtype)
    y = torch.tensor(exps * len(vals), dtype=dtype)
    assert torch.equal((x.to("tpu") ** y.to("tpu")).cpu(), x**y)
    assert torch.equal((x.to("tpu") ** 64).cpu(), x**64)
    assert not checks.has_pending()


# -- class targets out of range ---------------------------------------------------------------------
def _logits(d: str, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(1)).to(d)


BAD_TARGETS = {
    "ce_1d_target_too_big": lambda d: F.cross_entropy(_logits(d, 3, 4), T(d, [0, 5, 1])),
    "ce_negative": lambda d: F.cross_entropy(_logits(d, 3, 4), T(d, [0, -1, 1])),
    "ce_none": lambda d: F.cross_entropy(_logits(d, 3, 4), T(d, [0, 1, -3]), reduction="none"),
    "ce_sum_first_of_two": lambda d: F.cross_entropy(_logits(d, 3, 4), T(d, [-3, 2, 5]), reduction="sum"),
    "ce_weight": lambda d: F.cross_entropy(_logits(d, 3, 4), T(d, [0, 4, 1]), weight=T(d, [1.0, 2.0, 3.0, 4.0])),
    "ce_label_smoothing": lambda d: F.cross_entropy(_logits(d, 3, 4), T(d, [0, 7, 1]), label_smoothing=0.1),
    "ce_3d": lambda d: F.cross_entropy(_logits(d, 2, 4, 3), T(d, [[0, 1, 2], [3, 9, 0]])),
    "ce_4d_none": lambda d: F.cross_entropy(
        _logits(d, 2, 4, 2, 2), T(d, [[[0, 1], [2, 3]], [[3, 1], [-2, 1]]]), reduction="none"
    ),
    "ce_4d_mean_first_of_two": lambda d: F.cross_entropy(_logits(d, 2, 4, 2), T(d, [[0, 7], [5, -3]])),
    "ce_unbatched": lambda d: F.cross_entropy(_logits(d, 4), T(d, 4)),
    "nll_ignore_index_skipped": lambda d: F.nll_loss(_logits(d, 3, 4), T(d, [-100, 2, 9])),
    "nll_custom_ignore_index": lambda d: F.nll_loss(_logits(d, 3, 4), T(d, [7, 2, 8]), ignore_index=7),
    "nll_ignore_negative": lambda d: F.nll_loss(_logits(d, 3, 4), T(d, [-1, -2, 1]), ignore_index=-1),
    "nll_2d_weight_sum": lambda d: F.nll_loss(
        _logits(d, 2, 3, 2, 2), T(d, [[[0, 1], [2, 0]], [[1, 3], [0, 0]]]), weight=T(d, [1.0, 0.5, 2.0]), reduction="sum"
    ),
    "nll_backward": lambda d: torch.ops.aten.nll_loss_backward(
        T(d, 1.0), _logits(d, 3, 4), T(d, [0, 5, 1]), None, 1, -100, T(d, 3.0)
    ),
    "nll2d_backward": lambda d: torch.ops.aten.nll_loss2d_backward(
        T(d, 1.0), _logits(d, 1, 4, 1, 2), T(d, [[[0, 4]]]), None, 2, -100, T(d, 2.0)
    ),
}


@pytest.mark.parametrize("case", BAD_TARGETS)
def test_target_out_of_bounds_raises_index_error(case: str):
    err = _raises_like_cpu(BAD_TARGETS[case])
    assert isinstance(err, IndexError)
    _device_still_works()


def _rows(d: str) -> torch.Tensor:
    return torch.arange(15.0, device=d).view(5, 3)


# each op's own words and exception type on the CPU (IndexError or RuntimeError)
BAD_INDICES = {
    "index": lambda d: _rows(d)[T(d, [1, 7])],
    "index_negative": lambda d: _rows(d)[T(d, [-6])],
    "index_put": lambda d: _rows(d).index_put_((T(d, [1, 7]),), torch.ones(2, 3, device=d)),
    "gather": lambda d: torch.gather(_rows(d), 0, T(d, [[7, 0, 0]])),
    "scatter": lambda d: _rows(d).scatter(0, T(d, [[7, 0, 0]]), 1.0),
    "index_select": lambda d: _rows(d).index_select(0, T(d, [1, 7])),
    "take": lambda d: _rows(d).take(T(d, [99])),
    "put": lambda d: _rows(d).put(T(d, [99]), T(d, [1.0])),
    "index_add": lambda d: _rows(d).index_add(0, T(d, [1, 7]), torch.ones(2, 3, device=d)),
    "index_copy": lambda d: _rows(d).index_copy(0, T(d, [1, 7]), torch.ones(2, 3, device=d)),
    "index_fill": lambda d: _rows(d).index_fill(0, T(d, [1, 7]), 1.0),
    "embedding": lambda d: F.embedding(T(d, [1, 7]), _rows(d)),
}


@pytest.mark.parametrize("case", BAD_INDICES)
def test_index_out_of_range_raises_the_cpus_error(case: str):
    _raises_like_cpu(BAD_INDICES[case])
    _device_still_works()


def test_the_checks_of_one_program_come_back_as_one_buffer():
    """Several checks in one program (a DeferAndFuse graph here) are read at the wait as
    one packed buffer, and the one that failed is reported with its own values."""
    x = _rows("tpu")
    with torchtpu.eager_mode("defer_and_fuse"):
        x[T("tpu", [0, 4])], x.index_select(0, T("tpu", [2])), x[T("tpu", [1, 9])]
        deferred.flush()
        flags = [flag for added in checks._pending for flag in added.flags]
        assert len(flags) == 3 and len({id(f.buf) for f in flags}) == 1
        assert [f.span for f in flags] == [(0, 2), (2, 3), (3, 5)]
        with pytest.raises(IndexError, match="^index 9 is out of bounds for dimension 0 with size 5"):
            torch.tpu.synchronize()
    _device_still_works()


def test_several_bad_targets_name_the_first_in_row_major_order():
    # the CPU checks reduction="none" and the backward in parallel threads: either value
    # may come first there (both occur on a 2-core machine); the sum and mean loops are
    # sequential, and the tests above match those exactly
    x, t = torch.randn(3, 4, device="tpu"), torch.tensor([0, 5, -3], device="tpu")
    with pytest.raises(IndexError, match=r"^Target 5 is out of bounds\."):
        F.cross_entropy(x, t, reduction="none").cpu()


def test_valid_targets_keep_the_cpu_losses_and_gradients():
    x = torch.randn(5, 4)
    t = torch.tensor([0, 3, -100, 2, 1])
    w = torch.tensor([1.0, 2.0, 0.5, 3.0])
    for kw in ({}, {"weight": w}, {"reduction": "none"}, {"reduction": "sum", "label_smoothing": 0.2}):
        xt = x.to("tpu").requires_grad_()
        xc = x.clone().requires_grad_()
        kt = {k: v.to("tpu") if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
        lt, lc = F.cross_entropy(xt, t.to("tpu"), **kt), F.cross_entropy(xc, t, **kw)
        lt.sum().backward()
        lc.sum().backward()
        torch.testing.assert_close(lt.cpu(), lc.detach())
        torch.testing.assert_close(xt.grad.cpu(), xc.grad)
    x4, t4 = torch.randn(2, 3, 2, 2), torch.tensor([[[0, 1], [2, 0]], [[1, 2], [0, 1]]])
    torch.testing.assert_close(F.cross_entropy(x4.to("tpu"), t4.to("tpu")).cpu(), F.cross_entropy(x4, t4))
    assert not checks.has_pending()


def test_index_error_is_catchable_as_on_the_cpu():
    x, t = torch.randn(2, 3, device="tpu"), torch.tensor([1, 3], device="tpu")
    try:
        F.cross_entropy(x, t).item()
    except IndexError as e:  # what a user written for the CPU catches
        assert "Target 3 is out of bounds." in str(e)
    else:
        pytest.fail("no IndexError")


# -- multinomial --------------------------------------------------------------------------------------
BAD_PROBS = [
    [0.5, -0.1, 0.6],
    [0.5, nan, 0.6],
    [0.5, inf, 0.6],
    [0.5, -inf, 0.6],
    [[0.0, 0.0], [1.0, 1.0]],
    [[1.0, 1.0], [0.0, 0.0]],
    [[1.0, nan], [-1.0, 0.0]],
    [[0.0, 0.0], [-1.0, 1.0]],
    [[inf, -1.0], [1.0, 1.0]],
    [[1.0, 2.0], [inf, 0.0]],
    [0.0, 0.0],
]


@pytest.mark.parametrize("replacement,n", [(False, 1), (True, 1), (True, 3), (False, 2)])
@pytest.mark.parametrize("probs", BAD_PROBS, ids=str)
def test_multinomial_bad_probabilities(probs: list, replacement: bool, n: int):
    _raises_like_cpu(lambda d: torch.multinomial(T(d, probs), n, replacement=replacement))
    _device_still_works()


@pytest.mark.parametrize("replacement", [False, True])
def test_multinomial_valid_probabilities_sample_their_support(replacement: bool):
    p = torch.tensor([[0.0, 1.0, 3.0, 0.0], [2.0, 0.0, 0.0, 1e-3], [1e38, 1e38, 0.0, 1e38]], device="tpu")
    s = torch.multinomial(p, 2, replacement=replacement).cpu()
    assert s.shape == (3, 2)
    assert (p.cpu().gather(1, s) > 0).all()
    assert not checks.has_pending()


# -- factorizations -----------------------------------------------------------------------------------
NOT_PD = [
    [[1.0, 2.0], [2.0, 1.0]],  # leading minor of order 2
    [[-1.0, 0.0], [0.0, 1.0]],  # order 1
    [[4.0, 2.0, 0.0], [2.0, 5.0, 0.0], [0.0, 0.0, -1.0]],  # order 3
    [[4.0, 1.0], [1.0, nan]],
    [[4.0, 1.0, 1.0], [1.0, 0.25, 0.0], [1.0, 0.0, 9.0]],  # singular leading 2x2: order 2
    [[4.0, 100.0], [1.0, 1.0]],  # PD in the lower triangle, not in the upper one
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.complex64])
@pytest.mark.parametrize("upper", [False, True])
def test_cholesky_ex_info_is_the_order_of_the_first_failing_minor(upper: bool, dtype: torch.dtype):
    for a in NOT_PD:
        a = torch.tensor(a, dtype=dtype)
        want = torch.linalg.cholesky_ex(a, upper=upper).info
        got = torch.linalg.cholesky_ex(a.to("tpu"), upper=upper).info.cpu()
        assert got == want, (a, upper, got, want)


def test_cholesky_ex_info_batched_and_valid_factors_unchanged():
    eye = torch.eye(3, dtype=torch.float64)
    spd = torch.tensor([[4.0, 2.0, 0.6], [2.0, 5.0, 1.0], [0.6, 1.0, 3.0]], dtype=torch.float64)
    a = torch.stack([eye, torch.tensor(NOT_PD[2], dtype=torch.float64), spd, -eye]).reshape(2, 2, 3, 3)
    got = torch.linalg.cholesky_ex(a.to("tpu"))
    want = torch.linalg.cholesky_ex(a)
    assert torch.equal(got.info.cpu(), want.info)
    ok = want.info == 0
    torch.testing.assert_close(got.L.cpu()[ok], want.L[ok])
    torch.testing.assert_close(torch.linalg.cholesky(spd.to("tpu")).cpu(), torch.linalg.cholesky(spd))
    torch.testing.assert_close(torch.cholesky(spd.to("tpu"), upper=True).cpu(), torch.cholesky(spd, upper=True))
    assert not checks.has_pending()


A_NOT_PD = [[1.0, 2.0], [2.0, 1.0]]
SINGULAR = [[1.0, 2.0], [2.0, 4.0]]
EYE = [[1.0, 0.0], [0.0, 1.0]]
LINALG_ERRORS = {
    "cholesky": (lambda d: torch.cholesky(T(d, A_NOT_PD)), True),
    "cholesky_upper_batched": (lambda d: torch.cholesky(T(d, [EYE, A_NOT_PD]), upper=True), True),
    "cholesky_ex_check_errors": (lambda d: torch.linalg.cholesky_ex(T(d, A_NOT_PD), check_errors=True), True),
    "cholesky_ex_check_errors_batched": (lambda d: torch.linalg.cholesky_ex(T(d, [[EYE, A_NOT_PD]]), check_errors=True), True),
    "inv_ex_check_errors": (lambda d: torch.linalg.inv_ex(T(d, SINGULAR), check_errors=True), True),
    "inv_ex_check_errors_batched": (lambda d: torch.linalg.inv_ex(T(d, [EYE, SINGULAR]), check_errors=True), True),
    "solve_ex_check_errors": (lambda d: torch.linalg.solve_ex(T(d, SINGULAR), T(d, [1.0, 2.0]), check_errors=True), True),
    "solve_ex_check_errors_batched": (
        lambda d: torch.linalg.solve_ex(T(d, [EYE, SINGULAR]), T(d, [1.0, 2.0]), check_errors=True),
        True,
    ),
    "lu_factor_ex_check_errors": (lambda d: torch.linalg.lu_factor_ex(T(d, SINGULAR), check_errors=True), True),
    # the composite ops read info on the host (_linalg_check_errors): they raise at the call
    "linalg_cholesky": (lambda d: torch.linalg.cholesky(T(d, A_NOT_PD)), False),
    "linalg_cholesky_batched": (lambda d: torch.linalg.cholesky(T(d, [EYE, A_NOT_PD, A_NOT_PD])), False),
    "linalg_inv": (lambda d: torch.linalg.inv(T(d, SINGULAR)), False),
    "linalg_solve_batched": (lambda d: torch.linalg.solve(T(d, [EYE, SINGULAR]), T(d, [1.0, 2.0])), False),
    "linalg_lu_factor_batched": (lambda d: torch.linalg.lu_factor(T(d, [EYE, SINGULAR])), False),
}


@pytest.mark.parametrize("case", LINALG_ERRORS)
def test_failed_factorizations_raise_like_the_cpu(case: str):
    fn, on_device = LINALG_ERRORS[case]
    _raises_like_cpu(fn, on_device)
    _device_still_works()


@pytest.mark.parametrize("op", ["inv_ex", "lu_factor_ex", "solve_ex"])
def test_singular_infos_match_the_cpu(op: str):
    a = torch.tensor([EYE, SINGULAR, [[0.0, 0.0], [0.0, 1.0]]])
    fn = {
        "inv_ex": lambda m: torch.linalg.inv_ex(m).info,
        "lu_factor_ex": lambda m: torch.linalg.lu_factor_ex(m).info,
        "solve_ex": lambda m: torch.linalg.solve_ex(m, torch.ones(2, device=m.device)).info,
    }[op]
    assert torch.equal(fn(a.to("tpu")).cpu(), fn(a))


# -- modes, types, messages ---------------------------------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
def test_checks_in_every_eager_mode(mode: str):
    with torchtpu.eager_mode(mode):
        for _ in range(2):  # the second time the programs are cached
            _raises_like_cpu(BAD_TARGETS["ce_4d_mean_first_of_two"])
            _raises_like_cpu(DIV_BY_ZERO_TENSOR["remainder"])
            _raises_like_cpu(LINALG_ERRORS["cholesky"][0])
            _raises_like_cpu(lambda d: torch.multinomial(T(d, [[1.0, 1.0], [0.0, 0.0]]), 3, replacement=True))
            _raises_like_cpu(DIV_BY_ZERO_SCALAR["floor_divide"], on_device=False)
            _device_still_works()


def test_launch_blocking_raises_at_the_failing_call_with_the_cpu_type():
    x = torch.randn(3, 4, device="tpu")
    with torchtpu.eager_mode("launch_blocking"):
        with pytest.raises(IndexError, match=r"^Target 4 is out of bounds\.") as e:
            F.cross_entropy(x, torch.tensor([0, 4, 1], device="tpu"))  # no wait needed
        assert "asynchronously" not in str(e.value)


def test_deferred_error_names_the_failing_op_in_a_fused_graph():
    a, b = torch.tensor([6, 7], device="tpu"), torch.tensor([2, 0], device="tpu")
    with torchtpu.eager_mode("defer_and_fuse"):
        y = (a + 1) * 3
        z = y % b
        w = z + y
        with pytest.raises(RuntimeError, match=r"^ZeroDivisionError \(torchtpu: aten::remainder.Tensor failed") as e:
            w.cpu()
    line = test_deferred_error_names_the_failing_op_in_a_fused_graph.__code__.co_firstlineno + 4
    assert f"test_device_checks.py:{line})" in str(e.value)
    _device_still_works()


def test_error_types_are_both_tpu_async_errors_and_the_cpu_type():
    for exc in (IndexError, torch.linalg.LinAlgError, ValueError):
        cls = checks.error_type(exc)
        assert issubclass(cls, checks.TpuAsyncError) and issubclass(cls, exc)
        assert checks.error_type(exc) is cls
        err = pickle.loads(pickle.dumps(cls("text")))
        assert type(err) is cls and str(err) == "text"
    assert checks.error_type(RuntimeError) is checks.TpuAsyncError


def test_first_failure_wins_and_later_pending_checks_are_dropped():
    x = torch.tensor([4, 5], device="tpu")
    y = x // torch.tensor([0, 1], device="tpu")
    z = F.nll_loss(torch.randn(2, 3, device="tpu"), torch.tensor([0, 8], device="tpu"))
    with pytest.raises(RuntimeError, match="^ZeroDivisionError"):
        z.cpu()
    assert not checks.has_pending()
    del y


def test_compiled_graphs_check_targets():
    f = torch.compile(lambda x, t: F.cross_entropy(x, t), backend="tpu")
    with pytest.raises(IndexError, match="Target 5 is out of bounds."):
        f(torch.randn(3, 4, device="tpu"), torch.tensor([0, 5, 1], device="tpu")).cpu()
    # the graph stays usable, and a valid call after the failing one gives the CPU's loss
    x, t = torch.randn(3, 4), torch.tensor([0, 3, 1])
    assert torch.allclose(f(x.to("tpu"), t.to("tpu")).cpu(), F.cross_entropy(x, t), rtol=1.3e-6, atol=1e-5)


def test_compiled_graphs_check_integer_division_by_zero():
    f = torch.compile(lambda a, b: a // b, backend="tpu")
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        f(torch.tensor([4, 5], device="tpu"), torch.tensor([2, 0], device="tpu")).cpu()


# -- shape rules the lowering checks while building (the CPU's types and messages) ---------
def test_index_add_source_shape_is_checked():
    x, index, source = torch.zeros(3, 2), torch.tensor([0, 1]), torch.ones(2)
    with pytest.raises(RuntimeError, match=r"source tensor shape must match self tensor shape.*\[3, 2\].*\[2\]"):
        x.index_add(0, index, source)  # the CPU refuses it; tpu returned a result
    with pytest.raises(RuntimeError, match=r"source tensor shape must match self tensor shape.*\[3, 2\].*\[2\]"):
        x.to("tpu").index_add(0, index.to("tpu"), source.to("tpu"))


def test_as_strided_scatter_out_of_bounds_is_refused():
    x, src = torch.zeros(16), torch.ones(2, 2)
    with pytest.raises(RuntimeError, match="out of bounds for storage of size 64"):
        torch.as_strided_scatter(x, src, (2, 2), (200, 200))
    with pytest.raises(RuntimeError, match="out of bounds for storage of size 64"):
        torch.as_strided_scatter(x.to("tpu"), src.to("tpu"), (2, 2), (200, 200))


def test_a_recorded_source_line_reads_as_the_line_python_reports() -> None:
    """A check keeps the user's frame as (code, instruction) and looks its line up only when
    a message shows it: the text must be the ``file:line`` of ``f_lineno``."""
    f = sys._getframe(0)
    site, expected = checks.SourceLine(f.f_code, f.f_lasti), f"{f.f_code.co_filename}:{f.f_lineno}"
    assert str(site) == expected
    assert f"at {site}." == f"at {expected}."


def test_user_source_line_passes_over_library_frames_and_the_ones_skipped() -> None:
    def library_caller() -> Any:  # stands for dispatch.run: skipped without a look
        return checks.user_source_line(skip=1)

    line = sys._getframe(0).f_lineno + 1
    site = library_caller()
    assert str(site) == f"{__file__}:{line}"


@pytest.mark.parametrize("mode", [*MODES, "compile"])
def test_assert_async_fires_as_on_cuda(mode):
    """``torch._assert_async`` had no tpu kernel, and in a compiled function (Dynamo turns a
    tensor ``assert`` into it) it was dropped: the assert never fired."""

    def check(x):
        assert (x > 0).all(), "x must be positive"
        return x * 2

    run = torch.compile(check, backend="tpu") if mode == "compile" else check
    if mode != "compile":
        torchtpu.set_eager_mode(mode)
    torch._dynamo.reset()
    assert run(torch.ones(3, device="tpu")).cpu().tolist() == [2.0, 2.0, 2.0]
    # eagerly Python's assert raises; compiled, the assert is an op (RuntimeError, as inductor's)
    with pytest.raises(RuntimeError if mode == "compile" else AssertionError, match="x must be positive"):
        run(-torch.ones(3, device="tpu")).cpu()
    with pytest.raises(RuntimeError, match="Expected Tensor with single nonzero value, but got zero"):
        torch._assert_async(torch.tensor(0.0, device="tpu"))
        torch.tpu.synchronize()
    torch._assert_async(torch.tensor(3, device="tpu"), "not raised")
    torch.tpu.synchronize()
    with pytest.raises(RuntimeError, match="Boolean value of Tensor with more than one value is ambiguous"):
        torch._assert_async(torch.ones(2, device="tpu"))
