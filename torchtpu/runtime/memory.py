"""Live device bytes held by tpu storages (torch.tpu.memory_allocated and friends)."""

from __future__ import annotations

import threading

_lock = threading.Lock()
_stats = {"allocated_bytes": 0, "peak_bytes": 0, "num_allocs": 0, "num_frees": 0}


def allocated(nbytes: int) -> None:
    with _lock:
        _stats["allocated_bytes"] += nbytes
        _stats["num_allocs"] += 1
        if _stats["allocated_bytes"] > _stats["peak_bytes"]:
            _stats["peak_bytes"] = _stats["allocated_bytes"]


def freed(nbytes: int) -> None:
    with _lock:
        _stats["allocated_bytes"] -= nbytes
        _stats["num_frees"] += 1


def current() -> int:
    return _stats["allocated_bytes"]


def peak() -> int:
    return _stats["peak_bytes"]


def reset_peak() -> None:
    with _lock:
        _stats["peak_bytes"] = _stats["allocated_bytes"]


def snapshot() -> dict[str, int]:
    with _lock:
        return dict(_stats)
