"""Bounded dynamism for eager ops: a data-dependent length through a few bucketed programs.

A mixture of experts routes ``token = torch.where(routed[e])[1]`` -- a different number of
tokens every step -- through ``x[token]``, the expert's linears and ``out.index_add_(0,
token, y)``; a recommender's batch holds a different total of ids per table. Keyed by
exact shapes, every new length compiles every op that touches it, forward and backward.

A *bucketed* tensor has a leading storage dimension with spare rows: its storage holds
``cap`` rows (``rows(n)``: growth.capacity's scheme) of which the first ``n`` are its
elements (a :class:`Bucket` on the storage's cell). Such storages are ``nonzero``'s
results (``upload``; ``where(cond)``) and the results of padded ops on them. Tensors a
user uploads keep storages of their own size (``untyped_storage().nbytes()`` is
PyTorch's); a 1-d upload whose length varies (``varies``: ids) also gets a bucketed
*twin*, which padded ops read in its place while the storage is unwritten (``add_twin``). An op that reads one runs *padded* (``plan_padded``) when

- it is known to be exact under XLA's masking (``PADDING_SAFE``), and
- every bucketed view it reads walks the live rows of its storage along one dimension
  (``dynamic_dim``), all with the same ``n`` and ``cap``, and
- PyTorch's meta kernels, given the views padded to ``cap`` rows, agree with the exact
  call: each result dimension is the same in both, or ``n`` there and ``cap`` here.

The padded program is keyed by ``cap`` (the key carries the padded shapes and
``Padded.key``), takes ``n`` as an operand and marks each padded view with
``stablehlo.set_dimension_size`` (``oplower.lower_op``), so XLA masks reductions, matmuls,
gathers and scatters over the padding -- the same mechanism compile/dynamic.py uses in
graphs. Results that carry the length are bucketed storages again, so the next op
(``y = expert(x[token])``, its backward) is padded too. Anything else runs at exact shapes,
as before: reading a bucketed storage at exact shapes is an ordinary strided view.

Rows past ``n`` hold anything (zeros from the host, leftovers of earlier ops): no result
ever depends on them.
"""

from __future__ import annotations

import math
import weakref
from typing import Any, NamedTuple

import numpy as np
import torch
from torch.utils._pytree import tree_flatten

from ..lowering.strided import contiguous_strides
from ..runner.bounded import BoundedCache
from ..stablehlo.types import host_numpy
from ..tensor.storage import Cell, new_tensor
from .growth import capacity
from .plan import KIND_TENSOR, KIND_TENSOR_LIST, OpPlan

# Op packets whose results do not change when a dimension is padded and marked with
# set_dimension_size (XLA masks the padding). Shared with compile/dynamic.py.
PADDING_SAFE = {
    # elementwise and activations
    "add", "sub", "mul", "div", "neg", "exp", "log", "tanh", "sigmoid", "relu", "gelu", "silu", "pow", "sqrt",
    "rsqrt", "abs", "where", "maximum", "minimum", "clamp", "erf", "reciprocal", "_to_copy", "clone", "copy",
    "eq", "ne", "lt", "le", "gt", "ge", "logical_not", "logical_and", "logical_or", "bitwise_and", "masked_fill",
    "scalar_tensor", "full", "zeros", "ones", "arange", "iota", "full_like", "zeros_like", "ones_like", "detach",
    "new_zeros", "new_ones", "new_full",
    "alias", "lift_fresh_copy", "threshold_backward", "gelu_backward", "sigmoid_backward", "tanh_backward",
    "rsub",
    # layout
    "view", "_unsafe_view", "reshape", "permute", "transpose", "t", "expand", "unsqueeze", "squeeze",
    "slice", "select", "split", "split_with_sizes", "cat", "contiguous", "unbind", "slice_scatter",
    # linear algebra and reductions XLA masks
    "mm", "addmm", "bmm", "matmul", "sum", "amax", "amin", "_softmax", "_log_softmax", "_softmax_backward_data",
    "_log_softmax_backward_data", "embedding", "embedding_dense_backward", "native_layer_norm",
    "native_layer_norm_backward", "baddbmm", "linear_nd", "contract_leading",
    # bags mask positions past the ids' true length (embedding.py: _live)
    "_embedding_bag", "_embedding_bag_forward_only", "_embedding_bag_backward", "_embedding_bag_dense_backward",
    "_embedding_bag_per_sample_weights_backward",
    # rows gathered by padded indices are padding themselves; XLA's dynamic padder turns a
    # scatter's padded indices out of bounds, so their updates are dropped
    "index_select", "index_add",
}  # fmt: skip

