"""TorchScript on tpu as on CUDA: tracing a model on the device, and moving a scripted or
loaded module there (``.to("tpu")``, ``map_location="tpu"``), then running and training it."""

from __future__ import annotations

import io

import torch
from torch import nn
from utils import TPU, assert_close


def _cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.ConvTranspose2d(4, 2, 3, stride=2), nn.Flatten(), nn.Linear(2 * 13 * 13, 5)
    )


def _grads(module: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    module.train()
    out = module(x)
    out.square().mean().backward()
    return out.detach().cpu(), {k: p.grad.cpu() for k, p in module.named_parameters()}


def test_a_model_traced_on_tpu_runs_and_trains_as_on_the_cpu():
    """``torch.jit.trace`` of a conv net on tpu failed: the meta kernels read sizes while the
    tracer made every size a tensor ("cond must be a bool, but got a Tensor"), and the tracer
    records a convolution as ``aten::_convolution``, which the tpu kernel never called."""
    x = torch.randn(2, 3, 8, 8)
    want_out, want_grads = _grads(torch.jit.trace(_cnn().eval(), x), x)
    traced = torch.jit.trace(_cnn().eval().to(TPU), x.to(TPU))
    assert "aten::_convolution" in str(traced.inlined_graph)
    got_out, got_grads = _grads(traced, x.to(TPU))
    assert_close(got_out, want_out)
    for name in want_grads:
        assert_close(got_grads[name], want_grads[name], msg=name)


def test_a_scripted_module_saved_on_the_cpu_moves_to_tpu_and_trains():
    """``.to("tpu")`` of a loaded TorchScript module asserted "param must be a Parameter":
    its parameters are attributes of the C++ module, which neither PyTorch's swap nor its
    new-Parameter path can replace for a device without shallow-copy compatibility."""
    x = torch.randn(2, 3, 8, 8)
    blob = io.BytesIO()
    torch.jit.save(torch.jit.script(_cnn()), blob)
    blob.seek(0)
    want_out, want_grads = _grads(torch.jit.load(blob), x)
    for load in (lambda: torch.jit.load(blob).to(TPU), lambda: torch.jit.load(blob, map_location=TPU)):
        blob.seek(0)
        module = load()
        assert all(p.device.type == "tpu" and p.requires_grad for p in module.parameters())
        assert all(b.device.type == "tpu" for b in module.buffers())
        got_out, got_grads = _grads(module, x.to(TPU))
        assert_close(got_out, want_out)
        for name in want_grads:
            assert_close(got_grads[name], want_grads[name], msg=name)
        assert module.to("cpu")(x).device.type == "cpu"
