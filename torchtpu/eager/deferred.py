"""DeferAndFuse: record ops into a pending graph, run it as one fused, cached program.

Recording an op costs a cache-key build and a dictionary lookup: the op's output shapes
come from a spec cache keyed like eager programs, so nothing is lowered or compiled on
the hot path. Output tensors are ordinary tpu tensors whose storage cells are *lazy*
(``Cell.lazy`` is the graph). The graph runs ("flushes") when

- a value is needed: anything reading a lazy cell's buffer (``.cpu()``, ``.item()``,
  ``.tolist()``, print, ``torch.save``, ``bool(t)``, a collective, a host-synced op);
- the user waits: ``torch.tpu.synchronize()``, leaving the mode;
- ``backward()`` ends, when the autograd engine's device thread recorded into a graph of
  its own (a callback queued on the engine). Usually the backward runs on the calling
  thread (torchtpu turns the engine's device threads off for the thread that imports
  torch) or, on a device thread, records into the graph of the forward pass
  (:func:`_join_forward_graph`): that graph goes on, and the optimizer step fuses into the
  same program as forward and backward;
- the op about to be recorded starts the same sequence again (a loop step repeats);
- the graph reaches ``MAX_NODES`` ops, so programs stay compilable.

Collectives of the xla transport are recorded too (:func:`record_collective`): the graph's
program then spans the collective's group (replica mode, ``runner/program.py``), so a
gradient all-reduce runs in one program with the compute around it.

The fused program is cached by the graph's structure: per op its eager key with the
storage slots it touches, the kinds of the graph's inputs, and which written storages
are still alive (dead intermediates are not outputs, so XLA fuses them away). Input
storages that the graph overwrites and nobody else holds are donated.
"""

from __future__ import annotations

import itertools
import sys
import threading
import weakref
from collections.abc import Callable, Hashable, Sequence
from typing import Any, NamedTuple

import torch

from .. import _spans, metrics
from ..errors import TpuError
from ..lowering.strided import buffer_shape
from ..runner import checks
from ..runner.bounded import BoundedCache
from ..runner.program import Blame, ProgramBuilder, StorageProgram, execute
from ..runtime import memory
from ..stablehlo.builder import Builder, Value
from ..tensor.storage import Cell, new_tensor
from . import growth, modes, rng, validate
from .oplower import RUNTIME_OFFSET, dynamic, lower_op, lower_single, scalar_params
from .plan import KIND_TENSOR, KIND_TENSOR_LIST, OpPlan

MAX_NODES = 4096  # flush before a graph grows past this many ops
MIN_REPEAT = 8  # a repeated first op only ends a graph at least this long

_epochs = itertools.count(1)


class _ThreadGraph(threading.local):
    # a class default: a thread that never recorded reads None without the AttributeError
    # that ``getattr(local, name, None)`` raises and catches inside (once per op and sync)
    graph: Graph | None = None


_local = _ThreadGraph()
_SPECS = BoundedCache("DeferAndFuse op specs")  # op key -> _Spec
_GRAPHS = BoundedCache("DeferAndFuse graphs")  # graph key -> _Compiled

IN, ZEROS, NEW = "in", "zeros", "new"


class _Spec(NamedTuple):
    """What recording an op needs to know without lowering it again."""

    outputs: list  # OutputSpec per new result; None for an absent one
    rebuild: Callable[[list], Any] | None  # the new results (flat) as the op's plain returns; None: a flat list
    updates: list[int]  # call slots the op rewrites
    buffer_shapes: list  # per new result, its storage's buffer shape (strided.buffer_shape); None for an absent one
    checked: bool  # its program reports device-side checks: the node keeps the user's line to blame
    # the first call's arguments with tensors dropped (they live in the key), which every
    # call of the key lowers with: the key holds each static argument, and a number passed
    # as an operand is lowered from its type alone (as one eager program serves every value)
    lvalues: list
    # names the op key in graph keys: a step's graph key of small ints hashes and compares in
    # microseconds, where its op keys (nested tuples) took ~0.3 ms per flush of minGPT's step
    uid: int


