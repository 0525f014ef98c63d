"""``torch.compile(model)`` with PyTorch's default backend (inductor) on tpu tensors: the
graph compiles with backend "tpu" (torchtpu/compile/default_backend.py). Before, inductor
generated Pallas code for the device type "tpu" (Google's TorchTPU) and failed with
``No module named 'torch_tpu'``."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn as nn

import torchtpu
from torchtpu.compile.default_backend import computes_on_tpu

TPU = "tpu"


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 2))


def _compiles() -> int:
    return torchtpu.metrics.snapshot()["compiles"]


@pytest.mark.parametrize("rows,how", [(3, "torch.compile"), (5, "backend=inductor"), (6, "Module.compile")])
def test_default_backend_compiles_tpu_graphs_with_xla(rows: int, how: str) -> None:
    cpu = _mlp()
    dev = copy.deepcopy(cpu).to(TPU)
    if how == "Module.compile":
        dev.compile()
        compiled = dev
    else:
        compiled = torch.compile(dev, **({"backend": "inductor"} if how == "backend=inductor" else {}))
    x = torch.randn(rows, 4)  # a batch size of its own: programs of its own to count
    before = _compiles()
    out = compiled(x.to(TPU))
    out.square().sum().backward()
    assert _compiles() > before  # XLA programs, not inductor kernels
    want = cpu(x)
    want.square().sum().backward()
    torch.testing.assert_close(out.detach().cpu(), want.detach())
    for p_dev, p_cpu in zip(dev.parameters(), cpu.parameters()):
        torch.testing.assert_close(p_dev.grad.cpu(), p_cpu.grad)


def test_inductor_settings_warn_once_that_they_do_not_apply() -> None:
    from torchtpu.compile import default_backend

    default_backend._warned[0] = False
    dev = _mlp().to(TPU)
    x = torch.randn(3, 4).to(TPU)
    with pytest.warns(UserWarning, match=r"inductor settings .*max_autotune.* do not apply on tpu"):
        torch.compile(dev, mode="max-autotune")(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.compile(dev, mode="max-autotune")(x * 2)


def test_a_graph_that_only_creates_tpu_tensors_is_routed_too() -> None:
    """No tpu input at all: a factory inside the graph makes the tpu tensor."""
    compiled = torch.compile(lambda n: torch.ones(n, device=TPU) * 2)
    assert torch.equal(compiled(3).cpu(), torch.full((3,), 2.0))


def test_cpu_graphs_stay_with_inductor() -> None:
    """The routing decision on Dynamo's own graphs: CPU-only graphs are not tpu's (they go
    to inductor unchanged; inductor itself is not run here, its C++ build takes seconds)."""
    seen = []

    def capture(gm: torch.fx.GraphModule, inputs: list) -> object:
        seen.append(computes_on_tpu(gm, inputs))
        return gm.forward

    model = _mlp()
    torch._dynamo.reset()
    torch.compile(model, backend=capture)(torch.randn(3, 4))
    torch.compile(copy.deepcopy(model).to(TPU), backend=capture)(torch.randn(3, 4).to(TPU))
    assert seen == [False, True]
