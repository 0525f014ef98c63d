"""``torch._grouped_mm`` (``F.grouped_mm``), what transformers' mixture-of-experts layers
call on tpu: every layout against the CPU, forward and gradients, eager, DeferAndFuse and
compiled. Compiled, PyTorch's Meta kernel refused float32 (it mirrors CUDA's bfloat16
fast path), so every MoE model of the zoo failed under torch.compile before."""

from __future__ import annotations

import pytest
import torch

import torchtpu

TPU = "tpu"
# group ends: an empty group (3..3) and groups of uneven sizes; the CPU kernel wants
# 16-byte strides, hence sizes in multiples of 4
OFFS = torch.tensor([3, 3, 9, 16], dtype=torch.int32)
LAYOUTS = {
    "rows of a in groups (2d x 3d)": ((16, 8), (4, 8, 12), OFFS),
    "columns of b in groups (3d x 2d)": ((4, 6, 8), (8, 16), OFFS),
    "contraction in groups (2d x 2d)": ((8, 16), (16, 12), OFFS),
    "batched (3d x 3d)": ((4, 6, 8), (4, 8, 12), None),
}


def _run(fn, a, b, offs, device):
    a = a.detach().to(device).requires_grad_()
    b = b.detach().to(device).requires_grad_()
    out = fn(a, b, offs.to(device) if offs is not None else None)
    loss = (out * out).sum() + out.sum()
    loss.backward()
    return out.detach().cpu(), a.grad.cpu(), b.grad.cpu()


@pytest.mark.parametrize("mode", ["eager", "defer_and_fuse", "compile"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_grouped_mm_matches_the_cpu(layout: str, mode: str) -> None:
    torch.manual_seed(0)
    a_shape, b_shape, offs = LAYOUTS[layout]
    a, b = torch.randn(a_shape), torch.randn(b_shape)
    expected = _run(torch._grouped_mm, a, b, offs, "cpu")
    if mode == "compile":
        torch._dynamo.reset()
        actual = _run(torch.compile(torch._grouped_mm, backend="tpu"), a, b, offs, TPU)
    else:
        with torchtpu.eager_mode(mode):
            actual = _run(torch._grouped_mm, a, b, offs, TPU)
    for name, x, y in zip(("result", "grad a", "grad b"), actual, expected):
        torch.testing.assert_close(x, y, msg=f"{layout} {mode}: {name}")


def test_grouped_mm_in_bfloat16_matches_the_cpu() -> None:
    torch.manual_seed(0)
    a, b = torch.randn(16, 16, dtype=torch.bfloat16), torch.randn(4, 16, 16, dtype=torch.bfloat16)  # 16-byte strides
    expected = torch._grouped_mm(a, b, OFFS)
    actual = torch._grouped_mm(a.to(TPU), b.to(TPU), OFFS.to(TPU)).cpu()
    assert actual.dtype == torch.bfloat16
    torch.testing.assert_close(actual, expected)


def test_grouped_mm_refuses_what_the_cpu_refuses() -> None:
    a, b = torch.randn(16, 8), torch.randn(4, 8, 12)
    for offs in (OFFS.long(), None):
        with pytest.raises(RuntimeError):
            torch._grouped_mm(a, b, offs)
        with pytest.raises(RuntimeError):
            torch._grouped_mm(a.to(TPU), b.to(TPU), offs.to(TPU) if offs is not None else None)
