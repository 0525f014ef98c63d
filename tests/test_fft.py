"""torch.fft on tpu vs CPU (stablehlo.fft): every normalization, dims moved to the end,
more than three dims, real/Hermitian transforms, and gradients."""

import pytest
import torch
from utils import check

C64, C128 = torch.complex64, torch.complex128


def _c(*shape, dtype=C64):
    return torch.randn(*shape, dtype=dtype).requires_grad_()


def _r(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype).requires_grad_()


NORMS = [None, "ortho", "forward"]


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("fn", [torch.fft.fft, torch.fft.ifft])
def test_c2c_1d(fn, norm):
    check(lambda x: fn(x, norm=norm), _c(3, 8))
    check(lambda x: fn(x, dim=0, norm=norm), _c(5, 4))
    check(lambda x: fn(x, n=6, norm=norm), _c(2, 8))  # cropped
    check(lambda x: fn(x, n=11, norm=norm), _c(2, 8))  # zero-padded


@pytest.mark.parametrize("norm", NORMS)
def test_real_transforms(norm):
    check(lambda x: torch.fft.rfft(x, norm=norm), _r(3, 8))
    check(lambda x: torch.fft.rfft(x, n=7, norm=norm), _r(3, 8))
    check(lambda x: torch.fft.irfft(x, norm=norm), _c(3, 5))
    check(lambda x: torch.fft.irfft(x, n=9, norm=norm), _c(3, 5))
    check(lambda x: torch.fft.hfft(x, norm=norm), _c(4, 5))
    check(lambda x: torch.fft.ihfft(x, norm=norm), _r(4, 6))
    check(lambda x: torch.fft.fft(x, norm=norm), _r(6))  # real input to a complex transform


@pytest.mark.parametrize("norm", NORMS)
def test_nd(norm):
    check(lambda x: torch.fft.fft2(x, norm=norm), _c(2, 4, 6))
    check(lambda x: torch.fft.ifftn(x, dim=(0, 2), norm=norm), _c(3, 4, 5))
    check(lambda x: torch.fft.rfft2(x, norm=norm), _r(3, 4, 6))
    check(lambda x: torch.fft.irfft2(x, norm=norm), _c(3, 4, 4))
    check(lambda x: torch.fft.rfftn(x, s=(3, 5), dim=(0, 2), norm=norm), _r(4, 2, 6))


def test_more_than_three_dims():
    check(torch.fft.fftn, _c(2, 3, 2, 4, 3))
    check(torch.fft.rfftn, _r(2, 3, 2, 4, 6))
    check(torch.fft.irfftn, _c(2, 3, 2, 4, 4))


def test_float64_and_helpers():
    check(torch.fft.fft, _c(8, dtype=C128))
    check(torch.fft.rfft, _r(2, 9, dtype=torch.float64))
    check(lambda x: torch.fft.fftshift(torch.fft.fft(x)), _c(7))
    check(lambda x: torch.fft.fft(x).abs().pow(2).sum(), _r(16))  # a power spectrum loss
