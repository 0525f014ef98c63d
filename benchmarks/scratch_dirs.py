"""Temporary directories the benchmarks need (cold compile caches, a child's output),
removed when the process that made them exits."""

from __future__ import annotations

import atexit
import shutil
import tempfile


def scratch_dir(prefix: str) -> str:
    """A new empty directory under the system's temporary directory, deleted at exit."""
    path = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path
