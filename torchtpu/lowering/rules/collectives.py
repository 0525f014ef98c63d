"""Functional collectives (``_c10d_functional.*``, what DTensor, FSDP2 and tensor
parallelism put into torch.compile graphs) lowered to StableHLO collectives inside the
program, over the replica groups the program's :class:`~torchtpu.lowering.collectives.ReplicaLayout`
gives each process-group name (compile/ resolves them). ``wait_tensor`` is the identity:
inside one program the collective's result is ready when it is used.

Only torch.compile programs lower these: eager mode runs functional collectives through
the process group (their kernels are c10d's own, never torchtpu's).
"""

from __future__ import annotations

from typing import Any

import torch

from ...stablehlo.builder import Value, prod
from .. import collectives as C
from ..registry import register

_F = torch.ops._c10d_functional


def _name(group_name: Any) -> str:
    """A process group's name, given as the name or as the group."""
    return group_name if isinstance(group_name, str) else group_name.group_name


def _groups(L: Any, group_name: Any) -> tuple[tuple[int, ...], ...]:
    return C.groups_of(L.ctx, _name(group_name), L.op.name() if L.op is not None else "collective")


def _op(reduce_op: str, dtype: torch.dtype) -> str:
    op = reduce_op.lower()
    C.check_reduce(op, dtype)
    return op


def _check_size(L: Any, groups: Any, group_size: int) -> None:
    if len(groups[0]) != group_size:
        raise ValueError(f"torchtpu: {L.op.name()} got group_size {group_size} for a group of {len(groups[0])} ranks")


@register(_F.wait_tensor.default)
def wait_tensor(L: Any, x: Value) -> Value:
    return x


@register(_F.all_reduce.default, _F.all_reduce_.default)
def all_reduce(L: Any, x: Value, reduce_op: str, group_name: Any) -> Value:
    (y,) = C.all_reduce_many(L.b, [x], _op(reduce_op, x.dtype), _groups(L, group_name))
    return y


@register(_F.all_reduce_coalesced.default, _F.all_reduce_coalesced_.default)
def all_reduce_coalesced(L: Any, xs: list[Value], reduce_op: str, group_name: Any) -> list[Value]:
    ops = {_op(reduce_op, x.dtype) for x in xs}
    return C.all_reduce_many(L.b, xs, ops.pop(), _groups(L, group_name)) if xs else []


def _gather(L: Any, x: Value, groups: Any) -> Value:
    shape = (len(groups[0]) * (x.shape[0] if x.shape else 1), *x.shape[1:])
    return L.b.reshape(C.all_gather(L.b, x, groups), shape)


@register(_F.all_gather_into_tensor.default)
def all_gather_into_tensor(L: Any, x: Value, group_size: int, group_name: Any) -> Value:
    groups = _groups(L, group_name)
    _check_size(L, groups, group_size)
    return _gather(L, x, groups)


@register(_F.all_gather_into_tensor_coalesced.default)
def all_gather_into_tensor_coalesced(L: Any, xs: list[Value], group_size: int, group_name: Any) -> list[Value]:
    groups = _groups(L, group_name)
    _check_size(L, groups, group_size)
    return [_gather(L, x, groups) for x in xs]