_SPEC_UIDS = itertools.count()


class _Compiled:
    """A fused graph's program; its results are the graph's live written storages."""

    __slots__ = ("program", "blame_nodes", "described")

    def __init__(self, program: StorageProgram, blame_nodes: list[int]):
        self.program = program
        self.blame_nodes = blame_nodes  # per device-side check: the node that added it
        self.described: tuple = ()  # its graph key with every node's full op key (what explain compares)


class Collective(NamedTuple):
    """A collective to record into a graph: it reads the flat values of ``reads`` storages
    and writes the flat values of the ones after them (``record_collective``)."""

    key: tuple  # what it computes, the group's ranks included: part of the graph's cache key
    group: tuple[int, ...]  # global ranks its program spans (replica i runs on rank group[i])
    reads: int
    lower: Callable[[Builder, list[Value]], list[Value]]  # read values -> written values

    @property
    def name(self) -> str:
        return str(self.key[0])

    def apply(self, ctx: Any, values: list[Value]) -> list[Value]:
        return self.lower(ctx.b, values)


class Inlined(NamedTuple):
    """A piece of program recorded whole -- a torch.compile graph (compile/fx_lowering.py):
    it reads the values of the ``reads`` storages and writes the ones after them, lowered
    with the program context, so it may take parameters of its own (``record_inlined``)."""

    key: tuple  # what it computes (the graph and its inputs' geometry): part of the graph's cache key
    name: str  # in errors and explanations
    reads: int
    lower: Callable[[Any, list[Value]], list[Value]]  # (program context, read values) -> written values

    def apply(self, ctx: Any, values: list[Value]) -> list[Value]:
        return self.lower(ctx, values)


class _Node:
    __slots__ = (
        "plan",
        "key",
        "lvalues",
        "gslots",
        "out_gslots",
        "scalar_types",
        "random",
        "where",
        "padded_key",
        "out_specs",
        "whole",
        "keep",
        "name",
    )

    def __init__(self, plan: OpPlan | None, key: tuple, lvalues: list, gslots: tuple, scalar_types: list):
        self.plan = plan  # None for a flat append (growth.py), lowered from its key
        self.key = key
        self.lvalues = lvalues  # the call's arguments with tensors dropped (they live in ``key``)
        self.gslots = gslots  # graph slot of each call slot
        self.out_gslots: list[int] = []
        self.scalar_types = scalar_types
        self.random = plan is not None and plan.random
        self.where = ""
        self.padded_key: tuple | None = None  # buckets.Padded.key of a call run padded
        self.out_specs: list | None = None  # _Spec.outputs: the geometry its results' tensors were given
        self.whole: Collective | Inlined | None = None  # lowered whole, from the storages' values
        self.keep: tuple[Cell, ...] = ()  # a collective's written storages, alive until the flush
        self.name = plan.name if plan is not None else "flat append (torch.cat)"  # in errors


