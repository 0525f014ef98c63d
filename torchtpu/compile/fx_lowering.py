"""One AOTAutograd graph -> XLA programs (one per input geometry and precision), and running them.

A :class:`CompiledGraph` is what the "tpu" backend hands back to AOTAutograd for each
forward, backward or inference graph. It is called with the boxed convention (one list of
arguments, which it clears so inputs can die early). On a call it keys the arguments'
geometry (storage slot, dtype, shape, stride, offset — never their values), finds or
builds the program, and runs it:

- every tpu storage the arguments view is one flat parameter; views are read inside the
  program (``read_view``), as the eager path does;
- ``copy_`` into a graph input (AOTAutograd's input mutations: BatchNorm running stats,
  optimizer state, in-place parameter updates) becomes a new value of that storage,
  returned by the program and swapped into the storage cell; the old buffer is donated
  (``tf.aliasing_output``) so a step does not double its memory;
- random nodes each take their own device RNG state ``[seed, counter + i]``, the states
  eager execution of the same ops would use, so dropout matches eager under one seed;
- outputs that are graph inputs are returned as the input tensors themselves;
- functional collectives (``_c10d_functional.*``) lower to StableHLO collectives inside the
  same program (``lowering/rules/collectives.py``), over the ``replicas`` the backend
  resolved from their process groups: the program is compiled in replica mode over those
  ranks and every rank runs it (``runner/program.py``'s ``group``).
"""

from __future__ import annotations

import itertools
import math
import operator
import os
import sys
import weakref
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from .. import _spans, config, metrics
from ..eager import deferred, rng
from ..errors import TpuError
from ..lowering import registry
from ..lowering.collectives import ReplicaLayout
from ..lowering.context import NodeLowering, ProgramContext, ScalarValue, conform, lower_call
from ..lowering.graph import GraphHooks, lower_graph
from ..lowering.strided import (
    buffer_shape,
    contiguous_strides,
    flatten_for_strides,
    read_view,
    write_view,
)
from ..runner.bounded import BoundedCache
from ..runner.precision import current as current_precision
from ..runner.program import ProgramBuilder, StorageProgram, device_scalar, execute, write_back
from ..runtime import pjrt
from ..stablehlo.builder import Value
from ..tensor.storage import Cell, cell_of, graph_key, input_buffers, new_tensor, same_graph_key
from .dynamic import mark_rows

aten = torch.ops.aten
_SKIPPED = {
    aten._assert_scalar.default,
    aten.sym_constrain_range_for_size.default,
}
# torch.utils.checkpoint under torch.compile: the partitioner recomputes a checkpointed
# random op in the backward from the RNG state its forward saved (_functorch/partitioners.py,
# functionalize_rng_ops). Ours is the op's [seed, counter] program state (see _Hooks).
_RUN_AND_SAVE_RNG_STATE = torch._prims.rng_prims.run_and_save_rng_state
_RUN_WITH_RNG_STATE = torch._prims.rng_prims.run_with_rng_state
LOWERED_HIGHER_ORDER = frozenset({_RUN_AND_SAVE_RNG_STATE, _RUN_WITH_RNG_STATE})  # the only ones (backend.py)
_dump_ids = itertools.count()
_tokens = itertools.count()
GRAPHS: weakref.WeakSet = weakref.WeakSet()  # every live CompiledGraph (tests, debugging)


class Program:
    """One compiled storage program of a graph and how to read its results."""

    __slots__ = ("storage", "outputs", "n_random", "dynamic_dims", "fresh")

    def __init__(self, storage: StorageProgram | None, outputs: list[tuple], n_random: int):
        self.storage = storage  # None: the graph computes nothing (its outputs are inputs, views, constants)
        # per graph output: ("new", sizes, strides, dtype, numel, exprs) | ("input", i) | ("const", v)
        # | ("view", i, ((view op, its other args, kwargs), ...)): views of input i
        self.outputs = outputs
        self.n_random = n_random  # RNG states the program consumes
        self.dynamic_dims: list[list[tuple[int, Any]]] | None = None  # per output, of a bucketed graph (_dynamic_dims)
        # per "new" output, in order: (numel, dtype, its buffer's shape), the cell each call makes
        self.fresh: list[tuple[int, torch.dtype, tuple[int, ...]]] = []
        if storage is not None:
            news = [s for s in outputs if s[0] == "new"]
            self.fresh = [(s[4], s[3], shape) for s, (shape, _) in zip(news, storage.result_types)]


class _Lowered(NamedTuple):
    """A graph lowered over its call's storages (``CompiledGraph._lower``)."""

    outputs: list[Value]  # the values of the "new" results in their buffers' shapes (strided.buffer_shape), in output order
    specs: list[tuple]  # per graph output, as Program.outputs
    bases: list[Value]  # every storage's value after the graph (rewritten or as read)
    updated: list[int]  # the storage slots the graph rewrites, in graph order
    n_random: int  # RNG states it consumes


