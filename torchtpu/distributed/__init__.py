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


def _create(opts: Any, backend_options: Any = None) -> Any:
    """c10d's extended creator API: it also says which global ranks form the group (the
    xla transport compiles over their devices); empty for the default group."""
    from .process_group import TpuProcessGroup

    ranks = list(opts.global_ranks_in_group) or None
    return TpuProcessGroup(opts.store, opts.group_rank, opts.group_size, opts.timeout, ranks)


def register_backend() -> None:
    """Make ``init_process_group("tpu")`` and ``new_group(backend="tpu")`` work."""
    import torch.distributed as dist

    if not dist.is_available() or BACKEND.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["tpu"])
