"""Stream and Event for ``torch.tpu``, as FSDP2 needs them (``device_handle.Stream``,
``Event``, ``current_stream``, ``stream``).

A PjRT device runs one in-order queue, so every stream is that queue: waits are no-ops,
synchronize waits for the device. (The asynchronous collectives, all_reduce, complete
through ``Work.wait()``, as c10d requires, not through stream order.) Installed on
``torch.tpu`` when a "tpu" process group is created, only where the device module does
not define its own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch


class Stream:
    """The device's single in-order queue (every instance is the same queue)."""

    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any) -> None:
        self.device = torch.device("tpu", 0)
        self.priority = priority

    def wait_stream(self, stream: Stream) -> None:
        return None

    def wait_event(self, event: Event) -> None:
        return None

    def record_event(self, event: Event | None = None) -> Event:
        event = event if event is not None else Event()
        event.record(self)
        return event

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        torch.tpu.synchronize()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stream)

    def __hash__(self) -> int:
        return hash(Stream)

    def __repr__(self) -> str:
        return "torch.tpu.Stream(device=tpu:0)"


class Event:
    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> None:
        self.recorded = False

    def record(self, stream: Stream | None = None) -> None:
        self.recorded = True

    def wait(self, stream: Stream | None = None) -> None:
        return None

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        torch.tpu.synchronize()


_DEFAULT = Stream()


def current_stream(device: Any = None) -> Stream:
    return _DEFAULT


def default_stream(device: Any = None) -> Stream:
    return _DEFAULT


def set_stream(stream: Stream) -> None:
    return None


@contextlib.contextmanager
def stream(s: Stream | None) -> Iterator[None]:
    yield


def install() -> None:
    """Add what torch.tpu lacks; a device module's own definitions win."""
    mod = torch.tpu
    for name, obj in {
        "Stream": Stream,
        "Event": Event,
        "current_stream": current_stream,
        "default_stream": default_stream,
        "set_stream": set_stream,
        "stream": stream,
    }.items():
        if not hasattr(mod, name):
            setattr(mod, name, obj)