class _RecordSpec(NamedTuple):
    """What a call recorded under DeferAndFuse produces (``CompiledGraph._record``)."""

    outputs: list[tuple]  # per graph output, as Program.outputs
    updated: tuple[int, ...]  # the storage slots it rewrites
    n_random: int  # RNG states it consumes
    checks: bool  # whether it checks something on the device (an index in range, ...)


class _Call:
    """The operands of one call, gathered while its key is built."""

    __slots__ = ("key", "cells", "slot_of", "scalars", "args", "stand_ins")

    def __init__(self, args: list[Any]) -> None:
        self.args = args
        # arguments the program reads through a stand-in, as (index, the caller's tensor): CPU
        # tensors (a global moved with .to(device) inside the compiled code, a non-capturable
        # optimizer's step count), uploaded; tensors with PyTorch's lazy conjugate or negative
        # bit (a ``_conj`` view a forward saved for its backward), resolved to their values
        self.stand_ins: list[tuple[int, torch.Tensor]] = []
        self.key: list[Any] = []
        self.cells: list[Cell] = []
        self.slot_of: dict[int, int] = {}
        self.scalars: list[Any] = []

    def user_args(self) -> list[Any]:
        """The arguments as the caller passed them (not their stand-ins): what an output
        that returns an input, or a view of one, is made from."""
        if not self.stand_ins:
            return self.args
        args = list(self.args)
        for i, t in self.stand_ins:
            args[i] = t
        return args

    def without_tensors(self) -> _Call:
        """The call's geometry and Python arguments, without its tensors (a recorded
        graph lowers from this later, and must not keep the step's tensors alive)."""
        shape = _Call([None if isinstance(a, torch.Tensor) else a for a in self.args])
        shape.key = self.key
        return shape


def _slot(call: _Call, t: torch.Tensor) -> int:
    cell = cell_of(t)
    slot = call.slot_of.get(id(cell))
    if slot is None:
        slot = call.slot_of[id(cell)] = len(call.cells)
        call.cells.append(cell)
    return slot


def _collect(args: list[Any], name: str, last_key: tuple | None = None) -> _Call:
    """The call's storages, scalar operands and cache key. A step calls each graph with the
    arguments' geometry of its last call: ``last_key`` (that call's key, a tuple) is then
    this call's key, checked in C++ without building it (``same_graph_key``)."""
    if last_key is not None and same_graph_key is not None:
        call = _Call(args)
        if same_graph_key(args, last_key, call.cells, call.slot_of) and last_key[-1] == current_precision():
            call.key = last_key
            return call
    call = _Call(args)
    # every argument a plain tpu tensor, an int or None: _collect_args's loop, in C++
    if graph_key is None or not graph_key(args, call.key, call.cells, call.slot_of):
        call = _Call(args)  # from the start: the C++ loop stops part way
        _collect_args(call, name)
    # Cell.initialized (inlined: once per storage per call), which runs no pending work
    call.key.append(tuple([(c.shape, c.dtype, c._buf is not None or c.lazy is not None) for c in call.cells]))
    call.key.append(current_precision())  # dot/conv precision_config is baked into the program
    return call


def _collect_args(call: _Call, name: str) -> None:
    """The key entries, storage slots and scalar operands of the call's arguments."""
    key, cells, slot_of, args = call.key, call.cells, call.slot_of, call.args
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            # the common case, a tpu tensor without a lazy conjugate or negative bit, without
            # the device check: only a tpu storage has a cell (once per argument per call)
            try:
                cell = a.untyped_storage()._cell
            except AttributeError:
                cell = None
            dtype = a.dtype
            if cell is not None and not a.is_neg() and not (dtype.is_complex and a.is_conj()):
                slot = slot_of.get(id(cell))
                if slot is None:
                    slot = slot_of[id(cell)] = len(cells)
                    cells.append(cell)
                key.append((slot, dtype, tuple(a.shape), a.stride(), a.storage_offset()))
                continue
            if a.device.type != "tpu":
                if a.device.type != "cpu":
                    raise TpuError(
                        f"torchtpu: argument {i} of compiled graph {name} is a {a.device} tensor of shape "
                        f"{tuple(a.shape)}; move it to the device with .to('tpu') before calling the compiled function"
                    )
                call.stand_ins.append((i, a))
                a = args[i] = a.to("tpu")
            elif a.is_conj() or a.is_neg():  # a program reads storages: give it the values
                call.stand_ins.append((i, a))
                a = args[i] = a.resolve_conj().resolve_neg()
            key.append((_slot(call, a), a.dtype, tuple(a.shape), a.stride(), a.storage_offset()))
        elif isinstance(a, bool) or isinstance(a, int):
            key.append(("i", int(a)))  # sizes of dynamic dims: they shape the program
        elif isinstance(a, float):
            call.scalars.append(device_scalar(a, float))
            key.append(("f",))
        elif a is None:
            key.append(None)
        elif _opaque(a):  # DTensor's DeviceMesh, passed along by AOTAutograd's subclass wrapper
            key.append(("obj", type(a).__qualname__))
        elif isinstance(a, torch.SymInt) and a.node.is_nested_int():
            raise TpuError(
                f"torchtpu: compiled graph {name} takes the ragged size of a jagged nested tensor (argument {i}, {a}): "
                "torch.compile(backend='tpu') does not compile jagged nested tensors (torch.nested, layout=torch.jagged) "
                "yet. Run that code uncompiled (eager or DeferAndFuse mode both run it), or compile it on padded tensors "
                "(nt.to_padded_tensor(...))"
            )
        else:
            raise TpuError(f"torchtpu: compiled graph {name} got an argument of type {type(a).__name__} (argument {i})")