class Graph:
    """The ops recorded on one thread since the last flush."""

    def __init__(self) -> None:
        self.epoch = next(_epochs)
        self.nodes: list[_Node] = []
        self.cells: list[weakref.ref] = []  # per graph slot
        self.kinds: list[tuple] = []  # per graph slot: (IN|ZEROS|NEW, numel, dtype, buffer shape)
        self.inputs: list[Any] = []  # buffers of the IN slots, in slot order
        self.input_slots: list[int] = []
        self.operands: list[Any] = []  # Python-number and RNG-state buffers, in node order
        self.written: dict[int, None] = {}  # slots created or overwritten (ordered set)
        self.keys: list[tuple] = []
        self.hooked_backward = -1
        self.owner = threading.get_ident()  # the thread that records into it, unless joined
        self.group: tuple[int, ...] | None = None  # the ranks of its collectives, if any
        self.lock = threading.RLock()
        self.flushed = False

    def slot(self, cell: Cell) -> int:
        tag = cell.gslot
        if tag is not None and tag[0] == self.epoch:
            return tag[1]
        if cell.lazy is not None and cell.lazy is not self:  # produced by another thread's graph
            cell.lazy.flush_for(cell)
        idx = len(self.cells)
        self.cells.append(weakref.ref(cell))
        if cell._buf is not None:
            self.kinds.append((IN, cell.numel, cell.dtype, cell.shape))
            self.inputs.append(cell._buf)
            self.input_slots.append(idx)
        else:
            self.kinds.append((ZEROS, cell.numel, cell.dtype, cell.shape))
        cell.gslot = (self.epoch, idx)
        return idx

    def new_cell(self, numel: int, dtype: torch.dtype, shape: Sequence[int] | None = None) -> tuple[Cell, int]:
        cell = Cell(numel, dtype, None, shape, self)  # counted from now on, as a CUDA allocation would be
        idx = len(self.cells)
        self.cells.append(weakref.ref(cell))
        self.kinds.append((NEW, numel, dtype, cell.shape))
        cell.gslot = (self.epoch, idx)
        self.written[idx] = None
        return cell, idx

    def flush_for(self, cell: Cell) -> None:
        """A consumer needs ``cell``'s value: run this graph."""
        _flush_graph(self, "value_needed")


def _graph() -> Graph:
    g = _local.graph
    if g is None or g.flushed:
        g = _local.graph = Graph()
    return g


# --------------------------------------------------------------------------
# recording
# --------------------------------------------------------------------------
def _graph_for(cells: list[Cell], key: tuple) -> Graph:
    """The graph the next op (``key``, reading ``cells``) is recorded into."""
    g = _local.graph  # _graph(), inlined: once per op
    if g is None or g.flushed:
        g = _graph()
    if not g.nodes and torch._C._current_graph_task_id() != -1:
        g = _join_forward_graph(g, cells)
    if len(g.nodes) >= MIN_REPEAT and key is not None and g.nodes[0].key == key:
        _flush_graph(g, "repeat")
        g = _graph()
    return g


def _append_node(g: Graph, node: _Node, key: Hashable) -> None:
    """Add ``node``; ``key`` stands for what it computes in the graph's key (its op key, or
    the uid of that key's spec)."""
    g.nodes.append(node)
    g.keys.append((key, node.gslots))
    _hook_backward(g)


def record(plan: OpPlan, values: list[Any], call: Any, key: tuple, generator: torch.Generator | None = None) -> Any:
    g = _graph_for(call.cells, key)
    spec = _SPECS.get(key)
    if spec is None:
        spec = _SPECS[key] = _spec(plan, values, call)
    if memory.cap is not None:  # torch.tpu.set_per_process_memory_fraction: refuse before recording
        memory.ensure_room(memory.new_bytes(spec.outputs))
    slot, epoch = g.slot, g.epoch
    # Graph.slot's first test inlined: most storages an op reads are in the graph already
    gslots = tuple([t[1] if (t := c.gslot) is not None and t[0] == epoch else slot(c) for c in call.cells])
    node = _Node(plan, key, spec.lvalues, gslots, call.scalar_types)
    specs = node.out_specs = spec.outputs
    padded = call.padded
    if padded is not None:
        node.padded_key = padded.key
    if spec.checked:
        node.where = checks.user_source_line(skip=2)  # past this frame and dispatch.run's
    g.operands.extend(call.scalars)
    if plan.random:
        g.operands.append(rng.next_state_buffer(generator))
    new = []
    shapes = spec.buffer_shapes
    for i, s in enumerate(specs):
        if s is None:
            new.append(None)
            continue
        cell, idx = g.new_cell(s[3], s[2], shapes[i] if padded is None else None)
        node.out_gslots.append(idx)
        new.append(new_tensor(cell, s[0], s[1], 0, s[2]) if padded is None else padded.result(cell, s, padded.out_dims[i]))
    for i in spec.updates:
        cell = call.cells[i]
        cell.lazy = g
        g.written[gslots[i]] = None
    _append_node(g, node, spec.uid)
    result = plan.returns(values, new if spec.rebuild is None else spec.rebuild(new))
    if len(g.nodes) >= MAX_NODES:
        _flush_graph(g, "size")
    return result


