"""Tracing decompositions into FX graphs, and lowering FX graphs node by node."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_unflatten

from ..errors import not_implemented
from ..stablehlo.builder import Value
from ..stablehlo.types import host_numpy
from .context import ProgramContext, lower_call, meta_of, op_name


def trace_decomposition(decomp: Any, flat: list[Any], spec: Any, value_pos: Sequence[int]) -> torch.fx.GraphModule:
    """FX graph of ``decomp`` applied to meta stand-ins of the Values in ``flat``."""
    from .decomp import tracing_table

    def fn(*tensors: torch.Tensor) -> Any:
        filled = list(flat)
        for i, t in zip(value_pos, tensors):
            filled[i] = t
        args, kwargs = tree_unflatten(filled, spec)
        return decomp(*args, **kwargs)

    metas = [meta_of(flat[i]) for i in value_pos]
    functional = torch.func.functionalize(fn, remove="mutations")
    with _disable_current_modes(), _tracing_keys_enabled():
        return make_fx(functional, decomposition_table=tracing_table(), tracing_mode="real")(*metas)


# The dispatch keys make_fx and functionalize work through. A kernel of ours called from a
# TorchDispatchMode's handler (a user's FlopCounterMode; AOTAutograd's runtime checks
# around a compiled call that flushes DeferAndFuse) runs with them excluded, and a trace
# made there lost its input: the decomposition's result indexed a data-less meta constant.
_TRACING_KEYS = tuple(
    getattr(torch._C.DispatchKey, name)
    for name in (
        "Functionalize",
        "FuncTorchDynamicLayerFrontMode",
        "FuncTorchDynamicLayerBackMode",
        "PythonTLSSnapshot",
        "PreDispatch",
        "Conjugate",
        "Negative",
        "ZeroTensor",
    )
)


def _tracing_keys_enabled() -> Any:
    exclude = torch._C._dispatch_tls_local_exclude_set()
    for key in _TRACING_KEYS:
        exclude = exclude.remove(key)
    return torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), exclude)


def _constant(ctx: ProgramContext, t: torch.Tensor) -> Value:
    t = t.detach()
    if t.numel() == 1:
        return ctx.b.broadcast_in_dim(ctx.b.constant(t.reshape(()).item(), t.dtype), t.shape, [])
    return ctx.b.constant_array(host_numpy(t.cpu().resolve_conj().resolve_neg()), t.dtype)


class GraphHooks:
    """Optional behaviour of ``lower_graph`` for whole-program graphs (torch.compile).

    ``node(ctx, node, args, kwargs)`` may lower a node itself and return
    ``(True, value)``; ``(False, None)`` lets the registry lower it. ``use_meta`` False
    makes every node infer its output shapes from the concrete input Values (graphs traced
    with symbolic shapes).
    """

    use_meta = True

    def node(self, ctx: ProgramContext, node: torch.fx.Node, args: Any, kwargs: Any) -> tuple[bool, Any]:
        return False, None


def lower_graph(
    ctx: ProgramContext,
    gm: torch.fx.GraphModule,
    inputs: Sequence[Any],
    context_op: Any = None,
    hooks: GraphHooks | None = None,
) -> Any:
    """Interpret the ATen FX graph ``gm`` into the builder; returns the output structure
    with Values in place of tensors. ``inputs`` fill the placeholders in order."""
    env: dict[torch.fx.Node, Any] = {}
    inputs = list(inputs)
    placeholder = 0

    def load(a: Any) -> Any:
        return torch.fx.node.map_arg(a, lambda n: env[n])

    for node in gm.graph.nodes:
        if node.op == "placeholder":
            env[node] = inputs[placeholder]
            placeholder += 1
        elif node.op == "get_attr":
            env[node] = _constant(ctx, getattr(gm, node.target))
        elif node.op == "call_function":
            args, kwargs = load(node.args), load(node.kwargs)
            if node.target is operator.getitem:
                env[node] = args[0][args[1]]
                continue
            if hooks is not None:
                done, value = hooks.node(ctx, node, args, kwargs)
                if done:
                    env[node] = value
                    continue
            meta = node.meta.get("val") if hooks is None or hooks.use_meta else None
            try:
                env[node] = lower_call(ctx, node.target, args, kwargs, meta)
            except NotImplementedError as e:
                if context_op is None or "needed by" in str(e):
                    raise
                raise not_implemented(op_name(node.target), f"needed by the decomposition of '{op_name(context_op)}'") from e
        elif node.op == "output":
            return load(node.args[0])
        else:
            raise NotImplementedError(f"torchtpu: FX node kind {node.op!r} ({node.target}) is not supported in a lowered graph")
    raise AssertionError("graph without output")