def _storages(pb: ProgramBuilder, call: _Call) -> list[Value]:
    """The flat value of each storage the call reads, as parameters of ``pb``'s program."""
    return [pb.storage(slot, c.shape, c.numel, c.dtype, c.initialized) for slot, c in enumerate(call.cells)]


def _opaque(a: Any) -> bool:
    """An opaque Python object AOTAutograd hands a graph (a DTensor's DeviceMesh): the program
    cannot read it, so it only passes through to the placeholder."""
    try:
        from torch.distributed.device_mesh import DeviceMesh
    except ImportError:  # a torch built without distributed
        return False
    return isinstance(a, DeviceMesh)


class _Hooks(GraphHooks):
    """Input mutations, per-node RNG states and symbolic-size arithmetic."""

    def __init__(self, ctx: ProgramContext, placeholders: dict[torch.fx.Node, int], use_meta: bool):
        self.placeholders = placeholders
        self.use_meta = use_meta
        self.mutations: dict[int, Value] = {}
        self.n_random = 0
        self.rng_base: Value | None = None
        self.ctx = ctx

    def node(self, ctx: ProgramContext, node: torch.fx.Node, args: Any, kwargs: Any) -> tuple[bool, Any]:
        target = node.target
        if target is _RUN_AND_SAVE_RNG_STATE:  # forward: (the state the op draws from, its result)
            op, *rest = args
            self._fresh_rng_state(ctx)
            state = ctx.rng_state
            return True, (state, lower_call(ctx, op, rest, kwargs, self._meta(_random_result(node))))
        if target is _RUN_WITH_RNG_STATE:  # backward: the same op again, from that state
            state, op, *rest = args
            ctx.rng_state, ctx._philox_state = state, None
            return True, lower_call(ctx, op, rest, kwargs, self._meta(node))
        if not isinstance(target, torch._ops.OpOverload):
            return True, target(*args, **kwargs)  # operator.mul on sizes, sym_float, ...
        if target in _SKIPPED:
            return True, None
        if target in (aten.sym_size.int, aten.sym_stride.int, aten.sym_numel.default):
            return True, _size_query(target, args)
        if target is aten.copy_.default:
            dst = node.args[0]
            if isinstance(dst, torch.fx.Node) and dst.op == "placeholder":
                return True, self._mutate(ctx, self.placeholders[dst], args[0], args[1])
            return True, _copy(ctx, args[0], args[1])
        if target in _STRIDED_READS and isinstance(node.args[0], torch.fx.Node):
            return _strided_read(ctx, node, args)
        if target in registry.RANDOM or torch.Tag.nondeterministic_seeded in target.tags:
            self._fresh_rng_state(ctx)
        return False, None

    def _meta(self, node: torch.fx.Node | None) -> Any:
        return node.meta.get("val") if node is not None and self.use_meta else None

    def _mutate(self, ctx: ProgramContext, index: int, dst: Value, src: Value) -> Value:
        value = _copy(ctx, dst, src)
        self.mutations[index] = value
        return value

    def _fresh_rng_state(self, ctx: ProgramContext) -> None:
        """The state eager execution would give this op: [seed, counter + i]."""
        b = ctx.b
        if self.rng_base is None:
            self.rng_base = b.param((2,), torch.uint64)
        seed = b.slice(self.rng_base, [0], [1])
        counter = b.slice(self.rng_base, [1], [2])
        if self.n_random:
            counter = b.binary("add", counter, b.constant(self.n_random, torch.uint64, (1,)))
        ctx.rng_state = b.concatenate([seed, counter], 0)
        ctx._philox_state = None
        self.n_random += 1


def _random_result(node: torch.fx.Node) -> torch.fx.Node | None:
    """The node reading the op's result out of ``run_and_save_rng_state``'s pair (it carries
    the op's fake value)."""
    return next((u for u in node.users if u.target is operator.getitem and u.args[1] == 1), None)


def _saved_rng_state(node: Any) -> bool:
    """Whether graph output ``node`` is the RNG state a recomputed random op saved. Its fake
    value is the CPU generator's state whatever the device (the partitioner asks only
    CUDA-like devices for theirs); the program returns the op's u64[2] state on the device."""
    return (
        isinstance(node, torch.fx.Node)
        and node.target is operator.getitem
        and isinstance(node.args[0], torch.fx.Node)
        and node.args[0].target is _RUN_AND_SAVE_RNG_STATE
        and node.args[1] == 0
    )


_STRIDED_READS = (aten.as_strided.default, aten.as_strided_copy.default)


