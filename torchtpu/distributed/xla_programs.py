"""StableHLO programs for the XLA transport: one small program per collective and geometry.

Every program runs in replica mode over one group: replica ``i`` is the group's rank ``i``,
and every rank of the group runs the *same* program (a TPU requires it; on the CPU it
also keeps the gloo rendezvous in step). Inputs arrive with their device buffer's shape
and are flattened first; outputs leave with the shapes the caller asks for.

What XLA's CPU client can and cannot do shapes the programs (``notes/cpu-collectives.md``):

- ``all_reduce`` accepts only add / multiply / minimum / maximum regions (an ``or`` region
  is UNIMPLEMENTED): bitwise ops and bool tensors reduce an ``all_gather`` locally;
- a small native ``reduce_scatter`` slows every later collective of the group ~10x
  (the XLA runtime, 0.10.2): reduce-scatter is ``all_to_all`` plus a local reduction;
- ``collective_broadcast`` is not implemented: broadcast is an ``all_reduce`` sum of the
  root's bits (every other rank contributes zeros), exact for every value (-0.0, NaN).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..stablehlo.builder import Builder, Value, prod
from ..stablehlo.types import is_complex, is_float, is_unsigned

Shape = tuple[int, ...]
REDUCE_OPS = ("sum", "avg", "product", "min", "max", "band", "bor", "bxor")
_NATIVE = {"sum": "add", "avg": "add", "product": "multiply", "min": "minimum", "max": "maximum"}
_BITWISE = {"band": "and", "bor": "or", "bxor": "xor"}
_BOOL = {"sum": "or", "max": "or", "bor": "or", "product": "and", "min": "and", "band": "and", "bxor": "xor"}
_BITS = {1: torch.uint8, 2: torch.uint16, 4: torch.uint32, 8: torch.uint64}


def check_reduce(op: str, dtype: torch.dtype) -> None:
    """Raise for a reduction this transport (and PyTorch) does not define."""
    if op not in REDUCE_OPS:
        raise NotImplementedError(f"torchtpu.distributed: ReduceOp {op!r} is not supported by the xla transport")
    floating = is_float(dtype) or is_complex(dtype)
    if op in _BITWISE and floating:
        raise ValueError(f"torchtpu.distributed: ReduceOp.{op.upper()} needs an integer or bool tensor, got {dtype}")
    if is_complex(dtype) and op in ("min", "max"):
        raise ValueError(f"torchtpu.distributed: ReduceOp.{op.upper()} is not defined for complex tensors ({dtype})")
    if dtype is torch.bool and op == "avg":
        raise ValueError("torchtpu.distributed: ReduceOp.AVG is not defined for bool tensors")


# -- building blocks ---------------------------------------------------------------------------
def _groups(w: int) -> list[list[int]]:
    return [list(range(w))]


def _flat(b: Builder, x: Value) -> Value:
    return b.reshape(x, (prod(x.shape),))


def _combine_name(op: str, dtype: torch.dtype) -> str:
    if dtype is torch.bool:
        return _BOOL[op]
    return _BITWISE.get(op) or _NATIVE[op]


def _rows(b: Builder, x: Value) -> list[Value]:
    """The rows of a 2-d value as 1-d values."""
    w, n = x.shape
    return [b.reshape(b.slice(x, [i, 0], [i + 1, n]), (n,)) for i in range(w)]


def _reduce_rows(b: Builder, x: Value, op: str) -> Value:
    """Combine the rows of ``x`` (W, n) in rank order: ((r0 . r1) . r2) ..."""
    name = _combine_name(op, x.dtype)
    rows = _rows(b, x)
    acc = rows[0]
    for r in rows[1:]:
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


def _all_reduce_flat(b: Builder, x: Value, op: str, w: int) -> Value:
    if x.dtype is not torch.bool and op in _NATIVE:
        name = _NATIVE[op]
        y = b.all_reduce(x, _groups(w), lambda p, q: b.binary(name, p, q))
    else:  # XLA CPU reduces only with add/multiply/min/max: gather, then reduce here
        y = _reduce_rows(b, b.all_gather(b.reshape(x, (1, prod(x.shape))), 0, _groups(w)), op)
    return _divide(b, y, w) if op == "avg" else y


def _split(b: Builder, flat: Value, shapes: Sequence[Shape]) -> list[Value]:
    """Cut a 1-d value into consecutive pieces of ``shapes``."""
    outs, start = [], 0
    for s in shapes:
        n = prod(s)
        outs.append(b.reshape(b.slice(flat, [start], [start + n]), s))
        start += n
    return outs


# -- programs ----------------------------------------------------------------------------------
def all_reduce(shapes: Sequence[Shape], dtype: torch.dtype, op: str, w: int) -> str:
    """Each input reduced across the group; one all_reduce for all of them (coalesced)."""
    b = Builder()
    xs = [_flat(b, b.param(s, dtype)) for s in shapes]
    y = _all_reduce_flat(b, b.concatenate(xs, 0), op, w)
    return b.module(_split(b, y, shapes))


def all_gather(shape: Shape, dtype: torch.dtype, w: int, out_shapes: Sequence[Shape]) -> str:
    """The group's inputs concatenated in rank order, cut into ``out_shapes``."""
    b = Builder()
    x = _flat(b, b.param(shape, dtype))
    g = b.all_gather(b.reshape(x, (1, prod(x.shape))), 0, _groups(w))
    return b.module(_split(b, _flat(b, g), out_shapes))


