"""Extremal values (issue 16 item 3): NaN, +-inf, +-0 and the dtype's largest values through
the lowerings the extremal conformance run found wrong, each against the CPU (and, where the
CPU computes in a wider type than the result, against float64)."""

from __future__ import annotations

import math

import pytest
import torch
from utils import TPU, assert_close

F32, F64 = torch.float32, torch.float64
FLOATS = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
NAN, INF = math.nan, math.inf


def _specials(dtype: torch.dtype) -> torch.Tensor:
    big = torch.finfo(dtype).max
    return torch.tensor([NAN, INF, -INF, 0.0, -0.0, big, -big, 1.0, -1.0, 0.5, -2.5], dtype=dtype)


def _same_bits(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Equal values, NaN where the CPU has NaN, and the same sign on zeros."""
    actual = actual.cpu()
    torch.testing.assert_close(actual, expected, equal_nan=True, rtol=0, atol=0)
    assert torch.equal(actual.signbit(), expected.signbit()), (actual, expected)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("fn", [torch.sign, torch.sgn])
def test_sign_of_nan_is_zero_and_of_negative_zero_positive(fn: object, dtype: torch.dtype) -> None:
    x = _specials(dtype)
    _same_bits(fn(x.to(TPU)), fn(x))


@pytest.mark.parametrize("dtype", FLOATS)
def test_hypot_is_inf_when_either_operand_is_inf_even_with_nan(dtype: torch.dtype) -> None:
    v = _specials(dtype)
    x, y = v.repeat_interleave(len(v)), v.repeat(len(v))
    assert_close(torch.hypot(x.to(TPU), y.to(TPU)), torch.hypot(x, y))
    assert torch.hypot(torch.tensor([INF], dtype=dtype).to(TPU), torch.tensor([NAN], dtype=dtype).to(TPU)).item() == INF


_BIG = torch.finfo(F32).max


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fn", [torch.std, torch.var, torch.std_mean, torch.var_mean])
def test_std_var_of_rows_near_the_dtype_max_match_the_cpu(fn: object, dtype: torch.dtype) -> None:
    """The CPU accumulates float32/bfloat16 var in double: a row holding the max has a finite
    std (and mean) where float32 squares would overflow."""
    big = torch.finfo(dtype).max
    rows = [[0.0, -1.0, -0.0, -2.5, big], [big, big, big, big, big], [1e-30, 2e-30, 3e-30, 0.0, 1.0]]
    rows += [[NAN, 1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 4.0, 5.0]]
    if fn in (torch.std, torch.var):
        # std_mean/var_mean's mean is the CPU's Welford running mean: NaN once an infinity
        # is followed by another element (tpu: the true mean, +-inf), and a mean of
        # +-max with small values depends on the order of the cancellation
        rows += [[INF, 1.0, 2.0, 3.0, 4.0], [big, -big, 1.0, 2.0, 3.0]]
    x = torch.tensor(rows, dtype=dtype)
    for dim in (1, 0):
        assert_close(fn(x.to(TPU), dim=dim), fn(x, dim=dim))


def test_std_scaling_is_exact() -> None:
    """Each slice is scaled by a power of two before the two-pass sums: ordinary inputs
    round exactly as unscaled ones, so scaling the input by 2^k scales the result by 2^k."""
    torch.manual_seed(0)
    x = torch.randn(8, 300)
    base = torch.std(x.to(TPU), dim=1).cpu()
    for k in (-60, -7, 9, 60):
        assert torch.equal(torch.std((x * 2.0**k).to(TPU), dim=1).cpu(), base * 2.0**k), k
    assert_close(torch.std(x.to(TPU), dim=1), torch.std(x, dim=1))


def test_std_of_the_max_everywhere_is_zero_like_float64() -> None:
    """The CPU's all-reduce std of float32 computes the mean in float32 (inf here); the
    tpu result is the float64 one, 0."""
    x = torch.full((4,), _BIG)
    assert torch.std(x.double()).item() == 0.0
    assert torch.std(x.to(TPU)).item() == 0.0


def test_complex_var_and_std_match_the_cpu() -> None:
    x = torch.complex(torch.tensor([[_BIG, 1.0, 2.0], [1.0, 2.0, 3.0]]), torch.tensor([[1.0, _BIG / 2, 0.0], [0.0, 1.0, -1.0]]))
    for fn in (torch.var, torch.std, torch.var_mean):
        assert_close(fn(x.to(TPU), dim=1), fn(x, dim=1))


@pytest.mark.parametrize("ord", [0, 1, 2, 6, 0.9, -2.1, INF, -INF])
def test_vector_norm_over_size_one_dims_is_the_absolute_value(ord: float) -> None:
    """The CPU returns |x| (ord 0: x != 0) when every reduced dim has size 1: |max|^6 must
    not overflow."""
    x = _specials(F32).reshape(11, 1, 1)
    for dim in (1, (1, 2)):
        assert_close(torch.linalg.vector_norm(x.to(TPU), ord=ord, dim=dim), torch.linalg.vector_norm(x, ord=ord, dim=dim))
    assert_close(
        torch.linalg.vector_norm(x.to(TPU), ord=ord, dim=1, dtype=F64), torch.linalg.vector_norm(x, ord=ord, dim=1, dtype=F64)
    )


def test_modified_bessel_k0_at_the_smallest_normal_float32() -> None:
    """modified_bessel_k0_forward takes log(0.5 * x) in double: it is finite at x = 2^-126."""
    tiny = torch.finfo(F32).tiny
    x = torch.tensor([tiny, 2 * tiny, 3 * tiny, 1e-30, 0.5, 1.9], dtype=F32)
    assert_close(torch.special.modified_bessel_k0(x.to(TPU)), torch.special.modified_bessel_k0(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_lgamma_is_as_accurate_as_the_cpu(dtype: torch.dtype) -> None:
    """chlo.lgamma in float32 was 10x farther from float64 than glibc's lgammaf."""
    x = torch.linspace(-6, 6, 24001, dtype=F64).to(dtype)
    x = x[x != x.round()]
    reference = torch.lgamma(x.double())
    tpu_error = (torch.lgamma(x.to(TPU)).cpu().double() - reference).abs().max()
    cpu_error = (torch.lgamma(x).double() - reference).abs().max()
    assert tpu_error <= cpu_error * 1.01, (tpu_error, cpu_error)


def test_mvlgamma_sum_with_cancellation_matches_the_cpu() -> None:
    x = torch.tensor([-3.0574822425842285, 2.7, 5.5, 40.0])
    assert_close(torch.mvlgamma(x.to(TPU), p=5), torch.mvlgamma(x, p=5))


def test_complex_of_float16_parts_raises_not_implemented() -> None:
    a = torch.tensor([1.0, 2.0], dtype=torch.float16).to(TPU)
    with pytest.raises(NotImplementedError, match="complex32"):
        torch.complex(a, a)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("decimals", [3, 1, -1, -3])
def test_round_decimals_rounds_once_like_the_cpu(dtype: torch.dtype, decimals: int) -> None:
    """In opmath with a true division by 10^d (XLA turned x / 1000 into x * 0.001, and
    bfloat16 rounded x * 1000 to bfloat16 first: round(-3.0, 3) was -3.015625)."""
    torch.manual_seed(0)
    x = (torch.randn(4000, dtype=F64) * torch.logspace(-3, 4, 4000, dtype=F64)).to(dtype)
    x = torch.cat([x, _specials(dtype)])
    _same_bits(torch.round(x.to(TPU), decimals=decimals), torch.round(x, decimals=decimals))


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_complex_abs_is_inf_when_a_part_is_inf_and_the_other_nan(dtype: torch.dtype) -> None:
    parts = [NAN, INF, -INF, 0.0, 1.0, 3e38]
    x = torch.tensor([complex(a, b) for a in parts for b in parts], dtype=dtype)
    assert_close(torch.abs(x.to(TPU)), torch.abs(x))
    assert_close(torch.linalg.vector_norm(x.to(TPU).reshape(6, 6), dim=1), torch.linalg.vector_norm(x.reshape(6, 6), dim=1))


_COMPLEX_PARTS = [NAN, INF, -INF, 0.0, -0.0, 1.0, -2.5, 0.3, 3e38]
_COMPLEX_FUNCTIONS = [torch.exp, torch.exp2, torch.sqrt, torch.sin, torch.cos, torch.log10, torch.log2]
_COMPLEX_FUNCTIONS += [torch.asin, torch.asinh, torch.acos, torch.acosh, torch.atan, torch.atanh]


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
@pytest.mark.parametrize("fn", _COMPLEX_FUNCTIONS, ids=lambda f: f.__name__)
def test_complex_functions_keep_branch_cut_signs_and_c99_special_values(fn: object, dtype: torch.dtype) -> None:
    """sqrt(-2.5 - 0j) is -1.58j (XLA gave +1.58j: the zero's sign picks the side of the
    branch cut), and the infinities give C99 Annex G's values as on the CPU (exp(-inf + inf j)
    is 0, sqrt(NaN + inf j) is inf + inf j, log10(-inf + 0j) is inf + 1.36j), not NaN."""
    z = torch.tensor([complex(a, b) for a in _COMPLEX_PARTS for b in _COMPLEX_PARTS], dtype=dtype)
    assert_close(fn(z.to(TPU)), fn(z))
    torch.manual_seed(0)
    r = torch.complex(torch.randn(2000, dtype=F64) * 3, torch.randn(2000, dtype=F64) * 3).to(dtype)
    assert_close(fn(r.to(TPU)), fn(r))
