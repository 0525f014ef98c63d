"""FSDP2 on tpu without the C++ hooks: freeing and re-allocating unsharded parameter storage.

FSDP2 frees an unsharded parameter with ``untyped_storage().resize_(0)`` and brings it
back with ``resize_(nbytes)``. Storage resizing on PrivateUse1 needs a C++ hook
(``resizePrivateUse1Bytes``, torchtpu/csrc/hooks.cpp, built by ``make``); with it FSDP2's
own calls work as on CUDA, and so does FSDP1 (``FullyShardedDataParallel``), which reads
the storage's size to know whether a parameter is sharded. Where the extension was not
built, for tpu tensors "free" releases the device buffer behind the storage (the memory
FSDP wants back) and keeps the storage's size; "alloc" then has nothing to do, and the
all-gather writes the buffer again. (FSDP1 cannot work that way.)
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from ..runtime import memory
from ..tensor.storage import cell_of


def _free(original: Any) -> Any:
    def free_storage(tensor: torch.Tensor) -> None:
        if tensor.device.type != "tpu":
            return original(tensor)
        cell = cell_of(tensor)
        if cell.buf is not None:
            memory.freed(cell.nbytes)
            cell.buf = None  # reads as zeros until the next all-gather writes it

    free_storage._torchtpu = True  # type: ignore[attr-defined]
    return free_storage


def _alloc(original: Any) -> Any:
    def alloc_storage(tensor: torch.Tensor) -> None:
        if tensor.device.type != "tpu":
            return original(tensor)
        return None  # the storage kept its size; the buffer is written by the all-gather

    alloc_storage._torchtpu = True  # type: ignore[attr-defined]
    return alloc_storage


@functools.cache
def _storages_resize() -> bool:
    """Whether tpu storages can be resized (the C++ hooks are in): asked once per process,
    not at every group's creation; the probe starts no device client (the xla transport
    starts it itself)."""
    try:
        torch.empty(0, device="tpu").untyped_storage().resize_(0)
    except NotImplementedError:
        return False
    return True


def install() -> None:
    if _storages_resize():
        return
    from torch.distributed.fsdp._fully_shard import _fsdp_param, _fsdp_param_group

    if getattr(_fsdp_param.free_storage, "_torchtpu", False):
        return
    _fsdp_param.free_storage = _free(_fsdp_param.free_storage)
    alloc = _alloc(_fsdp_param.alloc_storage)
    _fsdp_param.alloc_storage = alloc
    _fsdp_param_group.alloc_storage = alloc
