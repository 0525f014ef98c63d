"""THE lowering registry: ``OpOverload -> rule``. Eager, deferred and compiled paths all read it.

A rule is ``rule(L, *args, **kwargs) -> Value | tuple[Value, ...] | list[Value]`` where
``L`` is a :class:`~torchtpu.lowering.context.NodeLowering` (the builder, the output
shapes/dtypes PyTorch's meta kernels computed, and helpers), tensor arguments are
:class:`~torchtpu.stablehlo.builder.Value` s and every other argument is what the op's
schema says (Python numbers may also arrive as 0-d ``ScalarValue`` operands: use
``L.scalar``/``L.promote`` to treat both alike).

Register with the decorator::

    @register(aten.add.Tensor, aten.add.Scalar)
    def add(L, x, y, alpha=1): ...
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

Rule = Callable[..., Any]

RULES: dict[torch._ops.OpOverload, Rule] = {}

# Ops whose Python-number arguments must stay compile-time constants (never lifted to
# device operands), e.g. because the value decides the program's structure.
STATIC_SCALARS: set[torch._ops.OpOverload] = set()

# Ops that draw random numbers: their programs take the device RNG state as an operand.
RANDOM: set[torch._ops.OpOverload] = set()


def register(
    *ops: torch._ops.OpOverload | torch._ops.OpOverloadPacket, static_scalars: bool = False, random: bool = False
) -> Callable[[Rule], Rule]:
    """Register ``rule`` for each op; a packet registers all of its overloads."""

    def deco(rule: Rule) -> Rule:
        for op in ops:
            overloads = (
                [getattr(op, name) for name in op.overloads()]
                if isinstance(op, torch._ops.OpOverloadPacket)
                else [op]
            )
            for ov in overloads:
                RULES[ov] = rule
                if static_scalars:
                    STATIC_SCALARS.add(ov)
                if random:
                    RANDOM.add(ov)
        return rule

    return deco


# Ops whose output metadata comes from a function of ours instead of PyTorch's Meta kernel,
# because that kernel refuses calls every real kernel runs (it mirrors one CUDA fast path).
# Eager mode computes its results' metadata with it, and torch.compile's fake tensors on
# the tpu device use it (``_fake_impl``); other devices keep PyTorch's kernel.
META: dict[torch._ops.OpOverload, Rule] = {}


def register_meta(*ops: torch._ops.OpOverload) -> Callable[[Rule], Rule]:
    """``meta(*args, **kwargs)`` gives ``op``'s results for meta or fake tensor arguments."""

    def deco(meta: Rule) -> Rule:
        for op in ops:
            META[op] = meta
        _install_fake_impl()
        return meta

    return deco


_fake_impl_installed = False


def _install_fake_impl() -> None:
    global _fake_impl_installed
    if _fake_impl_installed:
        return
    from torch._subclasses.fake_impls import register_op_impl

    register_op_impl(lambda func: func in META)(_fake_impl)
    _fake_impl_installed = True


def _fake_impl(fake_mode: Any, func: torch._ops.OpOverload, *args: Any, **kwargs: Any) -> Any:
    """A fake tensor call of a ``META`` op: ours on tpu tensors, PyTorch's elsewhere."""
    from torch.utils._pytree import tree_leaves

    device = torch._C._get_privateuse1_backend_name()
    if not any(isinstance(a, torch.Tensor) and a.device.type == device for a in tree_leaves((args, kwargs))):
        return NotImplemented
    with fake_mode:
        return META[func](*args, **kwargs)


def has_rule(op: torch._ops.OpOverload) -> bool:
    return op in RULES


def _load_rules() -> None:
    """Import every rule family (each registers itself)."""
    from .rules import load_all

    load_all()