def reduce_scatter(shapes: Sequence[Shape], dtype: torch.dtype, op: str, w: int, out_shape: Shape) -> str:
    """Rank r gets the reduction of every rank's r-th chunk (the inputs concatenated)."""
    b = Builder()
    x = b.concatenate([_flat(b, b.param(s, dtype)) for s in shapes], 0)
    n = prod(out_shape)
    # all_to_all + local reduction, not stablehlo.reduce_scatter (runtime bug 1, module doc)
    a = b.all_to_all(b.reshape(x, (w, n)), 0, 0, _groups(w))
    y = _reduce_rows(b, a, op)
    y = _divide(b, y, w) if op == "avg" else y
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
    x = b.concatenate([_flat(b, b.param(s, dtype)) for s in in_shapes], 0)
    even = all(s == width for s in in_splits) and all(s == width for s in out_splits)
    if even:
        a = b.all_to_all(b.reshape(x, (w, width)), 0, 0, _groups(w))
        return b.module(_split(b, _flat(b, a), out_shapes))
    zero = b.constant(0, dtype)
    chunks, start = [], 0
    for s in in_splits:
        piece = b.slice(x, [start], [start + s])
        chunks.append(b.reshape(b.pad(piece, zero, [0], [width - s]), (1, width)))
        start += s
    a = b.all_to_all(b.concatenate(chunks, 0), 0, 0, _groups(w))
    rows = [b.slice(r, [0], [s]) for r, s in zip(_rows(b, a), out_splits)]
    # `a` is an output too: a rank that receives nothing would otherwise have an all_to_all
    # whose result is unused, which XLA deletes -- and its peers would wait for it forever
    return b.module([*_split(b, b.concatenate(rows, 0), out_shapes), a])


def _bits_of(b: Builder, x: Value) -> Value:
    if x.dtype is torch.bool:
        return b.convert(x, torch.uint8)
    return b.bitcast_convert(x, x.shape, _BITS[x.dtype.itemsize])


def _from_bits(b: Builder, bits: Value, dtype: torch.dtype) -> Value:
    if dtype is torch.bool:
        return b.compare(bits, b.constant(0, bits.dtype, bits.shape), "NE")
    return b.bitcast_convert(bits, bits.shape, dtype)


def _broadcast_real(b: Builder, x: Value, root: int, w: int) -> Value:
    is_root = b.compare(b.replica_id(), b.constant(root, torch.uint32), "EQ")
    bits = _bits_of(b, x)
    mine = b.select(is_root, bits, b.constant(0, bits.dtype, bits.shape))
    total = b.all_reduce(mine, _groups(w), lambda p, q: b.binary("add", p, q))
    return _from_bits(b, total, x.dtype)


def broadcast(shapes: Sequence[Shape], dtype: torch.dtype, root: int, w: int) -> str:
    """Every rank gets the root's inputs, bit for bit."""
    b = Builder()
    outs = []
    for s in shapes:
        x = _flat(b, b.param(s, dtype))
        if is_complex(dtype):
            part = torch.float32 if dtype is torch.complex64 else torch.float64
            re = _broadcast_real(b, b.unary("real", x, part), root, w)
            im = _broadcast_real(b, b.unary("imag", x, part), root, w)
            y = b.op1("stablehlo.complex", [re, im], x.shape, dtype)
        else:
            y = _broadcast_real(b, x, root, w)
        outs.append(b.reshape(y, s))
    return b.module(outs)


def scatter(shape: Shape, dtype: torch.dtype, root: int, w: int, out_shape: Shape) -> str:
    """Rank r gets the root's r-th chunk (the other ranks' inputs are placeholders)."""
    b = Builder()
    x = _flat(b, b.param(shape, dtype))
    a = b.all_to_all(b.reshape(x, (w, prod(out_shape))), 0, 0, _groups(w))
    return b.module([b.reshape(_rows(b, a)[root], out_shape)])


def send_recv(shape: Shape, dtype: torch.dtype) -> str:
    """Over two replicas [sender, receiver]: replica 0's input arrives at replica 1."""
    b = Builder()
    return b.module([b.collective_permute(b.param(shape, dtype), [(0, 1)])])
