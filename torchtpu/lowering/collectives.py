"""The StableHLO of every collective, over replica groups: ONE implementation, used by the
xla transport's small programs (``distributed/xla_programs.py``) and by the lowering of
functional collectives inside compiled programs (``rules/collectives.py``).

A program runs in replica mode over a list of global ranks (replica ``i`` is the ``i``-th);
a collective's ``groups`` is the partition of those replicas into its process groups (each
block in group-rank order, all blocks the same size): ``[[0, 1]]`` for a 2-rank group,
``[[0, 1], [2, 3]]`` for the tensor-parallel dimension of a 2x2 mesh.

What XLA's CPU client can and cannot do shapes the StableHLO (``notes/cpu-collectives.md``):

- ``all_reduce`` accepts only add / multiply / minimum / maximum regions (an ``or`` region
  is UNIMPLEMENTED): bitwise ops and bool tensors reduce an ``all_gather`` locally;
- a small native ``reduce_scatter`` slows every later collective of the group ~10x
  (the XLA runtime, 0.10.2): reduce-scatter is ``all_to_all`` plus a local reduction;
- ``collective_broadcast`` is not implemented: broadcast is an ``all_reduce`` sum of the
  root's bits (every other rank contributes zeros), exact for every value (-0.0, NaN).

Which groups a compiled program's collectives use is plain data on its context
(:class:`ReplicaLayout`, set by compile/ from c10d's process groups): lowering never asks
torch.distributed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, NamedTuple

import torch

from ..stablehlo.builder import Builder, Value, prod
from ..stablehlo.types import is_complex, is_float, is_unsigned

Groups = Sequence[Sequence[int]]
REDUCE_OPS = ("sum", "avg", "product", "min", "max", "band", "bor", "bxor")
_NATIVE = {"sum": "add", "avg": "add", "product": "multiply", "min": "minimum", "max": "maximum"}
_BITWISE = {"band": "and", "bor": "or", "bxor": "xor"}
_BOOL = {"sum": "or", "max": "or", "bor": "or", "product": "and", "min": "and", "band": "and", "bxor": "xor"}
_BITS = {1: torch.uint8, 2: torch.uint16, 4: torch.uint32, 8: torch.uint64}


class ReplicaLayout(NamedTuple):
    """How a compiled program's collectives map onto replicas: the global ranks the program
    spans (replica ``i`` runs on ``ranks[i]``), per process-group name the partition of
    the replicas into that group's blocks, and per group name the smallest and largest
    ``all_to_all_single`` split (in rows) of any rank of the group in this graph, agreed
    when it was compiled: every rank must exchange the same padded shape."""

    ranks: tuple[int, ...]
    groups: dict[str, tuple[tuple[int, ...], ...]]
    split_ranges: Mapping[str, tuple[int, int]] = MappingProxyType({})


def groups_of(ctx: Any, group_name: str, what: str) -> tuple[tuple[int, ...], ...]:
    """The replica groups of process group ``group_name`` in this program."""
    layout = ctx.replica_layout
    if layout is None or group_name not in layout.groups:
        raise NotImplementedError(
            f"torchtpu: the functional collective {what} (group {group_name!r}) can only be lowered inside a "
            "torch.compile(backend='tpu') program compiled over its process group (TORCHTPU_COLLECTIVES=xla)"
        )
    return layout.groups[group_name]


def split_range(ctx: Any, group_name: str) -> tuple[int, int] | None:
    """The group's agreed (smallest, largest) ``all_to_all_single`` split in this program,
    or None where none was agreed (a program lowered outside torch.compile's backend)."""
    layout = ctx.replica_layout
    return None if layout is None else layout.split_ranges.get(group_name)


def check_reduce(op: str, dtype: torch.dtype) -> None:
    """Raise for a reduction XLA programs (and PyTorch) do not define."""
    if op not in REDUCE_OPS:
        raise NotImplementedError(f"torchtpu.distributed: ReduceOp {op!r} is not supported by the xla transport")
    floating = is_float(dtype) or is_complex(dtype)
    if op in _BITWISE and floating:
        raise ValueError(f"torchtpu.distributed: ReduceOp.{op.upper()} needs an integer or bool tensor, got {dtype}")
    if is_complex(dtype) and op in ("min", "max"):
        raise ValueError(f"torchtpu.distributed: ReduceOp.{op.upper()} is not defined for complex tensors ({dtype})")
    if dtype is torch.bool and op == "avg":
        raise ValueError("torchtpu.distributed: ReduceOp.AVG is not defined for bool tensors")


# -- small pieces ---------------------------------------------------------------------------------
def flat(b: Builder, x: Value) -> Value:
    return b.reshape(x, (prod(x.shape),))


def split(b: Builder, x: Value, shapes: Sequence[tuple[int, ...]]) -> list[Value]:
    """Cut a 1-d value into consecutive pieces of ``shapes``."""
    outs, start = [], 0
    for s in shapes:
        n = prod(s)
        outs.append(b.reshape(b.slice(x, [start], [start + n]), s))
        start += n
    return outs


def rows(b: Builder, x: Value) -> list[Value]:
    """The rows of a 2-d value as 1-d values."""
    w, n = x.shape
    return [b.reshape(b.slice(x, [i, 0], [i + 1, n]), (n,)) for i in range(w)]


def _combine_name(op: str, dtype: torch.dtype) -> str:
    if dtype is torch.bool:
        return _BOOL[op]
    return _BITWISE.get(op) or _NATIVE[op]


def _reduce_rows(b: Builder, x: Value, op: str) -> Value:
    """Combine the rows of ``x`` (W, n) in rank order: ((r0 . r1) . r2) ..."""
    name = _combine_name(op, x.dtype)
    parts = rows(b, x)
    acc = parts[0]
    for r in parts[1:]:
        acc = b.binary(name, acc, r)
    return acc


def _divide(b: Builder, x: Value, w: int) -> Value:
    """AVG's division by the group size; integers floor, as the host transport does."""
    c = b.constant(w, x.dtype, x.shape)
    q = b.binary("divide", x, c)
    if is_float(x.dtype) or is_complex(x.dtype) or is_unsigned(x.dtype):
        return q
    negative_rest = b.compare(b.binary("remainder", x, c), b.constant(0, x.dtype, x.shape), "LT")
    return b.binary("subtract", q, b.select(negative_rest, b.constant(1, x.dtype, x.shape), b.constant(0, x.dtype, x.shape)))


# -- the collectives ------------------------------------------------------------------------------
def all_reduce(b: Builder, x: Value, op: str, groups: Groups) -> Value:
    """``x`` (1-d) reduced over each group."""
    w = len(groups[0])
    if x.dtype is not torch.bool and op in _NATIVE:
        name = _NATIVE[op]
        y = b.all_reduce(x, groups, lambda p, q: b.binary(name, p, q))
    else:  # XLA CPU reduces only with add/multiply/min/max: gather, then reduce here
        y = _reduce_rows(b, b.all_gather(b.reshape(x, (1, prod(x.shape))), 0, groups), op)
    return _divide(b, y, w) if op == "avg" else y


def all_reduce_many(b: Builder, xs: Sequence[Value], op: str, groups: Groups) -> list[Value]:
    """Each value reduced over each group: one all_reduce per dtype (coalesced)."""
    out: list[Value | None] = [None] * len(xs)
    by_dtype: dict[torch.dtype, list[int]] = {}
    for i, x in enumerate(xs):
        by_dtype.setdefault(x.dtype, []).append(i)
    for idx in by_dtype.values():
        y = all_reduce(b, b.concatenate([flat(b, xs[i]) for i in idx], 0), op, groups)
        for i, v in zip(idx, split(b, y, [xs[i].shape for i in idx])):
            out[i] = v
    return out  # type: ignore[return-value]


def all_gather(b: Builder, x: Value, groups: Groups) -> Value:
    """Every rank's ``x`` in group-rank order, as the rows of a (W, numel) value."""
    return b.all_gather(b.reshape(x, (1, prod(x.shape))), 0, groups)


def reduce_scatter(b: Builder, x: Value, op: str, groups: Groups) -> Value:
    """Rank r of each group gets the reduction of every rank's r-th chunk of ``x`` (1-d)."""
    w = len(groups[0])
    # all_to_all + local reduction, not stablehlo.reduce_scatter (runtime bug, module doc)
    a = b.all_to_all(b.reshape(x, (w, prod(x.shape) // w)), 0, 0, groups)
    y = _reduce_rows(b, a, op)
    return _divide(b, y, w) if op == "avg" else y


def all_to_all(b: Builder, x: Value, groups: Groups) -> Value:
    """Even exchange of ``x`` (W, n): row p goes to group rank p; row p of the result came from it."""
    return b.all_to_all(x, 0, 0, groups)


def all_to_all_padded(b: Builder, x: Value, in_splits: Sequence[int], width: int, groups: Groups) -> Value:
    """Uneven exchange of ``x`` (1-d): ``in_splits[p]`` elements go to group rank p, each
    padded to ``width``; the (W, width) rows received."""
    zero = b.constant(0, x.dtype)
    chunks, start = [], 0
    for s in in_splits:
        piece = b.slice(x, [start], [start + s])
        chunks.append(b.reshape(b.pad(piece, zero, [0], [width - s]), (1, width)))
        start += s
    return all_to_all(b, b.concatenate(chunks, 0), groups)


def _bits_of(b: Builder, x: Value) -> Value:
    if x.dtype is torch.bool:
        return b.convert(x, torch.uint8)
    return b.bitcast_convert(x, x.shape, _BITS[x.dtype.itemsize])


def _from_bits(b: Builder, bits: Value, dtype: torch.dtype) -> Value:
    if dtype is torch.bool:
        return b.compare(bits, b.constant(0, bits.dtype, bits.shape), "NE")
    return b.bitcast_convert(bits, bits.shape, dtype)


def _is_root(b: Builder, root: int, groups: Groups) -> Value:
    """Whether this replica is group rank ``root`` of its group."""
    me = b.replica_id()
    flags = [b.compare(me, b.constant(g[root], torch.uint32), "EQ") for g in groups]
    acc = flags[0]
    for f in flags[1:]:
        acc = b.binary("or", acc, f)
    return acc


def _broadcast_real(b: Builder, x: Value, root: int, groups: Groups) -> Value:
    bits = _bits_of(b, x)
    mine = b.select(_is_root(b, root, groups), bits, b.constant(0, bits.dtype, bits.shape))
    total = b.all_reduce(mine, groups, lambda p, q: b.binary("add", p, q))
    return _from_bits(b, total, x.dtype)


def broadcast(b: Builder, x: Value, root: int, groups: Groups) -> Value:
    """Every rank of each group gets group rank ``root``'s ``x`` (1-d), bit for bit."""
    if not is_complex(x.dtype):
        return _broadcast_real(b, x, root, groups)
    part = torch.float32 if x.dtype is torch.complex64 else torch.float64
    re = _broadcast_real(b, b.unary("real", x, part), root, groups)
    im = _broadcast_real(b, b.unary("imag", x, part), root, groups)
    return b.op1("stablehlo.complex", [re, im], x.shape, x.dtype)
