"""The core ATen opset (every overload tagged torch.Tag.core): each has a lowering rule,
a runtime kernel, or a decomposition that lowers to ops with rules, unless it is listed
(with a reason) in torchtpu/testing/expected_failures.py CORE_MISSING."""

from __future__ import annotations

import warnings

import pytest
import torch
from utils import assert_close, to_tpu

import torchtpu  # noqa: F401  (registers the "tpu" device)
from torchtpu import coverage
from torchtpu.lowering import registry
from torchtpu.lowering.context import ProgramContext, lower_call
from torchtpu.stablehlo.builder import Value
from torchtpu.testing.expected_failures import CORE_MISSING

aten = torch.ops.aten
CORE = coverage.core_overloads()


def test_core_opset_is_enumerated() -> None:
    names = {str(op) for op in CORE}
    assert len(CORE) > 150
    assert {"aten.add.Tensor", "aten.convolution.default", "aten.var.dim"} <= names


@pytest.mark.parametrize("op", CORE, ids=[str(op) for op in CORE])
def test_core_overload_is_covered(op: torch._ops.OpOverload) -> None:
    entry = coverage.classify_core(op)
    assert entry.status != "missing", f"{op}: {entry.how}"
    if entry.status == "expected-missing":
        pytest.xfail(entry.how)


def test_core_missing_table_is_current() -> None:
    """An entry of CORE_MISSING that is now covered should be deleted (warn, don't fail:
    other workstreams land rules independently)."""
    names = {str(op) for op in CORE}
    unknown = [n for n in CORE_MISSING if n not in names]
    assert not unknown, f"not core overloads: {unknown}"
    stale = [str(op) for op in CORE if str(op) in CORE_MISSING and coverage.classify_core(op).status != "expected-missing"]
    if stale:
        warnings.warn(f"CORE_MISSING entries now covered, delete them: {stale}", stacklevel=1)


def _v(shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> Value:
    return ProgramContext().b.param(shape, dtype)


# Example calls for the core overloads that are decomposed: lowering them must reach only
# ops that have rules (traced on meta stand-ins; no device needed).
DECOMPOSED_EXAMPLES = {
    "aten.adaptive_avg_pool1d.default": lambda: ((_v((2, 3, 8)), [4]), {}),
    "aten.avg_pool1d.default": lambda: ((_v((2, 3, 8)), [2], [2]), {}),
    "aten.col2im.default": lambda: ((_v((1, 12, 9)), [4, 4], [2, 2], [1, 1], [0, 0], [1, 1]), {}),
    "aten.grid_sampler_2d.default": lambda: ((_v((1, 2, 4, 4)), _v((1, 3, 3, 2)), 0, 0, False), {}),
    "aten.reflection_pad1d.default": lambda: ((_v((2, 3, 8)), [2, 1]), {}),
    "aten.reflection_pad2d.default": lambda: ((_v((2, 3, 8, 8)), [2, 1, 1, 2]), {}),
    "aten.reflection_pad3d.default": lambda: ((_v((1, 2, 4, 4, 4)), [1, 1, 1, 1, 1, 1]), {}),
    "aten.replication_pad2d.default": lambda: ((_v((2, 3, 8, 8)), [2, 1, 1, 2]), {}),
    "aten.replication_pad3d.default": lambda: ((_v((1, 2, 4, 4, 4)), [1, 1, 1, 1, 1, 1]), {}),
    "aten.upsample_bilinear2d.vec": lambda: ((_v((1, 2, 4, 4)), [8, 8], False, None), {}),
    "aten.upsample_nearest2d.vec": lambda: ((_v((1, 2, 4, 4)), [8, 8], None), {}),
    "aten.var.dim": lambda: ((_v((3, 5)), [1]), {}),
    "aten._cdist_forward.default": lambda: ((_v((2, 4, 3)), _v((2, 5, 3)), 2.0, None), {}),
    "aten._pdist_forward.default": lambda: ((_v((5, 3)), 2.0), {}),
}

DECOMPOSED = [op for op in CORE if coverage.classify_core(op).status == "decomposed"]


@pytest.mark.parametrize("op", DECOMPOSED, ids=[str(op) for op in DECOMPOSED])
def test_decomposed_core_op_lowers_to_rules(op: torch._ops.OpOverload) -> None:
    example = DECOMPOSED_EXAMPLES.get(str(op))
    assert example is not None, f"add an example call for {op} to DECOMPOSED_EXAMPLES"
    registry._load_rules()
    ctx = ProgramContext()
    args, kwargs = example()
    # rebuild the stand-ins in this context's builder so the module prints
    args = [ctx.b.param(a.shape, a.dtype) if isinstance(a, Value) else a for a in args]
    out = lower_call(ctx, op, args, kwargs, None)
    flat = [o for o in (out if isinstance(out, (tuple, list)) else [out]) if isinstance(o, Value)]
    meta = op(*[torch.empty(a.shape, dtype=a.dtype, device="meta") if isinstance(a, Value) else a for a in args], **kwargs)
    metas = [m for m in (meta if isinstance(meta, (tuple, list)) else [meta]) if isinstance(m, torch.Tensor)]
    assert [o.shape for o in flat] == [tuple(m.shape) for m in metas]
    assert "stablehlo" in ctx.b.module(flat)


def _real_args(op: torch._ops.OpOverload) -> tuple[list[object], dict[str, object]]:
    """The DECOMPOSED_EXAMPLES call for ``op`` with each stand-in replaced by a seeded random
    CPU tensor of its shape and dtype."""
    torch.manual_seed(0)
    args, kwargs = DECOMPOSED_EXAMPLES[str(op)]()
    real: list[object] = [torch.randn(a.shape, dtype=a.dtype) if isinstance(a, Value) else a for a in args]
    if op is aten.grid_sampler_2d.default:
        # sampling coordinates are normalised to [-1, 1]; outside it only padding is tested
        real[1] = torch.rand(args[1].shape, dtype=args[1].dtype) * 2 - 1
    return real, kwargs


@pytest.mark.parametrize("op", DECOMPOSED, ids=[str(op) for op in DECOMPOSED])
def test_decomposed_core_op_runs_like_cpu(op: torch._ops.OpOverload) -> None:
    """The decomposed overload called directly on tpu tensors matches the CPU kernel at
    PyTorch's default tolerances."""
    assert str(op) in DECOMPOSED_EXAMPLES, f"add an example call for {op} to DECOMPOSED_EXAMPLES"
    args, kwargs = _real_args(op)
    expected = op(*args, **kwargs)
    actual = op(*to_tpu(args), **kwargs)
    outs = actual if isinstance(actual, (tuple, list)) else [actual]
    assert all(o.device.type == "tpu" for o in outs if isinstance(o, torch.Tensor))
    assert_close(actual, expected)
