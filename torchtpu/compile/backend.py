"""The torch.compile backend "tpu": Dynamo graph -> AOTAutograd -> ATen FX graphs -> XLA programs.

Registered through the ``torch_dynamo_backends`` entry point (pyproject.toml), so
``torch.compile(model, backend="tpu")`` finds it; the default backend (inductor) and
every other device are left alone.

AOTAutograd functionalizes the graph, splits training graphs into forward and backward
with the min-cut rematerialization partitioner, and hands each graph to a compiler below;
graphs that need no gradient (``torch.no_grad``, ``torch.inference_mode``, a whole
functional training step) arrive through the inference compiler. Input mutations stay
in the graphs as ``copy_`` into their inputs (``keep_inference_input_mutations``) and are
written back by the program itself (see fx_lowering.py).
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .. import metrics
from ..errors import TpuError
from ..lowering.collectives import ReplicaLayout
from . import layouts
from .dynamic import BOUNDS_ATTR, SymbolBounds, batched_linears_apart
from .flex_attention import inline_flex_attention
from .fx_lowering import LOWERED_HIGHER_ORDER, CompiledGraph, OpByOpGraph

_graph_ids = itertools.count()


def _skip_our_frames() -> None:
    """Dynamo must not trace torchtpu's own Python (the kernels behind tpu ops run when a
    graph break executes ops eagerly); it treats them like torch's internals."""
    import torch._dynamo.trace_rules as trace_rules

    trace_rules.add("torchtpu")


_skip_our_frames()


def _capturable_optimizers_on_tpu() -> None:
    """Under torch.compile, Dynamo makes a fresh optimizer "capturable" (its step counts
    live on the parameters' device) only when every parameter is on CUDA or XPU. On tpu the
    step counts then stay on the CPU, and a compiled AdamW step moved each one to the
    device and back: two transfers per parameter per step. PyTorch's optimizers support
    capturable on the PrivateUse1 device (``optim.optimizer._get_capturable_supported_devices``),
    so the same rule applies to tpu parameters, as for CUDA."""
    from torch._dynamo.variables.optimizer import OptimizerVariable

    original = OptimizerVariable._set_capturable
    if getattr(original, "torchtpu", False):
        return
    device = torch._C._get_privateuse1_backend_name()

    def set_capturable(self: OptimizerVariable, tx: Any) -> None:
        state = self.value.state
        for group in self.value.param_groups:
            params = group.get("params", [])
            if "capturable" in group and params and all(p.device.type == device and p not in state for p in params):
                group["capturable"] = True
        original(self, tx)

    set_capturable.torchtpu = True  # type: ignore[attr-defined]
    OptimizerVariable._set_capturable = set_capturable  # type: ignore[method-assign]


def _our_autograd_decompositions_on_tpu() -> None:
    """PyTorch decomposes a few losses at the Autograd key (``py_impl(DispatchKey.Autograd)``)
    whenever AOTAutograd traces, whatever the backend, before any table of ours is asked.
    Two of those decompositions give the wrong result: ``multilabel_margin_loss_forward``
    counts the target slots after the first -1 (pytorch/pytorch#141017: inductor and
    aot_eager on the CPU get the wrong loss too), and both it and ``multi_margin_loss``
    give a vector's unreduced loss the shape [1] (the CPU kernel: []). For tpu tensors the
    tracer runs our decompositions instead (the ones eager tpu uses); other devices keep
    PyTorch's."""
    from torch._C import DispatchKey

    from ..lowering.decomp import OWN

    device = torch._C._get_privateuse1_backend_name()
    aten = torch.ops.aten
    for op in (aten.multilabel_margin_loss_forward.default, aten.multi_margin_loss.default):
        theirs = op.py_kernels.get(DispatchKey.Autograd)
        if theirs is None or getattr(theirs, "torchtpu", False):
            continue
        op.py_kernels[DispatchKey.Autograd] = _by_device(device, OWN[op], theirs)
        op._dispatch_cache.clear()


