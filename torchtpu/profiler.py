"""Profiling torchtpu with the standard tools.

``torch.profiler.profile`` sees torchtpu's events as named spans (``torchtpu::compile
(compiled|disk|memory)``, ``torchtpu::execute``, ``torchtpu::device_wait``,
``torchtpu::flush (<reason>)``, ``torchtpu::h2d`` / ``torchtpu::d2h``,
``torchtpu::host_sync (<cause>)``, ``torchtpu::cpu_fallback (<op>)``; see
``torchtpu/_spans.py``), nested inside the ATen ops and the user's ``record_function``
scopes, in ``export_chrome_trace`` and ``key_averages()``. Their arguments (program,
cache tier, bytes, flush reason, sync cause) are recorded under
``profile(record_shapes=True)``. Nothing is recorded, and each event costs one flag test,
when no profiler runs.

Execution is asynchronous: ``torchtpu::execute`` covers only the enqueue.
``device_timing(True)`` makes every execution under a profiler wait for its results, in a
``torchtpu::device_wait`` span, so the trace shows how long the device worked (at the
cost of the overlap between host and device).

``trace(logdir)`` also records XLA's own device-side trace (the XLA runtime's profiler session:
each program's execution and its HLO instructions) and writes both, TensorBoard / XProf
style::

    <logdir>/plugins/profile/<run>/<host>.xplane.pb       XLA's trace (XProf, tensorboard-plugin-profile)
    <logdir>/plugins/profile/<run>/<host>.pt.trace.json   the torch.profiler Chrome trace

    with torchtpu.profiler.trace("runs/prof") as t:
        train_step()
    print(t.profile.key_averages().table(row_limit=20))
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import _spans

__all__ = ["Trace", "device_timing", "trace"]


def device_timing(enabled: bool) -> None:
    """Under a profiler, wait for each program's results in a ``torchtpu::device_wait`` span."""
    _spans.device_timing = bool(enabled)


@dataclass
class Trace:
    """What ``trace()`` recorded: the torch profiler (``profile.key_averages()``) and the
    files it writes at the end of the block."""

    profile: Any  # torch.profiler.profile
    run_dir: Path
    chrome_trace: Path  # <host>.pt.trace.json
    xplane: Path  # <host>.xplane.pb


def _finish_device_work() -> None:
    """Wait for every program the block enqueued: the device trace ends when the block
    does, and programs still running then (a backward after the last ``.item()``) would be
    missing from it."""
    import torch

    torch.tpu.synchronize()  # runs DeferAndFuse's pending graph too


@contextmanager
def trace(logdir: str | os.PathLike, record_shapes: bool = True, with_stack: bool = False) -> Iterator[Trace]:
    """Profile the block with torch.profiler (CPU activity) and XLA's profiler; write the
    Chrome trace and XLA's XSpace into ``<logdir>/plugins/profile/<run>/`` at the end."""
    import torch.profiler

    from .runtime.profiler import DeviceTrace

    run_dir = _new_run_dir(Path(logdir))
    host = socket.gethostname() or "localhost"
    prof = torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=record_shapes, with_stack=with_stack
    )
    result = Trace(prof, run_dir, run_dir / f"{host}.pt.trace.json", run_dir / f"{host}.xplane.pb")
    device = DeviceTrace()
    try:
        with prof:
            yield result
            _finish_device_work()  # inside: the wait shows in the Chrome trace too
    finally:
        result.xplane.write_bytes(device.stop())
        prof.export_chrome_trace(str(result.chrome_trace))


def _new_run_dir(logdir: Path) -> Path:
    """A new ``plugins/profile/<YYYY_MM_DD_HH_MM_SS>`` directory (XProf's run naming)."""
    base = logdir / "plugins" / "profile" / time.strftime("%Y_%m_%d_%H_%M_%S")
    base.parent.mkdir(parents=True, exist_ok=True)
    for n in range(1000):
        run = base.with_name(f"{base.name}_{n}") if n else base
        try:
            run.mkdir()
            return run
        except FileExistsError:
            continue
    raise FileExistsError(f"torchtpu: too many profiler runs named {base}")
