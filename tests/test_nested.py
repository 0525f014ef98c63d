"""Nested tensors on tpu against the CPU: jagged ones (``layout=torch.jagged``), whose ops
run as ordinary tpu ops plus the two fused conversions (lowering/decomp_nested.py), and
strided ones (the default layout), which pad, unbind and print; other ops on them raise a
message that names the jagged layout."""

from __future__ import annotations

import pytest
import torch

import torchtpu
from tests.utils import TPU
from torchtpu.errors import TpuError

aten = torch.ops.aten

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # "nested tensors are a prototype"


def _mode(mode: str) -> object:
    return torchtpu.eager_mode("defer_and_fuse" if mode == "defer" else "eager")


def _jagged(dev: str) -> dict[str, torch.Tensor]:
    out = {}
    values = torch.arange(12.0, device=dev).view(6, 2)
    offsets = torch.tensor([0, 2, 2, 6], device=dev)  # an empty sequence in the middle
    out["padded, cut to 3"] = aten._jagged_to_padded_dense_forward(values, [offsets], [3], -1.0)
    padded = aten._jagged_to_padded_dense_forward(values, [offsets], [5], 0.0)
    out["padded to 5"] = padded
    out["back, total_L given"] = aten._padded_dense_to_jagged_forward(padded, [offsets], 6)
    out["back, total_L read"] = aten._padded_dense_to_jagged_forward(padded, [offsets])
    out["int32 values"] = aten._jagged_to_padded_dense_forward(values.int(), [offsets], [3], -1.0)
    parts = [torch.randn(n, 4, generator=torch.Generator().manual_seed(n)).to(dev) for n in (2, 5, 3)]
    nt = torch.nested.nested_tensor(parts, layout=torch.jagged)
    out["to_padded_tensor"] = nt.to_padded_tensor(0.0)
    out["softmax along the ragged dim"] = nt.softmax(dim=1).to_padded_tensor(0.0)
    out["layer_norm"] = torch.nn.functional.layer_norm(nt, (4,)).to_padded_tensor(0.0)
    out["(x * 2).sum(dim=1)"] = (torch.nested.nested_tensor_from_jagged(nt.values(), nt.offsets()) * 2).sum(dim=1)
    leaf = torch.randn(10, 4, generator=torch.Generator().manual_seed(3)).to(dev).requires_grad_()
    padded = torch.nested.nested_tensor_from_jagged(leaf, torch.tensor([0, 2, 7, 10], device=dev)).to_padded_tensor(0.0)
    (padded * torch.arange(float(padded.shape[1]), device=dev).view(1, -1, 1)).sum().backward()
    out["gradient through to_padded_tensor"] = leaf.grad
    return {k: v.cpu() for k, v in out.items()}


@pytest.mark.parametrize("mode", ["eager", "defer"])
def test_jagged_nested_tensors_match_the_cpu(mode: str) -> None:
    with _mode(mode):
        got = _jagged(TPU)
    want = _jagged("cpu")
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, msg=name)


def test_compiling_a_jagged_nested_tensor_says_what_runs_it() -> None:
    def f(values: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return torch.nested.nested_tensor_from_jagged(values, offsets).softmax(dim=1).to_padded_tensor(0.0)

    with pytest.raises(TpuError, match="jagged nested tensors.*uncompiled"):
        torch.compile(f, backend="tpu")(torch.randn(5, 3, device=TPU), torch.tensor([0, 2, 5], device=TPU))


def _strided(dev: str) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ragged_2d = [torch.randn(2, 3, generator=g), torch.randn(4, 1, generator=g), torch.randn(1, 5, generator=g)]
    ragged_3d = [torch.randn(2, 3, 4, generator=g), torch.randn(1, 2, 4, generator=g)]
    nested = torch.nested.nested_tensor
    return {
        "1-d components": nested([torch.ones(2), torch.arange(3.0)], device=dev).to_padded_tensor(0.0).cpu(),
        "2-d, ragged in both dims": nested(ragged_2d, device=dev).to_padded_tensor(-1.0).cpu(),
        "2-d, output_size": nested(ragged_2d, device=dev).to_padded_tensor(7.0, output_size=(3, 6, 6)).cpu(),
        "3-d": nested(ragged_3d, device=dev).to_padded_tensor(0.5).cpu(),
        "unbind": torch.cat([t.reshape(-1) for t in nested(ragged_2d, device=dev).unbind()]).cpu(),
    }


def test_strided_nested_tensors_pad_unbind_and_print_as_on_the_cpu() -> None:
    got, want = _strided(TPU), _strided("cpu")
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, msg=name)
    nt = torch.nested.nested_tensor([torch.ones(2), torch.arange(3.0)], device=TPU)
    printed = repr(nt)
    assert printed.startswith("nested_tensor([") and printed.endswith("], device='tpu:0')")
    assert "tensor([1., 1.], device='tpu:0')" in printed and "tensor([0., 1., 2.], device='tpu:0')" in printed
    with pytest.raises(RuntimeError, match="unbound along dimension 0"):
        nt.unbind(1)


def test_other_ops_on_strided_nested_tensors_name_the_jagged_layout() -> None:
    nt = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)], device=TPU)
    with pytest.raises(NotImplementedError, match=r"aten::mul\.Tensor .*strided nested.*layout=torch\.jagged"):
        nt * 2
