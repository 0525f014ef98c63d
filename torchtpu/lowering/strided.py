"""Reading and writing a strided view of a flat storage buffer, inside a program.

A tpu storage is one flat device buffer; a tensor is (sizes, strides, offset) over it,
exactly as in ATen. Programs receive storages and start by materialising the views
they read (slices and reshapes, which XLA fuses; a gather only for overlapping views),
and end by writing in-place results back (a reshape when the view covers the whole
storage, a dynamic_update_slice for a contiguous range, a scatter otherwise).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..stablehlo.builder import Builder, Value, prod

Offset = int | Value
"""A view's storage offset: a Python int baked into the program, or an ``int64`` scalar
operand, so that one eager program serves a view wherever it starts (``x[:, -1:]`` of a
tensor growing by a token per step)."""


def _start(b: Builder, offset: Offset) -> Value:
    return offset if isinstance(offset, Value) else b.constant(offset, torch.int64)


def window(b: Builder, base: Value, offset: Offset, length: int, overhang: int = 0) -> Value:
    """``base[offset : offset + length]``, padded with zeros past the end of ``base``: the
    window may reach ``overhang`` elements past the view's last element (a strided view's
    last row can stop short of its stride)."""
    total = base.shape[0]
    if isinstance(offset, int):
        if offset + length > total:
            base = b.pad(base, b.constant(0, base.dtype), [0], [offset + length - total])
        return b.slice(base, [offset], [offset + length])
    # a runtime offset: the view fits in ``base``, so padding by the overhang keeps every
    # valid offset from making dynamic_slice clamp its start
    if overhang <= 0:
        return b.dynamic_slice(base, [offset], [length])
    bits = SAME_WIDTH_INT.get(base.dtype)
    if bits is None:
        padded = b.pad(base, b.constant(0, base.dtype), [0], [overhang])
        return b.dynamic_slice(padded, [offset], [length])
    # XLA:CPU pads 16-bit floats through float32, which rewrites NaN payloads (bfloat16
    # 0xFFFF came back 0xFFC0): move the bits as integers
    moved = window(b, b.bitcast_convert(base, base.shape, bits), offset, length, overhang)
    return b.bitcast_convert(moved, moved.shape, base.dtype)


SAME_WIDTH_INT = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32, torch.float64: torch.int64}


def storage_param(b: Builder, shape: Sequence[int], numel: int, dtype: torch.dtype) -> Value:
    """A storage buffer as a program parameter of its device ``shape``, read flat."""
    p = b.param(tuple(shape), dtype)
    return p if tuple(shape) == (numel,) else b.reshape(p, (numel,))


def buffer_shape(sizes: Sequence[int], strides: Sequence[int], numel: int) -> tuple[int, ...]:
    """The device shape of a new storage's buffer: its tensor's own when the tensor fills the
    storage row-major (most results), else flat. A later program that updates the storage
    in place (an optimizer's momentum, made by the first step) then does so without a copy:
    XLA copies a donated buffer whose update goes through a reshape of a flat one (SGD with
    momentum on ResNet-18: 42 copies per step, 10.7 of its optimizer program's 30 ms)."""
    sizes = tuple(int(n) for n in sizes)
    if len(sizes) >= 2 and prod(sizes) == numel and is_contiguous(sizes, strides):
        return sizes
    return (numel,)


def storage_result(b: Builder, flat: Value, shape: Sequence[int]) -> Value:
    """A new value of a storage, in the storage buffer's device ``shape``."""
    return flat if tuple(shape) == flat.shape else b.reshape(flat, tuple(shape))


def contiguous_strides(sizes: Sequence[int]) -> tuple[int, ...]:
    strides, acc = [], 1
    for n in reversed(sizes):
        strides.append(acc)
        acc *= max(int(n), 1)
    return tuple(reversed(strides))


def is_contiguous(sizes: Sequence[int], strides: Sequence[int]) -> bool:
    expected = contiguous_strides(sizes)
    return all(n == 1 or s == e for n, s, e in zip(sizes, strides, expected))


def storage_extent(sizes: Sequence[int], strides: Sequence[int], offset: int) -> int:
    """Number of storage elements a view needs (its highest index + 1)."""
    if any(n == 0 for n in sizes):
        return offset
    return offset + 1 + sum((n - 1) * s for n, s in zip(sizes, strides))


def dense_order(sizes: Sequence[int], strides: Sequence[int]) -> list[int] | None:
    """If the view is a permutation of a dense, non-overlapping layout, the dims from
    outermost to innermost; else None."""
    order = sorted(range(len(sizes)), key=lambda d: (-strides[d], -d))
    acc = 1
    for d in reversed(order):
        if sizes[d] != 1 and strides[d] != acc:
            return None
        acc *= sizes[d]
    return order


_COMPLEX_PARTS = {torch.complex64: torch.float32, torch.complex128: torch.float64}


def bitcast(b: Builder, x: Value, dtype: torch.dtype) -> Value:
    """``x`` reinterpreted as ``dtype``, byte for byte along its last dimension, as
    ``view(dtype)`` does on the CPU (f32[..., n] <-> u8[..., 4n]). For a flat storage
    whose bytes do not fill a last element of ``dtype``, that element reads as zero
    bytes (no view can reach it). Complex values are pairs of their real part type;
    bool is one byte holding 0 or 1, and a byte reads as True when it is not zero."""
    if x.dtype == dtype:
        return x
    if x.dtype in _COMPLEX_PARTS:
        return bitcast(b, _complex_to_parts(b, x), dtype)
    if dtype in _COMPLEX_PARTS:
        return _parts_to_complex(b, bitcast(b, x, _COMPLEX_PARTS[dtype]), dtype)
    if x.dtype is torch.bool:
        return bitcast(b, b.convert(x, torch.uint8), dtype)
    if dtype is torch.bool:
        u8 = bitcast(b, x, torch.uint8)
        return b.compare(u8, b.broadcast_in_dim(b.constant(0, torch.uint8), u8.shape, []), "NE")
    src, dst = x.dtype.itemsize, dtype.itemsize
    if src == dst:  # (also for 0-d values: the only sizes PyTorch lets a 0-d tensor change between)
        return b.bitcast_convert(x, x.shape, dtype)
    lead, n = x.shape[:-1], x.shape[-1]
    if src > dst:  # each element becomes k narrower ones: a trailing dimension, then merged
        k = src // dst
        return b.reshape(b.bitcast_convert(x, lead + (n, k), dtype), lead + (n * k,))
    k = dst // src  # k elements make one wider one: grouped in a trailing dimension
    x = _pad_last(b, x, -n % k)
    m = x.shape[-1] // k
    return b.bitcast_convert(b.reshape(x, lead + (m, k)), lead + (m,), dtype)


def _pad_last(b: Builder, x: Value, extra: int) -> Value:
    if not extra:
        return x
    return b.pad(x, b.constant(0, x.dtype), [0] * x.rank, [0] * (x.rank - 1) + [extra])


def _complex_to_parts(b: Builder, x: Value) -> Value:
    """Complex elements as interleaved (re, im) parts (view_as_real's layout), flattened
    into the last dimension."""
    part = _COMPLEX_PARTS[x.dtype]
    re = b.op1("stablehlo.real", [x], x.shape, part)
    im = b.op1("stablehlo.imag", [x], x.shape, part)
    pair = b.concatenate([b.reshape(re, x.shape + (1,)), b.reshape(im, x.shape + (1,))], x.rank)
    return b.reshape(pair, x.shape[:-1] + (x.shape[-1] * 2,))


def _parts_to_complex(b: Builder, parts: Value, dtype: torch.dtype) -> Value:
    parts = _pad_last(b, parts, parts.shape[-1] % 2)
    lead, m = parts.shape[:-1], parts.shape[-1] // 2
    pairs = b.reshape(parts, lead + (m, 2))
    zeros = [0] * len(lead)
    re = b.reshape(b.slice(pairs, zeros + [0, 0], list(lead) + [m, 1]), lead + (m,))
    im = b.reshape(b.slice(pairs, zeros + [0, 1], list(lead) + [m, 2]), lead + (m,))
    return b.op1("stablehlo.complex", [re, im], re.shape, dtype)


def _write_unit(dtype: torch.dtype) -> torch.dtype:
    """The element type a write through a view of ``dtype`` into a storage of another
    type is done in: bool writes its bytes (0/1), so other bytes of the storage keep
    their exact values."""
    return torch.uint8 if dtype is torch.bool else dtype


def _flat_indices(b: Builder, sizes: Sequence[int], strides: Sequence[int], offset: Offset) -> Value:
    """i64 tensor of ``sizes``: the storage index of every element of the view."""
    idx = b.broadcast_in_dim(_start(b, offset), tuple(sizes), [])
    for d, (n, s) in enumerate(zip(sizes, strides)):
        if n == 1 or s == 0:
            continue
        term = b.binary(
            "multiply", b.iota(sizes, d, torch.int64), b.broadcast_in_dim(b.constant(s, torch.int64), tuple(sizes), [])
        )
        idx = b.binary("add", idx, term)
    return idx


def read_view(b: Builder, base: Value, sizes: Sequence[int], strides: Sequence[int], offset: Offset, dtype: torch.dtype) -> Value:
    sizes, strides = tuple(sizes), tuple(strides)
    base = bitcast(b, base, dtype)
    numel = prod(sizes)
    total = base.shape[0]
    if numel == 0:
        return b.broadcast_in_dim(b.constant(0, dtype), sizes, [])
    if is_contiguous(sizes, strides):
        if isinstance(offset, int) and offset == 0 and numel == total:
            return b.reshape(base, sizes)
        return b.reshape(window(b, base, offset, numel), sizes)
    # Drop size-1 dims; broadcast stride-0 dims at the end.
    kept = [d for d in range(len(sizes)) if sizes[d] != 1 and strides[d] != 0]
    order = sorted(kept, key=lambda d: -strides[d])
    if _nested_slices_ok(sizes, strides, order):
        x = _nested_slices(b, base, sizes, strides, offset, order)
        # x has dims in `order`; put them back in view order
        inv = sorted(range(len(order)), key=lambda i: order[i])
        x = b.transpose(x, inv)
        kept_sorted = sorted(kept)
        bshape = tuple(sizes)
        inner = tuple(sizes[d] for d in kept_sorted)
        x = b.reshape(x, inner)
        return b.broadcast_in_dim(x, bshape, kept_sorted)
    # Overlapping views (e.g. unfold with step < size): gather every element.
    idx = _flat_indices(b, sizes, strides, offset)
    idx = b.reshape(idx, sizes + (1,))
    return b.gather(base, idx, [], [0], [0], len(sizes), [1], sizes)


def _nested_slices_ok(sizes: Sequence[int], strides: Sequence[int], order: Sequence[int]) -> bool:
    for a, c in zip(order, order[1:]):
        if strides[a] % strides[c] != 0 or strides[a] < sizes[c] * strides[c]:
            return False
    return True


def _nested_slices(
    b: Builder, base: Value, sizes: Sequence[int], strides: Sequence[int], offset: Offset, order: Sequence[int]
) -> Value:
    """Slice/reshape chain for a non-overlapping strided view; dims come out in ``order``."""
    if not order:  # every dim has size 1 or stride 0: a single element
        return b.reshape(window(b, base, offset, 1), ())
    n0, s0 = sizes[order[0]], strides[order[0]]
    span = 1 + sum((sizes[d] - 1) * strides[d] for d in order)
    x = b.reshape(window(b, base, offset, n0 * s0, n0 * s0 - span), (n0, s0))
    lead = [n0]
    for d in order[1:]:
        n, s = sizes[d], strides[d]
        rank = len(lead) + 1
        x = b.slice(x, [0] * rank, list(lead) + [n * s])
        x = b.reshape(x, tuple(lead) + (n, s))
        lead.append(n)
    rank = len(lead) + 1
    x = b.slice(x, [0] * rank, list(lead) + [1])
    return b.reshape(x, tuple(lead))


def write_view(b: Builder, base: Value, sizes: Sequence[int], strides: Sequence[int], offset: Offset, value: Value) -> Value:
    """The storage after writing ``value`` (already of the view's shape and dtype) into the view."""
    sizes, strides = tuple(sizes), tuple(strides)
    numel = prod(sizes)
    if numel == 0:
        return base
    if value.dtype != base.dtype:  # a view of another dtype (x.view(dtype)): write in its units, cast back
        unit = _write_unit(value.dtype)
        updated = write_view(b, bitcast(b, base, unit), sizes, strides, offset, b.convert(value, unit))
        restored = bitcast(b, updated, base.dtype)  # a partial last element was padding: drop it
        return restored if restored.shape == base.shape else b.slice(restored, [0], [base.shape[0]])
    total = base.shape[0]
    flat = b.reshape(value, (numel,))
    if is_contiguous(sizes, strides):
        if isinstance(offset, int) and offset == 0 and numel == total:
            return flat
        return b.dynamic_update_slice(base, flat, [_start(b, offset)])
    idx = b.reshape(_flat_indices(b, sizes, strides, offset), (numel, 1))
    return b.scatter(base, idx, flat, [], [0], [0], 1)


def storage_strides(sizes: Sequence[int], strides: Sequence[int]) -> tuple[int, ...]:
    """The strides a result really gets from ``flatten_for_strides`` (without building it)."""
    if is_contiguous(sizes, strides):
        return tuple(strides)
    if prod(sizes) <= 1 or dense_order(sizes, strides) is None:
        return contiguous_strides(sizes)
    return tuple(strides)


def flatten_for_strides(b: Builder, value: Value, strides: Sequence[int]) -> tuple[Value, tuple[int, ...]]:
    """Flatten a result into a storage laid out with the strides PyTorch's meta kernel
    chose. Returns the flat Value and the strides the tensor will really have
    (contiguous when the meta strides are not a dense permutation)."""
    sizes = value.shape
    numel = prod(sizes)
    if is_contiguous(sizes, strides) or numel <= 1:
        return b.reshape(value, (numel,)), tuple(strides) if is_contiguous(sizes, strides) else contiguous_strides(sizes)
    order = dense_order(sizes, strides)
    if order is None:
        return b.reshape(value, (numel,)), contiguous_strides(sizes)
    return b.reshape(b.transpose(value, order), (numel,)), tuple(strides)


def apply_math_bits(b: Builder, x: Value, conj: bool, neg: bool) -> Value:
    """A tensor with PyTorch's lazy conjugate/negative bit (``x.conj()``, ``_neg_view``)
    holds conj/neg of its storage; both are involutions, so this maps storage values to
    tensor values on reads and back on writes."""
    if conj and x.dtype in _COMPLEX_PARTS:
        part = _COMPLEX_PARTS[x.dtype]
        re = b.op1("stablehlo.real", [x], x.shape, part)
        im = b.op1("stablehlo.imag", [x], x.shape, part)
        x = b.op1("stablehlo.complex", [re, b.unary("negate", im)], x.shape, x.dtype)
    if neg:
        x = b.unary("negate", x)
    return x