def _by_device(device: str, ours: Callable[..., Any], theirs: Callable[..., Any]) -> Callable[..., Any]:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        on_device = any(isinstance(t, torch.Tensor) and t.device.type == device for t in (*args, *kwargs.values()))
        return ours(*args, **kwargs) if on_device else theirs(*args, **kwargs)

    kernel.torchtpu = True  # type: ignore[attr-defined]
    return kernel


_capturable_optimizers_on_tpu()
_our_autograd_decompositions_on_tpu()
layouts.install()
KNOWN_OPTIONS = ("bounded_dynamism", "max_size")


def _decompositions() -> dict:
    """Decompose at trace time every op that has no lowering rule (the table the eager
    path uses when it traces a decomposition, less the few the lowering must trace)."""
    from ..lowering import registry
    from ..lowering.decomp import compile_table

    registry._load_rules()
    return compile_table()


def _partition(
    joint: torch.fx.GraphModule, joint_inputs: Sequence[Any], **kwargs: Any
) -> tuple[torch.fx.GraphModule, torch.fx.GraphModule]:
    """AOTAutograd's min-cut rematerialization partitioner, without its CSE pass when CSE
    would merge nothing.

    That CSE pass (``torch._functorch.config.cse``) imports ``torch._inductor.pattern_matcher``,
    which pulls in Inductor's lowerings and decompositions: 0.5-1 s of the first compiled
    training step, more than everything else AOTAutograd does for it. Joint graphs of
    ordinary models have no duplicate node for it to merge, and then its output is the same
    graph. So it runs only when the joint graph has two nodes it could merge (found the way
    it finds them, without its narrowing conditions); else the partitioner runs with
    ``cse=False`` patched for this one call only (Dynamo compiles one frame at a time, under
    its compile lock), so the inductor backend and every other user of AOTAutograd keep
    their CSE. Skipping CSE where it does merge would change the graphs (more activations
    saved, other rounding in the backward), which is why this is no plain ``cse=False``.
    """
    from torch._functorch import config as functorch_config
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    if functorch_config.cse and not cse_candidates(joint.graph):
        with functorch_config.patch(cse=False):
            return min_cut_rematerialization_partition(joint, joint_inputs, **kwargs)
    return min_cut_rematerialization_partition(joint, joint_inputs, **kwargs)


def cse_candidates(graph: torch.fx.Graph) -> bool:
    """Whether ``torch._functorch.compile_utils.fx_graph_cse`` could merge any two nodes of
    ``graph``: two nodes (not placeholder, output or get_attr) with the same target and
    equal arguments, keyed and compared exactly as that pass does (flattened arguments and
    their tree specs; SymInts by their SymNode; the type of each argument in the hash, so
    ``1`` and ``1.0`` differ). The pass merges a subset of these pairs (it also keeps apart
    random ops, ``empty``, nodes aliasing an output and different mutation regions), so
    ``False`` here means it would return the graph unchanged."""
    from torch.utils._pytree import tree_flatten

    def flat(args: Any) -> tuple[tuple, Any]:
        leaves, spec = tree_flatten(args)
        return tuple(a.node if isinstance(a, (torch.SymInt, torch.SymFloat, torch.SymBool)) else a for a in leaves), spec

    seen: dict[tuple, list[dict]] = {}
    for n in graph.nodes:
        if n.op in ("placeholder", "output", "get_attr"):
            continue
        args, args_spec = flat(n.args)
        kwargs, kwargs_spec = flat(n.kwargs)
        token = {"target": n.target, "args": args, "args_spec": args_spec, "kwargs": kwargs, "kwargs_spec": kwargs_spec}
        try:
            key = (n.target, hash((tuple((a, type(a)) for a in args), tuple((a, type(a)) for a in kwargs))))
            tokens = seen.setdefault(key, [])
            if any(t == token for t in tokens):
                return True
        except (TypeError, RuntimeError):  # unhashable or uncomparable arguments: let the pass decide
            return True
        tokens.append(token)
    return False


