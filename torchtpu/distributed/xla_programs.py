"""StableHLO programs for the XLA transport: one small program per collective and geometry.

Every program runs in replica mode over one group: replica ``i`` is the group's rank ``i``,
and every rank of the group runs the *same* program (a TPU requires it; on the CPU it
also keeps the gloo rendezvous in step). Inputs arrive with their device buffer's shape
and are flattened first; outputs leave with the shapes the caller asks for.

The collectives themselves (and what XLA's CPU client cannot do, which shapes them) are
``lowering/collectives.py``: the same StableHLO a compiled program's functional
collectives lower to. This module only wraps them into whole programs.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..lowering import collectives as C
from ..lowering.collectives import REDUCE_OPS, check_reduce
from ..stablehlo.builder import Builder, Value, prod

__all__ = [
    "REDUCE_OPS",
    "check_reduce",
    "all_reduce",
    "all_reduce_values",
    "all_gather_value",
    "all_gather_values",
    "scatter_value",
    "reduce_scatter_value",
    "broadcast_value",
    "all_to_all_value",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "broadcast",
]

Shape = tuple[int, ...]


def _groups(w: int) -> list[list[int]]:
    return [list(range(w))]


def _params(b: Builder, shapes: Sequence[Shape], dtype: torch.dtype) -> list:
    return [C.flat(b, b.param(s, dtype)) for s in shapes]


def all_reduce(shapes: Sequence[Shape], dtype: torch.dtype, op: str, w: int) -> str:
    """Each input reduced across the group; one all_reduce for all of them (coalesced)."""
    b = Builder()
    return b.module(C.all_reduce_many(b, [b.param(s, dtype) for s in shapes], op, _groups(w)))


def all_reduce_values(b: Builder, xs: Sequence[Value], op: str, w: int) -> list[Value]:
    """``all_reduce`` inside a larger program (a DeferAndFuse graph): each value reduced."""
    return C.all_reduce_many(b, xs, op, _groups(w))


def all_gather_value(b: Builder, x: Value, w: int) -> Value:
    """``all_gather_into_tensor`` inside a larger program: the ranks' values, flat, in rank order."""
    return C.flat(b, C.all_gather(b, x, _groups(w)))


def all_gather_values(b: Builder, x: Value, w: int, numel: int) -> list[Value]:
    """``all_gather`` into a list inside a larger program: each rank's value, flat."""
    return C.split(b, all_gather_value(b, x, w), [(numel,)] * w)


def scatter_value(b: Builder, xs: Sequence[Value], numel: int, dtype: torch.dtype, root: int, w: int) -> Value:
    """``scatter`` inside a larger program: this rank's chunk of the root's ``xs``
    (concatenated; a rank other than the root passes none and sends zeros)."""
    if xs:
        x = b.concatenate([C.flat(b, v) for v in xs], 0)
    else:
        x = b.broadcast_in_dim(b.constant(0, dtype), (w * numel,), [])
    return C.rows(b, C.all_to_all(b, b.reshape(x, (w, numel)), _groups(w)))[root]


def reduce_scatter_value(b: Builder, x: Value, op: str, w: int) -> Value:
    """``reduce_scatter_tensor`` inside a larger program: this rank's chunk of the reduction (flat)."""
    return C.reduce_scatter(b, C.flat(b, x), op, _groups(w))


def broadcast_value(b: Builder, x: Value, root: int, w: int) -> Value:
    """``broadcast`` inside a larger program: the root's value, bit for bit, on every rank."""
    return C.broadcast(b, x, root, _groups(w))


def all_to_all_value(b: Builder, x: Value, w: int) -> Value:
    """An even ``all_to_all_single`` inside a larger program: chunk p of the flat value goes
    to rank p; chunk p of the result came from it."""
    return C.flat(b, C.all_to_all(b, b.reshape(x, (w, prod(x.shape) // w)), _groups(w)))


def all_gather(shape: Shape, dtype: torch.dtype, w: int, out_shapes: Sequence[Shape]) -> str:
    """The group's inputs concatenated in rank order, cut into ``out_shapes``."""
    b = Builder()
    g = C.all_gather(b, b.param(shape, dtype), _groups(w))
    return b.module(C.split(b, C.flat(b, g), out_shapes))


def reduce_scatter(shapes: Sequence[Shape], dtype: torch.dtype, op: str, w: int, out_shape: Shape) -> str:
    """Rank r gets the reduction of every rank's r-th chunk (the inputs concatenated)."""
    b = Builder()
    y = C.reduce_scatter(b, b.concatenate(_params(b, shapes, dtype), 0), op, _groups(w))
    return b.module([b.reshape(y, out_shape)])


def all_to_all(
    in_shapes: Sequence[Shape],
    dtype: torch.dtype,
    w: int,
    in_splits: Sequence[int],
    out_splits: Sequence[int],
    width: int,
    out_shapes: Sequence[Shape],
) -> str:
    """Rank r sends ``in_splits[p]`` elements to peer p and receives ``out_splits[p]`` from
    it. Uneven splits are padded to ``width`` elements (the largest split in the group),
    so every rank runs the same fixed-size all_to_all."""
    b = Builder()
    x = b.concatenate(_params(b, in_shapes, dtype), 0)
    even = all(s == width for s in in_splits) and all(s == width for s in out_splits)
    if even:
        a = C.all_to_all(b, b.reshape(x, (w, width)), _groups(w))
        return b.module(C.split(b, C.flat(b, a), out_shapes))
    a = C.all_to_all_padded(b, x, in_splits, width, _groups(w))
    received = [b.slice(r, [0], [s]) for r, s in zip(C.rows(b, a), out_splits)]
    # `a` is an output too: a rank that receives nothing would otherwise have an all_to_all
    # whose result is unused, which XLA deletes -- and its peers would wait for it forever
    return b.module([*C.split(b, b.concatenate(received, 0), out_shapes), a])


def broadcast(shapes: Sequence[Shape], dtype: torch.dtype, root: int, w: int) -> str:
    """Every rank gets the root's inputs, bit for bit."""
    b = Builder()
    return b.module([b.reshape(C.broadcast(b, x, root, _groups(w)), s) for x, s in zip(_params(b, shapes, dtype), shapes)])


def scatter(shape: Shape, dtype: torch.dtype, root: int, w: int, out_shape: Shape) -> str:
    """Rank r gets the root's r-th chunk (the other ranks' inputs are placeholders)."""
    b = Builder()
    x = C.flat(b, b.param(shape, dtype))
    a = C.all_to_all(b, b.reshape(x, (w, prod(out_shape))), _groups(w))
    return b.module([b.reshape(C.rows(b, a)[root], out_shape)])


def send_recv(shape: Shape, dtype: torch.dtype) -> str:
    """Over two replicas [sender, receiver]: replica 0's input arrives at replica 1."""
    b = Builder()
    return b.module([b.collective_permute(b.param(shape, dtype), [(0, 1)])])