# Eager calls pass positions along a dimension as plain numbers (``select(x, 0, -1)``,
# ``slice(x, 0, -3)``): counted from the padded end they would read padding, and the shapes
# alone cannot tell. (In eager these are views, run by no program; they reach a program
# only in functional form, e.g. a backward.)
_POSITIONAL = {"select", "slice", "split", "split_with_sizes", "unbind", "slice_scatter"}
# Eager ops padding-safe beyond the graph list: gathers and scatters of advanced indexing
# (the forward and backward of ``x[token]``), silu's backward (elementwise).
_EAGER_ONLY = {"index", "index_put", "_index_put_impl", "silu_backward"}
# Ops XLA cannot compile with a dimension marked dynamic: true division and pow put their
# divisor behind an optimization barrier (lowering's ``opaque``), which XLA's dynamic
# padder does not propagate through ("not implemented"), and integer pow's loop fails
# its RET_CHECK. They run at exact shapes.
_NOT_COMPILABLE_PADDED = {"div", "pow"}
EAGER_SAFE = (PADDING_SAFE - _POSITIONAL - _NOT_COMPILABLE_PADDED) | _EAGER_ONLY
# Ops exact under padding of some arguments only (the rest are read at exact shapes): a
# table's rows or an indexed tensor's indexed dim padded would take a negative index
# (``x[-1]``, padding_idx=-1) from the padded end, and a bag's offsets padded would end
# the last bag at a padding offset. Ops not listed may have any argument padded.
_PADDABLE = {
    "index": {"indices"},
    "index_put": {"indices", "values"},
    "_index_put_impl": {"indices", "values"},
    "index_select": {"index"},
    "index_add": {"index", "source"},
    "embedding": {"indices"},
    "embedding_dense_backward": {"grad_output", "indices"},
    "_embedding_bag": {"indices", "per_sample_weights"},
    "_embedding_bag_forward_only": {"indices", "per_sample_weights"},
    "_embedding_bag_backward": {"indices", "offset2bag", "per_sample_weights"},
    "_embedding_bag_dense_backward": {"indices", "offset2bag", "per_sample_weights"},
    "_embedding_bag_per_sample_weights_backward": {"indices", "offset2bag"},
}


class Bucket(NamedTuple):
    """A storage of ``cap`` rows of ``row`` elements whose first ``n`` rows are live."""

    n: int
    cap: int
    row: int


# id(cell) -> (weak reference, Bucket); an entry leaves with its cell. Cell has fixed
# slots, and a dict lookup by id is what the hot path can afford per tensor argument.
_CELLS: dict[int, tuple[weakref.ref, Bucket]] = {}


def rows(n: int) -> int:
    """The rows a bucketed storage of ``n`` live rows gets: growth.capacity's scheme (at
    least 512, powers of two up to 64K, then eighths of one), a function of ``n`` alone so
    that tensors of one length (ids and their weights, of different dtypes) pad alike."""
    return capacity(n)


def mark(cell: Cell, bucket: Bucket) -> None:
    key = id(cell)
    _CELLS[key] = (weakref.ref(cell, lambda _: _CELLS.pop(key, None)), bucket)


def bucket_of(cell: Cell) -> Bucket | None:
    entry = _CELLS.get(id(cell))
    return None if entry is None else entry[1]


def upload(t: torch.Tensor, to_device: Any) -> torch.Tensor | None:
    """CPU tensor ``t`` (positions whose count the data decided) copied into a bucketed
    storage, its leading dim padded on the host where it costs nothing; None where that
    does not apply (a scalar, a length that is already its bucket's size).
    ``to_device(array)`` puts a numpy array on the device."""
    if t.dim() == 0 or t.is_conj() or t.is_neg():
        return None
    padded = padded_rows(host_numpy(t.detach().contiguous()))
    return None if padded is None else upload_padded(padded, t.shape[0], t.dtype, to_device)


