"""Matmul/convolution precision reaches every dot_general and convolution, and the cache key."""

from __future__ import annotations

import warnings

import pytest
import torch

import torchtpu
from torchtpu.eager import dispatch
from torchtpu.runner import precision as prec


def _program_texts(op_name: str) -> list[str]:
    return [p.storage.text for k, p in dispatch._CACHE.items() if str(k[0]).startswith(op_name)]


def _mm_text() -> str:
    """The StableHLO of the program that ran ``a @ b`` under the current precision."""
    a = torch.randn(8, 4, device="tpu")
    b = torch.randn(4, 3, device="tpu")
    (a @ b).cpu()
    from torchtpu.tensor.storage import cell_of

    buffers = ((cell_of(a).shape, torch.float32, True), (cell_of(b).shape, torch.float32, True))
    mine = [
        p.storage.text
        for k, p in dispatch._CACHE.items()
        if str(k[0]) == "aten.mm.default" and prec.current() in k and k[1][2] == (8, 4) and k[2][2] == (4, 3)
        and all(buf in k for buf in buffers)  # storages of other shapes make other programs
    ]
    assert len(mine) == 1, f"expected one mm program for {prec.current()}, found {len(mine)}"
    return mine[0]


@pytest.fixture(autouse=True)
def _restore_precision():
    saved = prec._user_global, torch.get_float32_matmul_precision()
    yield
    prec._user_global = saved[0]
    torch._C._set_float32_matmul_precision(saved[1])


def test_default_is_medium_even_though_torch_says_highest():
    prec._user_global = None
    assert torch.tpu.precision  # the context manager is exported on torch.tpu
    assert prec.current() == "DEFAULT"
    assert "#stablehlo<precision DEFAULT>" in _mm_text()


@pytest.mark.parametrize("mode,name", [("high", "HIGH"), ("highest", "HIGHEST"), ("medium", "DEFAULT")])
def test_context_manager_sets_precision_config_and_key(mode, name):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.tpu.precision(mode):
            assert prec.current() == name
            text = _mm_text()
    assert f"precision_config = [#stablehlo<precision {name}>, #stablehlo<precision {name}>]" in text
    assert "precision DEFAULT" not in text or name == "DEFAULT"


def test_enum_and_nesting_and_thread_locality():
    import threading

    seen = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.tpu.precision(torch.tpu.Precision.HIGH):
            with torch.tpu.precision("highest"):
                assert prec.current() == "HIGHEST"
            assert prec.current() == "HIGH"
            t = threading.Thread(target=lambda: seen.setdefault("other", prec.current()))
            t.start()
            t.join()
    assert seen["other"] == "DEFAULT"
    assert prec.current() == "DEFAULT"


def test_set_float32_matmul_precision_is_honoured():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.set_float32_matmul_precision("highest")
    assert torch.get_float32_matmul_precision() == "highest"  # PyTorch's own global still set
    assert prec.current() == "HIGHEST"
    assert "#stablehlo<precision HIGHEST>" in _mm_text()
    torch.set_float32_matmul_precision("medium")
    assert prec.current() == "DEFAULT"


def test_precision_is_part_of_the_eager_cache_key():
    a = torch.randn(16, 16, device="tpu")
    (a @ a).cpu()
    torchtpu.metrics.reset()
    (a @ a).cpu()
    assert torchtpu.metrics.snapshot()["compiles"] == 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.tpu.precision("high"):
            (a @ a).cpu()
    assert torchtpu.metrics.snapshot()["compiles"] == 1


def test_convolution_carries_precision():
    x = torch.randn(1, 2, 5, 5, device="tpu")
    w = torch.randn(3, 2, 3, 3, device="tpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.tpu.precision("highest"):
            torch.nn.functional.conv2d(x, w).cpu()
    texts = [t for t in _program_texts("aten.convolution") if "precision HIGHEST" in t]
    assert texts and "stablehlo.convolution" in texts[-1]


def test_high_modes_warn_once_about_cost():
    prec._warned.clear()
    with pytest.warns(UserWarning, match="~6x"):
        with torch.tpu.precision("highest"):
            pass
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.tpu.precision("highest"):  # second time: silent
            pass


def test_unknown_precision_is_a_clear_error():
    with pytest.raises(ValueError, match="medium"):
        with torch.tpu.precision("fast"):
            pass
