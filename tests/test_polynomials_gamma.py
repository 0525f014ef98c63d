"""Orthogonal polynomials (stablehlo.while recurrences), igamma/igammac and frexp on tpu
vs CPU: special cases of n and x, degrees beyond every closed form and loop limit,
float32 and float64, scalar overloads, and the edge values of each kernel."""

import math

import pytest
import torch
from utils import TPU, assert_close, check

F32, F64 = torch.float32, torch.float64

POLYNOMIALS = [
    "chebyshev_polynomial_t",
    "chebyshev_polynomial_u",
    "chebyshev_polynomial_v",
    "chebyshev_polynomial_w",
    "shifted_chebyshev_polynomial_t",
    "shifted_chebyshev_polynomial_u",
    "shifted_chebyshev_polynomial_v",
    "shifted_chebyshev_polynomial_w",
    "hermite_polynomial_h",
    "hermite_polynomial_he",
    "laguerre_polynomial_l",
    "legendre_polynomial_p",
]

# x inside and outside [-1, 1] (and [0, 1] for the shifted ones), exactly +-1, 0, 1/2
XS = [-3.0, -1.5, -1.0, -0.7, -0.3, 0.0, 0.2, 0.5, 0.9, 1.0, 1.2, 2.5]
# negative, -0.5 (truncates to 0), 0, 1, fractional (truncated), each closed-form threshold, large, and n values
# the CPU converts to INT64_MIN (inf, nan, out of int64 range) -- all give 0
NS = [-3.0, -1.0, -0.5, 0.0, 1.0, 1.5, 2.0, 3.0, 4.9, 5.0, 7.0, 9.0, 10.0, 15.0, 40.0, 130.0, math.inf, math.nan, 1e30]


def _grid(dtype: torch.dtype, xs: list[float] = XS, ns: list[float] = NS) -> tuple[torch.Tensor, torch.Tensor]:
    x, n = torch.meshgrid(torch.tensor(xs, dtype=dtype), torch.tensor(ns, dtype=dtype), indexing="ij")
    return x.contiguous(), n.contiguous()


@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("name", POLYNOMIALS)
def test_polynomial_matches_cpu(name: str, dtype: torch.dtype) -> None:
    fn = getattr(torch.special, name)
    x, n = _grid(dtype)
    # float32 recurrences and trig forms of degree 130 drift by a few ulps x n from the CPU's
    tol = {"rtol": 2e-5, "atol": 1e-5} if dtype is F32 else {}
    check(fn, x, n, grad=False, **tol)


def test_polynomial_high_degree_float64() -> None:
    """Degrees past the float32 Hermite limit (128) and up to the float64 one (512)."""
    x, n = _grid(F64, [-0.9, -0.2, 0.3, 0.999, 1.01], [127.0, 129.0, 300.0, 512.0, 513.0])
    for name in POLYNOMIALS:
        check(getattr(torch.special, name), x, n, grad=False, rtol=1e-9, atol=1e-9)


def test_polynomial_scalar_overloads_and_integer_inputs() -> None:
    x = torch.tensor([-2.0, -0.5, 0.25, 1.0, 3.0])
    n = torch.tensor([0, 1, 2, 5, 11])
    check(lambda n: torch.special.chebyshev_polynomial_t(0.3, n), n, grad=False)  # x_scalar
    check(lambda x: torch.special.legendre_polynomial_p(x, 4), x, grad=False)  # n_scalar
    check(lambda x: torch.special.hermite_polynomial_h(x, 3.7), x, grad=False)
    # integer x and n compute in float32, like the CPU
    check(torch.special.laguerre_polynomial_l, torch.tensor([-2, 0, 1, 3, 4]), n, grad=False)
    check(torch.special.chebyshev_polynomial_u, torch.tensor([True, False, True]), torch.tensor([3, 2, 1]), grad=False)


def test_polynomial_broadcast_and_empty() -> None:
    check(torch.special.chebyshev_polynomial_w, torch.linspace(-2, 2, 6).reshape(6, 1), torch.arange(-1.0, 12.0), grad=False)
    check(torch.special.legendre_polynomial_p, torch.tensor(0.4), torch.tensor(8.0), grad=False)  # 0-d
    check(torch.special.hermite_polynomial_he, torch.empty(0, 3), torch.empty(0, 3), grad=False)


# -- igamma / igammac ---------------------------------------------------------------------------
# every regime of calc_igamma/calc_igammac: boundaries (negative, 0, inf, nan), both series,
# the continued fraction and the asymptotic expansion (20 < a < 200 and a > 200 with x ~ a)
_GAMMA_VALUES = [-1.0, 0.0, 1e-3, 0.1, 0.5, 0.7, 1.0, 1.05, 1.5, 3.0, 10.0, 25.0, 100.0, 250.0, 1e4, math.inf, math.nan]
_NEAR_A = [25.0, 100.0, 150.0, 300.0, 1000.0, 5000.0]


def _gamma_args(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    v = torch.tensor(_GAMMA_VALUES, dtype=dtype)
    a, x = torch.meshgrid(v, v, indexing="ij")
    near = torch.tensor(_NEAR_A, dtype=dtype)
    a = torch.cat([a.flatten(), near, near, near])
    x = torch.cat([x.flatten(), near * 1.02, near * 0.97, near + 1])
    return a, x


@pytest.mark.parametrize("dtype", [F32, F64, torch.bfloat16])
@pytest.mark.parametrize("fn", [torch.igamma, torch.igammac])
def test_incomplete_gamma_matches_cpu(fn, dtype: torch.dtype) -> None:
    a, x = _gamma_args(dtype)
    check(fn, a, x, grad=False)


def test_incomplete_gamma_grad_and_aliases() -> None:
    a = torch.tensor([0.5, 1.5, 3.0, 30.0])
    x = torch.tensor([0.2, 2.0, 7.0, 29.0], requires_grad=True)
    check(lambda x: torch.igamma(a.to(x.device), x), x)  # d/dx; d/da is not implemented by PyTorch
    check(lambda x: torch.special.gammaincc(a.to(x.device), x), x)
    check(lambda a, x: torch.special.gammainc(a, x), a.reshape(4, 1), x.detach(), grad=False)  # broadcasting


# -- frexp -------------------------------------------------------------------------------------
_FREXP_VALUES = [0.0, -0.0, math.inf, -math.inf, 1.0, 3.0, -5.0, 0.5, 1e38, 3.4e38, 6e-8, 1e-5, -2.5e-3]
_SUBNORMALS = {F32: [1e-40, -1.4e-45, 1e-39], F64: [5e-324, -7.4e-309], torch.float16: [6e-8, -3e-6], torch.bfloat16: [1e-40]}


@pytest.mark.parametrize("dtype", [F32, F64, torch.float16, torch.bfloat16])
def test_frexp_matches_cpu_bit_for_bit(dtype: torch.dtype) -> None:
    x = torch.tensor(_FREXP_VALUES + _SUBNORMALS[dtype] + [math.nan], dtype=dtype)
    m, e = torch.frexp(x)
    mt, et = torch.frexp(x.to(TPU))
    assert et.dtype is torch.int32
    assert torch.equal(et.cpu(), e)
    assert_close(mt, m, rtol=0, atol=0)
    finite = ~m.isnan()
    assert torch.equal(mt.cpu()[finite].signbit(), m[finite].signbit())  # -0.0 keeps its sign


def test_frexp_random_and_grad() -> None:
    check(torch.frexp, torch.randn(5, 7, dtype=F64) * 1e3)
    check(lambda x: torch.frexp(x).mantissa, torch.randn(4, 3, requires_grad=True))