def _positions(sizes: Sequence[int], strides: Sequence[int], offset: int) -> np.ndarray:
    """The storage positions a strided view reads (with repeats)."""
    pos = np.full((1,), offset, np.int64)
    for n, st in zip(sizes, strides):
        pos = (pos[:, None] + np.arange(n, dtype=np.int64)[None, :] * st).reshape(-1)
    return pos


def _strided_read(ctx: ProgramContext, node: torch.fx.Node, args: Any) -> tuple[bool, Any]:
    """``as_strided(x, size, stride, offset)`` addresses x's *storage*, but in a program x is
    a value in its logical shape. When x is a view laid out otherwise (LED/Longformer's
    overlapping chunks: ``x.transpose(..).reshape(..).view(..).as_strided(..)``, where the
    reshape is a view), the storage is rebuilt from x by writing x where its view sits, and
    the result is read from that. Positions x does not cover are not in the program: that
    raises, rather than reading zeros."""
    meta = node.args[0].meta.get("val")
    if not _static(meta):  # the rule's reading (x row-major) cannot be checked: let it stand
        return False, None
    x, size, stride = args[0], [int(n) for n in args[1]], [int(n) for n in args[2]]
    offset = int(args[3]) if len(args) > 3 and args[3] is not None else 0
    sizes, strides, start = tuple(meta.shape), tuple(meta.stride()), meta.storage_offset()
    last_read = offset + sum((n - 1) * st for n, st in zip(size, stride)) if all(size) else -1
    if strides == contiguous_strides(sizes) and start == 0 and last_read < math.prod(sizes):
        return False, None  # x is its storage's beginning, row-major: the rule reads it right
    read, covered = _positions(size, stride, offset), _positions(sizes, strides, start)
    if not np.isin(read, covered).all():
        raise NotImplementedError(
            f"torchtpu: as_strided(size={size}, stride={stride}, storage_offset={offset}) of a view with strides "
            f"{list(strides)} and offset {start} reads storage outside that view, which a compiled program does not "
            "hold; call .contiguous() on the view before as_strided, or run this part outside torch.compile"
        )
    b = ctx.b
    storage = b.broadcast_in_dim(b.constant(0, x.dtype), (int(covered.max()) + 1,), [])
    storage = write_view(b, storage, sizes, strides, start, x)
    return True, read_view(b, storage, size, stride, offset, x.dtype)


def _through_input_copies(node: Any) -> Any:
    """The graph input a ``copy_`` into it returns (``v.masked_fill_(m, x)`` becomes
    ``copy_(v, masked_fill(v, m, x))``): that output *is* the input, mutated, as in eager;
    a new tensor with its values would leave the caller's later writes out of the input."""
    if (
        isinstance(node, torch.fx.Node)
        and node.op == "call_function"
        and node.target is aten.copy_.default
        and isinstance(node.args[0], torch.fx.Node)
        and node.args[0].op == "placeholder"  # the program writes the value back (_Hooks._mutate)
    ):
        return node.args[0]
    return node


def _view_chain(node: Any) -> list[torch.fx.Node] | None:
    """``[input, view, ...]`` when ``node`` is a chain of view ops of a graph input with
    constant arguments (``x.detach()``, ``x.view(2, 3).t()``), else None: such an output
    is made by running the views on the input tensor, an alias as in eager, no program."""
    chain = []
    node = _through_input_copies(node)
    while isinstance(node, torch.fx.Node) and node.op == "call_function":
        target = node.target
        if not (isinstance(target, torch._ops.OpOverload) and target.is_view and node.args):
            return None
        if _reads_computed_nodes((node.args[1:], node.kwargs)):  # a size the graph computes: not an alias we can make
            return None
        chain.append(node)
        node = node.args[0]
    if not chain or not isinstance(node, torch.fx.Node) or node.op != "placeholder":
        return None
    return [node, *reversed(chain)]


def _size_from_inputs(node: torch.fx.Node) -> bool:
    """Whether graph node ``node`` is a size the call's own inputs give: an input
    (``expand(x, [s0])``'s ``s0``), Python arithmetic on such sizes (``sym_max(s0 - 1, 1)``)
    or a dimension of an input tensor. ``CompiledGraph._view`` evaluates it per call."""
    if node.op == "placeholder":
        return True
    if node.op != "call_function":
        return False
    if node.target is aten.sym_size.int:
        return isinstance(node.args[0], torch.fx.Node) and node.args[0].op == "placeholder"
    if isinstance(node.target, torch._ops.OpOverload):
        return False
    ok = True

    def visit(a: torch.fx.Node) -> torch.fx.Node:
        nonlocal ok
        ok = ok and _size_from_inputs(a)
        return a

    torch.fx.node.map_arg((node.args, node.kwargs), visit)
    return ok


def _reads_computed_nodes(args: Any) -> bool:
    """Whether ``args`` hold a graph node the call's inputs do not give (a size computed on
    the device): such a view output cannot be made as an alias of the input."""
    found = False

    def visit(a: torch.fx.Node) -> torch.fx.Node:
        nonlocal found
        found = found or not _size_from_inputs(a)
        return a

    torch.fx.node.map_arg(args, visit)
    return found


