"""Tensors that grow by concatenation, without a program per length.

Text generation grows ``input_ids`` (and ``position_ids``, an attention mask) by one token
per step with ``torch.cat([ids, new], dim=-1)``. Keyed by exact shapes, that is a new
program per token for the cat and for every op that then reads ``ids[:, -1:]``.

When the concatenation is a flat append — every input contiguous and every dimension
before ``dim`` of size 1, so the result's elements are the inputs' elements one after
another — the result is written into a storage with spare capacity (``capacity``: at
least 4 KiB, then powers of two, then steps of an eighth), by a program keyed by the storages' capacities,
not by the lengths: each input is copied with ``dynamic_update_slice`` at a position
passed at run time. The next step's inputs live in such storages too, so the same program
serves every length up to the capacity, and the views read from them
(``ids[:, -1:]``, whose offset is a runtime operand: ``dispatch._Call``) key on the
capacity as well. A generation of n tokens compiles O(log n) programs per op instead of n.

The result is an ordinary contiguous tensor; only its storage is larger than its
elements (``untyped_storage().nbytes()``), as a caching allocator's block would be.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

from ..lowering.strided import contiguous_strides, storage_param, window
from ..stablehlo.builder import Builder, Value
from ..tensor.storage import Cell, cell_of, new_tensor

_SMALL = 1 << 16  # up to here capacities are powers of two (at least _MIN_BYTES); above, eighths of one
# The smallest storage an append gets. Every capacity a generation passes through costs a
# program per op that reads the storage (a fused step graph: three), so a small one is
# worth making roomy: 4 KiB holds a 512-token int64 prompt plus its continuation, where
# 64 elements made a 64-token generate() from an 8-token prompt go through 64 and 128.
_MIN_BYTES = 4096


def capacity(numel: int, itemsize: int = 8) -> int:
    """The storage size (in elements) an appended result of ``numel`` elements of
    ``itemsize`` bytes gets."""
    least = max(_MIN_BYTES // itemsize, 1)
    if numel <= least:
        return least
    p = 1 << (numel - 1).bit_length()
    if p <= _SMALL:
        return p
    step = p >> 3
    return -(-numel // step) * step


class Piece(NamedTuple):
    """One input of an append, as its program sees it."""

    cell_shape: tuple[int, ...]  # its storage buffer's device shape
    numel: int  # the storage's size in elements (its capacity)
    at_start: bool  # the input starts at the storage's first element (no offset operand)


class Append(NamedTuple):
    """A ``torch.cat`` call that is a flat append: what its program depends on (``key``)
    and what it is given at run time."""

    key: tuple  # ("append", dtype, pieces, capacity)
    cells: list[Cell]  # the inputs' storages, in order
    operands: list[int]  # per input: its storage offset (unless at_start), its position
    sizes: list[int]  # the result's sizes
    dtype: torch.dtype
    capacity: int

    def result(self, cell: Cell) -> torch.Tensor:
        return new_tensor(cell, self.sizes, contiguous_strides(self.sizes), 0, self.dtype)


def plan_append(tensors: Sequence[Any], dim: int) -> Append | None:
    """``torch.cat(tensors, dim)`` as a flat append into a storage with spare capacity, or
    None when the call is not one (it then runs as an ordinary op)."""
    sizes = _appended_sizes(tensors, dim)
    if sizes is None:
        return None
    dtype = tensors[0].dtype
    cap = capacity(sum(t.numel() for t in tensors), tensors[0].element_size())
    cells = [cell_of(t) for t in tensors]
    if any(c.numel > cap for c in cells):  # a small view of a large storage: copy it the usual way
        return None
    pieces = tuple(Piece(c.shape, c.numel, t.storage_offset() == 0) for c, t in zip(cells, tensors))
    operands, position = [], 0
    for t, piece in zip(tensors, pieces):
        if not piece.at_start:
            operands.append(t.storage_offset())
        operands.append(position)
        position += t.numel()
    return Append(("append", dtype, pieces, cap), cells, operands, sizes, dtype, cap)


def run_append(a: Append, run: Any, operand: Any) -> torch.Tensor:
    """Run the append now (eager): ``run(key, build, inputs)`` runs a program built once
    per key (``dispatch.run_utility``); ``operand(n)`` is the device buffer of int64 ``n``."""
    inputs, operands = [], iter(a.operands)
    for c, piece in zip(a.cells, a.key[2]):
        inputs.append(c.buf)
        inputs.extend(operand(next(operands)) for _ in range(1 if piece.at_start else 2))
    (buf,) = run(a.key, lambda b: [_build(b, a.key)], inputs)
    return a.result(Cell(a.capacity, a.dtype, buf))


def _build(b: Builder, key: tuple) -> Value:
    """The eager program: each storage followed by its operands, as ``run_append`` passes them."""
    bases, operands = [], []
    for p in key[2]:
        bases.append(storage_param(b, p.cell_shape, p.numel, key[1]))
        operands.extend(b.param((), torch.int64) for _ in range(1 if p.at_start else 2))
    return lower_append(b, key, bases, operands)


def lower_append(b: Builder, key: tuple, bases: list[Value], operands: list[Value]) -> Value:
    """The appended storage (``key[3]`` elements): each input's storage window copied to
    its position, in order, so that a window's spare tail is overwritten by the next input;
    the buffer has room for the last window's tail, which lies past the result and is
    dropped. ``operands``: per input its offset (unless at_start) and position."""
    _, dtype, pieces, cap = key
    widest = max(p.numel for p in pieces)
    out = b.broadcast_in_dim(b.constant(0, dtype), (cap + widest,), [])
    operand = iter(operands)
    for p, base in zip(pieces, bases):
        if not p.at_start:  # the storage from the input's offset on (its tail padded: no clamping)
            base = window(b, base, next(operand), p.numel, overhang=p.numel)
        out = b.dynamic_update_slice(out, base, [next(operand)])
    return b.slice(out, [0], [cap])


def _appended_sizes(tensors: Sequence[Any], dim: int) -> list[int] | None:
    """The result's sizes when ``cat(tensors, dim)`` lays the inputs end to end in memory."""
    if len(tensors) < 2 or not all(isinstance(t, torch.Tensor) and t.device.type == "tpu" for t in tensors):
        return None
    first = tensors[0]
    rank, dtype = first.dim(), first.dtype
    if rank == 0:
        return None
    dim = dim + rank if dim < 0 else dim
    if not 0 <= dim < rank or any(s != 1 for s in first.shape[:dim]):
        return None
    for t in tensors:
        if t.dtype != dtype or t.dim() != rank or t.numel() == 0 or not t.is_contiguous():
            return None
        if t.is_conj() or t.is_neg() or any(a != c for d, (a, c) in enumerate(zip(t.shape, first.shape)) if d != dim):
            return None
        cell = cell_of(t)
        if not cell.initialized or cell.dtype != dtype:
            return None
    sizes = list(first.shape)
    sizes[dim] = sum(t.shape[dim] for t in tensors)
    return sizes
