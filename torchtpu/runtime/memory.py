"""Live device bytes held by tpu storages (torch.tpu.memory_allocated and friends).

Counted twice per op result (a storage cell gets a buffer, later dies), so the counters
are C functions where the extension was built (torchtpu/csrc/counters.c, run under the
GIL); the Python twins below, behind a lock, do the same otherwise."""

from __future__ import annotations

import threading

_lock = threading.Lock()
# num_live: buffers held now (num_allocs - num_frees until reset_accumulated zeroes both)
_stats = {"allocated_bytes": 0, "peak_bytes": 0, "num_allocs": 0, "num_frees": 0, "num_live": 0}


def _py_allocated(nbytes: int) -> None:
    with _lock:
        _stats["allocated_bytes"] += nbytes
        _stats["num_allocs"] += 1
        _stats["num_live"] += 1
        if _stats["allocated_bytes"] > _stats["peak_bytes"]:
            _stats["peak_bytes"] = _stats["allocated_bytes"]


def _py_freed(nbytes: int) -> None:
    with _lock:
        _stats["allocated_bytes"] -= nbytes
        _stats["num_frees"] += 1
        _stats["num_live"] -= 1


def _py_current() -> int:
    return _stats["allocated_bytes"]


def _py_peak() -> int:
    return _stats["peak_bytes"]


def _py_reset_peak() -> None:
    with _lock:
        _stats["peak_bytes"] = _stats["allocated_bytes"]


def _py_reset_accumulated() -> None:
    with _lock:
        _stats["num_allocs"] = _stats["num_frees"] = 0


def _py_snapshot() -> dict[str, int]:
    with _lock:
        return dict(_stats)


try:
    from . import _counters  # type: ignore[attr-defined]
except ImportError:
    _counters = None

if _counters is None:
    allocated, freed, current, peak, reset_peak, snapshot = _py_allocated, _py_freed, _py_current, _py_peak, _py_reset_peak, _py_snapshot
    reset_accumulated = _py_reset_accumulated
else:
    allocated, freed, current, peak = _counters.allocated, _counters.freed, _counters.current, _counters.peak
    reset_peak, snapshot, reset_accumulated = _counters.reset_peak, _counters.snapshot, _counters.reset_accumulated
