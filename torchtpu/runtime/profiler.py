"""XLA's own profiler: jaxlib's PjRT profiler session, recording XSpace device traces.

The only module (with pjrt.py) that calls jaxlib for profiling. A session records what
XLA's runtime does: compiles, each program's execution and, per HLO instruction, its
events (on the cpu platform XLA's thunk executor reports each fusion, dot or copy with
``hlo_module`` = the program's name, ``hlo_op`` = the instruction). ``stop()`` returns
the serialized XSpace proto, the ``<host>.xplane.pb`` TensorBoard's profile plugin and
XProf read from ``<logdir>/plugins/profile/<run>/``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import TpuRuntimeError
from . import pjrt


class DeviceTrace:
    """A running XLA profiler session (one per process at a time)."""

    def __init__(self) -> None:
        pjrt.get()  # the client first: its device tracers register with the profiler
        from jaxlib import _profiler

        opts = _profiler.ProfileOptions()
        opts.python_tracer_level = 0  # torch.profiler already covers Python; this one is costly
        opts.host_tracer_level = 2  # XLA's runtime and per-instruction events
        opts.enable_hlo_proto = True  # XProf's op profile needs the programs' HLO
        opts.raise_error_on_start_failure = True
        try:
            self._session = _profiler.ProfilerSession(opts)
        except Exception as e:  # noqa: BLE001 - jaxlib raises a bare RuntimeError / XlaRuntimeError
            raise TpuRuntimeError(
                f"torchtpu: could not start XLA's profiler ({e}); only one torchtpu.profiler.trace() "
                "(or other XLA profiler session) can run at a time"
            ) from e
        self._data: bytes | None = None

    def stop(self) -> bytes:
        """End the session; returns the serialized XSpace (idempotent)."""
        if self._data is None:
            self._data = self._session.stop()
        return self._data


@dataclass(frozen=True)
class XlaEvent:
    plane: str  # "/host:CPU", "/device:TPU:0", ...
    line: str  # the thread or stream
    name: str
    start_ns: float
    duration_ns: float
    stats: dict[str, Any]


def read_xspace(source: bytes | str | Path) -> list[XlaEvent]:
    """Every event of an XSpace (serialized bytes, or an ``.xplane.pb`` file), parsed with
    jaxlib's reader: what a test or a script checks a device trace with."""
    from jaxlib import _profile_data

    if isinstance(source, bytes):
        data = _profile_data.ProfileData.from_serialized_xspace(source)
    else:
        data = _profile_data.ProfileData.from_file(str(source))
    out = []
    for plane in data.planes:
        for line in plane.lines:
            for e in line.events:
                stats = {k: v for k, v in e.stats if k is not None}
                out.append(XlaEvent(plane.name, line.name, e.name, e.start_ns, e.duration_ns, stats))
    return out
