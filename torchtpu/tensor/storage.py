"""The storage cell: one flat device buffer per PyTorch StorageImpl.

A tpu tensor is a plain ``torch.Tensor`` whose StorageImpl (device ``tpu:0``, an opaque
unique data pointer) carries a :class:`Cell` on its preserved Python object. Every view
shares the StorageImpl and therefore the cell; an in-place write swaps the cell's buffer
(device buffers are immutable), so all aliases see it.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import torch

from ..runtime import memory

DEVICE = torch.device("privateuseone", 0)  # renamed to "tpu" at autoload; the index is what matters
_CPU_KEYSET = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
_create_impl = torch._C._acc.create_empty_tensor
_make_storage = torch._C._construct_storage_from_data_pointer
_set_storage = torch.ops.aten.set_.source_Storage_storage_offset.redispatch

try:  # the C++ fast paths (torchtpu/csrc/fast.cpp), where they were built (setup.py)
    from . import _fast  # type: ignore[attr-defined]
except ImportError:
    _fast = None

# Storages need unique, non-null data pointers (torch.save and overlap checks read them);
# they are opaque handles, spaced so that no two storages' byte ranges overlap.
_ptr_lock = threading.Lock()
_next_ptr = [1 << 32]


def _py_fake_pointer(nbytes: int) -> int:
    with _ptr_lock:
        ptr = _next_ptr[0]
        _next_ptr[0] = ptr + (((nbytes + 4095) >> 12) + 1 << 12)
    return ptr


_fake_pointer = _py_fake_pointer if _fast is None else _fast.fake_pointer  # one counter: C++'s where built


class Cell:
    """One device buffer of ``numel`` elements of ``dtype`` (None: not yet written, reads
    as zeros). Programs read it flat; ``shape`` is the buffer's own shape on the device —
    ``(numel,)``, or the shape of the tensor that created it (a parameter moved with
    ``.to("tpu")``). Keeping a parameter's shape lets XLA update it in place inside a
    compiled step: an update computed through a reshape of a flat buffer costs a copy.

    Under DeferAndFuse a cell may be *lazy*: its value is the result of recorded ops
    that have not run yet (``lazy`` is the pending graph). Reading ``buf`` or calling
    ``set`` runs that graph first, so every consumer outside the dispatcher sees a real
    buffer; the dispatcher itself reads ``_buf``/``lazy`` to record without running.
    """

    __slots__ = ("_buf", "numel", "dtype", "shape", "nbytes", "lazy", "gslot", "counted", "__weakref__")

    def __init__(
        self, numel: int, dtype: torch.dtype, buf: Any = None, shape: Sequence[int] | None = None, lazy: Any = None
    ) -> None:
        self.numel = numel = int(numel)
        self.dtype = dtype
        self.shape = (numel,) if shape is None else tuple(shape)  # every new buffer keeps it
        self.nbytes = nbytes = numel * dtype.itemsize
        self._buf = buf
        self.lazy: Any = lazy  # the pending graph that will produce this cell's value
        self.gslot: Any = None  # (graph epoch, slot) while a pending graph refers to it
        # counted in torch.tpu.memory_allocated (holds or will hold a buffer); ``_count``,
        # inlined: a cell is made for every op's result
        self.counted = holds = buf is not None or lazy is not None
        if holds:
            memory.allocated(nbytes)

    @property
    def buf(self) -> Any:
        if self.lazy is not None:
            self.lazy.flush_for(self)
        return self._buf

    @buf.setter
    def buf(self, value: Any) -> None:
        if self.lazy is not None:
            self.lazy.flush_for(self)
        self._buf = value
        self.gslot = None  # see set()
        self._count(value is not None)

    @property
    def initialized(self) -> bool:
        return self._buf is not None or self.lazy is not None

    def set(self, buf: Any) -> None:
        if self.lazy is not None:
            self.lazy.flush_for(self)
        self._buf = buf  # _set, inlined: once per storage a program rewrites
        # A pending DeferAndFuse graph that read the old buffer keeps it for the ops that
        # read it (their value is the one they saw); the next op it records must read this
        # one, not the old buffer's slot (a host-to-device copy_, a collective's result)
        self.gslot = None
        if not self.counted:
            memory.allocated(self.nbytes)
            self.counted = True

    def _set(self, buf: Any) -> None:
        """Store a buffer without looking at pending work (the deferred runner's path)."""
        self._buf = buf
        self._count(True)

    def _count(self, holds: bool) -> None:
        if holds and not self.counted:
            memory.allocated(self.nbytes)
        elif not holds and self.counted:
            memory.freed(self.nbytes)
        self.counted = holds

    def __del__(self) -> None:
        if self.counted:
            try:
                memory.freed(self.nbytes)
            except (AttributeError, TypeError):  # interpreter shutdown: the modules are gone, nothing to count
                pass


def _py_new_tensor(
    cell: Cell,
    sizes: Sequence[int],
    strides: Sequence[int],
    offset: int,
    dtype: torch.dtype,
) -> torch.Tensor:
    """A tpu tensor viewing ``cell`` with the given geometry (``_fast.new_tensor`` does the
    same in one call: the factory, the storage and the redispatched ``set_`` here are most
    of the cost of an op's result)."""
    t = _create_impl([0], dtype)
    storage = _make_storage(_fake_pointer(cell.nbytes), DEVICE, cell.nbytes)
    _set_storage(_CPU_KEYSET, t, storage, offset, list(sizes), list(strides))
    storage._cell = cell
    return t


new_tensor = _py_new_tensor if _fast is None else _fast.new_tensor
# graph_key(args, key, cells, slot_of): the key entries of a compiled graph's arguments when
# all are plain tpu tensors, ints or None (compile/fx_lowering.py ``_collect``, whose loop
# does the same in Python); None where the fast paths were not built
graph_key = None if _fast is None else _fast.graph_key
# same_graph_key(args, key, cells, slot_of): whether those arguments have an earlier call's
# whole key, checked without building it (None where not built: the key is built instead)
same_graph_key = None if _fast is None else _fast.same_graph_key
# eager_keys(tensors, cells, slot_of, seen, runtime_offset, offsets): an eager op's key
# entries of its tensor arguments (eager/dispatch.py ``_Call._tensor``, in C++), or None
eager_keys = None if _fast is None else _fast.eager_keys
# collect_call(kinds, values, lift, key, cells, slot_of, tensors, scalars, scalar_types): an
# eager op's whole key but its precision (eager/dispatch.py ``_collect``), or False where
# an argument needs the Python loop; configure_collect gives it the Python helpers it calls
collect_call = None if _fast is None else _fast.collect_call
configure_collect = None if _fast is None else _fast.configure_collect
# ``var.data = new`` across tpu, as set_data does for CUDA (device/modules.py); None without C++
set_data_across = None if _fast is None else _fast.set_data
# donatable(tensors, slot_of), input_buffers(cells), write_back(updates, cells, outs, n): the
# per-storage work around an execution (eager/dispatch.py ``_donatable``, the runners' input
# lists, runner/program.py ``write_back``), or None where the fast paths were not built
donatable = None if _fast is None else _fast.donatable
input_buffers = None if _fast is None else _fast.input_buffers
native_write_back = None if _fast is None else _fast.write_back


def attach(t: torch.Tensor, cell: Cell, sizes: Sequence[int], strides: Sequence[int], offset: int = 0) -> None:
    """Point an existing tpu tensor at a new storage (used by resize_ and set_)."""
    storage = _make_storage(_fake_pointer(cell.nbytes), DEVICE, cell.nbytes)
    _set_storage(_CPU_KEYSET, t, storage, offset, list(sizes), list(strides))
    storage._cell = cell


def cell_of(t: torch.Tensor) -> Cell:
    try:
        return t.untyped_storage()._cell
    except AttributeError:
        raise RuntimeError(
            "torchtpu: this tpu tensor has no device buffer (its storage was not created by torchtpu, "
            "e.g. through torch.UntypedStorage(device='tpu')); create tpu tensors with torch factories or .to('tpu')"
        ) from None
