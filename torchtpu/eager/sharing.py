"""tpu tensors sent to another process: torch.multiprocessing queues, pipes, process
arguments and DataLoader workers.

A tpu tensor's device memory belongs to the process whose XLA client made it; no other
process can map it (there are no IPC handles, as CUDA has). torch.multiprocessing pickles
tensors and storages with its own reducers (``ForkingPickler``), ahead of the
``__reduce__`` plain pickle uses, and its reducers would ask a tpu storage for a CPU
shared-memory handle. So a tpu tensor travels as a CPU copy of its storage (which
torch's reducer then shares through shared memory, as any CPU tensor) and is rebuilt on
the receiving process's tpu device. Values, dtype, shape, strides, storage offset and
storage sharing among the tensors of one message are kept; unlike CUDA, the two
processes hold separate copies, so a write in one is not seen by the other.

``install`` also lets DataLoader workers collate tpu tensors: ``default_collate`` asks
``UntypedStorage._new_shared(n, device="tpu")``, which would construct
``UntypedStorage(n, device="tpu")`` and crash the process (no C++ allocator for tpu).
"""

from __future__ import annotations

from typing import Any

import torch

_NON_LEAF = (
    "Cowardly refusing to serialize non-leaf tensor which requires_grad, since autograd does not support "
    "crossing process boundaries.  If you just want to transfer the data, call detach() on the tensor "
    "before serializing (e.g., putting it on the queue)."
)


def _reduce_tensor(t: torch.Tensor) -> tuple:
    if t.requires_grad and not t.is_leaf:
        raise RuntimeError(_NON_LEAF)  # torch's own reducer's check and message
    data = t.detach()
    if data.is_conj() or data.is_neg():  # the lazy bits are not part of (storage, geometry)
        data = data.resolve_conj().resolve_neg()
    meta = (data.dtype, data.storage_offset(), tuple(data.shape), data.stride(), t.requires_grad)
    # the storage object is the same for every tensor sharing it, so the pickle memo sends
    # it once and the receiver's tensors share one storage again
    return (rebuild_tensor, (type(t), data.untyped_storage(), meta))


def _reduce_storage(storage: Any) -> tuple:
    from .minimal import storage_to_host

    host = storage_to_host(storage)
    # the bytes travel inside the message, not as a shared-memory handle: the receiver may
    # read it after the sender has exited (a DataLoader worker, a child that puts and returns)
    return (rebuild_storage, (host.view(torch.uint8).numpy().tobytes(), host.dtype))


def rebuild_storage(data: bytes, dtype: torch.dtype) -> Any:
    """A tpu storage holding ``data``, as elements of ``dtype`` (the sender's cell type)."""
    from .minimal import from_cpu

    host = torch.frombuffer(bytearray(data), dtype=dtype) if data else torch.empty(0, dtype=dtype)
    return from_cpu(host).untyped_storage()


def rebuild_tensor(cls: type, storage: Any, meta: tuple) -> torch.Tensor:
    dtype, offset, size, stride, requires_grad = meta
    t = torch.empty(0, dtype=dtype, device=storage.device).set_(storage, offset, size, stride)
    if cls is torch.nn.Parameter:
        return torch.nn.Parameter(t, requires_grad=requires_grad)
    return t.requires_grad_(requires_grad)


def _tpu_first(reduce_tpu: Any, original: Any) -> Any:
    """A reducer that handles tpu objects and hands every other one to torch's."""

    def reduce(obj: Any) -> tuple:
        if obj.device.type == "tpu":
            return reduce_tpu(obj)
        return original(obj)

    reduce._torchtpu = True  # type: ignore[attr-defined]
    return reduce


def _new_shared(original: Any) -> Any:
    def new_shared(cls: type, size: int, *, device: Any = "cpu") -> Any:
        if torch.device(device).type != "tpu":
            return original.__func__(cls, size, device=device)
        from .minimal import empty_memory_format

        # a worker's batch lives in its own process; a plain new storage (zeros until written)
        return empty_memory_format([int(size)], torch.uint8).untyped_storage()

    new_shared._torchtpu = True  # type: ignore[attr-defined]
    return classmethod(new_shared)


def install() -> None:
    """Register the tpu reducers with ``ForkingPickler`` (idempotent)."""
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing.reductions  # noqa: F401  torch's reducers first: ours wrap them

    table = ForkingPickler._extra_reducers
    for cls, reduce_tpu in (
        (torch.Tensor, _reduce_tensor),
        (torch.nn.Parameter, _reduce_tensor),
        (torch.UntypedStorage, _reduce_storage),
    ):
        original = table.get(cls)
        if original is not None and not getattr(original, "_torchtpu", False):
            ForkingPickler.register(cls, _tpu_first(reduce_tpu, original))
    if not getattr(torch.UntypedStorage._new_shared, "_torchtpu", False):
        torch.UntypedStorage._new_shared = _new_shared(torch.UntypedStorage._new_shared)
