"""The runtime kernels that are not lowerings: allocation, transfers, metadata views,
resize/set, and reading a scalar back. Everything else goes through eager/dispatch.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .. import _spans, metrics, op_report
from ..errors import check_device_index
from ..lowering.strided import contiguous_strides, dense_order, storage_extent, storage_param
from ..runner import checks
from ..runtime import memory, pjrt
from ..stablehlo.types import host_numpy, numpy_dtype, torch_from_host
from ..tensor.storage import _CPU_KEYSET, Cell, _fake_pointer, _set_storage, attach, cell_of, new_tensor

aten = torch.ops.aten
_PROFILER = _spans.PROFILER  # torch's fast "a profiler records" flag: one test per transfer or sync
_META_KEYSET = torch._C.DispatchKeySet(torch._C.DispatchKey.Meta)


def _dtype(dtype: torch.dtype | None) -> torch.dtype:
    return dtype if dtype is not None else torch.get_default_dtype()


def _ensure_ops() -> None:
    from .register import ensure_op_kernels

    ensure_op_kernels()


def check_device(device: Any) -> None:
    """Refuse a device index that names no device of this process's (errors.check_device_index:
    tpu:0, or tpu:LOCAL_RANK under torchrun)."""
    if device is not None:
        check_device_index(torch.device(device).index)


# -- host <-> device --------------------------------------------------------------
def _host_array(t: torch.Tensor) -> np.ndarray:
    """A contiguous numpy array with the bytes of a CPU tensor (bf16 via ml_dtypes)."""
    return host_numpy(t.detach().resolve_conj().resolve_neg().contiguous())


def from_cpu(t: torch.Tensor, keep_layout: bool = False) -> torch.Tensor:
    """A new tpu tensor holding a copy of CPU tensor ``t``: contiguous, or with ``t``'s own
    strides when ``keep_layout`` and ``t`` is dense (``memory_format=torch.preserve_format``:
    a channels-last tensor stays channels-last, and a size-1 dim keeps its stride, as
    ``.to("cuda")`` keeps them)."""
    _ensure_ops()
    order = _memory_order(t) if keep_layout else None
    keep = keep_layout and (order is not None or t.is_contiguous())  # dense: permuted or as it is
    sizes, strides = tuple(t.shape), (t.stride() if keep else contiguous_strides(t.shape))
    if order is not None:  # upload the elements in memory order; the view restores the sizes
        t = t.permute(order)
    arr = _host_array(t)  # the buffer keeps the (permuted) tensor's shape (see Cell)
    memory.ensure_room(arr.nbytes)  # torch.tpu.set_per_process_memory_fraction
    buf = _put(arr)
    metrics.add("h2d_bytes", arr.nbytes)
    metrics.add("h2d_transfers")
    out = new_tensor(Cell(arr.size, t.dtype, buf, arr.shape), sizes, strides, 0, t.dtype)
    if t.dim() == 1 and not t.requires_grad:  # ids of varying length get a bucketed twin (buckets.add_twin)
        from .buckets import add_twin

        add_twin(out, arr, _put_counted)
    return out


def _put_counted(arr: np.ndarray) -> Any:
    metrics.add("h2d_bytes", arr.nbytes)
    metrics.add("h2d_transfers")
    return _put(arr)


def upload_bucketed(t: torch.Tensor) -> torch.Tensor | None:
    """CPU tensor ``t`` in a storage with spare rows (``buckets.upload``), or None."""
    from .buckets import upload

    return upload(t, _put_counted)


def _put(arr: np.ndarray) -> Any:
    """Copy ``arr`` to the device (in a ``torchtpu::h2d`` span while a profiler records)."""
    if _PROFILER._is_profiler_enabled:
        with _spans.span("torchtpu::h2d", bytes=arr.nbytes):
            return pjrt.get().put(arr)
    return pjrt.get().put(arr)


def _dense(t: torch.Tensor) -> bool:
    """Whether ``t``'s elements fill its extent exactly once: then a copy that preserves
    the format takes its strides as they are (PyTorch's ``_to_copy`` and ``clone``).
    (torch._prims_common's check costs ~200 us a call: its symbolic-shape guards.)"""
    return dense_order(t.shape, t.stride()) is not None


def _memory_order(t: torch.Tensor) -> list[int] | None:
    """The dims of a dense, non-contiguous ``t`` from the largest stride to the smallest
    (``t.permute(order)`` is contiguous); None when ``t`` is contiguous or not dense."""
    if t.is_contiguous() or not _dense(t):
        return None
    return sorted(range(t.dim()), key=lambda d: (-t.stride(d), d))


# what made the host wait, by ``to_cpu``'s reason (profiler spans, metrics, explain)
SYNC_CAUSES = {"item": ".item()", "to_cpu": ".cpu() / print", "pickle": "torch.save / pickle"}


# torch.tpu.set_sync_debug_mode: 0 lets host syncs pass, 1 warns and 2 raises at each, as
# torch.cuda.set_sync_debug_mode does for CUDA's synchronizing operations
sync_debug_mode = 0


def _report_sync(cause: str) -> None:
    where = checks.user_source_line()
    message = f"called a synchronizing tpu operation ({cause}) at {where}"
    if sync_debug_mode == 1:
        import warnings

        warnings.warn(message, stacklevel=2)
    else:
        raise RuntimeError(f"{message}; torch.tpu.set_sync_debug_mode(0) allows it")


def to_cpu(t: torch.Tensor, reason: str = "to_cpu", cause: str | None = None) -> torch.Tensor:
    """A CPU copy of tpu tensor ``t`` with the same sizes (contiguous). This is a point
    where the user waits: pending deferred work runs and asynchronous errors surface.
    ``cause`` names the sync when ``reason`` does not say it (a data-dependent op)."""
    if op_report.recorder is not None:
        op_report.recorder.host_sync(reason)
    cause = cause or SYNC_CAUSES.get(reason, reason)
    if sync_debug_mode:
        _report_sync(cause)
    metrics.add("host_syncs")
    metrics.add(metrics.SYNC_PREFIX + cause)
    if _spans.explain is not None:
        _spans.explain.host_sync(cause)
    if _PROFILER._is_profiler_enabled:
        with _spans.span(f"torchtpu::host_sync ({cause})", cause=cause):
            return _to_cpu(t, reason)
    return _to_cpu(t, reason)


def _to_cpu(t: torch.Tensor, reason: str) -> torch.Tensor:
    cell = cell_of(t)
    if cell.lazy is not None:
        from . import deferred

        deferred.flush(reason)
    if _PROFILER._is_profiler_enabled:
        with _spans.span("torchtpu::d2h", bytes=t.numel() * t.element_size()):
            arr = _host_values(t, cell)
    else:
        arr = _host_values(t, cell)
    if t.is_conj():  # the lazy conjugate bit (x.conj()): the values are conj(storage)
        np.conjugate(arr, out=arr)
    if t.is_neg():
        np.negative(arr, out=arr)
    metrics.add("d2h_bytes", arr.nbytes)
    metrics.add("d2h_transfers")
    return torch_from_host(arr, t.dtype)


def _host_values(t: torch.Tensor, cell: Cell) -> np.ndarray:
    """Wait for ``t``'s storage and copy its elements (by ``t``'s geometry) to a new array."""
    sizes, strides, offset = tuple(t.shape), t.stride(), t.storage_offset()
    buf = cell.buf
    if buf is None:
        flat = np.zeros(cell.numel, numpy_dtype(cell.dtype))
    else:
        flat = pjrt.get().to_numpy(buf).reshape(-1)
    checks.raise_pending()
    if t.dtype != cell.dtype:  # a view of another dtype (x.view(torch.uint8)): reinterpret the bytes
        flat = _reinterpret(flat, t.dtype)
    # PyTorch's preserve_format: an expanded view (a stride 0 walking several elements)
    # comes back contiguous; numpy's "K" order would put that dim innermost
    expanded = any(st == 0 and n > 1 for n, st in zip(sizes, strides))
    return np.array(_strided_view(flat, sizes, strides, offset), copy=True, order="C" if expanded else "K")


def _strided_view(flat: np.ndarray, sizes: tuple[int, ...], strides: Sequence[int], offset: int) -> np.ndarray:
    """The elements of flat array ``flat`` a view of this geometry reads (read-only; not a
    copy). numpy's own constructor: ``np.lib.stride_tricks.as_strided`` took 12 us of a
    .item()'s ~44 us in torchtpu, through the Python object it builds first."""
    item = flat.itemsize
    byte_strides = [s * item for s in strides]
    try:
        return np.ndarray(sizes, flat.dtype, buffer=flat, offset=offset * item, strides=byte_strides)
    except (TypeError, ValueError):  # an offset at the very end of an empty view, which the constructor refuses
        return np.lib.stride_tricks.as_strided(flat[offset:], sizes, byte_strides, writeable=False)


def _reinterpret(flat: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    """The bytes of flat array ``flat`` as elements of ``dtype``; a partial last element
    (a 6-byte storage viewed as float32) is dropped: no view can reach it."""
    raw = flat.view(np.uint8)
    return raw[: raw.size - raw.size % dtype.itemsize].view(numpy_dtype(dtype))


def covers_storage(t: torch.Tensor) -> bool:
    """Whether ``t`` is exactly its storage's buffer: every element, in order, same dtype,
    no conj/neg bit (then the buffer itself can stand for the tensor)."""
    cell = cell_of(t)
    return (
        t.is_contiguous()
        and t.storage_offset() == 0
        and t.numel() == cell.numel
        and t.dtype == cell.dtype
        and not t.is_conj()
        and not t.is_neg()
    )


# -- allocation ----------------------------------------------------------------------
def _check_size_nonnegative(size: list[int]) -> None:
    """at::check_size_nonnegative, with the CPU's message (torch.empty(-1))."""
    for s in size:
        if s < 0:
            raise RuntimeError(f"Trying to create tensor with negative dimension {s}: {list(size)}")


def check_not_pinned(pin_memory: Any) -> None:
    """Pinning is for host memory: CUDA's factories refuse pin_memory=True alike (the
    allocation kernels here and every other factory, eager/validate.py)."""
    if pin_memory:
        raise RuntimeError("Only dense CPU tensors can be pinned")


def empty_memory_format(
    size: list[int],
    dtype: torch.dtype | None = None,
    layout: Any = None,
    device: Any = None,
    pin_memory: Any = None,
    memory_format: Any = None,
) -> torch.Tensor:
    _ensure_ops()
    check_device(device)
    _check_size_nonnegative(size)
    check_not_pinned(pin_memory)
    dtype = _dtype(dtype)
    numel = int(np.prod(size)) if len(size) else 1
    if memory_format is not None and memory_format is not torch.contiguous_format and memory_format is not torch.preserve_format:
        strides = torch.empty(size, memory_format=memory_format, device="meta").stride()
    else:
        strides = contiguous_strides(size)
    memory.ensure_room(numel * dtype.itemsize)  # its buffer comes at its first write: check the cap now
    return new_tensor(Cell(numel, dtype), size, strides, 0, dtype)


def empty_strided(
    size: list[int],
    stride: list[int],
    dtype: torch.dtype | None = None,
    layout: Any = None,
    device: Any = None,
    pin_memory: Any = None,
) -> torch.Tensor:
    _ensure_ops()
    check_device(device)
    _check_size_nonnegative(size)
    check_not_pinned(pin_memory)
    dtype = _dtype(dtype)
    numel = storage_extent(size, stride, 0)
    memory.ensure_room(numel * dtype.itemsize)  # as empty_memory_format
    return new_tensor(Cell(numel, dtype), size, stride, 0, dtype)


def new_empty_strided(
    x: torch.Tensor,
    size: list[int],
    stride: list[int],
    dtype: torch.dtype | None = None,
    layout: Any = None,
    device: Any = None,
    pin_memory: Any = None,
) -> torch.Tensor:
    return empty_strided(size, stride, dtype if dtype is not None else x.dtype, layout, device, pin_memory)


# -- copies ---------------------------------------------------------------------------
def copy_(dst: torch.Tensor, src: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    from . import dispatch

    if dst.device.type != "tpu":  # device -> host
        dst.copy_(to_cpu(src))
        return dst
    if src.device.type != "tpu":  # host -> device
        if src.dtype != dst.dtype:
            src = src.to(dst.dtype)
        if src.shape == dst.shape and covers_storage(dst):
            cell = cell_of(dst)
            arr = _host_array(src).reshape(cell.shape)
            cell.set(_put(arr))
            metrics.add("h2d_bytes", arr.nbytes)
            metrics.add("h2d_transfers")
            return dst
        src = from_cpu(src)
    return dispatch.run(aten.copy_.default, (dst, src, non_blocking), {})


def copy_from(src: torch.Tensor, dst: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    return copy_(dst, src, non_blocking)


def copy_from_and_resize(src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    if dst.shape != src.shape:
        dst.resize_(src.shape)
    return copy_(dst, src)


def to_copy(
    x: torch.Tensor,
    dtype: torch.dtype | None = None,
    layout: Any = None,
    device: Any = None,
    pin_memory: Any = None,
    non_blocking: bool = False,
    memory_format: Any = None,
) -> torch.Tensor:
    from . import dispatch

    preserve = memory_format is None or memory_format is torch.preserve_format
    if isinstance(x, torch.nn.parameter.UninitializedTensorMixin):
        # A LazyModule's UninitializedParameter/Buffer raises on ``.shape`` (its
        # ``.to("cuda")`` copies the empty placeholder): copy the plain tensor. (Only these:
        # a plain alias of a Parameter would lose ``requires_grad``, which the upload reads.)
        with torch._C.DisableTorchFunctionSubclass():
            x = x.as_subclass(torch.Tensor)
    if device is not None and torch.device(device).type == "cpu":
        host = to_cpu(x)
        if dtype is not None and dtype != host.dtype:
            host = host.to(dtype)
        if not preserve:
            return host.contiguous(memory_format=memory_format)
        if x.stride() != host.stride() and _dense(x):  # channels-last, a size-1 dim's stride: keep them
            return torch.empty_strided(x.shape, x.stride(), dtype=host.dtype).copy_(host)
        return host
    check_device(device)
    if x.device.type != "tpu":  # host -> device
        if dtype is not None and dtype != x.dtype:
            x = x.to(dtype)
        if not preserve:
            x = x.contiguous(memory_format=memory_format)
        return from_cpu(x, keep_layout=True)
    return dispatch.run(
        aten._to_copy.default,
        (x,),
        {
            "dtype": dtype,
            "layout": layout,
            "device": None,
            "pin_memory": pin_memory,
            "non_blocking": non_blocking,
            "memory_format": memory_format,
        },
    )


def clone_storage(storage: Any) -> Any:
    """A new tpu storage with the same bytes in a buffer of its own (``UntypedStorage.clone``,
    which ``copy.deepcopy`` of a tensor calls). Sharing the immutable buffer looked free, but
    programs that rewrite a storage in place donate its old buffer to XLA (a compiled step
    always does), which deletes it under every other holder: after ``ema = deepcopy(model)``,
    one compiled training step left the copy's BatchNorm statistics unreadable."""
    cell = storage._cell
    buf = cell.buf  # runs a pending graph that writes it
    copy = Cell(cell.numel, cell.dtype, None if buf is None else _copied(cell, buf), cell.shape)
    return new_tensor(copy, [cell.numel], [1], 0, cell.dtype).untyped_storage()


def _copied(cell: Cell, buf: Any) -> Any:
    """A new device buffer holding ``buf``'s values (an identity program: XLA copies a
    parameter that is returned without being donated)."""
    from .dispatch import run_utility

    (out,) = run_utility(("copy", cell.shape, cell.numel, cell.dtype), lambda b: [b.param(tuple(cell.shape), cell.dtype)], [buf])
    return out


def storage_to_host(storage: Any) -> torch.Tensor:
    """A flat CPU tensor with the elements (and so the bytes) of tpu storage ``storage``."""
    cell = storage._cell
    return to_cpu(new_tensor(cell, [cell.numel], [1], 0, cell.dtype), "pickle")


def local_scalar_dense(x: torch.Tensor) -> Any:
    return to_cpu(x, "item").item()


def is_set_to(x: torch.Tensor, src: torch.Tensor) -> bool:
    """Whether ``x`` views the same storage as ``src`` with the same offset, sizes and
    strides (the CPU's rule; nothing on the device is read)."""
    return (
        x.untyped_storage()._cdata == src.untyped_storage()._cdata
        and x.storage_offset() == src.storage_offset()
        and x.shape == src.shape
        and x.stride() == src.stride()
    )


def equal(x: torch.Tensor, y: torch.Tensor) -> bool:
    """torch.equal returns a Python bool: compare on the device, read back one flag."""
    if x.shape != y.shape:
        return False
    return bool(torch.eq(x, y).all().item())


# -- metadata -----------------------------------------------------------------------------
def resize_(x: torch.Tensor, size: list[int], memory_format: Any = None) -> torch.Tensor:
    strides = contiguous_strides(size)
    offset = x.storage_offset()
    need = storage_extent(size, strides, offset)
    cell = cell_of(x)
    if need <= cell.numel:
        _set_storage(_CPU_KEYSET, x, x.untyped_storage(), offset, list(size), list(strides))
        return x
    attach(x, _grown(cell, need), size, strides, offset)
    return x


def resize_as_(x: torch.Tensor, template: torch.Tensor, memory_format: Any = None) -> torch.Tensor:
    return resize_(x, list(template.shape))


def resize_storage(storage: Any, nbytes: int) -> int:
    """``untyped_storage().resize_(nbytes)`` of a tpu storage, the Python half of the C++
    hook (``resizePrivateUse1Bytes``, torchtpu/csrc/hooks.cpp): the storage gets a cell of
    ``nbytes`` whose first bytes are the old ones, as PyTorch keeps them, the rest zeros.
    Returns the data pointer the storage holds from now on (its byte range is new). FSDP's
    FullyShardedDataParallel frees an unsharded parameter this way (``resize_(0)``) and
    brings it back (``resize_(n)``), reading the storage's size to know which it is."""
    cell = storage._cell
    itemsize = cell.dtype.itemsize
    if nbytes % itemsize:
        raise RuntimeError(
            f"torchtpu: a tpu storage of {cell.dtype} elements can be resized to a multiple of {itemsize} bytes, "
            f"not {nbytes}"
        )
    numel = nbytes // itemsize
    if numel > cell.numel:
        storage._cell = _grown(cell, numel)
    elif numel < cell.numel:
        storage._cell = _shrunk(cell, numel)
    return _fake_pointer(nbytes)


def _shrunk(cell: Cell, numel: int) -> Cell:
    if numel == 0 or cell.buf is None:
        return Cell(numel, cell.dtype)
    from .dispatch import run_utility

    def build(b: Any) -> list:
        p = storage_param(b, cell.shape, cell.numel, cell.dtype)
        return [b.slice(p, [0], [numel], [1])]

    (buf,) = run_utility(("shrink", cell.shape, numel, cell.dtype), build, [cell.buf])
    return Cell(numel, cell.dtype, buf)


def _grown(cell: Cell, numel: int) -> Cell:
    if cell.buf is None:
        return Cell(numel, cell.dtype)
    from .dispatch import run_utility

    def build(b: Any) -> list:
        p = storage_param(b, cell.shape, cell.numel, cell.dtype)
        return [b.pad(p, b.constant(0, cell.dtype), [0], [numel - cell.numel])]

    (buf,) = run_utility(("grow", cell.shape, numel, cell.dtype), build, [cell.buf])
    return Cell(numel, cell.dtype, buf)


def set_source_storage_offset(
    x: torch.Tensor, source: Any, storage_offset: int, size: list[int], stride: list[int] = ()
) -> torch.Tensor:
    aten.set_.source_Storage_storage_offset.redispatch(_CPU_KEYSET, x, source, storage_offset, size, stride)
    _adopt_dtype(x)
    return x


def set_source_storage(x: torch.Tensor, source: Any) -> torch.Tensor:
    aten.set_.source_Storage.redispatch(_CPU_KEYSET, x, source)
    _adopt_dtype(x)
    return x


def _adopt_dtype(x: torch.Tensor) -> None:
    """Give a byte storage the element type of the first tensor of another type set onto it.

    torch.load, pickle and DataLoader workers restore a storage as untyped bytes (a uint8
    cell) and then ``set_`` typed tensors onto it. Every program would then reinterpret
    the bytes (strided.bitcast) on each read and write; retyping the cell once
    keeps loaded parameters as fast as ones moved with ``.to("tpu")``. The bytes are the
    same, so other views of the storage see no change. Not to bool: a byte other than
    0/1 would not survive a bool cell."""
    storage = x.untyped_storage()
    cell = getattr(storage, "_cell", None)
    dtype = x.dtype
    if cell is None or cell.dtype is not torch.uint8 or dtype in (torch.uint8, torch.bool) or cell.nbytes % dtype.itemsize:
        return
    numel = cell.nbytes // dtype.itemsize
    covers = x.storage_offset() == 0 and x.numel() == numel and x.is_contiguous()
    shape = tuple(x.shape) if covers and x.dim() else (numel,)  # a parameter keeps its shape (see Cell)
    if not cell.initialized:
        storage._cell = Cell(numel, dtype, shape=shape)
        return
    # through the host, not a device program: a checkpoint has many sizes, each would compile
    with _spans.maybe_span("torchtpu::d2h", bytes=cell.nbytes):
        flat = _reinterpret(pjrt.get().to_numpy(cell.buf).reshape(-1), dtype)
    storage._cell = Cell(numel, dtype, _put(flat.reshape(shape)), shape)
    metrics.add("d2h_bytes", flat.nbytes)
    metrics.add("h2d_bytes", flat.nbytes)


def set_source_tensor(x: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
    return aten.set_.source_Tensor.redispatch(_CPU_KEYSET, x, source)


def set_empty(x: torch.Tensor) -> torch.Tensor:
    attach(x, Cell(0, x.dtype), [0], [1])
    return x


def meta_view(op: Any) -> Any:
    """View ops only change metadata: the Meta kernel does that and shares the storage."""

    def kernel(*args: Any, **kwargs: Any) -> Any:
        return op.redispatch(_META_KEYSET, *args, **kwargs)

    return kernel


VIEW_OPS = [
    aten.view.default,
    aten._unsafe_view.default,  # a view autograd does not track (kron's out= writes through it)
    aten._reshape_alias.default,
    aten.as_strided.default,
    aten.unfold.default,
    aten.view.dtype,
    aten.view_as_real.default,
    aten.view_as_complex.default,
    # in-place view ops only restride the tensor itself: the data stays where it is
    aten.squeeze_.default,
    aten.squeeze_.dim,
    aten.squeeze_.dims,
    aten.unsqueeze_.default,
    aten.transpose_.default,
    aten.t_.default,
    aten.swapdims_.default,
    aten.swapaxes_.default,
    aten.as_strided_.default,
]


def new_empty(
    x: torch.Tensor,
    size: list[int],
    dtype: torch.dtype | None = None,
    layout: Any = None,
    device: Any = None,
    pin_memory: Any = None,
) -> torch.Tensor:
    return empty_memory_format(size, dtype or x.dtype, layout, device, pin_memory)


def record_stream(t: torch.Tensor, stream: Any) -> None:
    """``Tensor.record_stream``: CUDA's caching allocator must not reuse the memory before
    ``stream``'s work is done; a tpu buffer lives as long as a program or tensor holds it,
    on the device's one queue, so there is nothing to record."""


def kernels() -> dict[Any, Any]:
    table = {
        aten.record_stream.default: record_stream,
        aten.empty.memory_format: empty_memory_format,
        aten.new_empty.default: new_empty,
        aten.empty_strided.default: empty_strided,
        aten.new_empty_strided.default: new_empty_strided,
        aten.copy_.default: copy_,
        aten._copy_from.default: copy_from,
        aten._copy_from_and_resize.default: copy_from_and_resize,
        aten._to_copy.default: to_copy,
        aten._local_scalar_dense.default: local_scalar_dense,
        aten.equal.default: equal,
        aten.is_set_to.default: is_set_to,
        aten.resize_.default: resize_,
        aten.resize_as_.default: resize_as_,
        aten.set_.source_Storage_storage_offset: set_source_storage_offset,
        aten.set_.source_Storage: set_source_storage,
        aten.set_.source_Tensor: set_source_tensor,
        aten.set_.default: set_empty,
    }
    for op in VIEW_OPS:
        table[op] = meta_view(op)
    return table