def record_append(a: growth.Append, operand: Any) -> torch.Tensor:
    """Record a flat ``torch.cat`` (growth.py): its node is keyed by the storages'
    capacities and takes offsets and positions as operands, so a loop that grows a tensor
    records the same graph at every length up to the capacity."""
    g = _graph_for(a.cells, a.key)
    node = _Node(None, a.key, [], tuple(g.slot(c) for c in a.cells), [RUNTIME_OFFSET] * len(a.operands))
    g.operands.extend(operand(n) for n in a.operands)
    cell, idx = g.new_cell(a.capacity, a.dtype)
    node.out_gslots.append(idx)
    _append_node(g, node, a.key)
    result = a.result(cell)
    if len(g.nodes) >= MAX_NODES:
        _flush_graph(g, "size")
    return result


def deferring() -> bool:
    """Whether this thread records ops (DeferAndFuse) instead of running them."""
    return modes.current() == modes.DEFER


def record_collective(c: Collective, reads: Sequence[Cell], writes: Sequence[Cell]) -> None:
    """Record collective ``c`` -- reading the storages ``reads``, rewriting ``writes`` --
    into this thread's graph, whose program then spans ``c.group``. Its written storages
    stay results of the program even if the user drops them: XLA deletes a collective whose
    result is unused, and a peer whose program kept it would wait for it forever. Every
    rank must record the same collectives in the same order (as it must call them); where
    each rank's graphs begin and end may differ."""
    g = _graph_for(list(reads), c.key)
    if g.group not in (None, c.group):  # one replica layout per program
        _flush_graph(g, "collective_group")
        g = _graph()
    g.group = c.group
    _with_collectives.add(g)
    node, _ = _whole_node(g, c, reads, writes, ())
    node.keep = tuple(writes)
    _append_whole(g, node)


def record_inlined(
    sub: Inlined, reads: Sequence[Cell], writes: Sequence[Cell], new: Sequence[tuple[int, torch.dtype]], operands: Sequence[Any]
) -> list[Cell]:
    """Record ``sub`` -- reading the storages ``reads``, rewriting ``writes``, creating one
    storage per ``new`` (numel, dtype), taking ``operands`` (device buffers) as its
    parameters -- into this thread's graph; the new storages' (pending) cells."""
    g = _graph_for(list(reads), sub.key)
    node, created = _whole_node(g, sub, reads, writes, new)
    node.where = checks.user_source_line()  # for a device-side check that fails (cheap next to a graph's call)
    g.operands.extend(operands)
    _append_whole(g, node)
    return created


def _whole_node(
    g: Graph, sub: Collective | Inlined, reads: Sequence[Cell], writes: Sequence[Cell], new: Sequence[tuple[int, torch.dtype]]
) -> tuple[_Node, list[Cell]]:
    """The node of ``sub`` in ``g`` (its slots: ``reads``, then ``writes``, now pending
    in ``g``, then the storages it creates) and the cells it creates."""
    gslots = [g.slot(cell) for cell in reads]
    for cell in writes:
        cell.lazy = g
        g.written[g.slot(cell)] = None
        gslots.append(g.slot(cell))
    created = []
    for numel, dtype in new:
        cell, idx = g.new_cell(numel, dtype)
        created.append(cell)
        gslots.append(idx)
    node = _Node(None, sub.key, [], tuple(gslots), [])
    node.whole, node.name = sub, sub.name
    return node, created


def _append_whole(g: Graph, node: _Node) -> None:
    _append_node(g, node, node.key)
    if len(g.nodes) >= MAX_NODES:
        _flush_graph(g, "size")


def _join_forward_graph(g: Graph, cells: list[Cell]) -> Graph:
    """The autograd engine runs backward on its own thread: let it record into the graph
    that holds the forward pass (the caller of backward() waits meanwhile), so forward
    and backward fuse into one program."""
    for c in cells:
        other = c.lazy
        if other is not None and other is not g and not other.flushed:
            _local.graph = other
            return other
    return g


