"""Host views of tpu tensors for the host transport (gloo).

On the cpu platform an XLA buffer *is* host memory: ``Runtime.to_numpy`` returns a
read-only numpy view of it, so a collective's input needs no copy at all. Outputs land
in fresh host tensors and are written back with ``copy_`` (one host-to-device put).
On other platforms ``to_numpy`` is a device-to-host copy and the same code is correct.

An asynchronous all_reduce of whole storages does better on the cpu platform: it claims
each storage's buffer (``runner.program.claim``: XLA hands it over once the programs
reading it are done) and gloo reduces in that memory itself -- no copy at all. Until the
collective is done the storage is marked in flight (:class:`InFlight` as its ``Cell.lazy``),
so whatever reads or writes it first waits for the result, as after ``work.wait()``.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .. import metrics
from ..eager.minimal import covers_storage, to_cpu
from ..errors import TpuError
from ..runner.program import claim
from ..runtime import pjrt
from ..stablehlo.types import host_numpy, numpy_dtype, torch_from_host
from ..tensor.storage import cell_of


def is_tpu(t: torch.Tensor) -> bool:
    return t.device.type == "tpu"


def _from_numpy(arr: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    with warnings.catch_warnings():  # the array may be read-only: gloo only reads it
        warnings.simplefilter("ignore", UserWarning)
        return torch_from_host(arr, dtype)


def read_view(t: torch.Tensor) -> torch.Tensor:
    """A CPU tensor with ``t``'s value that the caller must only read.

    Zero-copy for a contiguous tpu tensor (a view of the device buffer on the cpu
    platform); a copy otherwise. CPU tensors are returned as they are."""
    if not is_tpu(t):
        return t
    cell = cell_of(t)
    pending = getattr(cell, "lazy", None) is not None  # DeferAndFuse: to_cpu runs the pending graph
    if pending or cell.buf is None or not t.is_contiguous() or t.dtype != cell.dtype or t.is_conj() or t.is_neg():
        return to_cpu(t)
    flat = pjrt.get().to_numpy(cell.buf).reshape(-1)
    start = t.storage_offset()
    arr = flat[start : start + t.numel()].reshape(tuple(t.shape))
    assert arr.dtype == numpy_dtype(t.dtype)
    return _from_numpy(arr, t.dtype)


def work_copy(t: torch.Tensor) -> torch.Tensor:
    """A writable, contiguous CPU tensor holding ``t``'s value (gloo works in place on it);
    for a contiguous CPU tensor, ``t`` itself."""
    if not is_tpu(t):
        return t if t.is_contiguous() else t.contiguous()
    return to_cpu(t)


def empty_like_host(t: torch.Tensor) -> torch.Tensor:
    return torch.empty(t.shape, dtype=t.dtype)


class InFlight:
    """The mark (``Cell.lazy``) of a storage a collective is writing in place: reading or
    writing the storage first waits for the collective. If the collective failed after it
    began writing, the storage's value is lost and reading it raises that error."""

    flushed = True  # never a pending DeferAndFuse graph to record into

    __slots__ = ("done", "error", "writing")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.writing = False

    def flush_for(self, cell: Any) -> None:
        self.done.wait()
        if self.error is not None:
            raise TpuError(
                "torchtpu: the collective that was writing this tensor in place failed "
                f"({type(self.error).__name__}: {str(self.error)[:500]}), so its value is lost; "
                "recompute it or reload it from a checkpoint"
            ) from self.error


class Whole:
    """A tpu tensor that is its storage's whole buffer, captured on the caller's thread so
    that a background thread can read it and replace its buffer without the dispatcher
    (the asynchronous host path). ``in_flight``: the storage's buffer is claimed and is
    written in place (the cpu platform; see the module doc)."""

    __slots__ = ("cell", "buf", "in_flight")

    def __init__(self, cell: Any, buf: Any, in_flight: InFlight | None = None) -> None:
        self.cell, self.buf, self.in_flight = cell, buf, in_flight

    def to_host(self, writing: bool = True) -> torch.Tensor:
        """A writable flat CPU tensor holding the captured value (waits for the device):
        the buffer's own memory when claimed, else a copy. ``writing=False``: the caller
        only reads it until :meth:`begin_writing` (a failure before then loses nothing)."""
        rt = pjrt.get()
        rt.block([self.buf])  # releases the GIL while the device finishes
        if self.in_flight is not None:
            self.in_flight.writing = writing
            return torch.frombuffer(rt.host_memory(self.buf, self.cell.nbytes), dtype=self.cell.dtype)
        arr = rt.to_numpy(self.buf).reshape(-1)
        return _from_numpy(arr if arr.flags.writeable else arr.copy(), self.cell.dtype)

    def begin_writing(self) -> None:
        """The collective starts writing the claimed buffer: a failure from now on loses its value."""
        if self.in_flight is not None:
            self.in_flight.writing = True

    def store(self, host: torch.Tensor) -> None:
        """Make ``host`` (flat, same dtype) the storage's new value: every alias sees it."""
        if self.in_flight is not None:  # already in the buffer: the storage is readable again
            self.release(None)
            return
        arr = host_numpy(host).view(numpy_dtype(self.cell.dtype)).reshape(self.cell.shape)
        # a copy on purpose: a buffer aliasing host memory (PjRT's zero-copy put) cannot be
        # donated, so every later in-place write into the storage (DDP's bucket fill: one
        # program per gradient) would copy the whole buffer -- measured: DDP's host step
        # 23 ms with this copy, 35-39 ms without it, though a lone 64 MB all_reduce gains 9 ms
        self.cell.set(pjrt.get().put(arr))

    def release(self, error: BaseException | None) -> None:
        """End the in-flight mark (a no-op for a copied value). ``error``: why the
        collective failed, which reading the storage raises if gloo had begun writing it."""
        mark = self.in_flight
        if mark is None or mark.done.is_set():
            return
        if error is not None and mark.writing:
            mark.error = error
        elif self.cell.lazy is mark:
            self.cell.lazy = None
        self.buf = None  # the storage holds the only reference again: later writes donate it
        mark.done.set()


def capture_whole(tensors: Sequence[torch.Tensor], in_place: bool = False) -> list[Whole] | None:
    """Each tensor's buffer, when every one is a tpu tensor covering its whole storage
    with a value; None otherwise (the caller takes the synchronous path). Pending
    DeferAndFuse work that produces them runs here, on the caller's thread. ``in_place``:
    claim the buffers a collective may write in place (the cpu platform), marking their
    storages in flight; the caller must ``release`` every one."""
    cells = []
    for t in tensors:
        if not is_tpu(t) or not covers_storage(t):
            return None
        cell = cell_of(t)
        if cell.buf is None:  # runs a pending graph
            return None
        cells.append(cell)
    in_place = in_place and pjrt.get().platform == "cpu" and len({id(c) for c in cells}) == len(cells)
    out = []
    for cell in cells:
        if in_place and cell.nbytes and claim(cell):
            mark = cell.lazy = InFlight()
            metrics.add("collectives_in_place")
            out.append(Whole(cell, cell._buf, mark))
        else:
            out.append(Whole(cell, cell._buf))
    return out


def write_back(dst: torch.Tensor, host: torch.Tensor) -> None:
    """Put ``host``'s value into ``dst`` (a tpu tensor, or a CPU tensor gloo did not write)."""
    if dst is host:
        return
    with torch.no_grad():
        dst.copy_(host.view(dst.shape) if host.shape != dst.shape else host)
