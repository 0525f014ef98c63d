"""Asynchronous errors: conditions a program checks on the device and the host reads later.

XLA has no assertion op, and an out-of-range index would silently clamp. A rule that can
detect misuse (``L.check(pred, message)``) adds a boolean output to its program; the
dispatcher keeps the flag buffer with the op's name and the user's source line. Like a
CUDA device-side assert, the error surfaces at the next point where the user waits
(``.cpu()``, ``.item()``, ``torch.tpu.synchronize()``) — or at once under
``launch_blocking`` — and the device stays usable.

A check may name the exception type the CPU raises for the same input (``IndexError``,
``torch.linalg.LinAlgError``): the error raised is then a subclass of both ``TpuAsyncError``
and that type, so ``except IndexError`` works as on the CPU. Its message starts with the
CPU's text (with the values the device read, "Target 5 is out of bounds.") and ends with
our context: the op, the user's source line and how to stop at the failing call.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any, NamedTuple

import numpy as np
import torch

from ..errors import CheckMessage, TpuError


class TpuAsyncError(TpuError):
    """A check inside an asynchronously executed program failed."""


class TpuAsyncIndexError(TpuAsyncError, IndexError):
    """A device-side check failed where the CPU raises IndexError (e.g. a target out of range)."""


class TpuAsyncLinAlgError(TpuAsyncError, torch.linalg.LinAlgError):
    """A device-side check failed where the CPU raises torch.linalg.LinAlgError."""


_ERROR_TYPES: dict[type, type] = {IndexError: TpuAsyncIndexError, torch.linalg.LinAlgError: TpuAsyncLinAlgError}


def error_type(exc: type[Exception]) -> type[TpuAsyncError]:
    """The TpuAsyncError subclass that is also an ``exc`` (made once per type)."""
    if issubclass(TpuAsyncError, exc):
        return TpuAsyncError
    cls = _ERROR_TYPES.get(exc)
    if cls is None:
        name = "TpuAsync" + exc.__name__.lstrip("_")
        cls = _ERROR_TYPES[exc] = type(name, (TpuAsyncError, exc), {"__module__": __name__})
        globals()[name] = cls  # so that pickle finds it (multiprocessing re-raises errors)
    return cls


class Flag(NamedTuple):
    """Where a check's flag is: a buffer of its own, or ``span`` of a program's packed flags."""

    buf: Any
    span: tuple[int, int] | None = None


class _Added(NamedTuple):
    """The checks one execution reported (``add``): read together at the next wait."""

    flags: list[Flag]
    op: str
    messages: list[str]
    where: SourceLine | str


_pending: list[_Added] = []
_lock = threading.Lock()
_LIB_DIRS = tuple(os.path.dirname(m.__file__) + os.sep for m in (torch,)) + (os.path.dirname(os.path.dirname(__file__)) + os.sep,)


class SourceLine:
    """Where user code called an op: the frame's code and instruction, formatted as
    ``file:line`` only when a message shows it. Looking the line up costs ~1-2 us, paid
    on every recorded op whose program checks something (``nll_loss``, ``gather``...)
    where almost none ever fails."""

    __slots__ = ("code", "lasti")

    def __init__(self, code: Any, lasti: int) -> None:
        self.code = code
        self.lasti = lasti  # bytes into co_code, as f_lasti and co_lines() count them

    def __str__(self) -> str:
        line = next((n for start, end, n in self.code.co_lines() if start <= self.lasti < end and n is not None), None)
        return f"{self.code.co_filename}:{self.code.co_firstlineno if line is None else line}"

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)


_LIBRARY_FILES: dict[str, bool] = {}  # file name -> inside torch or torchtpu (asked per frame walked)


def _is_library(filename: str) -> bool:
    lib = _LIBRARY_FILES.get(filename)
    if lib is None:
        if len(_LIBRARY_FILES) > 4096:  # generated code (Dynamo's "<eval_with_key>.N") names new files
            _LIBRARY_FILES.clear()
        lib = _LIBRARY_FILES[filename] = filename.startswith(_LIB_DIRS) or filename.startswith("<frozen")
    return lib


def user_source_line(skip: int = 0) -> SourceLine | str:
    """The innermost frame outside torch and torchtpu, as ``file:line`` (a :class:`SourceLine`).
    ``skip``: how many frames above the caller are torchtpu's for sure, passed over without
    being looked at (Python makes a frame object for every frame it hands out, ~1 us each
    inside a recorded op)."""
    try:
        f = sys._getframe(1 + skip)
    except ValueError:  # a shallower stack than the caller said
        f = sys._getframe(1)
    while f is not None:
        code = f.f_code
        if not _is_library(code.co_filename):
            return SourceLine(code, f.f_lasti)
        f = f.f_back
    return "<unknown>"


def add(flags: list[Flag], op: str, messages: list[str], where: SourceLine | str) -> None:
    with _lock:
        _pending.append(_Added(flags, op, messages, where))


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
    # a program's packed flags are read once; a buffer of zeros holds no failure (a flag
    # and its values are all 0 unless its check failed): an execution whose flags are
    # packed in one is passed over whole (DLRM's compiled step: 26 flags, two buffers)
    read: dict[int, np.ndarray | None] = {}
    for flags, op, messages, where in items:
        for flag, msg in zip(flags, messages):
            key = id(flag.buf)
            if key in read:
                values = read[key]
            else:
                values = np.asarray(rt.to_numpy(flag.buf)).reshape(-1)
                values = read[key] = values if values.any() else None
            if values is None:
                if flag.span is not None:  # packed: every flag of this execution is in that buffer
                    break
                continue
            if flag.span is not None:
                values = values[flag.span[0] : flag.span[1]]
            if values[0]:  # [bad] or [bad, values...] (L.check)
                raise _error(op, msg, [int(v) for v in values[1:]], where, blocking)


def _error(op: str, msg: str, values: list[int], where: SourceLine | str, blocking: bool) -> TpuAsyncError:
    if not isinstance(msg, CheckMessage):
        msg = CheckMessage(msg)
    hint = (
        ""
        if blocking
        else " The error was detected asynchronously; set TORCHTPU_LAUNCH_BLOCKING=1 (or "
        "torchtpu.set_eager_mode('launch_blocking')) to stop at the failing call."
    )
    text = f"{msg.render(values)} (torchtpu: {op} failed on the device, called at {where}).{hint}"
    return error_type(msg.exc)(text)