def _spec(plan: OpPlan, values: list[Any], call: Any) -> _Spec:
    """Output specs and rewritten slots of a call never seen before, by lowering it once
    on its own (not compiled): this also raises NotImplementedError at the op itself,
    and learns whether its program reports device-side checks."""
    validate.check(plan, values)  # the CPU's metadata checks, once per op key
    pb, low = lower_single(plan, values, call)
    shapes = [None if s is None else buffer_shape(s[0], s[1], s[3]) for s in low.specs]
    lvalues = [
        None if k == KIND_TENSOR_LIST or (k == KIND_TENSOR and isinstance(v, torch.Tensor)) else v
        for k, v in zip(plan.kinds, values)
    ]
    return _Spec(low.specs, low.rebuild(), list(low.updates), shapes, bool(pb.ctx.checks), lvalues, next(_SPEC_UIDS))


_multithreading_enabled = torch._C._is_multithreading_enabled  # looked up once: _hook_backward runs per op
_thread_id = threading.get_ident
_graph_task_id = torch._C._current_graph_task_id


def _hook_backward(g: Graph) -> None:
    """Inside ``backward()``, run a graph of the autograd engine's own thread when the engine
    finishes: nothing else would. A forward graph it joined is left pending: the thread that
    called ``backward()`` records the optimizer step into it next. Without the engine's
    threads (``torch.autograd.set_multithreading_enabled(False)``, torchtpu's default for
    the thread that imports torch) the caller's own graph records the backward: it goes on."""
    if not _multithreading_enabled() or g.owner != _thread_id():
        return
    task = _graph_task_id()
    if task == -1 or g.hooked_backward == task:
        return
    g.hooked_backward = task
    torch.autograd.Variable._execution_engine.queue_callback(lambda: _flush_graph(g, "backward"))


# --------------------------------------------------------------------------
# flushing
# --------------------------------------------------------------------------
def _mark_checked(key: tuple) -> None:
    """The op of ``key`` reported device-side checks inside a graph though not alone: its
    later records keep the user's line too."""
    spec = _SPECS.get(key)
    if spec is not None and not spec.checked:
        _SPECS[key] = spec._replace(checked=True)


def flush(reason: str = "explicit") -> None:
    """Run this thread's pending graph (no-op when nothing is pending)."""
    g = _local.graph
    if g is not None and not g.flushed and g.nodes:
        _flush_graph(g, reason)


# Pending graphs that recorded a collective, whichever thread recorded them
_with_collectives: weakref.WeakSet[Graph] = weakref.WeakSet()


def flush_collectives(reason: str) -> None:
    """Run this thread's pending graph and every pending graph, of any thread, that holds a
    collective: before a host exchange between the ranks (a collective's cross-rank check).
    A rank that issues it from a future's callback may be on another thread than its peer
    (the callback runs where the future completed), so flushing only this thread's graph
    left a recorded all_reduce pending on one rank while its peer ran it: both waited."""
    flush(reason)
    for g in list(_with_collectives):
        _flush_graph(g, reason)


def flush_readers(cells: Sequence[Cell]) -> None:
    """Run this thread's pending graph if it reads one of ``cells``: a program run outside
    it is about to donate their buffers, which the graph still holds as inputs."""
    g = _local.graph
    if g is not None and not g.flushed and any(c.gslot is not None and c.gslot[0] == g.epoch for c in cells):
        _flush_graph(g, "donation")


def pending_ops() -> int:
    g = _local.graph
    return 0 if g is None or g.flushed else len(g.nodes)


def _flush_graph(g: Graph, reason: str) -> None:
    with g.lock:
        if g.flushed:
            return
        g.flushed = True
        if _local.graph is g:
            _local.graph = None
        if not g.nodes:
            return
        try:
            _run(g, reason)
        except Exception as e:
            _poison(g, e)
            raise


