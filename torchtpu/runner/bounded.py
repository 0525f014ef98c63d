"""A bounded dictionary: every host-side cache of programs is one of these.

A training loop whose shapes change every few hundred steps makes new programs for ever;
keeping all of them (and their StableHLO text) would grow host memory without limit. Each
cache keeps at most ``TORCHTPU_MAX_PROGRAMS`` entries (read when an entry is added, so
tests can lower it) and drops the oldest entries; a dropped program is rebuilt on its
next use (its executable usually still in the executable cache, in memory or on disk).

Oldest, not least recently used: a hit is then a plain C-level ``dict.get`` (the eager
hot path looks one up per op), and a hot program evicted once is rebuilt once and is
then the newest entry.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Any

from .. import config, metrics


class BoundedCache(OrderedDict):
    """An ``OrderedDict`` that keeps the ``TORCHTPU_MAX_PROGRAMS`` (or ``limit``) most
    recently added entries."""

    def __init__(self, name: str, limit: int | None = None) -> None:
        super().__init__()
        self.name = name
        self.limit = limit

    def __setitem__(self, key: Hashable, value: Any) -> None:
        super().__setitem__(key, value)
        limit = self.limit if self.limit is not None else int(config.get("TORCHTPU_MAX_PROGRAMS"))
        while len(self) > limit:
            self.popitem(last=False)
            metrics.add("cache_evictions")
