"""Counters every execution path updates: what was compiled, hit in cache, run, moved.

``torchtpu.metrics.snapshot()`` returns a dict; ``reset()`` zeroes the counters.
"""

from __future__ import annotations

import threading
from collections import Counter

_lock = threading.Lock()
_counts: Counter = Counter()
_FIELDS = ("compiles", "cache_hits", "executions", "h2d_bytes", "d2h_bytes", "h2d_transfers", "d2h_transfers", "cpu_fallbacks")


def add(name: str, n: int = 1) -> None:
    _counts[name] += n


def snapshot() -> dict[str, int | float]:
    """Current counters: compiles, cache_hits, executions, h2d_bytes, d2h_bytes, ..."""
    with _lock:
        out = {k: _counts.get(k, 0) for k in _FIELDS}
        out.update({k: v for k, v in _counts.items() if k not in out})
        return out


def reset() -> None:
    with _lock:
        _counts.clear()
