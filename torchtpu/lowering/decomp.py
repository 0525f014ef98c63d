"""Decompositions: PyTorch's tables for ops without a rule, plus our own (in ``OWN``)."""

from __future__ import annotations

import functools
from typing import Any

import torch

from . import registry

# Our own decompositions, for ops PyTorch's tables miss or decompose badly.
OWN: dict[Any, Any] = {}


def register_own(*ops: Any) -> Any:
    def deco(fn: Any) -> Any:
        for op in ops:
            OWN[op] = fn
        return fn

    return deco


@functools.cache
def _pytorch_tables() -> tuple[dict, dict]:
    from torch._decomp import core_aten_decompositions, decomposition_table

    return dict(core_aten_decompositions()), dict(decomposition_table)


def decomposition_for(op: Any) -> Any:
    """The decomposition used for ``op`` when it has no rule (None if there is none)."""
    if op in OWN:
        return OWN[op]
    core, full = _pytorch_tables()
    fn = core.get(op) or full.get(op)
    if fn is None and isinstance(op, torch._ops.OpOverload):
        # CompositeImplicitAutograd ops decompose through their own kernel when traced.
        if torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd"):
            return functools.partial(_composite_implicit, op)
    return fn


def _composite_implicit(op: Any, *args: Any, **kwargs: Any) -> Any:
    return op.decompose(*args, **kwargs)


def has_decomposition(op: Any) -> bool:
    return decomposition_for(op) is not None


def tracing_table() -> dict:
    """What make_fx may decompose while tracing: every op that has no rule."""
    return _tracing_table(len(registry.RULES), len(OWN))


@functools.cache
def _tracing_table(_n_rules: int, _n_own: int) -> dict:
    core, full = _pytorch_tables()
    table = {**full, **core, **OWN}
    return {op: fn for op, fn in table.items() if op not in registry.RULES}