def _compiler(kind: str, bounds: SymbolBounds | None) -> Callable[[torch.fx.GraphModule, Sequence[Any]], CompiledGraph]:
    def compile_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> CompiledGraph | OpByOpGraph:
        metrics.add("compiled_graphs")
        name = f"{kind}{next(_graph_ids)}"
        replicas, in_program = _collectives(gm, name)
        if not in_program:
            return OpByOpGraph(gm, name)
        operators = higher_order_operators(gm) + opaque_custom_operators(gm)
        if operators:
            _warn_op_by_op_operators(name, operators)
            return OpByOpGraph(gm, name)
        shaped_by_values = data_dependent_shape(gm)
        if shaped_by_values:
            _warn_data_dependent(name, shaped_by_values)
            return OpByOpGraph(gm, name)
        graph = CompiledGraph(gm, name, dynamic=_has_symbols(example_inputs), bounds=bounds, replicas=replicas)
        graph.compile_id = _compile_id()
        return graph

    return compile_graph


def _compile_id() -> str | None:
    """Dynamo's id of the frame compile under way ("0/1": frame 0, its second compile), which
    names the reason for a recompile in torch._dynamo.utils.get_compilation_metrics()."""
    from torch._guards import CompileContext

    cid = CompileContext.current_compile_id()
    return None if cid is None else str(cid)


def _has_symbols(example_inputs: Sequence[Any]) -> bool:
    from torch.fx.experimental.symbolic_shapes import has_free_symbols

    return any(isinstance(x, (torch.SymInt, torch.SymFloat)) or (isinstance(x, torch.Tensor) and has_free_symbols(x)) for x in example_inputs)


def _collectives(gm: torch.fx.GraphModule, name: str) -> tuple[ReplicaLayout | None, bool]:
    """The replica layout of ``gm``'s functional collectives (None without any), and whether
    they can run inside the XLA program: only on groups with the xla transport. Otherwise
    the graph runs op by op, its collectives through the process group (warned once)."""
    from ..distributed import compiled

    names = compiled.group_names(gm)
    if not names:
        return None, True
    outside = compiled.not_in_program(names)
    if outside:
        _warn_op_by_op(name, outside)
        return None, False
    layout = compiled.replica_layout(names, f"compiled graph {name}")
    return layout._replace(split_ranges=compiled.split_ranges(gm, f"compiled graph {name}")), True


def higher_order_operators(gm: torch.fx.GraphModule) -> list[str]:
    """The higher-order operators in ``gm`` (``torch.cond``, ``while_loop``, ``scan``, ...:
    ops that call subgraphs) the lowering has no rule for: all but checkpointing's RNG pair."""
    return sorted(
        {
            str(n.target)
            for n in gm.graph.nodes
            if n.op == "call_function" and isinstance(n.target, torch._ops.HigherOrderOperator) and n.target not in LOWERED_HIGHER_ORDER
        }
    )


def opaque_custom_operators(gm: torch.fx.GraphModule) -> list[str]:
    """Operators of other libraries in ``gm`` (``torch.library.custom_op``) with neither a
    lowering (``torchtpu.library.register_lowering``) nor a decomposition, whose own
    implementation runs on any device (a CompositeExplicitAutograd kernel, as custom_op
    registers it): opaque to compilers by design, they run as written, as in eager."""
    from ..lowering import registry
    from ..lowering.decomp import decomposition_for

    registry._load_rules()
    names = set()
    for n in gm.graph.nodes:
        op = n.target
        if n.op != "call_function" or not isinstance(op, torch._ops.OpOverload) or op.namespace in ("aten", "prims"):
            continue
        if op in registry.RULES or decomposition_for(op) is not None:
            continue
        if torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeExplicitAutograd"):
            names.add(op.name())
    return sorted(names)


# why a graph ran op by op, warned once per process each: collectives, operators, shapes
WARNED: set[str] = set()


def _warn_once(reason: str, message: str) -> None:
    if reason in WARNED:
        return
    WARNED.add(reason)
    warnings.warn(message, stacklevel=3)


