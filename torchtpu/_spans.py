"""The two observers every layer reports its events to: torch.profiler and explain.

A leaf module (like ``metrics`` and ``op_report``): every layer may import it. When nothing
observes, each event costs one attribute test:

- ``PROFILER._is_profiler_enabled`` is PyTorch's own fast flag, true while a
  ``torch.profiler.profile`` (or ``torch.autograd.profiler.profile``) session records. Only
  then is a span opened: :func:`span` makes the record function that
  ``torch.profiler.record_function`` makes, so the user's scopes nest around ours and the
  spans show in ``export_chrome_trace`` and ``key_averages()``.
- ``explain`` is the recorder of ``torchtpu.debug.explain`` while it records, else None.

Span names are ``torchtpu::`` and the event, with a low-cardinality detail in parentheses
so that ``key_averages()`` groups by it. Their arguments show in the Chrome trace under
``profile(record_shapes=True)`` (PyTorch records a span's arguments only then):

=====================================  ======================================================
``torchtpu::compile (<tier>)``         a call needs a program it has not used: ``memory`` (the
                                       same program text was built already), ``disk`` (loaded
                                       from the disk cache) or ``compiled`` (by XLA); args
                                       ``program`` (op and shapes, or graph), ``tier``
``torchtpu::execute``                  enqueue a program; args ``program`` (its HLO module
                                       name, as XLA's own trace shows it)
``torchtpu::device_wait``              with ``torchtpu.profiler.device_timing(True)``: wait
                                       for that program's results; args ``program``
``torchtpu::flush (<reason>)``         DeferAndFuse runs its pending graph; args ``reason``,
                                       ``ops``
``torchtpu::h2d``, ``torchtpu::d2h``   a host<->device copy; args ``bytes``
``torchtpu::host_sync (<cause>)``      the host waits for a value: ``.item()``, ``.cpu() /
                                       print``, ``torch.save / pickle``, ``<op> (data-dependent
                                       shape)``; args ``cause``
``torchtpu::cpu_fallback (<op>)``      an op without a lowering ran on the host; args ``op``
=====================================  ======================================================
"""

from __future__ import annotations

from typing import Any

from torch._C._profiler import _RecordFunctionFast
from torch.autograd import profiler as PROFILER

device_timing = False  # torchtpu.profiler.device_timing(True): also time the device's work
explain: Any = None  # torchtpu.debug.explain's recorder while it records


def active() -> bool:
    """Whether a torch.profiler session is recording (then spans are worth opening)."""
    return PROFILER._is_profiler_enabled


def span(name: str, **args: str | int | float | bool) -> Any:
    """A span (context manager) for the running profiler; open it only when :func:`active`.
    Argument values must be str, int, float or bool."""
    # both the positional and the keyword list must be given: PyTorch aborts the process on None
    return _RecordFunctionFast(name, [], args)


class _Null:
    """The span of an event nobody observes."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


NULL = _Null()


def maybe_span(name: str, **args: str | int | float | bool) -> Any:
    """``span(name, **args)`` while a profiler records, else a no-op context manager. For
    rare events (compiles, CPU fallbacks): off, it still costs a call and a ``with``
    (~0.5 us), so frequent events test ``PROFILER._is_profiler_enabled`` themselves."""
    return _RecordFunctionFast(name, [], args) if PROFILER._is_profiler_enabled else NULL