def _scatter(L: Any, x: Value, reduce_op: str, groups: Any) -> Value:
    w = len(groups[0])
    if not x.shape or x.shape[0] % w:
        raise ValueError(f"torchtpu: reduce_scatter_tensor needs dim 0 divisible by the group size {w}, got {x.shape}")
    y = C.reduce_scatter(L.b, C.flat(L.b, x), _op(reduce_op, x.dtype), groups)
    return L.b.reshape(y, (x.shape[0] // w, *x.shape[1:]))


@register(_F.reduce_scatter_tensor.default)
def reduce_scatter_tensor(L: Any, x: Value, reduce_op: str, group_size: int, group_name: Any) -> Value:
    groups = _groups(L, group_name)
    _check_size(L, groups, group_size)
    return _scatter(L, x, reduce_op, groups)


@register(_F.reduce_scatter_tensor_coalesced.default)
def reduce_scatter_tensor_coalesced(L: Any, xs: list[Value], reduce_op: str, group_size: int, group_name: Any) -> list[Value]:
    groups = _groups(L, group_name)
    _check_size(L, groups, group_size)
    return [_scatter(L, x, reduce_op, groups) for x in xs]


@register(_F.all_to_all_single.default)
def all_to_all_single(L: Any, x: Value, output_split_sizes: list[int], input_split_sizes: list[int], group_name: Any) -> Value:
    """Rank r sends ``input_split_sizes[p]`` rows of ``x`` to group rank p and receives
    ``output_split_sizes[p]`` from it. Every rank must run the same fixed-size exchange:
    uneven splits are padded to the largest split of any rank of the group, agreed when
    the graph was compiled (``ReplicaLayout.split_ranges``), as the xla transport pads
    an eager uneven all_to_all."""
    b, groups = L.b, _groups(L, group_name)
    ins, outs = list(input_split_sizes), list(output_split_sizes)
    if not x.shape or any(not isinstance(s, int) for s in ins + outs):
        raise NotImplementedError(
            f"torchtpu: all_to_all_single of a {tuple(x.shape)} tensor with splits (in {ins}, out {outs}) cannot be "
            "lowered into a compiled program: the splits must be Python ints known when it is compiled. "
            "Run it outside the compiled function (torch._dynamo.disable)."
        )
    agreed = C.split_range(L.ctx, _name(group_name))
    low, high = agreed if agreed is not None else (min(ins + outs), max(ins + outs))
    w, row = len(groups[0]), prod(x.shape[1:])
    if low == high and x.shape[0] == w * high:  # even everywhere: one (w, chunk) exchange
        a = C.all_to_all(b, b.reshape(x, (w, prod(x.shape) // w)), groups)
        return b.reshape(a, x.shape)
    if agreed is None:
        raise NotImplementedError(
            f"torchtpu: all_to_all_single with uneven splits (in {ins}, out {outs}) needs the padded size its group "
            "agreed on when torch.compile(backend='tpu') compiled the graph; this program was lowered without it"
        )
    shape = (sum(outs), *x.shape[1:])
    if high == 0:  # nothing moves anywhere in the group
        return b.constant(0, x.dtype, shape)
    a = C.all_to_all_padded(b, C.flat(b, x), [s * row for s in ins], high * row, groups)
    L.ctx.keep.append(a)  # a rank that receives nothing must still run the exchange its peers wait on
    received = [b.slice(r, [0], [s * row]) for r, s in zip(C.rows(b, a), outs)]
    return b.reshape(b.concatenate(received, 0), shape)


@register(torch.ops._dtensor.shard_dim_alltoall.default)
def shard_dim_alltoall(L: Any, x: Value, gather_dim: int, shard_dim: int, group_name: Any) -> Value:
    """DTensor's ``Shard(gather_dim) -> Shard(shard_dim)`` redistribution: ``x`` is cut into
    the group's chunks along ``shard_dim``, chunk p goes to group rank p, and the chunks
    received are concatenated along ``gather_dim`` in rank order. DTensor pads ``x`` so that
    ``shard_dim`` divides evenly (``Shard._pad_for_new_shard_dim``)."""
    b, groups = L.b, _groups(L, group_name)
    w, shape = len(groups[0]), list(x.shape)
    rank = len(shape)
    g, s = gather_dim % rank, shard_dim % rank
    if shape[s] % w:
        raise NotImplementedError(
            f"torchtpu: shard_dim_alltoall of a {tuple(shape)} tensor: dim {s} does not divide by the {w} ranks"
        )
    chunk = shape[s] // w
    piece = [*shape[:s], chunk, *shape[s + 1 :]]  # one rank's chunk
    # (..., w, chunk, ...) with the w axis first: row p is the chunk for rank p
    split = b.reshape(x, [*shape[:s], w, chunk, *shape[s + 1 :]])
    rows = b.transpose(split, [s, *(d for d in range(rank + 1) if d != s)])
    exchanged = C.all_to_all(b, b.reshape(rows, (w, prod(piece))), groups)
    L.ctx.keep.append(exchanged)  # DTensor slices off its padding: a rank may use none of it
    received = b.reshape(exchanged, (w, *piece))
    # row p came from rank p: put the w axis just before gather_dim and merge the two
    moved = b.transpose(received, [*range(1, g + 1), 0, *range(g + 1, rank + 1)])
    return b.reshape(moved, [*piece[:g], w * piece[g], *piece[g + 1 :]])


@register(_F.broadcast.default, _F.broadcast_.default)
def broadcast(L: Any, x: Value, src: int, group_name: Any) -> Value:
    groups = _groups(L, group_name)
    if not 0 <= src < len(groups[0]):
        raise ValueError(f"torchtpu: broadcast from rank {src} of a group of {len(groups[0])} ranks")
    return L.b.reshape(C.broadcast(L.b, C.flat(L.b, x), src, groups), x.shape)