class _Failed:
    """Stands in for the graph of cells whose pending computation failed: reading them
    raises the original error again instead of returning stale or zero data."""

    flushed = True  # not a graph to record into (_join_forward_graph): reading raises

    def __init__(self, error: BaseException):
        self.error = error

    def flush_for(self, cell: Cell) -> None:
        raise TpuError(
            "torchtpu: the deferred computation that produces this tensor failed earlier "
            f"({type(self.error).__name__}: {str(self.error)[:500]}); recompute it (for example in "
            "torchtpu.eager_mode('eager') to find the op)"
        ) from self.error


def _poison(g: Graph, error: BaseException) -> None:
    failed = _Failed(error)
    for ref in g.cells:
        cell = ref()
        if cell is not None and cell.lazy is g:
            cell.lazy = failed


def _run(g: Graph, reason: str) -> None:
    if _spans.PROFILER._is_profiler_enabled:
        with _spans.span(f"torchtpu::flush ({reason})", reason=reason, ops=len(g.nodes)):
            return _run_graph(g, reason)
    return _run_graph(g, reason)


def _run_graph(g: Graph, reason: str) -> None:
    live = []  # (slot, cell): written storages someone still holds
    for idx in g.written:
        cell = g.cells[idx]()
        if cell is not None:
            live.append((idx, cell))
    donated = _donatable(g, live)
    gkey = (tuple(g.keys), tuple(g.kinds[i] for i in g.input_slots), tuple(i for i, _ in live), donated)
    compiled = _GRAPHS.get(gkey)
    if compiled is None:
        compiled = _compile(g, [i for i, _ in live], donated)
        compiled.described = (tuple((n.key, n.gslots) for n in g.nodes), *gkey[1:])
        if _spans.explain is not None:  # why a new program: the first node that differs
            _spans.explain.graph_program(g.nodes, compiled.described, [c.described for c in _GRAPHS.values()])
        _GRAPHS[gkey] = compiled
    else:
        metrics.add("cache_hits")
    for i in donated:  # the cell gets the program's output; drop our last references
        cell = g.cells[g.input_slots[i]]()
        if cell is not None:
            cell._buf = None  # still counted: the program's output replaces it
    blame = [
        Blame(g.nodes[n].name, g.nodes[n].where or "<unknown: run with TORCHTPU_LAUNCH_BLOCKING=1>") for n in compiled.blame_nodes
    ]
    outs = execute(compiled.program, g.inputs + g.operands, blame)
    g.inputs = g.operands = []
    metrics.add("flushes")
    metrics.add(f"flushes_{reason}")
    metrics.add("fused_ops", len(g.nodes))
    for (_, cell), buf in zip(live, outs):
        cell.lazy = None
        cell.gslot = None
        cell._set(buf)
    for ref in g.cells:  # storages read or written but not live: nothing pending any more
        cell = ref()
        if cell is not None and cell.lazy is g:
            cell.lazy = None


def _donatable(g: Graph, live: list[tuple[int, Cell]]) -> tuple[int, ...]:
    """Inputs the graph overwrites whose old buffer only the cell and this graph hold."""
    live_slots = {i for i, _ in live}
    out = []
    for i, idx in enumerate(g.input_slots):
        if idx not in live_slots or idx not in g.written:
            continue
        cell = g.cells[idx]()
        if cell is None or cell._buf is not g.inputs[i]:
            continue
        # references: g.inputs, cell._buf, getrefcount's argument (synchronize() tracks
        # results weakly); any other holder (another cell sharing the buffer, a user's
        # handle) forbids donation
        if sys.getrefcount(g.inputs[i]) == 3:
            out.append(i)
    return tuple(out)


