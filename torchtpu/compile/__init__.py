"""torch.compile(backend="tpu"): see backend.py (entry), fx_lowering.py (graphs -> programs)
and dynamic.py (bounded dynamism)."""

from __future__ import annotations

from .dynamic import mark_dynamic

__all__ = ["mark_dynamic"]