def padded_rows(arr: np.ndarray) -> np.ndarray | None:
    """A copy of host array ``arr`` with zero rows after it up to its bucket's rows, or
    None when its length is its bucket's size already (numpy: a few microseconds, where
    torch's zeros and a slice copy took several times that on every twin's upload)."""
    n = arr.shape[0]
    cap = rows(n)
    if cap == n:
        return None
    padded = np.zeros((cap, *arr.shape[1:]), arr.dtype)
    padded[:n] = arr
    return padded


def upload_padded(padded: np.ndarray, n: int, dtype: torch.dtype, to_device: Any) -> torch.Tensor:
    """A tensor of ``n`` rows over a bucketed storage holding ``padded`` (``padded_rows``)."""
    shape = (n, *padded.shape[1:])
    row = math.prod(padded.shape[1:])
    cell = Cell(padded.size, dtype, to_device(padded), padded.shape)
    mark(cell, Bucket(n, padded.shape[0], row))
    # row-major strides even where a dim of size 0 or 1 leaves them free (nonzero's
    # (1, 2) result has strides (1, 1)): dynamic_dim finds the rows by their stride
    return new_tensor(cell, shape, contiguous_strides(shape), 0, dtype)


# -- ids a user uploads: an exact storage, and a bucketed twin ---------------------------------
# (dtype, bucket) -> the first length a 1-d upload of that dtype and bucket had, or VARYING
# once another followed. Bounded by dtypes x buckets.
_UPLOAD_LENGTHS: dict[tuple[torch.dtype, int], int] = {}
VARYING = -1
_TWIN_MAX_ROWS = 1 << 20  # past this a second copy on the device costs more than a compile


class _Twin:
    """The bucketed copy of an uploaded storage: uploaded from a padded host copy the first
    time a padded op reads it (an upload that no padded op reads costs no second transfer),
    and valid while the storage still holds the buffer it was uploaded with (XLA buffers
    are immutable: any write replaces it)."""

    __slots__ = ("buf", "host", "n", "dtype", "to_device", "twin", "full")

    def __init__(self, buf: Any, host: np.ndarray, n: int, dtype: torch.dtype, to_device: Any) -> None:
        # weakly: a second reference would make the storage's buffer look shared, and an
        # in-place write (or a collective) would copy it instead of taking it over
        self.buf = weakref.ref(buf)
        self.host: np.ndarray | None = host  # padded_rows of the upload
        self.n = n
        self.dtype = dtype
        self.to_device = to_device
        self.twin: torch.Tensor | None = None
        self.full: torch.Tensor | None = None  # the twin at its storage's full rows (full_tensor)

    def tensor(self) -> torch.Tensor | None:
        if self.host is not None:
            self.twin, self.host = upload_padded(self.host, self.n, self.dtype, self.to_device), None
        return self.twin

    def full_tensor(self) -> torch.Tensor:
        """The twin's whole storage as one 1-d tensor: what a bucketed graph reads."""
        if self.full is None:
            twin = self.tensor()
            cell = twin.untyped_storage()._cell
            self.full = new_tensor(cell, (cell.numel,), (1,), 0, self.dtype)
        return self.full


_TWINS: dict[int, tuple[weakref.ref, _Twin]] = {}


def varies(dtype: torch.dtype, n: int) -> bool:
    """Whether 1-d uploads of ``dtype`` have come at two lengths of ``n``'s bucket (this
    one included): a batch's ids, its per-sample weights. A tensor uploaded at one length
    -- a bias, a buffer, a fixed batch of labels -- has no twin. Sticky: once a bucket
    varies, a length that happens to repeat reuses its programs too."""
    key = (dtype, rows(n))
    first = _UPLOAD_LENGTHS.setdefault(key, n)
    if first not in (n, VARYING):
        _UPLOAD_LENGTHS[key] = first = VARYING
    return first == VARYING


def add_twin(t: torch.Tensor, host: np.ndarray, to_device: Any) -> None:
    """Give uploaded tensor ``t`` (a copy of the 1-d host array ``host`` of a tensor that
    needs no gradient, in a storage of its own size: what PyTorch's ``untyped_storage()``
    shows) a bucketed twin, when uploads of its length vary: ops that read ``t`` and run padded read the twin instead
    (``plan_padded``), so a new total of ids compiles nothing."""
    n = host.shape[0]
    if n > _TWIN_MAX_ROWS or rows(n) == n or not varies(t.dtype, n):
        return
    cell = t.untyped_storage()._cell
    key = id(cell)
    # a copy (padded_rows): the user may change their CPU tensor before a padded op reads the twin
    twin = _Twin(cell._buf, padded_rows(host), n, t.dtype, to_device)
    _TWINS[key] = (weakref.ref(cell, lambda _: _TWINS.pop(key, None)), twin)


