"""``nn.DataParallel(model)`` on tpu, as on a machine with one CUDA device.

DataParallel moves its inputs to its devices with ``torch.nn.parallel.comm.scatter`` and
brings gradients back with ``comm.gather``, which call ``torch._C._scatter`` /
``torch._C._gather``: bindings that exist only in a CUDA build of PyTorch. With tpu as the
accelerator, a wrapped model failed at its first call with "module 'torch._C' has no
attribute '_scatter'". One device per process means one chunk: scatter is a copy to
tpu:0, gather a copy to the destination (the CPU for an input that came from there), and
DataParallel then calls the module directly, as it does for a single CUDA device.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.nn.parallel import comm


def _device(index: Any) -> torch.device:
    """A device index of DataParallel's (an int, or a device): tpu's; -1 is the CPU."""
    if isinstance(index, torch.device):
        return index
    if isinstance(index, str):
        return torch.device(index)
    return torch.device("cpu") if index == -1 else torch.device("tpu", index)


def _scatter(
    tensor: torch.Tensor,
    devices: Sequence[Any] | None = None,
    chunk_sizes: Sequence[int] | None = None,
    dim: int = 0,
    streams: Any = None,
    *,
    out: Sequence[torch.Tensor] | None = None,
) -> tuple[torch.Tensor, ...]:
    if out is not None:
        sizes = [o.size(dim) for o in out]
        for o, chunk in zip(out, tensor.split(sizes, dim)):
            o.copy_(chunk)
        return tuple(out)
    assert devices is not None, "comm.scatter: give devices or out"
    chunks = tensor.split(list(chunk_sizes), dim) if chunk_sizes is not None else tensor.chunk(len(devices), dim)
    return tuple(chunk.to(_device(d)).contiguous() for chunk, d in zip(chunks, devices))


def _gather(tensors: Sequence[torch.Tensor], dim: int = 0, destination: Any = None, *, out: torch.Tensor | None = None) -> torch.Tensor:
    if out is not None:
        return torch.cat([t.to(out.device) for t in tensors], dim, out=out)
    target = tensors[0].device if destination is None else _device(destination)
    return torch.cat([t.to(target) for t in tensors], dim)


def install() -> None:
    """Where this PyTorch has no ``torch._C._scatter`` (every build but CUDA's), tpu
    tensors scatter and gather in Python; anything else keeps PyTorch's functions."""
    if hasattr(torch._C, "_scatter") or getattr(comm.scatter, "_torchtpu", False):
        return
    original_scatter, original_gather = comm.scatter, comm.gather

    def scatter(tensor: torch.Tensor, devices: Any = None, chunk_sizes: Any = None, dim: int = 0, streams: Any = None, *, out: Any = None) -> Any:
        targets = [o.device for o in out] if out is not None else [_device(d) for d in devices or ()]
        if not any(t.type == "tpu" for t in targets):
            return original_scatter(tensor, devices, chunk_sizes, dim, streams, out=out)
        return _scatter(tensor, devices, chunk_sizes, dim, streams, out=out)

    def gather(tensors: Sequence[torch.Tensor], dim: int = 0, destination: Any = None, *, out: Any = None) -> Any:
        if not any(t.device.type == "tpu" for t in tensors):
            return original_gather(tensors, dim, destination, out=out)
        return _gather(tensors, dim, destination, out=out)

    scatter._torchtpu = True  # type: ignore[attr-defined]
    scatter.__doc__, gather.__doc__ = original_scatter.__doc__, original_gather.__doc__
    comm.scatter, comm.gather = scatter, gather
