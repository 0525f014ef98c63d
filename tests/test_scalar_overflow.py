"""Scalar arguments that do not fit the tensor's dtype are refused as the CPU refuses them
(torchtpu/eager/scalar_range.py): ``masked_fill(mask, torch.finfo(torch.float32).min)`` on
a bfloat16 tensor (DeBERTa's attention under autocast) raised on the CPU and stored -inf
on tpu; 300 filled into uint8 became 44."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from utils import assert_close

import torchtpu
from torchtpu.eager import cpu_errors

BIG = 1e39  # beyond float32's and bfloat16's max
bf16, f16, f32, u8 = torch.bfloat16, torch.float16, torch.float32, torch.uint8


def zeros(dev: str, dtype: torch.dtype = bf16) -> torch.Tensor:
    return torch.zeros(2, 3, dtype=dtype, device=dev)


def mask(dev: str) -> torch.Tensor:
    return torch.tensor([[True, False, True]], device=dev)


def index(dev: str) -> torch.Tensor:
    return torch.tensor([1], device=dev)


# each case: a call on device `dev`; the CPU raises for the overflowing ones, accepts the rest
CASES: dict[str, Callable[[str], Any]] = {
    "fill_": lambda d: zeros(d).fill_(BIG),
    "fill_ float32": lambda d: zeros(d, f32).fill_(BIG),
    "fill_ float16": lambda d: zeros(d, f16).fill_(65520.0),
    "fill_ uint8 300": lambda d: zeros(d, u8).fill_(300),
    "fill_ uint8 -256": lambda d: zeros(d, u8).fill_(-256),
    "fill_ int8 200": lambda d: zeros(d, torch.int8).fill_(200),
    "fill_ int32 nan": lambda d: zeros(d, torch.int32).fill_(float("nan")),
    "fill_ int64 inf": lambda d: zeros(d, torch.int64).fill_(float("inf")),
    "fill_ complex64": lambda d: zeros(d, torch.complex64).fill_(complex(1, BIG)),
    "fill_ float32 with a complex": lambda d: zeros(d, f32).fill_(1j),
    "masked_fill": lambda d: zeros(d).masked_fill(mask(d), torch.finfo(f32).min),
    "masked_fill_": lambda d: zeros(d).masked_fill_(mask(d), -BIG),
    "masked_fill float16 -1e9": lambda d: zeros(d, f16).masked_fill(mask(d), -1e9),
    "full": lambda d: torch.full((2,), BIG, dtype=bf16, device=d),
    "full uint8": lambda d: torch.full((2,), 300, dtype=u8, device=d),
    "full default dtype": lambda d: torch.full((2,), BIG, device=d),
    "new_full": lambda d: zeros(d).new_full((2,), BIG),
    "clamp": lambda d: zeros(d).clamp(min=-BIG),
    "clamp int8": lambda d: zeros(d, torch.int8).clamp(max=300),
    "index_fill": lambda d: zeros(d).index_fill(1, index(d), BIG),
    "scatter value": lambda d: zeros(d).scatter(1, index(d).expand(2, 1), BIG),
    "threshold": lambda d: F.threshold(zeros(d), BIG, 0.0),
    "hardtanh": lambda d: F.hardtanh(zeros(d), -BIG, BIG),
    "leaky_relu": lambda d: F.leaky_relu(zeros(d), BIG),
    "elu": lambda d: F.elu(zeros(d), alpha=BIG),
    "addcmul value": lambda d: torch.addcmul(zeros(d), zeros(d), zeros(d), value=BIG),
    "add alpha": lambda d: torch.add(zeros(d), zeros(d), alpha=BIG),
    "addmm alpha": lambda d: torch.addmm(zeros(d), zeros(d), zeros(d).t(), alpha=BIG),
    "pow": lambda d: zeros(d).pow(BIG),
    "fill_diagonal_": lambda d: zeros(d).fill_diagonal_(BIG),
    # accepted by the CPU: a wrapped number, where's scalar, the infinities, values in range
    "mul by a big number": lambda d: zeros(d).mul(BIG),
    "where scalar": lambda d: torch.where(mask(d), zeros(d), BIG),
    "masked_fill -inf": lambda d: zeros(d).masked_fill(mask(d), float("-inf")),
    "masked_fill float32 min": lambda d: zeros(d, f32).masked_fill(mask(d), torch.finfo(f32).min),
    "fill_ uint8 -1": lambda d: zeros(d, u8).fill_(-1),
    "fill_ bool 2": lambda d: zeros(d, torch.bool).fill_(2),
    "fill_ int32 2.5": lambda d: zeros(d, torch.int32).fill_(2.5),
    "nan_to_num posinf": lambda d: zeros(d).nan_to_num(posinf=BIG),
}


def _outcome(fn: Callable[[str], Any], dev: str) -> tuple[str, Any]:
    try:
        return "ok", fn(dev)
    except Exception as e:  # noqa: BLE001 - the exception is the outcome compared
        return type(e).__name__, str(e)


@pytest.mark.parametrize("mode", ["eager", "defer_and_fuse"])
@pytest.mark.parametrize("name", list(CASES))
def test_like_the_cpu(name: str, mode: str) -> None:
    expected = _outcome(CASES[name], "cpu")
    with torchtpu.eager_mode(mode):
        actual = _outcome(CASES[name], "tpu")
        if actual[0] == "ok":
            actual = ("ok", actual[1].cpu())
    assert actual[0] == expected[0], (actual, expected)
    if expected[0] == "ok":
        assert_close(actual[1], expected[1])
    else:
        assert actual[1] == expected[1]


def test_the_cpu_is_asked_once_per_accepted_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """A loop filling with a value some dtype of the call cannot hold (where's 1e39 with a
    bfloat16 tensor, which the CPU accepts) asks the CPU on its first call only."""
    asked = []
    real = cpu_errors.cpu_error

    def counting(*args: Any, **kwargs: Any) -> Any:
        asked.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(cpu_errors, "cpu_error", counting)
    x, m = zeros("tpu"), mask("tpu")
    results = [torch.where(m, x, 3.391e38 + i * 1e35).cpu() for i in range(3)] + [torch.where(m, x, 3.391e38).cpu() for _ in range(3)]
    assert len(asked) == 3  # three values, then the first one again: remembered
    assert all(torch.equal(r, torch.where(mask("cpu"), zeros("cpu"), 3.391e38)) for r in results[3:])


def test_ordinary_scalars_never_ask_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the CPU was asked")

    monkeypatch.setattr(cpu_errors, "cpu_error", fail)
    x = torch.ones(4, device="tpu")
    y = x.masked_fill(x > 0, float("-inf")).clamp(min=-1e30).add(x, alpha=2).fill_(torch.finfo(f32).min)
    assert y.cpu().eq(torch.finfo(f32).min).all()