def _valid_twin(t: Any, cell: Cell | None = None) -> _Twin | None:
    """The twin of ``t``'s storage (``cell``, where the caller has it), or None: no twin, or
    the storage was written since (its buffer replaced, or a pending DeferAndFuse write),
    or ``t`` reads it as another dtype (a uint8 storage viewed as bool means other
    elements than the twin holds)."""
    if cell is None:
        if not isinstance(t, torch.Tensor):
            return None
        try:  # the twins' lookup first: asked of every tensor argument while any twin lives
            cell = t.untyped_storage()._cell
        except AttributeError:  # not a tpu tensor
            return None
    entry = _TWINS.get(id(cell))
    if entry is None or cell.lazy is not None or t.dtype != cell.dtype:
        return None
    uploaded = entry[1].buf()
    if uploaded is None or cell._buf is not uploaded:
        return None
    if t.is_conj() or t.is_neg():
        return None
    return entry[1]


def bucketed_twin(t: torch.Tensor, cell: Cell) -> _Twin | None:
    """The bucketed twin of tpu tensor ``t`` -- an uploaded 1-d tensor, the whole of its
    storage ``cell`` -- or None: the same values in an eager-bucketed storage with spare
    rows after them (``_Twin.tensor`` uploads it if no padded op has read it yet)."""
    entry = _valid_twin(t, cell)
    if entry is None or t.dim() != 1 or t.storage_offset() or t.stride(0) != 1 or t.shape[0] != cell.numel:
        return None
    return entry


def _twin_view(t: torch.Tensor) -> torch.Tensor | None:
    """``t`` read from its storage's bucketed twin (same geometry), or None."""
    entry = _valid_twin(t)
    twin = None if entry is None else entry.tensor()
    return None if twin is None else twin.as_strided(t.shape, t.stride(), t.storage_offset())


def dynamic_dim(t: torch.Tensor, b: Bucket) -> int | None:
    """The dimension of view ``t`` that walks its storage's live rows (size ``n``, stride
    one row, every other index within the first row), so that padding it to ``cap`` reads
    the storage's padding rows and nothing else; None if there is none."""
    if t.is_conj() or t.is_neg() or t.dtype.itemsize * b.row * b.cap != t.untyped_storage().nbytes():
        return None
    shape, strides = t.shape, t.stride()
    for d, (size, stride) in enumerate(zip(shape, strides)):
        if size == b.n and stride == b.row:
            rest = sum((s - 1) * st for k, (s, st) in enumerate(zip(shape, strides)) if k != d)
            if t.storage_offset() + rest < b.row and all(s > 0 for k, s in enumerate(shape) if k != d):
                return d
            return None
    return None


def _broadcast_dim(t: torch.Tensor, n: int) -> int | None:
    """A dim of size ``n`` that ``t`` broadcasts (stride 0: a sum's gradient expanded back
    to its input's shape): padded, it repeats the same elements and reads nothing new."""
    hits = [d for d, (size, stride) in enumerate(zip(t.shape, t.stride())) if size == n]
    if len(hits) != 1 or t.stride(hits[0]) != 0 or t.is_conj() or t.is_neg():
        return None
    return hits[0]


