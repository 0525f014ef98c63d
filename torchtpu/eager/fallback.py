"""TORCHTPU_CPU_FALLBACK=1: run an op we cannot lower on the host, with a one-time warning."""

from __future__ import annotations

import warnings
from contextlib import ExitStack
from typing import Any

import torch
from torch.utils._pytree import tree_map

from .. import _spans, metrics, op_report

_warned: set[str] = set()


def run_on_cpu(op: Any, args: tuple, kwargs: dict) -> Any:
    name = op.name() if hasattr(op, "name") else str(op)
    if name not in _warned:
        _warned.add(name)
        warnings.warn(
            f"torchtpu: '{name}' has no tpu lowering; running it on the CPU (TORCHTPU_CPU_FALLBACK=1). "
            "This copies its inputs to the host and back.",
            stacklevel=3,
        )
    metrics.add("cpu_fallbacks")
    metrics.add(metrics.FALLBACK_PREFIX + name)
    with ExitStack() as observed:  # its host copies are part of the fallback, not syncs of their own
        if op_report.recorder is not None:
            op_report.recorder.record(op_report.MISSING, name, "ran on the CPU")
            observed.enter_context(op_report.recorder.quiet())
        if _spans.explain is not None:
            _spans.explain.cpu_fallback(name)
            observed.enter_context(_spans.explain.quiet())
        observed.enter_context(_spans.maybe_span(f"torchtpu::cpu_fallback ({name})", op=name))
        return _run_on_cpu(op, name, args, kwargs)


def _run_on_cpu(op: Any, name: str, args: tuple, kwargs: dict) -> Any:
    from .minimal import from_cpu, to_cpu

    originals: dict[int, torch.Tensor] = {}

    def down(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.device.type == "tpu":
            c = to_cpu(x)
            originals[id(c)] = x
            return c
        if isinstance(x, torch.device) and x.type == "tpu":
            return torch.device("cpu")
        return x

    cargs = tree_map(down, args)
    ckwargs = tree_map(down, kwargs)
    out = op(*cargs, **ckwargs)
    # write mutated inputs back
    schema = op._schema
    for i, a in enumerate(schema.arguments):
        if a.alias_info is not None and a.alias_info.is_write:
            v = cargs[i] if i < len(cargs) else ckwargs.get(a.name)
            for c in (v if isinstance(v, (list, tuple)) else [v]):
                if isinstance(c, torch.Tensor) and id(c) in originals:
                    orig = originals[id(c)]
                    if orig.shape != c.shape:
                        orig.resize_(c.shape)
                    orig.copy_(c)

    def up(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            if id(x) in originals:
                return originals[id(x)]
            if x.layout is not torch.strided:  # e.g. embedding_bag(sparse=True)'s gradient
                from .register import sparse_not_supported

                raise sparse_not_supported(name)
            return from_cpu(x)
        return x

    return tree_map(up, out)
