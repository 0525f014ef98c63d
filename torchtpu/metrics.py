"""Counters every execution path updates: what was compiled, hit in cache, run, moved.

``torchtpu.metrics.snapshot()`` returns a dict; ``reset()`` zeroes the counters.
"""

from __future__ import annotations

import sys
import threading
from collections import Counter
from typing import Any

_lock = threading.Lock()
_counts: Counter = Counter()
_FIELDS = (
    "compiles",
    "cache_hits",
    "disk_cache_hits",
    "executions",
    "flushes",
    "fused_ops",
    "compile_seconds",
    "execute_seconds",
    "h2d_bytes",
    "d2h_bytes",
    "h2d_transfers",
    "d2h_transfers",
    "cpu_fallbacks",
)
_FLUSH_PREFIX = "flushes_"


def add(name: str, n: int = 1) -> None:
    _counts[name] += n


def snapshot() -> dict[str, Any]:
    """Current counters: compiles, cache_hits, disk_cache_hits, executions, flushes,
    fused_ops, compile_seconds, execute_seconds, transfers, ... and ``flushes_by_reason``
    (DeferAndFuse: what made each pending graph run)."""
    with _lock:
        out: dict[str, Any] = {k: _counts.get(k, 0) for k in _FIELDS}
        out.update({k: v for k, v in _counts.items() if k not in out})
        out["flushes_by_reason"] = {k[len(_FLUSH_PREFIX) :]: v for k, v in _counts.items() if k.startswith(_FLUSH_PREFIX)}
        return out


def report(file: Any = None) -> str:
    """A readable table of the counters (printed to ``file``, default stdout, and returned)."""
    snap = snapshot()
    reasons = snap.pop("flushes_by_reason")
    lines = [f"{'torchtpu metric':<28}{'value':>16}"]
    for k, v in snap.items():
        if k.startswith(_FLUSH_PREFIX):
            continue
        lines.append(f"{k:<28}{v:>16.3f}" if isinstance(v, float) else f"{k:<28}{v:>16,}")
    for k, v in sorted(reasons.items()):
        lines.append(f"{'  flushes: ' + k:<28}{v:>16,}")
    text = "\n".join(lines)
    print(text, file=file or sys.stdout)
    return text


def reset() -> None:
    with _lock:
        _counts.clear()
