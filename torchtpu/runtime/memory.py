"""Live device bytes held by tpu storages (torch.tpu.memory_allocated and friends).

Counted twice per op result (a storage cell gets a buffer, later dies), so the counters
are C functions where the extension was built (torchtpu/csrc/counters.c, run under the
GIL); the Python twins below, behind a lock, do the same otherwise."""

from __future__ import annotations

import threading
from collections.abc import Callable

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


# torch.tpu.set_per_process_memory_fraction's cap: None, or (bytes, over_limit) where
# over_limit(nbytes) raises. Checked where an op, a transfer or a factory is about to make
# new storages, before anything happens (``ensure_room``), so a refused op changes nothing.
cap: tuple[int, Callable[[int], None]] | None = None


def set_limit(nbytes: int | None, over_limit: Callable[[int], None] | None = None) -> None:
    """Cap the bytes tpu storages hold at ``nbytes`` (None: no cap)."""
    global cap
    cap = None if nbytes is None or over_limit is None else (nbytes, over_limit)


def ensure_room(nbytes: int) -> None:
    """Raise (the cap's ``over_limit``) when ``nbytes`` more would pass the cap."""
    if cap is not None and current() + nbytes > cap[0]:
        cap[1](nbytes)


def new_bytes(specs: list) -> int:
    """The bytes of an op's new results, from its output specs ``(sizes, strides, dtype,
    numel)`` (None for a result that is no new storage)."""
    return sum(s[3] * s[2].itemsize for s in specs if s is not None)