def _compile(g: Graph, live: list[int], donated: tuple[int, ...]) -> _Compiled:
    """The graph's program: every written storage still alive is a result (rewritten
    inputs and new cells alike); the rest are intermediates XLA fuses away."""
    # a graph with collectives: its ranks' graphs may begin and end at different ops, so
    # the n-th program of each rank is not the others' n-th (ProgramBuilder's agreement);
    # the process group checks every collective call instead (TORCHTPU_DIST_CHECK)
    pb = ProgramBuilder(g.group, agree=False)
    values: list[Any] = [None] * len(g.kinds)
    for idx, (kind, numel, dtype, shape) in enumerate(g.kinds):
        if kind != NEW:
            values[idx] = pb.storage(idx, shape, numel, dtype, kind == IN)
    blame_nodes: list[int] = []
    for n, node in enumerate(g.nodes):
        before = len(pb.ctx.checks)
        _lower_node(pb.ctx, g, node, values)
        if len(pb.ctx.checks) > before:
            _mark_checked(node.key)
            blame_nodes.extend([n] * (len(pb.ctx.checks) - before))
    results = [(idx, values[idx], g.kinds[idx][3]) for idx in live]
    donate = [g.input_slots[i] for i in donated]
    what = f"fused graph of {len(g.nodes)} ops"
    collectives = dict.fromkeys(n.whole.name for n in g.nodes if isinstance(n.whole, Collective))
    if collectives:  # named in the error of a failed collective (a dead peer)
        what += f" with {', '.join(collectives)}"
    return _Compiled(pb.finish([], results, what, donate), blame_nodes)


def _lower_node(ctx: Any, g: Graph, node: _Node, values: list[Any]) -> None:
    """Lower one recorded op, reading and writing the graph's current storage values."""
    if node.whole is not None:
        reads, writes = node.gslots[: node.whole.reads], node.gslots[node.whole.reads :]
        for slot, v in zip(writes, node.whole.apply(ctx, [values[s] for s in reads])):
            values[slot] = v
        return
    scalars = scalar_params(ctx.b, node.scalar_types)
    if node.plan is None:
        values[node.out_gslots[0]] = growth.lower_append(ctx.b, node.key, [values[s] for s in node.gslots], scalars)
        return
    if node.random:
        ctx.new_rng_param()
    args, slot_of = _meta_args(node, g)
    dyn = dynamic(ctx.b, node.padded_key, scalars)  # the key's shapes are the bucket's already
    # the results' layout is the one their tensors got when recorded: the meta arguments carry
    # the key's strides, where a size-1 dimension's stride is normalized, and that can change
    # the memory format a meta kernel suggests (a pooled transposed view: channels-last or not)
    strides = [None if s is None else s[1] for s in node.out_specs]
    low = lower_op(ctx, node.plan, args, slot_of, [values[s] for s in node.gslots], scalars, dyn, strides)
    for idx, v in zip(node.out_gslots, low.outputs):
        values[idx] = v
    for slot, v in low.updates.items():
        values[node.gslots[slot]] = v


def _meta_args(node: _Node, g: Graph) -> tuple[list[Any], Any]:
    """The call's arguments with meta tensors of the recorded geometry in place of tensors."""
    key = node.key
    slots: dict[int, int] = {}
    numels = [g.kinds[s][1] for s in node.gslots]

    def meta(entry: tuple) -> torch.Tensor:
        slot, dtype, shape, stride, offset, conj, neg = entry
        if offset == RUNTIME_OFFSET:  # any nonzero offset: lower_op then takes the operand (the view fits at 1 too)
            offset = 1
        t = torch.empty(numels[slot], dtype=dtype, device="meta").as_strided(shape, stride, offset)
        if conj:
            t = t.conj()
        if neg:
            t = t._neg_view()
        slots[id(t)] = slot
        return t

    args = []
    for i, (kind, v) in enumerate(zip(node.plan.kinds, node.lvalues)):
        entry = key[1 + i]
        if kind == KIND_TENSOR and v is None and entry is not None:
            args.append(meta(entry))
        elif kind == KIND_TENSOR_LIST:
            args.append([None if e is None else meta(e) for e in entry])
        else:
            args.append(v)
    return args, lambda t: slots[id(t)]


def clear_cache() -> None:
    _SPECS.clear()
    _GRAPHS.clear()
