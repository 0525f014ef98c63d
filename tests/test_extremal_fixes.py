"""Extremal values (issue 16 item 3): NaN, +-inf, +-0 and the dtype's largest values through
the lowerings the extremal conformance run found wrong, each against the CPU (and, where the
CPU computes in a wider type than the result, against float64)."""

from __future__ import annotations

import math

import pytest
import torch
from utils import TPU, assert_close

from torchtpu.testing import opinfo

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


def test_float64_atan2_of_subnormals_reads_them_as_signed_zeros() -> None:
    """XLA:CPU's float64 atan2 calls libm's, which under denormals-are-zero read a subnormal
    half as zero: atan2(2^-1024, -1) was -pi (pi flushed or not). tpu now flushes first and
    agrees with the CPU under set_flush_denormal(True)."""
    s = torch.finfo(F64).tiny / 4
    y = torch.tensor([s, s, s, s, -s, -s, 1.0, -0.0], dtype=F64)
    x = torch.tensor([0.0, -0.0, -1.0, s, -1.0, 1.0, 2.0, -3.0], dtype=F64)
    got = torch.atan2(y.to(TPU), x.to(TPU)).cpu()
    assert got[2].item() == math.pi
    torch.set_flush_denormal(True)
    try:
        expected = torch.atan2(y.repeat(4), x.repeat(4))[: len(y)]  # the CPU's vectorised (flushing) path
    finally:
        torch.set_flush_denormal(False)
    _same_bits(got, expected)


def _parts_close(actual: torch.Tensor, expected: torch.Tensor, rtol: float, atol: float = 0.0) -> None:
    """Each part against the CPU's own, so a small part is not lost in the modulus."""
    torch.testing.assert_close(
        torch.view_as_real(actual.cpu()), torch.view_as_real(expected), rtol=rtol, atol=atol, equal_nan=True
    )