class Padded(NamedTuple):
    """A call that runs padded: its length and bucket, the dynamic dim of each padded view
    (by id, and by position among the call's tensors for the key) and of each new result."""

    n: int
    cap: int
    dims: dict[int, int]  # id(tensor) -> dim padded to cap
    in_dims: tuple[tuple[int, int], ...]  # (tensor ordinal in the call, dim)
    out_dims: tuple[int | None, ...]  # per flattened new result: its dim of length n, or None
    values: list[Any]  # the call's arguments, uploaded ids replaced by their bucketed twins

    @property
    def key(self) -> tuple:
        return ("bucketed", self.cap, self.in_dims, self.out_dims)

    def padded_shape(self, t: torch.Tensor) -> tuple[int, ...]:
        shape = tuple(t.shape)
        d = self.dims.get(id(t))
        return shape if d is None else shape[:d] + (self.cap,) + shape[d + 1 :]

    def result(self, cell: Cell, spec: Any, d: int | None) -> torch.Tensor:
        """A new result over ``cell`` as the program wrote it (``spec``, the bucket's
        geometry): of the true length, its storage bucketed, where ``d`` is its length dim."""
        sizes = spec[0]
        if d is not None:
            sizes = sizes[:d] + (self.n,) + sizes[d + 1 :]
            mark(cell, Bucket(self.n, self.cap, spec[1][d]))
        return new_tensor(cell, sizes, spec[1], 0, spec[2])

    def new_results(self, specs: list, bufs: Any) -> list[Any]:
        """Eager: the new results over the program's buffers (one per non-None spec)."""
        it = iter(bufs)
        return [None if s is None else self.result(Cell(s[3], s[2], next(it)), s, d) for s, d in zip(specs, self.out_dims)]


def _tensors(plan: OpPlan, values: list[Any]) -> list[tuple[str, torch.Tensor]]:
    """The call's tensor arguments (with their names) in the order dispatch._Call sees them."""
    out = []
    for name, kind, v in zip(plan.names, plan.kinds, values):
        if kind == KIND_TENSOR and isinstance(v, torch.Tensor):
            out.append((name, v))
        elif kind == KIND_TENSOR_LIST:
            out.extend((name, t) for t in v if t is not None)
    return out


def plan_padded(plan: OpPlan, values: list[Any]) -> Padded | None:
    """How this call runs padded, or None: it runs at exact shapes."""
    packet = plan.functional.overloadpacket.__name__
    if not (_CELLS or _TWINS) or plan.out_positions or packet not in EAGER_SAFE:
        return None
    paddable = _PADDABLE.get(packet)
    if _TWINS:
        values = _with_twins(plan, values, paddable)
    dims: dict[int, int] = {}
    in_dims, length = [], None
    for i, (name, t) in enumerate(_tensors(plan, values)):
        if t.device.type != "tpu" or (paddable is not None and name not in paddable):
            continue
        b = bucket_of(t.untyped_storage()._cell)
        d = None if b is None else dynamic_dim(t, b)
        if d is None:
            continue
        if length not in (None, (b.n, b.cap)):
            return None  # two lengths: no single operand says which rows are live
        length = (b.n, b.cap)
        dims[id(t)] = d
        in_dims.append((i, d))
    if length is None:
        return None
    n, cap = length
    for i, (name, t) in enumerate(_tensors(plan, values)):
        if id(t) in dims or (paddable is not None and name not in paddable):
            continue
        d = _broadcast_dim(t, n)
        if d is not None:  # a gradient expanded to the length: padded alike
            dims[id(t)] = d
            in_dims.append((i, d))
        elif paddable is not None and n in t.shape:
            # an argument the op pads together with the others (embedding_dense_backward's
            # grad_output with its indices) read at its exact length: padding the rest alone
            # would pair rows that do not belong together (meta kernels do not check that)
            return None
    # every other tensor is read at exact shapes; _result_dims checks that the call means
    # the same with the padded views at two different bucket sizes
    in_dims.sort()
    out_dims = _known_result_dims(plan, values, dims, n, cap)
    if out_dims is None:
        return None
    return Padded(n, cap, dims, tuple(in_dims), out_dims, values)


def _with_twins(plan: OpPlan, values: list[Any], paddable: set[str] | None) -> list[Any]:
    """``values`` with each uploaded tensor the op may pad read from its bucketed twin;
    never one the op writes (the write must reach the user's storage)."""
    if not any(_valid_twin(t) is not None for _, t in _tensors(plan, values)):
        return values  # the common case: nothing to swap, nothing copied
    written = {id(t) for t in plan.mutated_tensors(values) if isinstance(t, torch.Tensor)}

    def swap(name: str, t: Any) -> Any:
        if not isinstance(t, torch.Tensor) or id(t) in written or (paddable is not None and name not in paddable):
            return t
        if paddable is None and (t.is_floating_point() or t.is_complex()):
            # a float upload's length is not a count the op pads along: padded, a layer
            # norm's weight (length 1, after uploads of length 2) read 512 rows against
            # normalized_shape [1] (an XLA error, or wrong values after other calls). Only
            # the ops that name their padded arguments (_PADDABLE: per_sample_weights) read
            # a float twin; elementwise ops read ids' twins
            return t
        twin = _twin_view(t)
        return t if twin is None else twin

    out = list(values)
    for i, (name, kind, v) in enumerate(zip(plan.names, plan.kinds, values)):
        if kind == KIND_TENSOR:
            out[i] = swap(name, v)
        elif kind == KIND_TENSOR_LIST and v is not None:
            out[i] = type(v)(swap(name, t) for t in v)
    return out