def _size_query(target: Any, args: Any) -> int:
    x = args[0]
    if target is aten.sym_numel.default:
        return int(np.prod(x.shape))
    if target is aten.sym_size.int:
        return x.shape[args[1]]
    return contiguous_strides(x.shape)[args[1]]


def _copy(ctx: ProgramContext, dst: Value, src: Any) -> Value:
    L = NodeLowering(ctx, None, None)
    v = L.to(src, dst.dtype) if isinstance(src, Value) else L.scalar(src, dst.dtype)
    return L.broadcast_to(v, dst.shape)


def _static_dim(b: Any, v: Value, d: int) -> Value:
    """``v`` with dimension ``d`` static again: a gather with static indices (XLA cannot
    return a bounded-dynamic buffer that another program could take)."""
    idx = b.iota((v.shape[d], 1), 0, torch.int32)
    offset = [k for k in range(v.rank) if k != d]
    sizes = [1 if k == d else n for k, n in enumerate(v.shape)]
    return b.gather(v, idx, offset, [d], [d], 1, sizes, v.shape)


def _on_host(node: Any) -> bool:
    """Whether graph output ``node`` is a CPU tensor (its fake value's device)."""
    meta = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return isinstance(meta, torch.Tensor) and meta.device.type == "cpu" and not _saved_rng_state(node)


def _static(meta: Any) -> bool:
    from torch.fx.experimental.symbolic_shapes import has_free_symbols

    return isinstance(meta, torch.Tensor) and not has_free_symbols(meta)


def _dynamic_dims(spec: tuple, symbols: list[Any]) -> list[tuple[int, Any]]:
    """The dims of a bucketed program's output whose true length the call decides: per
    such dim, the index of its symbol in ``symbols``, or the size expression over them.
    Empty for an output that is not "new" or has only static sizes (it is returned as the
    program made it)."""
    if spec[0] != "new" or len(spec) <= 5 or spec[5] is None:
        return []
    dims: list[tuple[int, Any]] = []
    for d, e in enumerate(spec[5]):
        if getattr(e, "free_symbols", None):
            dims.append((d, symbols.index(e) if e in symbols else e))
    return dims


