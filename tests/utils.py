"""Helpers that compare an op on tpu against the same op on CPU, forward and backward."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map

TPU = torch.device("tpu")


def to_tpu(x: Any) -> Any:
    return tree_map(lambda t: t.detach().to(TPU).requires_grad_(t.requires_grad) if isinstance(t, torch.Tensor) else t, x)


def to_cpu(x: Any) -> Any:
    return tree_map(lambda t: t.detach().cpu() if isinstance(t, torch.Tensor) else t, x)


def assert_close(actual: Any, expected: Any, **tol: Any) -> None:
    """torch.testing.assert_close after moving ``actual`` to the CPU (PyTorch's default
    tolerances per dtype unless given)."""
    a, _ = tree_flatten(to_cpu(actual))
    e, _ = tree_flatten(to_cpu(expected))
    assert len(a) == len(e), f"{len(a)} outputs vs {len(e)} expected"
    for x, y in zip(a, e):
        if isinstance(y, torch.Tensor):
            torch.testing.assert_close(x, y, equal_nan=True, **tol)
        else:
            assert x == y, (x, y)


def check(fn: Callable[..., Any], *args: Any, grad: bool = True, **tol: Any) -> None:
    """Run ``fn`` on CPU inputs and on tpu copies; compare outputs, and (for float inputs
    that require grad) the gradients of the sum of every float output."""
    cpu_args = tree_map(lambda t: t.clone().requires_grad_(t.requires_grad) if isinstance(t, torch.Tensor) else t, args)
    tpu_args = to_tpu(args)
    expected = fn(*cpu_args)
    actual = fn(*tpu_args)
    assert_close(actual, expected, **tol)
    if not grad:
        return
    cpu_leaves = [t for t in tree_flatten(cpu_args)[0] if isinstance(t, torch.Tensor) and t.requires_grad]
    tpu_leaves = [t for t in tree_flatten(tpu_args)[0] if isinstance(t, torch.Tensor) and t.requires_grad]
    if not cpu_leaves:
        return
    e_outs = [o for o in tree_flatten(expected)[0] if isinstance(o, torch.Tensor) and o.requires_grad]
    a_outs = [o for o in tree_flatten(actual)[0] if isinstance(o, torch.Tensor) and o.requires_grad]
    if not e_outs:
        return
    torch.manual_seed(1234)
    cot = [torch.randn(o.shape, dtype=o.dtype) for o in e_outs]
    e_grads = torch.autograd.grad(e_outs, cpu_leaves, cot, allow_unused=True)
    a_grads = torch.autograd.grad(a_outs, tpu_leaves, [c.to(TPU) for c in cot], allow_unused=True)
    for a, e in zip(a_grads, e_grads):
        if e is None:
            assert a is None or not a.cpu().any()
        else:
            torch.testing.assert_close(a.cpu(), e, equal_nan=True, **tol)
