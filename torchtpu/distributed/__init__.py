"""torch.distributed on tpu: the c10d process-group backend "tpu".

``import torch`` registers the backend (cheap: one dict entry; the process group module
loads when a group is created). Then PyTorch's own idioms work unchanged::

    torch.distributed.init_process_group("tpu")            # or "cpu:gloo,tpu:tpu"
    torch.nn.parallel.DistributedDataParallel(model.to("tpu"))

One process per device (each sees ``tpu:0``); launch with ``torchrun --nproc-per-node=N``.
How the bytes move on each platform: ``docs/distributed.md``.
"""

from __future__ import annotations

from typing import Any

BACKEND = "tpu"

__all__ = ["BACKEND", "register_backend"]


def _create(store: Any, rank: int, size: int, timeout: Any) -> Any:
    from .process_group import TpuProcessGroup

    return TpuProcessGroup(store, rank, size, timeout)


def register_backend() -> None:
    """Make ``init_process_group("tpu")`` and ``new_group(backend="tpu")`` work."""
    import torch.distributed as dist

    if not dist.is_available() or BACKEND.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND, _create, devices=["tpu"])