class CompiledGraph:
    """Callable (boxed convention) that runs ``gm`` as XLA programs on tpu tensors."""

    def __init__(
        self,
        gm: torch.fx.GraphModule,
        name: str,
        dynamic: bool = False,
        bounds: Any = None,
        replicas: ReplicaLayout | None = None,
    ):
        self._boxed_call = True  # an instance attribute: wrappers copy __dict__, not class attributes
        self.name = name
        self.replicas = replicas  # functional collectives: the ranks the program spans and their groups
        self.dynamic = dynamic
        self.plan = None  # bounded dynamism: how dynamic dims are bucketed (dynamic.py)
        self.gm = gm
        # bounded dynamism (a dynamic.SymbolBounds); never with collectives: padding a
        # dimension would change what an all_gather concatenates or a reduce_scatter splits
        if dynamic and bounds is not None and replicas is None:
            from .dynamic import BoundedPlan, warn_exact

            plan = BoundedPlan(gm, bounds)
            if plan.usable:
                self.plan = plan
            elif plan.reason:
                warn_exact(name, plan.reason)
        self._lengths: list[Value] = []
        self.programs = BoundedCache(f"programs of compiled graph {name}")
        self.recorded = BoundedCache(f"recorded calls of compiled graph {name}")  # key -> _RecordSpec
        self.token = next(_tokens)  # names this graph in DeferAndFuse's graph keys (ids are reused)
        self._last_key: tuple | None = None  # the last run call's key and program
        self._last_program: Program | None = None
        self.compile_id: str | None = None  # Dynamo's id of the frame compile that made this graph ("0/1")
        nodes = list(gm.graph.nodes)
        self.placeholders = {n: i for i, n in enumerate(n for n in nodes if n.op == "placeholder")}
        self.output_args = list(nodes[-1].args[0]) if nodes and nodes[-1].op == "output" else []
        # outputs on the CPU (``x.cpu()``, arithmetic on a CPU input): the program computes
        # them with the rest, and they are copied to the host after it, as eager would return them
        self.host_outputs = frozenset(i for i, n in enumerate(self.output_args) if _on_host(n))
        GRAPHS.add(self)

    def __call__(self, args: list[Any]) -> list[Any]:
        args_l = list(args)
        args.clear()  # boxed: let AOTAutograd's references to the inputs die
        lengths = None
        if self.plan is not None:
            unpadded = args_l
            lengths, args_l = self.plan.pad(args_l)
        # bounded dynamism adds the lengths as operands: its keys are built
        call = _collect(args_l, self.name, self._last_key if lengths is None else None)
        if lengths is not None:
            call.scalars.extend(device_scalar(n, int, np.int32) for n in lengths)
        key = call.key if call.key is self._last_key else tuple(call.key)
        if lengths is None and self.replicas is None and not call.stand_ins and not self.host_outputs and deferred.deferring():
            return self._record(key, call)
        # the last call's program without hashing its key again (a step's graphs repeat)
        prog = self._last_program if key is self._last_key else self.programs.get(key)
        if prog is None:
            self._explain_new(key)
            prog = self._build(call)
            if _spans.explain is not None:  # why a new program (this graph's other keys, or Dynamo's reason)
                _spans.explain.compiled_program(self, key)
            self.programs[key] = prog
        else:
            metrics.add("cache_hits")
        self._last_key, self._last_program = key, prog
        results = self._run(prog, call)
        if lengths is not None:
            results = self._unpad(prog, results, lengths, unpadded)
        return results

    def _unpad(self, prog: Program, results: list[Any], lengths: list[int], args: list[Any]) -> list[Any]:
        """Outputs with dynamic dims: views of their first ``n`` rows (over the padded
        storage); an input returned as it is (a size a forward saves for its backward) is
        the caller's own, not its padded or bucketed stand-in."""
        if prog.dynamic_dims is None:
            prog.dynamic_dims = [_dynamic_dims(spec, self.plan.symbols) for spec in prog.outputs]
        out = []
        for node, spec, dims, r in zip(self.output_args, prog.outputs, prog.dynamic_dims, results):
            if spec[0] == "input":
                r = args[spec[1]]
            elif spec[0] == "const":  # a number the program's build computed from the buckets
                r = self._number_at(node, r, lengths)
            elif spec[0] == "view":  # of the caller's input, not of its padded stand-in
                r = self._view(spec, args)
            elif dims and isinstance(r, torch.Tensor):
                sizes = list(r.shape)
                for d, size in dims:
                    sizes[d] = lengths[size] if isinstance(size, int) else int(size.xreplace(dict(zip(self.plan.symbols, lengths))))
                grown = [d for d, _ in dims if sizes[d] != r.shape[d]]
                # a tensor of its own over the padded storage, not a view: AOTAutograd calls
                # this under no_grad, and an in-place op on a view made there is an error
                # (SwitchTransformers' ``index_add_`` into a compiled ``zeros_like``)
                r = new_tensor(cell_of(r), sizes, r.stride(), 0, r.dtype)
                if len(grown) == 1:  # eager ops that read it run padded too (eager/buckets.py)
                    mark_rows(r, sizes[grown[0]], grown[0])
            out.append(r)
        return out

    def _number_at(self, node: Any, built: Any, lengths: list[int]) -> Any:
        """A number the graph returns (``n + 1`` of a SymInt input ``n``, a size's product)
        for this call's true lengths: the program was built, and its constants computed,
        with each symbol at its bucket."""
        val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
        if not isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return built
        exact = val.node.expr.xreplace(dict(zip(self.plan.symbols, lengths)))
        return bool(exact) if isinstance(val, torch.SymBool) else type(built)(exact)

    # -- recording under DeferAndFuse ---------------------------------------------------------
    def _record(self, key: tuple, call: _Call) -> list[Any]:
        """Record this call into DeferAndFuse's pending graph instead of running it: the
        graphs of a step (forward, backward, optimizer) and the eager ops between them
        then run as one fused program."""
        spec = self.recorded.get(key)
        if spec is None:
            spec = self.recorded[key] = self._record_spec(call)
        if not (spec.updated or spec.n_random or spec.checks or any(s[0] == "new" for s in spec.outputs)):
            return self._results(spec.outputs, call.args, iter(()))  # nothing to compute
        shape = call.without_tensors()

        def lower(ctx: ProgramContext, values: list[Value]) -> list[Value]:
            low = self._lower(ctx, shape, values)  # DeferAndFuse's cells are flat
            return [low.bases[slot] for slot in spec.updated] + [ctx.b.reshape(v, (math.prod(v.shape),)) for v in low.outputs]

        operands = list(call.scalars)
        if spec.n_random:
            operands.append(rng.reserve_state_buffer(spec.n_random))
        new = [(s[4], s[3]) for s in spec.outputs if s[0] == "new"]
        sub = deferred.Inlined(("compiled graph", self.token, key), f"compiled graph {self.name}", len(call.cells), lower)
        cells = iter(deferred.record_inlined(sub, call.cells, [call.cells[s] for s in spec.updated], new, operands))
        return self._results(spec.outputs, call.args, cells)

    def _record_spec(self, call: _Call) -> _RecordSpec:
        """What a recorded call produces, from lowering it once on its own (not compiled):
        this also raises NotImplementedError at the graph, as running it would."""
        pb = ProgramBuilder()
        low = self._lower(pb.ctx, call, _storages(pb, call))
        return _RecordSpec(low.specs, tuple(low.updated), low.n_random, bool(pb.ctx.checks))

    # -- running -----------------------------------------------------------------------------
    def _run(self, prog: Program, call: _Call) -> list[Any]:
        if prog.storage is None:
            return self._results(prog.outputs, call.user_args(), iter(()))
        if prog.storage.updates:  # their old buffers are donated: a pending graph reading them runs first
            deferred.flush_readers([call.cells[slot] for slot in prog.storage.updates])
        # Cell.buf runs a pending graph: once per cell
        inputs = [c.buf for c in call.cells if c.initialized] if input_buffers is None else input_buffers(call.cells)
        inputs.extend(call.scalars)
        if prog.n_random:
            inputs.append(rng.reserve_state_buffer(prog.n_random))
        outs = execute(prog.storage, inputs, f"compiled graph {self.name}")
        new = write_back(prog.storage, call.cells, outs)
        for i, theirs in call.stand_ins:  # a mutated stand-in (e.g. a non-capturable optimizer step count)
            if call.slot_of[id(cell_of(call.args[i]))] in prog.storage.updates:
                theirs.copy_(call.args[i])
        cells = (Cell(numel, dtype, buf, shape) for (numel, dtype, shape), buf in zip(prog.fresh, new))
        results = self._results(prog.outputs, call.user_args(), cells)
        for i in self.host_outputs:
            if prog.outputs[i][0] == "new":
                results[i] = results[i].cpu()
        return results

    def _view(self, spec: tuple, args: list[Any]) -> torch.Tensor:
        """A ("view", input, chain) output: the view ops run on the caller's input, their
        size arguments that are graph inputs read from this call (``expand(x, [s0])``)."""
        t = args[spec[1]]
        for target, rest, kwargs in spec[2]:
            rest, kwargs = torch.fx.node.map_arg((rest, kwargs), lambda n: self._size(n, args))
            t = target(t, *rest, **kwargs)
        return t

    def _size(self, node: torch.fx.Node, args: list[Any]) -> Any:
        """The value of a size node (``_size_from_inputs``) for this call's ``args``."""
        if node.op == "placeholder":
            return args[self.placeholders[node]]
        values, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: self._size(n, args))
        return node.target(*values, **kwargs)

    def _results(self, specs: list[tuple], args: list[Any], cells: Iterator[Cell]) -> list[Any]:
        """The graph's outputs: a tensor over each new storage (``cells``, in order), the
        input tensors it returns as they are, and constants."""
        results: list[Any] = []
        for spec in specs:
            kind = spec[0]
            if kind == "new":
                sizes, strides, dtype = spec[1:4]
                results.append(new_tensor(next(cells), sizes, strides, 0, dtype))
            elif kind == "input":
                results.append(args[spec[1]])
            elif kind == "view":  # with bounded dynamism ``args`` are padded: _unpad makes it
                results.append(None if self.plan is not None else self._view(spec, args))
            else:
                results.append(spec[1])
        return results

    # -- building ------------------------------------------------------------------------------
    def _build(self, call: _Call) -> Program:
        pb = ProgramBuilder(group=self.replicas.ranks if self.replicas is not None else None)
        low = self._lower(pb.ctx, call, _storages(pb, call))
        if not (low.outputs or low.updated or low.n_random or pb.ctx.checks):
            return Program(None, low.specs, 0)  # only inputs, views of them, constants: nothing to run
        updates = [(slot, low.bases[slot], call.cells[slot].shape) for slot in low.updated]
        what = f"compiled graph {self.name} {[k[2] for k in call.key if isinstance(k, tuple) and len(k) == 5]}"
        # a rewritten input's old buffer dies with the step: let XLA reuse it for the new one
        storage = pb.finish(low.outputs, updates, what, donate=[s for s in low.updated if pb.has_param(s)])
        _dump(self.name, storage.text, self.gm)
        return Program(storage, low.specs, low.n_random)

    def _lower(self, ctx: ProgramContext, call: _Call, bases: list[Value]) -> _Lowered:
        """The graph lowered into ``ctx`` over the flat values ``bases`` of the call's
        storages: its new results, and the storages it rewrites (``copy_`` into inputs)."""
        if self.replicas is not None:
            ctx.replica_layout = self.replicas
        inputs, geometry = self._inputs(ctx.b, call, bases)
        hooks = _Hooks(ctx, self.placeholders, use_meta=not self.dynamic)
        result = lower_graph(ctx, self.gm, inputs, hooks=hooks)
        results = list(result) if isinstance(result, (tuple, list)) else [result]
        outputs, specs = [], []
        for node, v in zip(self.output_args, results):
            spec, flat = self._output(ctx, node, v)
            specs.append(spec)
            if flat is not None:
                outputs.append(flat)
        current = list(bases)
        updated: list[int] = []
        for index, value in hooks.mutations.items():  # copy_ into graph inputs, in graph order
            slot, sizes, strides, offset = geometry[index]
            current[slot] = write_view(ctx.b, current[slot], sizes, strides, offset, value)
            if slot not in updated:
                updated.append(slot)
        return _Lowered(outputs, specs, current, updated, hooks.n_random)

    def _inputs(self, b: Any, call: _Call, bases: list[Value]) -> tuple[list[Any], dict[int, tuple]]:
        inputs: list[Any] = []
        geometry: dict[int, tuple] = {}
        for i, (a, k) in enumerate(zip(call.args, call.key)):
            if isinstance(k, tuple) and len(k) == 5:  # a tensor (see _collect)
                slot, dtype, sizes, strides, offset = k
                geometry[i] = (slot, sizes, strides, offset)
                inputs.append(read_view(b, bases[slot], sizes, strides, offset, dtype))
            elif isinstance(a, float):
                p = b.param((), torch.float64 if pjrt.get().supports_f64 else torch.float32)
                inputs.append(ScalarValue(p.name, p.dtype, float))
            else:
                inputs.append(a)
        if self.plan is not None:
            self._lengths = [b.param((), torch.int32) for _ in self.plan.symbols]
            for i, dims in self.plan.tensor_dims.items():
                for d, s in dims:  # XLA masks the padding of this dim from here on
                    v = inputs[i]
                    inputs[i] = b.op1(
                        "stablehlo.set_dimension_size", [v, self._lengths[s]], v.shape, v.dtype, f"dimension = {d} : i64"
                    )
        return inputs, geometry

    def _output(self, ctx: ProgramContext, node: Any, v: Any) -> tuple[tuple, Value | None]:
        node = _through_input_copies(node)
        if isinstance(node, torch.fx.Node) and node.op == "placeholder":
            return ("input", self.placeholders[node]), None
        chain = _view_chain(node)
        if chain is not None:  # e.g. the step's ``loss.detach()``: a view, as eager makes it
            return ("view", self.placeholders[chain[0]], tuple((n.target, n.args[1:], n.kwargs) for n in chain[1:])), None
        if not isinstance(v, Value):
            return ("const", v), None
        meta = node.meta.get("val") if isinstance(node, torch.fx.Node) and not _saved_rng_state(node) else None
        if _static(meta):
            shape, dtype, stride = tuple(meta.shape), meta.dtype, meta.stride()
        else:
            shape, dtype = v.shape, v.dtype
            if isinstance(meta, torch.Tensor):
                dtype = meta.dtype
            stride = contiguous_strides(shape)
        v = conform(ctx, v, dtype, shape)
        exprs = None
        if self.plan is not None and isinstance(meta, torch.Tensor):
            exprs = [s.node.expr if isinstance(s, torch.SymInt) else int(s) for s in meta.shape]
            for d, e in enumerate(exprs):
                if not isinstance(e, int):
                    v = _static_dim(ctx.b, v, d)
        flat, strides = flatten_for_strides(ctx.b, v, stride)
        # the buffer keeps the tensor's shape where it can (strided.buffer_shape); results
        # with dynamic dims keep the flat (padded) storage the eager buckets read
        shaped = exprs is None and buffer_shape(v.shape, stride, flat.shape[0]) == v.shape
        return ("new", shape, strides, dtype, flat.shape[0], exprs), v if shaped else flat

    def _explain_new(self, key: tuple) -> None:
        """TORCHTPU_LOG_RECOMPILES=1: say why this graph needs another program."""
        if not self.programs or not config.flag("TORCHTPU_LOG_RECOMPILES"):
            return
        print(f"[torchtpu] recompiling {self.name}: {explain_key_change(self._last_key, key)}", file=sys.stderr)


