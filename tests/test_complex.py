"""Complex tensors on tpu vs CPU: transfers, views sharing storage (view_as_real,
view_as_complex, real/imag, the lazy conj bit), elementwise ops and their gradients."""

import pytest
import torch
from utils import TPU, assert_close, check

C64, C128 = torch.complex64, torch.complex128


def _c(*shape, dtype=C64, grad=True):
    return torch.randn(*shape, dtype=dtype).requires_grad_(grad)


def _r(*shape, grad=True):
    return torch.randn(*shape).requires_grad_(grad)


@pytest.mark.parametrize("dtype", [C64, C128])
def test_round_trip_and_item(dtype):
    x = torch.randn(3, 4, dtype=dtype)
    t = x.to(TPU)
    assert t.dtype == dtype and t.device.type == "tpu"
    assert_close(t, x)
    assert t[1, 2].item() == x[1, 2].item()
    assert_close(t.mT.contiguous(), x.mT.contiguous())


@pytest.mark.parametrize(
    "fn",
    [
        lambda a, b: a + b,
        lambda a, b: a - 2.5 * b,
        lambda a, b: a * b,
        lambda a, b: a / b,
        lambda a, b: a * b.conj(),
        lambda a, b: (a * b).sum(),
        lambda a, b: (a / b).mean(dim=0),
        lambda a, b: a @ b.mT,
    ],
)
def test_binary_and_reductions(fn):
    check(fn, _c(3, 4), _c(3, 4))


@pytest.mark.parametrize("dtype", [C64, C128])
@pytest.mark.parametrize(
    "fn",
    [torch.abs, torch.angle, torch.real, torch.imag, torch.conj_physical, torch.exp, torch.sgn, lambda x: x.conj() * 2],
)
def test_unary(fn, dtype):
    check(fn, _c(5, dtype=dtype))


def test_angle_of_real():
    x = torch.tensor([-2.0, 0.0, 3.0, -0.5, float("nan")])
    check(torch.angle, x, grad=False)


def test_complex_polar_and_views():
    check(torch.complex, _r(4), _r(4))
    check(torch.polar, torch.rand(4).add(0.1).requires_grad_(), _r(4))
    check(torch.view_as_real, _c(3, 2))
    check(lambda x: torch.view_as_complex(x * 1), _r(3, 2))
    check(lambda x: x.real * x.imag + x.abs(), _c(6))


def test_conj_bit_reads():
    x = torch.randn(4, dtype=C64)
    t = x.to(TPU)
    assert t.conj().is_conj()
    assert_close(t.conj(), x.conj())  # .cpu() applies the bit
    assert_close(t.conj() + 1, x.conj() + 1)  # resolved on the way into add
    assert_close(t.conj().clone(), x.conj().clone())  # clone sees the bit itself


def test_view_as_real_shares_storage_and_writes_through():
    x = torch.randn(5, dtype=C64)
    t = x.to(TPU)
    vr, vc = torch.view_as_real(x), torch.view_as_real(t)
    assert vc.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()
    vr[:, 0].mul_(3)
    vc[:, 0].mul_(3)  # scale the real parts through the float view
    vr[1, 1] = 7.0
    vc[1, 1] = 7.0
    assert_close(t, x)
    t.imag.add_(1)  # and through .imag
    x.imag.add_(1)
    assert_close(vc, vr)
    assert_close(t.real, x.real)


def test_view_as_complex_shares_storage_and_writes_through():
    x = torch.randn(4, 2)
    t = x.to(TPU)
    c, ct = torch.view_as_complex(x), torch.view_as_complex(t)
    ct[2] = 1 + 2j
    c[2] = 1 + 2j
    ct.mul_(1j)
    c.mul_(1j)
    assert_close(t, x)
    assert_close(ct, c)


def test_copy_into_conj_view():
    x = torch.randn(3, dtype=C64)
    src = torch.randn(3, dtype=C64)
    t = x.to(TPU)
    x.conj().copy_(src)
    t.conj().copy_(src.to(TPU))
    assert_close(t, x)


def test_nan_inf_tests():
    inf, nan = float("inf"), float("nan")
    x = torch.tensor([complex(1, 2), complex(nan, 0), complex(0, inf), complex(-inf, nan)], dtype=C64)
    for fn in (torch.isnan, torch.isinf, torch.isfinite):
        check(fn, x, grad=False)


def test_vdot_conjugates_its_first_argument():
    a, b = torch.randn(5, dtype=torch.complex64), torch.randn(5, dtype=torch.complex64)
    assert_close(torch.vdot(a.to(TPU), b.to(TPU)), torch.vdot(a, b))
    assert_close(torch.dot(a.to(TPU), b.to(TPU)), torch.dot(a, b))


@pytest.mark.parametrize("fn", [torch.tanh, torch.sigmoid, torch.nn.functional.tanhshrink])
def test_complex_gradients_use_the_conjugate_derivative(fn):
    x = torch.randn(6, dtype=torch.complex64, requires_grad=True)
    xt = x.detach().to(TPU).requires_grad_()
    g = torch.randn(6, dtype=torch.complex64)
    fn(x).backward(g)
    fn(xt).backward(g.to(TPU))
    assert_close(xt.grad, x.grad, atol=1e-5, rtol=1e-5)


def test_complex_logsumexp_is_a_clear_error_not_a_wrong_answer():
    x = torch.randn(3, 4, dtype=C64).to(TPU)
    with pytest.raises(NotImplementedError, match="complex"):
        torch.logsumexp(x, 1)
    with pytest.raises(NotImplementedError, match="complex"):
        torch.logcumsumexp(x, 1)
