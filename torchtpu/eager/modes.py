"""Eager execution modes: "eager" (async, one program per op), "defer_and_fuse" (record,
then run one fused program), "launch_blocking" (synchronous; errors name op and line).

The mode is thread-local; a thread starts in the process default, which comes from
``TORCHTPU_DEFER_AND_FUSE=1`` / ``TORCHTPU_LAUNCH_BLOCKING=1`` or ``set_eager_mode``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from .. import config

EAGER = "eager"
DEFER = "defer_and_fuse"
BLOCKING = "launch_blocking"
MODES = (EAGER, DEFER, BLOCKING)


def _from_env() -> str:
    if config.flag("TORCHTPU_LAUNCH_BLOCKING"):
        return BLOCKING
    if config.flag("TORCHTPU_DEFER_AND_FUSE"):
        return DEFER
    return EAGER


_default = _from_env()


class _ThreadMode(threading.local):
    mode: str | None = None  # a class default: reading it on a new thread raises nothing


_local = _ThreadMode()


_outer_context: list[str] = []  # modes of open eager_mode() contexts, any thread


def current() -> str:
    mode = _local.mode
    if mode is not None:
        return mode
    # Where the autograd engine runs backward on its own device thread (a thread with
    # torch.autograd.set_multithreading_enabled(True)), that thread follows the innermost
    # open ``eager_mode`` context, so a backward inside one is deferred too.
    if _outer_context and torch._C._current_graph_task_id() != -1:
        return _outer_context[-1]
    return _default


def _check(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"unknown eager mode {mode!r}: use one of {', '.join(repr(m) for m in MODES)}")
    return mode


def _leave(old: str, new: str) -> None:
    """Leaving DeferAndFuse runs what was recorded, so nothing stays pending unseen."""
    if old == DEFER and new != DEFER:
        from . import deferred

        deferred.flush("mode_change")


def set_eager_mode(mode: str) -> None:
    """Set the mode of this thread and the default of threads started later."""
    global _default
    mode = _check(mode)
    _leave(current(), mode)
    _default = mode
    _local.mode = mode


def get_eager_mode() -> str:
    """The mode of the calling thread: "eager", "defer_and_fuse" or "launch_blocking"."""
    return current()


@contextmanager
def eager_mode(mode: str) -> Iterator[None]:
    """``with torchtpu.eager_mode("defer_and_fuse"): ...`` (this thread only)."""
    mode = _check(mode)
    old = current()
    _leave(old, mode)
    saved = _local.mode
    _local.mode = mode
    _outer_context.append(mode)
    try:
        yield
    finally:
        _leave(mode, old)
        _outer_context.pop()
        _local.mode = saved