def _warn_op_by_op_operators(name: str, operators: list[str]) -> None:
    _warn_once(
        "operators",
        f"torchtpu: compiled graph {name} calls {', '.join(operators)}, which torchtpu does not lower into XLA "
        "programs: the graph runs op by op (eagerly; a higher-order operator's branches or loop body as their eager "
        "ops, its predicate read on the host; a custom operator's own implementation, as in eager mode). The "
        "results are the same, the speed is eager's. A custom operator joins the program once it has a lowering "
        "(torchtpu.library.register_lowering).",
    )


def data_dependent_shape(gm: torch.fx.GraphModule) -> str | None:
    """The first node of ``gm`` whose result's shape depends on tensor values (an unbacked
    size: ``nonzero`` or a boolean mask under ``capture_dynamic_output_shape_ops``), which
    no XLA program can have; None when every shape is known before the call."""
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    for n in gm.graph.nodes:
        val = n.meta.get("val")
        if isinstance(val, torch.Tensor) and free_unbacked_symbols(val.shape):
            return f"{n.target} -> shape {tuple(val.shape)}"
    return None


def _warn_data_dependent(name: str, where: str) -> None:
    _warn_once(
        "data-dependent shape",
        f"torchtpu: compiled graph {name} has a result whose shape depends on tensor values ({where}; "
        "torch._dynamo.config.capture_dynamic_output_shape_ops puts such ops into graphs). XLA programs have static "
        "shapes: the graph runs op by op (eagerly, the shape read from the device). The results are the same, the "
        "speed is eager's; without that option Dynamo breaks the graph at the op instead, and the rest compiles.",
    )


def _warn_op_by_op(name: str, outside: list[tuple[str, str]]) -> None:
    groups = ", ".join(f"{n!r} ({t})" for n, t in outside)
    _warn_once(
        "collectives",
        f"torchtpu: compiled graph {name} has functional collectives on process group(s) {groups} whose collectives "
        "cannot run inside an XLA program: it runs op by op (eagerly), its collectives through the process group. "
        "Set TORCHTPU_COLLECTIVES=xla (before init_process_group) to compile it into one program with its "
        "collectives inside.",
    )


def tpu_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], options: dict | None = None, mode: str | None = None) -> Callable:
    """The "tpu" backend: ``torch.compile(model, backend="tpu", options={...})``.

    options: ``bounded_dynamism`` (bool) runs dynamic dimensions through a small set of
    padded power-of-two bucket programs (see torchtpu.compile.dynamic), ``max_size`` (int)
    bounds every dynamic dimension for it.
    """
    from torch._dynamo.backends.common import aot_autograd

    options = dict(options or {})
    unknown = set(options) - set(KNOWN_OPTIONS)
    if unknown:
        raise TpuError(f"torchtpu: unknown torch.compile option(s) {sorted(unknown)} for backend 'tpu'; known: {list(KNOWN_OPTIONS)}")
    # bucket dynamic dims to a bound when one is given (options, or mark_dynamic on this
    # graph's own inputs); otherwise -- Dynamo's automatic dynamic shapes (a second size
    # seen), and torch.compile(dynamic=True) without a bound, which compiles on CUDA
    # without being told sizes -- to growing power-of-two buckets where the graph is
    # padding-safe, else at exact shapes, without a warning
    marked = any(getattr(t, BOUNDS_ATTR, None) for t in example_inputs if isinstance(t, torch.Tensor))
    bounded = bool(options.get("bounded_dynamism") or "max_size" in options or marked)
    bounds = SymbolBounds(options.get("max_size"), automatic=not bounded)
    batched_linears_apart(gm)
    inline_flex_attention(gm)
    compile_aot = aot_autograd(
        fw_compiler=_compiler("forward", bounds),
        bw_compiler=_compiler("backward", bounds),
        inference_compiler=_compiler("inference", bounds),
        partition_fn=_partition,
        decompositions=_decompositions(),
        keep_inference_input_mutations=True,
    )
    return compile_aot(gm, example_inputs)
