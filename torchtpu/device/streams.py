"""``torch.tpu.Stream``, ``Event``, ``current_stream``, ``stream``: CUDA's stream API.

A PjRT device runs its programs as one in-order queue, so every stream is that queue:
``wait_stream`` and ``Event.wait`` have nothing to order, and a stream context changes
nothing. What code written for CUDA relies on still holds:

- ``Event.record()`` marks the work enqueued so far (DeferAndFuse's pending graph is run
  first, so the mark covers it); ``query()`` says whether it has finished and
  ``synchronize()`` waits for it.
- Timing, ``Event(enable_timing=True)`` and ``start.elapsed_time(end)``: a timing event's
  ``record()`` waits until the device has finished the work before it, then reads the
  clock, so the time between two events is the device's time for what ran between them
  (CUDA's events read a device clock without waiting; the measure is the same).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import torch

from ..runner import checks, program
from ..runtime import pjrt


def _mark() -> list[Any]:
    """The device's enqueued work so far (``program.mark``: weak references to results and
    runtime tokens, no strong reference to a result, which would make it look shared to
    the donation checks)."""
    if not pjrt.started():
        return []
    from ..eager import deferred

    deferred.flush("event")
    return program.mark()


def _finished(mark: list[Any]) -> bool:
    return all(program.finished(e) for e in mark)


def _wait(mark: list[Any]) -> None:
    """Wait for every execution of ``mark``, those whose results were all dropped too (a
    timing event after ``model(x)`` in a loop)."""
    if mark:
        pjrt.get().wait([e.done for e in mark])
    checks.raise_pending()


class Event:
    """A mark in the device's queue (``torch.cuda.Event``)."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> None:
        self.enable_timing = enable_timing
        self._mark: list[Any] | None = None  # None until recorded (_mark)
        self._time: float | None = None  # perf_counter when the device reached the mark

    def record(self, stream: Stream | None = None) -> None:
        self._mark = _mark()
        if self.enable_timing:
            _wait(self._mark)
            self._time = time.perf_counter()

    def query(self) -> bool:
        return self._mark is None or _finished(self._mark)

    def synchronize(self) -> None:
        if self._mark is not None:
            _wait(self._mark)

    def wait(self, stream: Stream | None = None) -> None:
        """Make ``stream`` wait for this event: one in-order queue already does."""

    def elapsed_time(self, end_event: Event) -> float:
        """Milliseconds between this event and ``end_event`` (both recorded, with timing)."""
        if not (self.enable_timing and end_event.enable_timing):
            raise RuntimeError("Both events must be created with argument 'enable_timing=True' to measure elapsed time.")
        if self._time is None or end_event._time is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        return (end_event._time - self._time) * 1000.0

    def __repr__(self) -> str:
        return f"torch.tpu.Event(recorded={self._mark is not None}, enable_timing={self.enable_timing})"


class Stream(torch.Stream):
    """The device's in-order queue (``torch.cuda.Stream``); every instance is that queue.
    A ``torch.Stream`` (the device guard's default stream), so PyTorch's functions that
    take one take it too (``Tensor.record_stream``)."""

    def __new__(cls, device: Any = None, priority: int = 0, **kwargs: Any) -> Stream:
        return super().__new__(cls, device=torch.device("tpu", 0), priority=priority)

    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any) -> None:
        self.priority = priority

    def wait_stream(self, stream: torch.Stream) -> None:
        """Order this stream after ``stream``: they are the same queue."""

    def wait_event(self, event: Event) -> None:
        event.wait(self)

    def record_event(self, event: Event | None = None) -> Event:
        event = event if event is not None else Event()
        event.record(self)
        return event

    def query(self) -> bool:
        return _queue_finished()

    def synchronize(self) -> None:
        _synchronize_device()

    def __repr__(self) -> str:
        return "torch.tpu.Stream(device=tpu:0)"


def _queue_finished() -> bool:
    return _finished(_mark())


def _synchronize_device() -> None:
    from . import synchronize  # torch.tpu.synchronize: its package imports this module

    synchronize()


_DEFAULT: Stream | None = None  # made on first use: "tpu" is not a device yet when this module loads


def current_stream(device: Any = None) -> Stream:
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = Stream()
    return _DEFAULT


def default_stream(device: Any = None) -> Stream:
    return current_stream(device)


def set_stream(stream: Stream) -> None:
    """Select ``stream``: every stream is the device's one queue."""


@contextlib.contextmanager
def stream(s: Stream | None) -> Iterator[None]:
    """``with torch.tpu.stream(s):``: work inside runs on the device's one queue."""
    yield


# -- PyTorch's generic torch.Event / torch.Stream on "tpu" -------------------------------------
# The C++ device guard (csrc/hooks.cpp: TpuGuard) asks these: an event it records is an
# Event of this module, so torch.Event(device="tpu") and torch.tpu.Event behave alike.
def guard_record_event(timing: bool) -> Event:
    event = Event(enable_timing=timing)
    event.record()
    return event


def guard_query_event(event: Event) -> bool:
    return event.query()


def guard_synchronize_event(event: Event) -> bool:
    event.synchronize()
    return True


def guard_elapsed_time(start: Event, end: Event) -> float:
    return start.elapsed_time(end)


def guard_query_stream() -> bool:
    return _queue_finished()


def guard_synchronize() -> None:
    _synchronize_device()
