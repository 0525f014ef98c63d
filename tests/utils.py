"""Helpers that compare an op on tpu against the same op on CPU, forward and backward."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map

from torchtpu.testing.opinfo import summed_error

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


def _leaves(args: Any) -> list[torch.Tensor]:
    return [t for t in tree_flatten(args)[0] if isinstance(t, torch.Tensor) and t.requires_grad]


def _grad_outputs(out: Any) -> list[torch.Tensor]:
    return [o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor) and o.requires_grad]


def _cotangents(outs: list[torch.Tensor]) -> list[torch.Tensor]:
    torch.manual_seed(1234)
    return [torch.randn(o.shape, dtype=o.dtype) for o in outs]


def _grads(outs: list[torch.Tensor], leaves: list[torch.Tensor], cot: list[torch.Tensor]) -> tuple[Any, ...]:
    """The gradients of ``outs`` with cotangents ``cot`` (moved to the outputs' device and dtype)."""
    cot = [c.to(device=o.device, dtype=o.dtype) for c, o in zip(cot, outs)]
    return torch.autograd.grad(outs, leaves, cot, allow_unused=True)


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
    cpu_leaves, tpu_leaves = _leaves(cpu_args), _leaves(tpu_args)
    e_outs, a_outs = _grad_outputs(expected), _grad_outputs(actual)
    if not cpu_leaves or not e_outs:
        return
    cot = _cotangents(e_outs)
    e_grads = _grads(e_outs, cpu_leaves, cot)
    a_grads = _grads(a_outs, tpu_leaves, cot)
    for a, e in zip(a_grads, e_grads):
        if e is None:
            assert a is None or not a.cpu().any()
        else:
            torch.testing.assert_close(a.cpu(), e, equal_nan=True, **tol)


# -- float64-refereed comparison (16-bit results) -------------------------------------------------
def to_float64(x: Any) -> Any:
    """CPU float64 copies of the floating tensors in ``x`` (gradient flags kept), for the
    reference run of an op whose 16-bit results are judged by assert_close_or_closer."""

    def one(t: Any) -> Any:
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            return t
        return t.detach().cpu().to(torch.float64).requires_grad_(t.requires_grad)

    return tree_map(one, x)


def _distance(x: torch.Tensor, ref: torch.Tensor) -> float:
    """Summed absolute difference from ``ref`` (the conformance harness's float64 referee)."""
    return summed_error([x], [ref])


def assert_close_or_closer(actual: Any, expected: Any, reference: Any) -> None:
    """``actual`` (tpu) passes torch.testing.assert_close against ``expected`` (the CPU, same
    dtypes) at PyTorch's default tolerances, or is no farther than ``expected`` from
    ``reference`` (the same computation on float64 copies of the inputs, on the CPU): the
    absolute error summed over every float tensor of the result may not exceed the CPU's.
    That is how PyTorch's test_ops ``_ref_test_helper`` judges a reference implementation.
    Non-float tensors must match exactly."""
    a, _ = tree_flatten(to_cpu(actual))
    e, _ = tree_flatten(to_cpu(expected))
    r, _ = tree_flatten(to_cpu(reference))
    assert len(a) == len(e) == len(r), f"{len(a)} outputs vs {len(e)} expected and {len(r)} in the reference"
    failures, d_tpu, d_cpu = [], 0.0, 0.0
    for i, (x, y, z) in enumerate(zip(a, e, r)):
        if not isinstance(y, torch.Tensor):
            assert x == y, (x, y)
            continue
        assert (x.dtype, x.shape) == (y.dtype, y.shape), f"output {i}: {x.dtype}{list(x.shape)} vs {y.dtype}{list(y.shape)}"
        if not y.is_floating_point():
            torch.testing.assert_close(x, y, msg=lambda m, i=i: f"output {i}: {m}")
            continue
        d_tpu, d_cpu = d_tpu + _distance(x, z), d_cpu + _distance(y, z)
        try:
            torch.testing.assert_close(x, y, equal_nan=True)
        except AssertionError as err:
            failures.append(f"output {i} ({y.dtype}{list(y.shape)}): {err}")
    if failures and d_tpu > d_cpu:
        raise AssertionError(
            f"tpu is farther from the float64 result than the CPU is (summed |error| {d_tpu:.6g} vs {d_cpu:.6g}), "
            "and not within PyTorch's default tolerances of the CPU:\n" + "\n".join(failures)
        )


def check_refereed(fn: Callable[..., Any], *args: Any, grad: bool = True) -> None:
    """``check`` for ops with 16-bit inputs or results: outputs and gradients (with the same
    cotangents) judged by assert_close_or_closer against ``fn`` on float64 copies on the CPU."""
    cpu_args = tree_map(lambda t: t.clone().requires_grad_(t.requires_grad) if isinstance(t, torch.Tensor) else t, args)
    tpu_args, f64_args = to_tpu(args), to_float64(args)
    expected, actual, reference = fn(*cpu_args), fn(*tpu_args), fn(*f64_args)
    assert_close_or_closer(actual, expected, reference)
    e_outs = _grad_outputs(expected)
    if not grad or not _leaves(cpu_args) or not e_outs:
        return
    cot = _cotangents(e_outs)
    e_grads = _grads(e_outs, _leaves(cpu_args), cot)
    a_grads = _grads(_grad_outputs(actual), _leaves(tpu_args), cot)
    r_grads = _grads(_grad_outputs(reference), _leaves(f64_args), cot)
    for a, e in zip(a_grads, e_grads):
        assert e is not None or a is None or not a.cpu().any()
    defined = [i for i, e in enumerate(e_grads) if e is not None]
    assert_close_or_closer([a_grads[i] for i in defined], [e_grads[i] for i in defined], [r_grads[i] for i in defined])