class OpByOpGraph:
    """A graph that cannot become one XLA program (backend.py decides): its functional
    collectives' group has no xla transport; it calls a higher-order operator
    (``torch.cond``, ``while_loop``) or a custom operator without a lowering; or a result's
    shape depends on tensor values. AOTAutograd's graph runs op by op: every op through the
    eager kernels, every collective through its process group, every subgraph call and
    custom operator as its own implementation. Same results, more programs."""

    def __init__(self, gm: torch.fx.GraphModule, name: str):
        self._boxed_call = True
        self.gm = gm
        self.name = name

    def __call__(self, args: list[Any]) -> Any:
        args_l = list(args)
        args.clear()
        return self.gm(*args_l)


def explain_key_change(old: tuple | None, new: tuple) -> str:
    """Human-readable differences between two program keys."""
    if old is None:
        return "first call"
    reasons = []
    if old[-1] != new[-1]:
        reasons.append(f"matmul precision {old[-1]} -> {new[-1]}")
    if old[-2] != new[-2]:
        reasons.append("storage sizes/dtypes of the inputs changed")
    for i, (a, c) in enumerate(zip(old[:-2], new[:-2])):
        if a == c:
            continue
        if isinstance(a, tuple) and isinstance(c, tuple) and len(a) == 5 and len(c) == 5:
            names = ("storage slot", "dtype", "shape", "stride", "storage offset")
            diffs = [f"{n} {x} -> {y}" for n, x, y in zip(names, a, c) if x != y]
            reasons.append(f"input {i}: " + ", ".join(diffs))
        else:
            reasons.append(f"input {i}: {a} -> {c}")
    return "; ".join(reasons) or "new key"


def _dump(name: str, text: str, gm: torch.fx.GraphModule) -> None:
    directory = config.get("TORCHTPU_DUMP_DIR").strip()
    if not directory:
        return
    os.makedirs(directory, exist_ok=True)
    stem = os.path.join(directory, f"{os.getpid()}_{next(_dump_ids):04d}_{name}")
    with open(stem + ".stablehlo.mlir", "w") as f:
        f.write(text)
    with open(stem + ".fx.py", "w") as f:
        f.write(gm.code)


def describe(values: Sequence[Any]) -> str:
    return ", ".join(f"{tuple(v.shape)}:{v.dtype}" if isinstance(v, torch.Tensor) else repr(v) for v in values)
