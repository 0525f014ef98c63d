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
    "memory_cache_hits",
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
    "host_syncs",
    "cpu_fallbacks",
)
_FLUSH_PREFIX = "flushes_"
SYNC_PREFIX = "host_syncs_"  # + what made the host wait (".item()", ".cpu() / print", a data-dependent op)
FALLBACK_PREFIX = "cpu_fallbacks_"  # + the op that ran on the CPU
# per-cause counters: prefix -> (snapshot key, report label)
_BREAKDOWNS = {
    _FLUSH_PREFIX: ("flushes_by_reason", "flushes"),
    SYNC_PREFIX: ("host_syncs_by_cause", "host syncs"),
    FALLBACK_PREFIX: ("cpu_fallbacks_by_op", "CPU fallbacks"),
}


def add(name: str, n: int = 1) -> None:
    _counts[name] += n


def executed(seconds: float) -> None:
    """One program execution enqueued in ``seconds`` (counted once per execution: one call)."""
    _counts["executions"] += 1
    _counts["execute_seconds"] += seconds


def snapshot() -> dict[str, Any]:
    """Current counters: compiles, cache_hits (a call found its program), memory_cache_hits /
    disk_cache_hits (a new program found already built / on disk), executions, flushes,
    fused_ops, compile_seconds, execute_seconds, transfers, host_syncs, cpu_fallbacks, ...
    and the breakdowns ``flushes_by_reason`` (DeferAndFuse: what made each pending graph
    run), ``host_syncs_by_cause`` and ``cpu_fallbacks_by_op``."""
    with _lock:
        counts = dict(_counts)
    out: dict[str, Any] = {k: counts.get(k, 0) for k in _FIELDS}
    out.update({k: v for k, v in counts.items() if k not in out and _breakdown(k) is None})
    for prefix, (key, _) in _BREAKDOWNS.items():
        out[key] = {k[len(prefix) :]: v for k, v in counts.items() if _breakdown(k) == prefix}
    return out


def _breakdown(name: str) -> str | None:
    """The per-cause prefix ``name`` starts with, if any (the totals are not breakdowns)."""
    for prefix in _BREAKDOWNS:
        if name.startswith(prefix) and name not in _FIELDS:
            return prefix
    return None


def report(file: Any = None) -> str:
    """A readable table of the counters (printed to ``file``, default stdout, and returned)."""
    snap = snapshot()
    breakdowns = {label: snap.pop(key) for key, label in _BREAKDOWNS.values()}
    lines = [f"{'torchtpu metric':<28}{'value':>16}"]
    for k, v in snap.items():
        lines.append(f"{k:<28}{v:>16.3f}" if isinstance(v, float) else f"{k:<28}{v:>16,}")
    for label, counts in breakdowns.items():
        for k, v in sorted(counts.items()):
            lines.append(f"{f'  {label}: {k}':<28}{v:>16,}")
    text = "\n".join(lines)
    print(text, file=file or sys.stdout)
    return text


def reset() -> None:
    with _lock:
        _counts.clear()
