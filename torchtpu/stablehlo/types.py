"""The single dtype table: torch dtype <-> StableHLO element type <-> numpy dtype."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import torch

# torch dtype -> (StableHLO element type, numpy dtype)
_TABLE: dict[torch.dtype, tuple[str, np.dtype]] = {
    torch.float32: ("f32", np.dtype(np.float32)),
    torch.float64: ("f64", np.dtype(np.float64)),
    torch.float16: ("f16", np.dtype(np.float16)),
    torch.bfloat16: ("bf16", np.dtype(ml_dtypes.bfloat16)),
    torch.int8: ("i8", np.dtype(np.int8)),
    torch.int16: ("i16", np.dtype(np.int16)),
    torch.int32: ("i32", np.dtype(np.int32)),
    torch.int64: ("i64", np.dtype(np.int64)),
    torch.uint8: ("ui8", np.dtype(np.uint8)),
    torch.uint16: ("ui16", np.dtype(np.uint16)),
    torch.uint32: ("ui32", np.dtype(np.uint32)),
    torch.uint64: ("ui64", np.dtype(np.uint64)),
    torch.bool: ("i1", np.dtype(np.bool_)),
    torch.complex64: ("complex<f32>", np.dtype(np.complex64)),
    torch.complex128: ("complex<f64>", np.dtype(np.complex128)),
    torch.float8_e4m3fn: ("f8E4M3FN", np.dtype(ml_dtypes.float8_e4m3fn)),
    torch.float8_e5m2: ("f8E5M2", np.dtype(ml_dtypes.float8_e5m2)),
    torch.float8_e4m3fnuz: ("f8E4M3FNUZ", np.dtype(ml_dtypes.float8_e4m3fnuz)),
    torch.float8_e5m2fnuz: ("f8E5M2FNUZ", np.dtype(ml_dtypes.float8_e5m2fnuz)),
}
# torch.float8_e8m0fnu (MX block scales) is left out: XLA's cpu client converted every
# value to it as NaN
FLOAT8 = frozenset({torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz})
_FROM_NUMPY = {np_dt: t for t, (_, np_dt) in _TABLE.items()}

SUPPORTED_DTYPES = frozenset(_TABLE)


def is_supported(dtype: torch.dtype) -> bool:
    return dtype in _TABLE


def element_type(dtype: torch.dtype) -> str:
    try:
        return _TABLE[dtype][0]
    except KeyError:
        raise TypeError(
            f"torchtpu: dtype {dtype} is not supported on the tpu device; "
            f"use one of {sorted(str(d) for d in _TABLE)}"
        ) from None


def numpy_dtype(dtype: torch.dtype) -> np.dtype:
    element_type(dtype)  # raises the clear error for unsupported dtypes
    return _TABLE[dtype][1]


def host_numpy(t: torch.Tensor) -> np.ndarray:
    """The numpy array over a CPU tensor's values, in the dtype ``numpy_dtype`` gives
    (``Tensor.numpy()`` refuses bfloat16, which numpy knows only through ml_dtypes). A dtype
    the device does not have gets element_type's error, not numpy's "Got unsupported
    ScalarType"."""
    element_type(t.dtype)
    if t.dtype is torch.bfloat16:
        return t.view(torch.int16).numpy().view(numpy_dtype(torch.bfloat16))
    if t.dtype in FLOAT8:
        return t.view(torch.uint8).numpy().view(numpy_dtype(t.dtype))
    return t.numpy()


def torch_from_host(arr: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """The CPU tensor of ``dtype`` over ``arr`` (in ``numpy_dtype(dtype)``): host_numpy's
    inverse, through a same-width integer view where torch.from_numpy does not know
    ml_dtypes' types."""
    if arr.size == 0:  # numpy's strides for an empty array ((3, 0): (0, 4)) are not PyTorch's ((1, 1))
        return torch.empty(arr.shape, dtype=dtype)
    if dtype is torch.bfloat16:
        return torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
    if dtype in FLOAT8:
        return torch.from_numpy(arr.view(np.uint8)).view(dtype)
    return torch.from_numpy(arr)


def torch_dtype(np_dtype: np.dtype) -> torch.dtype:
    return _FROM_NUMPY[np.dtype(np_dtype)]


def tensor_type(shape: tuple[int, ...] | list[int], dtype: torch.dtype) -> str:
    """MLIR tensor type text, e.g. ``tensor<2x3xf32>`` or ``tensor<f32>``."""
    elem = element_type(dtype)
    if not shape:
        return f"tensor<{elem}>"
    return "tensor<" + "x".join(str(int(d)) for d in shape) + "x" + elem + ">"


def is_float(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point


def is_complex(dtype: torch.dtype) -> bool:
    return dtype.is_complex


def is_unsigned(dtype: torch.dtype) -> bool:
    return dtype in (torch.uint8, torch.uint16, torch.uint32, torch.uint64)


def is_integer(dtype: torch.dtype) -> bool:
    return not dtype.is_floating_point and not dtype.is_complex and dtype is not torch.bool
