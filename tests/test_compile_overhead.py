"""What a compiled call costs on the host, counted (never timed): the path from Dynamo to our
runner has no extra layer, one call runs one program, and the guard-filter option reaches Dynamo."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import torchtpu
from torchtpu.compile import fx_lowering


def _functional_step(options: dict | None = None) -> tuple[Callable[[], torch.Tensor], Callable]:
    """A small one-program training step (forward, backward and in-place SGD)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).to("tpu")
    params = {k: v.detach() for k, v in model.named_parameters()}
    x, y = torch.randn(5, 8).to("tpu"), torch.tensor([0, 1, 2, 3, 0]).to("tpu")

    def loss_fn(p: dict, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(torch.func.functional_call(model, p, (x,)), y)

    def step(p: dict, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        grads, loss = torch.func.grad_and_value(loss_fn)(p, x, y)
        for k in p:
            p[k].sub_(grads[k], alpha=0.1)
        return loss

    compiled = torch.compile(step, backend="tpu", fullgraph=True, options=options)
    return (lambda: compiled(params, x, y)), step


def _leaf_guards(fn: Callable) -> int:
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    def count(manager: Any) -> int:
        return len(manager.get_leaf_guards()) + sum(count(c) for c in manager.get_child_managers())

    entries = _debug_get_cache_entry_list(fn.__code__)
    assert len(entries) == 1
    return count(entries[0].guard_manager.root)


def test_one_call_runs_one_program_and_compiles_nothing():
    torch._dynamo.reset()
    call, _ = _functional_step()
    call()
    call()
    torchtpu.metrics.reset()
    for _ in range(3):
        call()
    m = torchtpu.metrics.snapshot()
    assert (m["compiles"], m["executions"]) == (0, 3)


def test_runner_is_called_by_aot_wrapper_directly(monkeypatch):
    """CompiledGraph carries _boxed_call, so AOTAutograd's generated runtime wrapper calls it
    with the argument list itself: no make_boxed_func layer in between."""
    callers = []
    original = fx_lowering.CompiledGraph.__call__

    def spy(self: Any, args: list) -> Any:
        callers.append(sys._getframe(1).f_code.co_name)
        return original(self, args)

    monkeypatch.setattr(fx_lowering.CompiledGraph, "__call__", spy)
    torch._dynamo.reset()
    call, _ = _functional_step()
    call()
    call()
    assert callers == ["_runtime_wrapper", "_runtime_wrapper"]


def test_guard_filter_option_reaches_dynamo():
    """options={"guard_filter_fn": ...} is Dynamo's, not the backend's: backend "tpu" accepts
    it, and keeping only tensor guards leaves fewer guards to evaluate per call."""
    torch._dynamo.reset()
    call, step = _functional_step()
    expected = call().item()
    full = _leaf_guards(step)
    torch._dynamo.reset()
    call, step = _functional_step({"guard_filter_fn": torch.compiler.keep_tensor_guards_unsafe})
    assert call().item() == pytest.approx(expected, rel=0, abs=0)
    assert _leaf_guards(step) < full
