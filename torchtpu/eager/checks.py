"""Asynchronous errors: conditions a program checks on the device and the host reads later.

XLA has no assertion op, and an out-of-range index would silently clamp. A rule that can
detect misuse (``L.check(pred, message)``) adds a boolean output to its program; the
dispatcher keeps the flag buffer with the op's name and the user's source line. Like a
CUDA device-side assert, the error surfaces at the next point where the user waits
(``.cpu()``, ``.item()``, ``torch.tpu.synchronize()``) — or at once under
``launch_blocking`` — and the device stays usable.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

import torch

from ..errors import TpuError


class TpuAsyncError(TpuError):
    """A check inside an asynchronously executed program failed."""


_pending: list[tuple[Any, str, str, str]] = []  # (flag buffer, op, message, source line)
_lock = threading.Lock()
_LIB_DIRS = tuple(os.path.dirname(m.__file__) + os.sep for m in (torch,)) + (
    os.path.dirname(os.path.dirname(__file__)) + os.sep,
)


def user_source_line() -> str:
    """``file:line`` of the innermost frame outside torch and torchtpu."""
    f = sys._getframe(1)
    while f is not None:
        name = f.f_code.co_filename
        if not name.startswith(_LIB_DIRS) and not name.startswith("<frozen"):
            return f"{name}:{f.f_lineno}"
        f = f.f_back
    return "<unknown>"


def add(flags: list[Any], op: str, messages: list[str], where: str) -> None:
    with _lock:
        for buf, msg in zip(flags, messages):
            _pending.append((buf, op, msg, where))


def clear() -> None:
    """Drop every pending check without reading it (tests isolate themselves with this)."""
    with _lock:
        _pending.clear()


def has_pending() -> bool:
    return bool(_pending)


def raise_pending(blocking: bool = False) -> None:
    """Read every pending flag; raise the first failure (in program order), drop the rest."""
    if not _pending:
        return
    from ..runtime import pjrt

    with _lock:
        items = list(_pending)
        _pending.clear()
    rt = pjrt.get()
    for buf, op, msg, where in items:
        if bool(rt.to_numpy(buf)):
            hint = (
                ""
                if blocking
                else " The error was detected asynchronously; set TORCHTPU_LAUNCH_BLOCKING=1 (or "
                "torchtpu.set_eager_mode('launch_blocking')) to stop at the failing call."
            )
            raise TpuAsyncError(f"torchtpu: {op} failed on the device: {msg} (called at {where}).{hint}")
