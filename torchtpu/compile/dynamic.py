"""Bounded dynamism for compiled graphs: many lengths, a few programs.

A dimension marked dynamic (``torchtpu.mark_dynamic(t, dim, max_size)``, or every dynamic
dimension under ``torch.compile(..., dynamic=True, options={"max_size": N})`` /
``options={"bounded_dynamism": True, "max_size": N}``) reaches the backend as a symbol.
At each call its length ``n`` is rounded up to a bucket (powers of two, at most the
bound); the program of that bucket is built once. Inside it, each dynamic input dimension
is marked with ``stablehlo.set_dimension_size(x, n)`` (``n`` an i32 operand), so XLA
masks reductions, matmuls and softmax over the padding itself and the results equal the
unpadded computation. Outputs are made static again (a gather with static indices along
each dynamic dimension) and handed back as views of their first ``n`` rows.

Batched linears: aten's ``linear`` on a (b, n, d) input reshapes it to (b*n, d), and XLA's
masks go wrong when a reshape folds a padded dim into another (measured). So before
AOTAutograd traces, the backend swaps torchtpu's ``linear_nd`` in for every ``linear`` and
``x @ w`` whose input has a dynamic dim among several leading dims
(:func:`batched_linears_apart`): it contracts the last dim directly, and its backward
(``linear_nd`` again, and ``contract_leading`` for the weight gradient) never reshapes.
Forward and backward graphs share the symbols' bounds (:class:`SymbolBounds`).

Limits, checked before a graph is bucketed (otherwise it runs at exact shapes, one program
per length, with a warning): only ops known to be exact under XLA's masking (see
``PADDING_SAFE``) — e.g. ``mean`` divides by a size baked into the program, and
``reduce_window`` over a bounded dim is an XLA bug; nothing XLA cannot compile padded (a
division by a dynamic tensor, integer pow); no input mutations; every dynamic
dimension is one plain symbol, and no other reshape folds it into another dimension; no
tensor has two different dynamic sizes; no size enters the arithmetic as a number.
Padding a dynamic input goes through the host (one transfer each way), as inputs of
varying length usually come from there; so do a training step's saved activations.
An input in an eager-bucketed storage (eager/buckets.py: ``nonzero``'s positions and what
padded eager ops made of them, e.g. ``x[token]`` between the graph breaks of a mixture of
experts) is read in place: its symbol takes that storage's rows as its bucket, and the
graph's outputs are marked bucketed alike, so the eager ops after the graph run padded.

Eager mode: ops on a ``mark_dynamic`` tensor outside torch.compile run at exact shapes.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

from ..eager import buckets
from ..eager.buckets import PADDING_SAFE  # op packets exact under XLA's masking, one list for both
from ..errors import TpuError

aten = torch.ops.aten
BOUNDS_ATTR = "_torchtpu_bounds"


def mark_dynamic(t: torch.Tensor, dim: int, max_size: int) -> torch.Tensor:
    """Mark ``t.shape[dim]`` as dynamic with lengths up to ``max_size`` for torch.compile
    (backend "tpu"): every length runs through a few bucket programs. Returns ``t``."""
    if not isinstance(max_size, int) or max_size < 1:
        raise ValueError(f"torchtpu.mark_dynamic: max_size must be a positive int, got {max_size!r}")
    dim = dim % t.dim()
    if t.shape[dim] > max_size:
        raise ValueError(f"torchtpu.mark_dynamic: dimension {dim} has size {t.shape[dim]} > max_size {max_size}")
    bounds = dict(getattr(t, BOUNDS_ATTR, {}) or {})
    bounds[dim] = max_size
    setattr(t, BOUNDS_ATTR, bounds)
    torch._dynamo.mark_dynamic(t, dim)
    return t


def bucket(n: int, bound: int | None) -> int:
    """Powers of two up to the bound (None: Dynamo's automatic dynamic shapes, unbounded)."""
    if bound is not None and n > bound:
        raise TpuError(f"torchtpu: a dynamic dimension has length {n}, above its bound {bound}; raise max_size")
    b = 1
    while b < n:
        b *= 2
    return b if bound is None else min(b, bound)


class SymbolBounds:
    """The bounds of one Dynamo graph's size symbols, shared by its forward, backward and
    inference graphs: the backward's inputs (saved activations) carry no mark_dynamic
    bound, so it takes the one its forward saw. ``automatic``: the dims are dynamic only
    because Dynamo saw a second size (automatic dynamic shapes, no bound asked for): they
    are bucketed to the next power of two, and a graph that is not padding-safe runs at
    exact shapes quietly, as it did before (the user asked for nothing to warn about)."""

    def __init__(self, max_size: int | None, automatic: bool = False) -> None:
        self.max_size = max_size
        self.automatic = automatic
        self.seen: dict[Any, int | None] = {}
        self.grown: dict[Any, int] = {}  # an unbounded symbol's largest bucket so far


class BoundedPlan:
    """How one symbolic graph is bucketed: which input dims carry which symbol."""

    def __init__(self, gm: torch.fx.GraphModule, shared: SymbolBounds):
        self.shared = shared
        self.max_size = shared.max_size
        self.symbols: list[Any] = []  # sympy symbols in operand order
        self.tensor_dims: dict[int, list[tuple[int, int]]] = {}  # input -> [(dim, symbol index)]
        self.int_inputs: dict[int, int] = {}  # SymInt input -> symbol index
        self.reason = _unsafe_reason(gm)
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        for i, node in enumerate(placeholders):
            self._add(i, node.meta.get("val"))
        self.exact_reason = self.reason  # why the graph runs at exact shapes, if it does
        if shared.automatic and self.reason:
            self.reason, self.symbols = None, []  # not usable, and no warning

    def _add(self, i: int, val: Any) -> None:
        if isinstance(val, torch.SymInt):
            expr = val.node.expr
            if not expr.is_Symbol:
                self.reason = self.reason or f"input {i} is the size expression {expr}"
                return
            self.int_inputs[i] = self._symbol(expr)
        elif isinstance(val, torch.Tensor):
            for d, s in enumerate(val.shape):
                if isinstance(s, torch.SymInt):
                    expr = s.node.expr
                    if not expr.is_Symbol:
                        self.reason = self.reason or f"input {i} dim {d} has the size expression {expr}"
                        return
                    self.tensor_dims.setdefault(i, []).append((d, self._symbol(expr)))

    def _symbol(self, expr: Any) -> int:
        if expr not in self.symbols:
            self.symbols.append(expr)
        return self.symbols.index(expr)

    @property
    def usable(self) -> bool:
        return self.reason is None and bool(self.symbols)

    def lengths(self, args: list[Any]) -> list[int]:
        values: list[int | None] = [None] * len(self.symbols)
        for i, dims in self.tensor_dims.items():
            for d, s in dims:
                values[s] = args[i].shape[d]
        for i, s in self.int_inputs.items():
            values[s] = int(args[i])
        return [int(v) if v is not None else 1 for v in values]

    def bounds(self, args: list[Any]) -> list[int | None]:
        out: list[int | None] = [self.max_size] * len(self.symbols)
        for i, dims in self.tensor_dims.items():
            marked = getattr(args[i], BOUNDS_ATTR, None) or {}
            for d, s in dims:
                if d in marked:
                    out[s] = marked[d] if out[s] is None else min(out[s], marked[d])
        for s, b in enumerate(out):
            if b is None:
                b = out[s] = self.shared.seen.get(self.symbols[s])
            if b is None and not self.shared.automatic:
                raise TpuError(
                    f"torchtpu: dynamic size {self.symbols[s]} has no bound; call torchtpu.mark_dynamic(t, dim, max_size) "
                    "on the input or pass options={'max_size': N} to torch.compile"
                )
        for symbol, b in zip(self.symbols, out):
            self.shared.seen[symbol] = b
        return out

    def pad(self, args: list[Any]) -> PaddedCall:
        """This call's lengths and its inputs padded to their buckets."""
        lengths = self.lengths(args)
        reads = self._reads(args)
        return PaddedCall(lengths, self._pad_args(args, reads, self.buckets(args, lengths, reads)))

    def _reads(self, args: list[Any]) -> dict[int, _Read]:
        """What each dynamic input is read from, and its eager-bucketed rows: asked once per
        input (both the buckets and the padding need them; each costs a few microseconds
        of tensor queries)."""
        return {i: _read(args[i], dims) for i, dims in self.tensor_dims.items()}

    def buckets(self, args: list[Any], lengths: list[int], reads: dict[int, _Read]) -> list[int]:
        """The size each symbol is padded to: its length's power-of-two bucket, within its
        bound. An unbounded (automatic) symbol's bucket leaves a quarter of room and only
        grows, as a caching allocator's block would: lengths that wander around a power of
        two (a batch's total of jagged ids) keep to one program instead of one per
        combination of tables, and a size Dynamo saw change grows into its room."""
        out = []
        held = self._eager_buckets(reads)
        for s, (symbol, n, b) in enumerate(zip(self.symbols, lengths, self.bounds(args))):
            if s in held and (b is None or held[s] <= b):
                k = held[s]  # the rows its inputs' storages hold already: no padding to do
            elif b is None:
                k = self.shared.grown[symbol] = max(bucket(n + n // 4, None), self.shared.grown.get(symbol, 0))
            else:
                k = bucket(n, b)
            out.append(k)
        return out

    def _eager_buckets(self, reads: dict[int, _Read]) -> dict[int, int]:
        """Symbol -> the rows of the eager-bucketed storages (eager/buckets.py) its inputs
        walk along their dynamic dim, where every such input agrees (a token count that
        ``nonzero`` produced, a saved activation of an earlier call): the program of that
        bucket reads those storages as they are, and its outputs are bucketed alike, so
        the eager ops around the graph keep running padded."""
        caps: dict[int, set[int | None]] = {}
        for i, dims in self.tensor_dims.items():
            for (_, s), rows in zip(dims, reads[i].rows):
                caps.setdefault(s, set()).add(rows)
        return {s: c.pop() for s, c in caps.items() if len(c) == 1 and None not in c}

    def _pad_args(self, args: list[Any], reads: dict[int, _Read], buckets: list[int]) -> list[Any]:
        """Inputs padded to their bucket sizes: a view over the spare rows of an
        eager-bucketed storage that holds them (a bucketed twin of uploaded ids included),
        else through the host; SymInts become buckets."""
        out = list(args)
        for i, dims in self.tensor_dims.items():
            t, rows, full = reads[i]
            pads = [(0, 0)] * t.dim()
            for d, s in dims:
                pads[d] = (0, buckets[s] - t.shape[d])
            if len(dims) == 1 and rows[0] == buckets[dims[0][1]]:
                d = dims[0][0]
                out[i] = full if full is not None else t.as_strided(t.shape[:d] + (rows[0],) + t.shape[d + 1 :], t.stride(), t.storage_offset())
            elif any(p[1] for p in pads) or not _own_storage(t):
                out[i] = _pad_host(t, pads)
        for i, s in self.int_inputs.items():
            out[i] = buckets[s]
        return out


class PaddedCall(NamedTuple):
    """A call of a bucketed graph: each symbol's true length, the inputs padded."""

    lengths: list[int]
    args: list[Any]


class _Read(NamedTuple):
    """A dynamic input as the padded program reads it."""

    tensor: Any  # the input, or the bucketed twin of its uploaded ids
    rows: list[int | None]  # per dynamic dim (tensor_dims order): its eager-bucketed storage's rows (_read)
    full: Any = None  # the twin at its storage's full rows: the input as a graph padded to them reads it


def _read(t: Any, dims: list[tuple[int, int]]) -> _Read:
    """How dynamic input ``t`` is read: from its bucketed twin (eager/buckets.py) when it is
    a 1-d upload that has one -- ids uploaded at varying lengths are then read padded on
    the device, with no trip of theirs through the host -- and, per dim of ``dims``, the
    rows of the eager-bucketed storage it reads when that dim walks the storage's live
    rows (else None). One pass per input: its storage is looked up once."""
    cell = _tpu_cell(t)
    twin = buckets.bucketed_twin(t, cell) if cell is not None and buckets._TWINS else None
    if twin is not None:
        # a twin is 1-d, its storage one row per element, its live rows those of ``t``
        # (bucketed_twin): dim 0 walks them, and the storage's length is the bucket's
        full = twin.full_tensor()
        rows = full.shape[0]
        return _Read(twin.tensor(), [rows if d == 0 else None for d, _ in dims], full)
    b = None if cell is None else buckets.bucket_of(cell)
    if b is None:
        return _Read(t, [None] * len(dims))
    return _Read(t, [b.cap if b.n == t.shape[d] and buckets.dynamic_dim(t, b) == d else None for d, _ in dims])


def _tpu_cell(t: Any) -> Any:
    """The storage cell of a tpu tensor; None for anything else."""
    if not isinstance(t, torch.Tensor):
        return None
    try:
        return t.untyped_storage()._cell
    except AttributeError:  # a CPU tensor's storage has no cell
        return None


def mark_rows(t: torch.Tensor, n: int, d: int) -> None:
    """Mark the storage of a graph's output ``t`` (its first ``n`` rows along ``d`` live,
    the rest the bucket's padding) as eager-bucketed, when its rows are laid out as
    eager/buckets.py reads them (``d`` outermost in memory, dense)."""
    from ..tensor.storage import cell_of

    cell = cell_of(t)
    row = t.stride(d)
    if row <= 0 or cell.numel % row or t.storage_offset():
        return
    cap = cell.numel // row
    b = buckets.Bucket(n, cap, row)
    if cap > n and buckets.dynamic_dim(t, b) == d:
        buckets.mark(cell, b)


def _own_storage(t: torch.Tensor) -> bool:
    """``t`` is its storage buffer, in the shape a padded input gets: a length that is its
    bucket already (a saved activation, a view of a padded output) must not key another
    program by its storage's layout."""
    if t.device.type != "tpu":
        return True
    from ..tensor.storage import cell_of

    return cell_of(t).shape == tuple(t.shape) and t.is_contiguous() and t.storage_offset() == 0


def _pad_host(t: torch.Tensor, pads: list[tuple[int, int]]) -> torch.Tensor:
    flat = [n for before_after in reversed(pads) for n in before_after]  # F.pad's order: last dimension first
    padded = torch.nn.functional.pad(t.detach().cpu(), flat)
    return padded.to(t.device) if t.device.type == "tpu" else padded


def _unsafe_reason(gm: torch.fx.GraphModule) -> str | None:
    return _unsafe_op(gm) or _size_used_as_a_value(gm)


def _unsafe_op(gm: torch.fx.GraphModule) -> str | None:
    for node in gm.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        if node.target is aten.copy_.default:
            if _dynamic_in(node.args[0]):  # the caller's storage was swapped for a padded copy
                return "the graph mutates a dynamic input"
            continue  # a static input (optimizer state, an accumulator) is written in place as usual
        name = node.target.overloadpacket.__name__
        if name.startswith("sym_") or name.startswith("_assert") or not _touches_dynamic(node):
            continue  # no padding reaches an op whose operands and results are all static
        if name not in PADDING_SAFE:
            return f"{node.target} is not known to be exact on padded, masked inputs"
        uncompilable = _not_compilable_padded(node, name)
        if uncompilable:
            return f"{node.target} {uncompilable}"
        several = _distinct_symbols(node.meta.get("val"))
        if several:
            # e.g. a batched linear with both batch and length dynamic: XLA's verifier
            # refuses broadcasts with two bounded dims (a RET_CHECK in its dynamic padder)
            return f"{node.target} makes a tensor with two dynamic dimensions ({several})"
        merged = _merged_dim(node.meta.get("val"))
        if merged is not None:
            # e.g. linear on a 3-d input views (b, n, d) as (b*n, d): XLA's masks go wrong
            # when a reshape folds a padded dim into another one
            return f"{node.target} makes a dimension of size {merged} (a reshape across a dynamic dim)"
    return None


def _not_compilable_padded(node: torch.fx.Node, name: str) -> str | None:
    """Why XLA cannot compile this op with a padded dimension (None: it can). The eager
    buckets' ``_NOT_COMPILABLE_PADDED`` in the graph's terms: only these operand forms fail."""
    divisor = node.args[1].meta.get("val") if len(node.args) > 1 and isinstance(node.args[1], torch.fx.Node) else None
    if name == "div" and isinstance(divisor, torch.Tensor) and _dynamic_in(divisor):
        # a true division puts its full-size divisor behind an optimization barrier
        # (lowering's ``opaque``), through which XLA's dynamic padder cannot carry a
        # dynamic dimension ("not implemented")
        return "divides by a tensor of dynamic size"
    val = node.meta.get("val")
    if name == "pow" and isinstance(val, torch.Tensor) and not val.dtype.is_floating_point:
        # integer pow is a while loop (lowering's _int_power): XLA's dynamic dimension
        # inference fails a RET_CHECK on it
        return "raises integers to a power (a loop XLA cannot run on a dynamic size)"
    return None


def _dynamic_in(val: Any) -> bool:
    """A node (or its meta value), a SymInt, or a nested list of them with a dynamic size."""
    from torch.fx.experimental.symbolic_shapes import has_free_symbols

    if isinstance(val, torch.fx.Node):
        val = val.meta.get("val")
    if isinstance(val, (list, tuple)):
        return any(_dynamic_in(v) for v in val)
    if isinstance(val, torch.Tensor):
        return has_free_symbols(val)
    return _symbolic(val)


def _touches_dynamic(node: torch.fx.Node) -> bool:
    return _dynamic_in(node) or any(_dynamic_in(a) for a in (*node.args, *node.kwargs.values()))


# Schema types of arguments that take a size (as the schema prints them; SymInt prints as
# int): a bucketed program may be given the bucket there.
_SIZE_TYPES = {"int", "List[int]", "Optional[int]", "Optional[List[int]]"}


def _size_used_as_a_value(gm: torch.fx.GraphModule) -> str | None:
    """A dynamic size that enters the computation as a number (``x.sum(0) / x.shape[0]``,
    ``x * n``, ``torch.full((1,), n)``): the program, built for the bucket, would compute
    with the bucket's size instead of the true one -- wrong values, so such a graph runs at
    exact shapes. Sizes that only shape tensors (view, full's size, arange's end, slice
    bounds) are what bucketing is for; a size the graph returns (a forward saving it for
    its backward) is the caller's own (``CompiledGraph._unpad``)."""
    for node in gm.graph.nodes:
        if not _symbolic(node.meta.get("val")):
            continue
        for user in node.users:
            if user.op != "call_function" or not isinstance(user.target, torch._ops.OpOverload):
                continue  # operator.mul, sym_float...: their results are checked in turn
            for arg, value in _schema_args(user):
                if value is node or (isinstance(value, (list, tuple)) and node in value):
                    if str(arg.type) not in _SIZE_TYPES and not _arange_end(user, arg):
                        return f"the size {node.name} is used as a number by {user.target}"
    return None


def _arange_end(node: torch.fx.Node, arg: Any) -> bool:
    """``arange(n)``'s end is a length (the bucket's first n values are the same)."""
    return node.target.overloadpacket is aten.arange and arg.name == "end"


def _symbolic(val: Any) -> bool:
    return isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)) and val.node.maybe_as_int() is None


def _schema_args(node: torch.fx.Node) -> list[tuple[Any, Any]]:
    arguments = node.target._schema.arguments
    pairs = list(zip(arguments, node.args))
    by_name = {a.name: a for a in arguments}
    pairs.extend((by_name[k], v) for k, v in node.kwargs.items() if k in by_name)
    return pairs


def _distinct_symbols(val: Any) -> str | None:
    """The symbols of a result with dims of two different dynamic sizes, if any."""
    for v in val if isinstance(val, (tuple, list)) else [val]:
        if isinstance(v, torch.Tensor):
            symbols = {str(s.node.expr) for s in v.shape if isinstance(s, torch.SymInt) and s.node.maybe_as_int() is None}
            if len(symbols) > 1:
                return ", ".join(sorted(symbols))
    return None


def _merged_dim(val: Any) -> Any:
    vals = val if isinstance(val, (tuple, list)) else [val]
    for v in vals:
        if isinstance(v, torch.Tensor):
            for s in v.shape:
                if isinstance(s, torch.SymInt) and not s.node.expr.is_Symbol:
                    return s.node.expr
    return None


def batched_linears_apart(gm: torch.fx.GraphModule) -> int:
    """Swap torchtpu's linear_nd in for ``linear(x, w, b)`` and ``x @ w`` (``w`` 2-d) in a
    Dynamo graph wherever ``x`` has a dynamic dim among 2+ leading dims: aten's linear
    would fold them into one (a reshape XLA cannot mask), linear_nd contracts the last
    dim directly, and so does its backward. Returns how many nodes were swapped."""
    import operator

    from ..lowering import registry

    registry._load_rules()
    from ..lowering.rules.linear import LINEAR_ND

    swapped = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or len(node.args) < 2 or node.kwargs:
            continue
        x, w = node.args[0], node.args[1]
        if node.target is torch._C._nn.linear:
            args = (x, w, node.args[2] if len(node.args) > 2 else None)
        elif node.target in (operator.matmul, torch.matmul) and _rank(w) == 2:
            with gm.graph.inserting_before(node):
                args = (x, gm.graph.call_function(torch.t, (w,)), None)
        else:
            continue
        if _rank(x) < 3 or not _has_symbol(_example(x).shape[:-1]):
            continue
        node.target, node.args = LINEAR_ND, args
        swapped += 1
    if swapped:
        gm.graph.lint()
        gm.recompile()
    return swapped


def _example(node: Any) -> Any:
    return node.meta.get("example_value") if isinstance(node, torch.fx.Node) else None


def _rank(node: Any) -> int:
    val = _example(node)
    return val.dim() if isinstance(val, torch.Tensor) else -1


def _has_symbol(sizes: Sequence[Any]) -> bool:
    return any(isinstance(s, torch.SymInt) and not isinstance(s.node.maybe_as_int(), int) for s in sizes)


def warn_exact(name: str, reason: str) -> None:
    warnings.warn(f"torchtpu: graph {name} runs at exact shapes (one program per length): {reason}", stacklevel=3)
