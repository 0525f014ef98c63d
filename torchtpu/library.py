"""Giving third-party ops a tpu lowering: ``torchtpu.library.register_lowering``.

A library that defines its own op (``torch.library.custom_op``) adds tpu support by
registering a lowering rule for it, written exactly as torchtpu's own rules are
(``torchtpu/lowering/rules/``)::

    @torch.library.custom_op("mylib::scaled_tanh", mutates_args=())
    def scaled_tanh(x: torch.Tensor, scale: float) -> torch.Tensor:
        return torch.tanh(x) * scale

    @scaled_tanh.register_fake
    def _(x, scale):
        return torch.empty_like(x)

    @torchtpu.library.register_lowering(scaled_tanh)
    def _(L, x, scale):  # L: the rule context; x: a stablehlo Value
        t = L.b.unary("tanh", x)
        return L.b.binary("multiply", t, L.full(scale, x.shape, x.dtype))

The rule receives ``L`` (:class:`~torchtpu.lowering.context.NodeLowering`: ``L.b`` the
program builder, ``L.out`` the output shapes and dtypes PyTorch's fake kernel promised,
helpers such as ``L.full``, ``L.to``, ``L.broadcast_to``, ``L.lower(aten_op, ...)``),
then the op's arguments: tensors as :class:`~torchtpu.stablehlo.builder.Value`, the rest
as the schema says. It returns one Value per tensor output (a tuple for several).

From then on the op runs on tpu tensors in eager mode (one cached program per shape),
inside DeferAndFuse graphs (fused with the ops around it) and in
``torch.compile(backend="tpu")`` graphs (one op for Dynamo: no graph break). The op's
fake kernel (``register_fake``) gives its output shapes in all three; its autograd
formula (``register_autograd``) works as on any device.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .lowering import registry
from .lowering.context import NodeLowering
from .stablehlo.builder import Value

__all__ = ["NodeLowering", "Value", "register_lowering"]

Rule = Callable[..., Any]


def _overloads(op: Any) -> list[torch._ops.OpOverload]:
    """The OpOverloads named by ``op``: a CustomOpDef, an OpOverload, an OpOverloadPacket
    (every overload) or a qualified name ("mylib::op" or "mylib::op.overload")."""
    if isinstance(op, str):
        ns, _, rest = op.partition("::")
        name, _, overload = rest.partition(".")
        try:
            packet = getattr(getattr(torch.ops, ns), name)
        except AttributeError:
            raise ValueError(f"torchtpu.library.register_lowering: no operator named {op!r} is defined") from None
        op = getattr(packet, overload) if overload else packet
    op = getattr(op, "_opoverload", op)  # torch.library.custom_op's CustomOpDef
    if isinstance(op, torch._ops.OpOverloadPacket):
        return [getattr(op, name) for name in op.overloads()]
    if isinstance(op, torch._ops.OpOverload):
        return [op]
    raise TypeError(
        "torchtpu.library.register_lowering: expected an operator (a torch.library.custom_op, an OpOverload such as "
        f"torch.ops.mylib.foo.default, or its qualified name), got {type(op).__name__}"
    )


def _check_supported(op: torch._ops.OpOverload) -> None:
    schema = op._schema
    if op in registry.RULES:
        raise ValueError(f"torchtpu.library.register_lowering: {op.name()} already has a tpu lowering")
    if any(a.alias_info is not None for a in [*schema.arguments, *schema.returns]):
        raise NotImplementedError(
            f"torchtpu.library.register_lowering: {op.name()} mutates or aliases its arguments ({schema}); only "
            "functional ops can be lowered this way: return new tensors instead of writing into (or viewing) inputs"
        )


def register_lowering(op: Any, fn: Rule | None = None, *, lift_scalars: bool = False) -> Any:
    """Register ``fn`` as the tpu lowering of ``op``; usable as a decorator.

    ``op``: a ``torch.library.custom_op``, an OpOverload (or packet: every overload) or a
    qualified name, with no tpu lowering yet; it must be functional (no mutated or aliased
    arguments). ``fn(L, *args, **kwargs)`` builds the op's program (see the module
    docstring). Python numbers reach ``fn`` as Python numbers, baked into the program (one
    program per value); ``lift_scalars=True`` passes them as 0-d device operands instead
    (``ScalarValue``: use ``L.scalar(x, dtype)``), so that a changing value compiles once.
    """

    def deco(rule: Rule) -> Rule:
        overloads = _overloads(op)
        for ov in overloads:
            _check_supported(ov)
        from .eager.register import register_lowered_op

        for ov in overloads:
            registry.register(ov, static_scalars=not lift_scalars)(rule)
            register_lowered_op(ov)
        return rule

    return deco if fn is None else deco(fn)