_PART_RTOL = {torch.complex64: 2e-6, torch.complex128: 1e-14}


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
@pytest.mark.parametrize("fn", [torch.sin, torch.cos, torch.sinh, torch.cosh], ids=lambda f: f.__name__)
def test_complex_sin_cos_sinh_cosh_keep_a_small_part(fn: object, dtype: torch.dtype) -> None:
    """sin(0.3 + 1e-8j) had imaginary part 0 in complex64 and sinh(1e-3 + 0j) was 1.000017e-3:
    XLA takes sinh of the small part as a difference of exponentials."""
    tiny = torch.finfo(dtype.to_real()).tiny
    small = [1e-3, -1e-5, 1e-8, 1e-12, -1e-20, tiny, 0.0]
    z = [complex(a, y) for a in (0.0, 0.3, -1.7, 2.5) for y in small]
    z += [complex(y, a) for a in (0.0, 0.3, -1.7, 2.5) for y in small]
    x = torch.tensor(z, dtype=dtype)
    _parts_close(fn(x.to(TPU)), fn(x), rtol=_PART_RTOL[dtype], atol=tiny)
    torch.manual_seed(0)
    r = torch.complex(torch.randn(500, dtype=F64) * 3, torch.randn(500, dtype=F64) * 3).to(dtype)
    assert_close(fn(r.to(TPU)), fn(r))


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_complex_sinc_of_a_tiny_argument_is_one(dtype: torch.dtype) -> None:
    """sinc(1e-308j) = sin(pi z) / (pi z) was 0 (sin's small imaginary part was lost), and
    sinc(t + tj) 0.5 - 0.5j."""
    tiny = torch.finfo(dtype.to_real()).tiny
    z = torch.tensor([complex(-0.0, tiny), complex(tiny, tiny), complex(0.0, 1e-20), complex(0.3, 1e-8)], dtype=dtype)
    assert_close(torch.sinc(z.to(TPU)), torch.sinc(z))
    assert torch.sinc(z[:2].to(TPU)).cpu().tolist() == [1.0, 1.0]


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_complex_atan_atanh_next_to_their_singularities(dtype: torch.dtype) -> None:
    """atan(1.2e-38 + 1j) is 0.785 + 44.01j in complex64 (XLA squared 1.2e-38 and gave inf);
    atan(1j) itself stays inf."""
    tiny = torch.finfo(dtype.to_real()).tiny
    z = torch.tensor([complex(tiny, 1), complex(2e-20, 1), complex(-1e-30, -1), complex(0, 1), complex(1e-3, 1)], dtype=dtype)
    assert_close(torch.atan(z.to(TPU)), torch.atan(z))
    assert_close(torch.atanh((z * 1j).to(TPU)), torch.atanh(z * 1j))
    if dtype == torch.complex64:
        assert abs(torch.atan(z[:1].to(TPU)).cpu().imag.item() - 44.014845965556525) < 1e-4


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_complex_sigmoid_at_infinity_is_one(dtype: torch.dtype) -> None:
    """sigmoid(inf + iy) = 1 / (1 + exp(-inf - iy)) = 1 (XLA's complex logistic gave NaN)."""
    z = torch.tensor([complex(INF, 1), complex(INF, INF), complex(INF, NAN), complex(0.3, -2.0)], dtype=dtype)
    assert_close(torch.sigmoid(z.to(TPU)), torch.sigmoid(z))


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
@pytest.mark.parametrize("exponent", [2, 3, -2, -1, 0.5, -0.5, 1, 0, 1.5])
def test_complex_pow_by_a_scalar_takes_the_cpus_special_forms(exponent: float, dtype: torch.dtype) -> None:
    """The CPU computes z ** 2 as z * z (and square(z) is pow(z, 2)), z ** 0.5 as sqrt(z),
    ...: square(-inf + 1j) is inf - inf j there; XLA's power gave NaN. (Negative exponents
    divide: at an infinite z the CPU's Smith division gives NaN where XLA's gives 0, so
    those are compared on finite values.)"""
    parts = [INF, -INF, 0.0, -0.0, 1.0, -2.5] if exponent >= 0 else [0.0, -0.0, 1.0, -2.5, 1e-3]
    z = torch.tensor([complex(a, b) for a in parts for b in parts], dtype=dtype)
    assert_close(torch.pow(z.to(TPU), exponent), torch.pow(z, exponent))
    if exponent == 2:
        assert_close(torch.square(z.to(TPU)), torch.square(z))


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_complex_pow_of_large_values_is_not_nan(dtype: torch.dtype) -> None:
    """(-501-501j) ** (-501+501j) is e^-2108 = 0; XLA's power multiplied 0 by inf (NaN).
    The finite results match the CPU; which results are finite, zero or NaN match too (the
    direction of an infinite one is the phase of Im(y log x) ~ 1e20, which no side has)."""
    from torch.testing._internal.opinfo.core import generate_elementwise_binary_large_value_tensors

    op = next(o for o in opinfo.op_db() if o.name == "pow")
    (sample,) = generate_elementwise_binary_large_value_tensors(op, device="cpu", dtype=dtype, requires_grad=False)
    x, y = sample.input, sample.args[0]
    got, expected = torch.pow(x.to(TPU), y.to(TPU)).cpu(), torch.pow(x, y)
    finite = torch.view_as_real(expected).isfinite().all(-1)
    assert torch.equal(torch.view_as_real(got).isfinite().all(-1), finite)
    assert torch.equal(got.isnan(), expected.isnan())
    assert_close(got[finite], expected[finite])
    assert int(finite.sum()) > 0 and int((expected[finite] == 0).sum()) > 0


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_complex_sgn_of_the_largest_values(dtype: torch.dtype) -> None:
    """sgn(-M - Mj) is -(1 + 1j)/sqrt(2): |z| overflows, so tpu scales z by its larger part
    first (it gave 0; the CPU, whose |z| is M under flushing, gives -1 - 1j)."""
    big = torch.finfo(dtype.to_real()).max
    z = torch.tensor([complex(-big, -big), complex(big, 1.0), complex(3.0, 4.0), 0j], dtype=dtype)
    expected = torch.tensor([complex(-1, -1) / math.sqrt(2), 1.0, complex(0.6, 0.8), 0j], dtype=dtype)
    assert_close(torch.sgn(z.to(TPU)), expected)


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_complex_exp_and_log_with_an_infinite_part(dtype: torch.dtype) -> None:
    """C99 Annex G as the CPU: exp(+inf + i inf) and exp(+inf + i NaN) are inf + i NaN,
    log(NaN - i inf) is inf + i NaN (XLA: NaN + i NaN)."""
    z = torch.tensor([complex(a, b) for a in _COMPLEX_PARTS for b in _COMPLEX_PARTS], dtype=dtype)
    assert_close(torch.exp(z.to(TPU)), torch.exp(z))
    assert_close(torch.log(z.to(TPU)), torch.log(z))