# (op, n, cap, each argument's geometry and padded dim, the other arguments) -> the answer
# of _result_dims, which asks PyTorch's meta kernels three times per padded call: every step
# of a recommender ran them for each embedding_bag, forward and backward (about a third of a
# DLRM step in eager and DeferAndFuse). Keyed by the exact length too: n decides the answer
# where it equals a static size (a length of 1 broadcasts).
_RESULT_DIMS = BoundedCache("padded result dims", limit=4096)
_UNKNOWN = object()


def _known_result_dims(plan: OpPlan, values: list[Any], dims: dict[int, int], n: int, cap: int) -> tuple[int | None, ...] | None:
    """``_result_dims``, remembered for calls of the same geometry."""
    key = _meta_key(plan, values, dims, n, cap)
    if key is None:
        return _result_dims(plan, values, dims, n, cap)
    out = _RESULT_DIMS.get(key, _UNKNOWN)
    if out is _UNKNOWN:
        out = _RESULT_DIMS[key] = _result_dims(plan, values, dims, n, cap)
    return out


def _meta_key(plan: OpPlan, values: list[Any], dims: dict[int, int], n: int, cap: int) -> tuple | None:
    """What the meta kernels of this padded call see, as a key; None if an argument cannot
    be one (then the call is not remembered)."""

    def part(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            return (v.shape, v.stride(), v.storage_offset(), v.dtype, v.device.type, dims.get(id(v)))
        if isinstance(v, (list, tuple)):
            return (type(v), tuple(part(x) for x in v))
        return (type(v), v)  # 1 and 1.0 promote differently

    key = (plan, n, cap, tuple(part(v) for v in values))
    try:
        hash(key)
    except TypeError:  # an unhashable argument
        return None
    return key


def _result_dims(plan: OpPlan, values: list[Any], dims: dict[int, int], n: int, cap: int) -> tuple[int | None, ...] | None:
    """Per new result, its dimension of length ``n`` (None: none); None when the call does
    not run padded. PyTorch's meta kernels see the call three times: exact, with the
    padded views at ``cap`` rows, and at twice that. A result dimension is the length where
    it is ``n``, ``cap`` and ``2 cap``, and static where it is the same in all three;
    anything else (a meta error, a size that grows otherwise) means the padded call would
    not be the exact one on more rows -- e.g. a tensor of the length left at exact shapes,
    or a row of the bucket's size that a length of 1 would broadcast against. Comparing two
    sizes, not one, is what tells a length of 1 or 2 from a static dim of that size."""
    try:
        exact = _new_and_mutated(plan, plan.functional_meta(values))
        at_cap, at_twice = (_checked_meta(plan, [_padded_meta(v, dims, c) for v in values]) for c in (cap, 2 * cap))
    except Exception:  # the padded call is not well formed (a size is compared with another)
        return None
    out = []
    for e, p, q in zip(exact.new, at_cap.new, at_twice.new):
        if not all(isinstance(x, torch.Tensor) for x in (e, p, q)):
            if any(isinstance(x, torch.Tensor) for x in (e, p, q)):
                return None
            out.append(None)
            continue
        d = _length_dim(e, p, q, n, cap)
        if d is False:
            return None
        out.append(d)
    for m, t in zip(at_cap.mutated, plan.mutated_tensors(values)):
        if isinstance(t, torch.Tensor) and (not isinstance(m, torch.Tensor) or tuple(m.shape) != _padded_shape(t, dims, cap)):
            return None
    return tuple(out)


def _check_index_put(a: dict[str, Any]) -> None:
    """index_put's meta kernel does not compare the values with the indexed shape (its CPU
    kernel does): values of the length left at exact shapes next to padded indices would
    pass it, so the values must broadcast to ``self[indices]``."""
    indexed = torch.ops.aten.index.Tensor(a["self"], a["indices"]).shape
    if torch.broadcast_shapes(a["values"].shape, indexed) != indexed:
        raise ValueError("index_put: values do not broadcast to the indexed shape")


def _check_index_add(a: dict[str, Any]) -> None:
    """index_add's meta kernel does not compare the source with ``self`` (its CPU kernel
    does): a source padded along a dimension other than ``dim`` -- a [1, 8] product of an
    uploaded 8-vector, whose twin made it [1, cap] -- next to an exact ``self`` would pass
    it, so every dimension but ``dim`` must be the same in both."""
    self, source, dim = a["self"], a["source"], a["dim"] % max(a["self"].dim(), 1)
    if source.dim() and any(s != t for d, (s, t) in enumerate(zip(self.shape, source.shape)) if d != dim):
        raise ValueError("index_add: the source's shape is not self's outside dim")


# The checks PyTorch's meta kernels leave out and the CPU kernels make, by op packet: a
# padded call that only passes the meta kernel for want of them is ill formed.
_META_CHECKS = {
    "index_put": _check_index_put,
    "_index_put_impl": _check_index_put,
    "index_add": _check_index_add,
}


def _checked_meta(plan: OpPlan, metas: list[Any]) -> _MetaResults:
    """The meta kernel's results for ``metas``, raising where the call is ill formed."""
    check = _META_CHECKS.get(plan.functional.overloadpacket.__name__)
    if check is not None:
        check(dict(zip(plan.names, metas)))
    return _new_and_mutated(plan, plan.functional_meta(metas))


class _MetaResults(NamedTuple):
    new: list[Any]
    mutated: list[Any]


def _new_and_mutated(plan: OpPlan, meta: Any) -> _MetaResults:
    new, _ = tree_flatten(list(meta[: plan.n_plain]))
    mutated, _ = tree_flatten(list(meta[plan.n_plain :]))
    return _MetaResults(new, mutated)


def _length_dim(e: torch.Tensor, p: torch.Tensor, q: torch.Tensor, n: int, cap: int) -> int | None | bool:
    """The result's dimension that is ``n`` exact, ``cap`` padded (``p``) and ``2 cap``
    padded twice as far (``q``); None: none; False when the sizes change otherwise, or
    the padded result could not be a bucketed storage (its length dimension must be the
    outermost in memory: rows of ``stride`` elements)."""
    if not (e.dtype == p.dtype == q.dtype) or not (e.dim() == p.dim() == q.dim()):
        return False
    found = None
    for d, (a, b, c) in enumerate(zip(e.shape, p.shape, q.shape)):
        if a == b == c:
            continue
        if (a, b, c) != (n, cap, 2 * cap) or found is not None:
            return False
        found = d
    if found is None:
        return None
    row = p.stride(found)
    others = [(size, st) for k, (size, st) in enumerate(zip(p.shape, p.stride())) if k != found]
    width = 1 + sum((size - 1) * st for size, st in others)  # the elements one row's indices span
    if row * cap != p.numel() or width != row or math.prod(size for size, _ in others) != row:
        return False  # not rows of ``row`` elements, densely: flatten_for_strides would relayout it
    return found


def _padded_shape(t: torch.Tensor, dims: dict[int, int], cap: int) -> tuple[int, ...]:
    d = dims.get(id(t))
    shape = tuple(t.shape)
    return shape if d is None else shape[:d] + (cap,) + shape[d + 1 :]


def _padded_meta(v: Any, dims: dict[int, int], cap: int) -> Any:
    if isinstance(v, torch.Tensor) and id(v) in dims:
        return torch.empty_strided(_padded_shape(v, dims, cap), v.stride(), dtype=v.dtype, device="meta")
    if isinstance(v, (list, tuple)) and any(isinstance(x, torch.Tensor) and id(x) in dims for x in v):
        return type(v)(_padded_meta(x, dims, cap) for x in v)
    return v


def padded_view_meta(t: torch.Tensor, padded: Padded) -> torch.Tensor:
    """A meta tensor with ``t``'s storage and geometry, padded where the call pads it (what
    ``oplower.lower_op`` reads the view by)."""
    numel = t.untyped_storage().nbytes() // t.dtype.itemsize
    return torch.empty(numel, dtype=t.dtype, device="meta").as_strided(padded.padded_shape(t), t.stride(), t.storage_offset())