def test_complex128_angle_of_subnormal_parts_reads_them_as_signed_zeros() -> None:
    """angle(-1 + 2^-1024 j) was -pi (libm's atan2 under denormals-are-zero); as atan2(+0, -1)
    it is pi, the CPU's value under set_flush_denormal(True)."""
    s = torch.finfo(F64).tiny / 4
    z = torch.tensor([complex(-1, s), complex(s, s), complex(-s, -s), complex(-1, -s), complex(3, 4)], dtype=torch.complex128)
    got = torch.angle(z.to(TPU)).cpu()
    assert got[0].item() == math.pi
    torch.set_flush_denormal(True)
    try:
        expected = torch.angle(z.repeat(8))[: len(z)]
    finally:
        torch.set_flush_denormal(False)
    _same_bits(got, expected)


def _ulps(actual: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    """|actual - exact| in units of the float32 spacing at the exact value."""
    rounded = exact.float().abs()
    spacing = torch.nextafter(rounded, torch.tensor(INF)).double() - rounded.double()
    return (actual.cpu().double() - exact).abs() / spacing


@pytest.mark.parametrize("name,low,high", [("sinh", -89.0, 89.0), ("cosh", -89.0, 89.0), ("erfc", -3.0, 9.0)])
def test_float32_sinh_cosh_erfc_are_within_an_ulp(name: str, low: float, high: float) -> None:
    """XLA:CPU's float32 expansions were up to 24 ulp off (cosh(55) = 3.8473981e23, exact
    3.8473926e23: 12 ulp, which failed the int32 extremal sample at PyTorch's tolerance);
    they are computed in float64 now where the platform has it, as the CPU's libm is
    accurate (0.9 ulp at most here)."""
    fn = getattr(torch, name)
    x = torch.linspace(low, high, 20001)
    exact = fn(x.double())
    finite = exact.float().isfinite() & (exact.float() != 0)
    assert _ulps(fn(x.to(TPU)), exact)[finite].max() <= 1.0
    ints = torch.tensor([1, -55, 55, 88], dtype=torch.int32)
    assert_close(fn(ints.to(TPU)), fn(ints))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
@pytest.mark.parametrize("fn", [torch.atan2, torch.pow], ids=["atan2", "pow"])
def test_subnormal_operands_of_atan2_and_pow_read_as_zeros(fn, dtype: torch.dtype) -> None:
    """XLA:CPU reads subnormals as zeros in some steps of atan2 and pow and not in others:
    float32 atan2(2.9e-39, 2.9e-39) was NaN, pow(2.9e-39, 0.5) 2.6e-23 (neither the flushed
    0 nor the exact 5.4e-20). The operands are flushed first now: tpu gives the CPU's
    values on the operands with their subnormals replaced by zeros of their sign, the
    model of XLA:CPU's arithmetic. (The CPU under torch.set_flush_denormal(True) is no
    single model: its float32 pow gives inf ** 2.9e-39 = 1 but (-inf) ** 2.9e-39 = inf.)"""
    tiny = torch.finfo(dtype).tiny / 4
    values = torch.tensor([tiny, -tiny, 0.0, -0.0, 0.5, -0.5, 2.5, -2.5, INF, -INF, NAN], dtype=dtype)
    x, y = values.repeat_interleave(len(values)), values.repeat(len(values))

    def flushed(t: torch.Tensor) -> torch.Tensor:
        return torch.where(t.abs() < torch.finfo(dtype).tiny, t * 0, t)  # -tiny * 0 = -0

    got = fn(x.to(TPU), y.to(TPU))
    assert_close(got, fn(flushed(x), flushed(y)))
    if fn is torch.atan2:  # NaN only from a NaN operand
        assert torch.equal(got.cpu().isnan(), x.isnan() | y.isnan())


@pytest.mark.parametrize("fn", [torch.log, torch.log2, torch.log10], ids=["log", "log2", "log10"])
def test_log_of_a_subnormal_is_the_same_at_every_position(fn) -> None:
    """XLA:CPU's float32 log read a subnormal as zero in its vector loop (-inf) and by its
    bits in the loop's scalar tail: log(2.9e-39) was -103.97 at position 12 of 14 (exact
    -88.72). Flushed first, every position gives the flushed value, log(+-0) = -inf."""
    tiny = torch.finfo(torch.float32).tiny / 4
    for n in (14, 28, 5):
        x = torch.full((n,), 0.5)
        x[-2], x[-1] = tiny, -tiny
        got = fn(x.to(TPU)).cpu()
        assert got[-2].item() == got[-1].item() == -INF, (n, got[-2:])
        assert_close(got[:-2], fn(x[:-2]))
