"""What each ATen op of a run did on tpu: lowered, decomposed, missing, or a host sync.

The dispatch layer reports to one recorder object (``recorder``), and only when one is
active: with none (the default) every hook is a single ``is None`` test. Turn it on for any
run with ``TORCHTPU_OP_REPORT=1`` (the report prints at exit), or run a script under
``python -m torchtpu.check_model script.py [args]``.

Categories, per op overload:

- ``lowered``: ran through its lowering rule.
- ``decomposed``: no rule of its own; ran as PyTorch's (or torchtpu's) decomposition into
  ops that have one.
- ``missing``: no lowering. With ``TORCHTPU_CPU_FALLBACK=1`` it ran on the CPU (its inputs
  copied to the host and back); without, it raised ``NotImplementedError``.
- ``host sync``: the host waited for the device and read data back (``.item()``, ``.cpu()``,
  printing; data-dependent shapes such as ``nonzero`` or boolean-mask indexing).

Each entry keeps the number of calls and the source line of the first one: the innermost
frame outside torch and torchtpu, and, when that frame is in an installed library (e.g.
transformers), also the innermost frame of the user's own code.

This module is a leaf (like ``metrics``): every layer may import it.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

LOWERED = "lowered"
DECOMPOSED = "decomposed"
MISSING = "missing"
HOST_SYNC = "host sync"
CATEGORIES = (MISSING, HOST_SYNC, DECOMPOSED, LOWERED)  # the report's order: what to fix first

# How a host sync is named in the report, by the reason ``to_cpu`` was given.
SYNC_NAMES = {
    "item": "aten::_local_scalar_dense (.item(), bool(t))",
    "to_cpu": "copy to the host (.cpu(), .tolist(), print)",
}


@dataclass
class Entry:
    category: str
    name: str
    calls: int
    where: str  # innermost frame outside torch/torchtpu
    user_where: str | None  # innermost frame of the user's code, when ``where`` is in a library
    detail: str = ""  # for missing ops: "ran on the CPU" or "raised NotImplementedError"


def _dir_of(module_file: str | None) -> str | None:
    return os.path.dirname(os.path.abspath(module_file)) + os.sep if module_file else None


_TORCH_DIR = _dir_of(sys.modules["torch"].__file__) if "torch" in sys.modules else None
_OWN_DIR = _dir_of(__file__)
_LIBRARY_DIRS = tuple(
    {
        os.path.abspath(p) + os.sep
        for p in (sysconfig.get_paths().get(k) for k in ("purelib", "platlib", "stdlib", "platstdlib"))
        if p
    }
)


def _internal(filename: str) -> bool:
    if filename.startswith("<frozen") or filename.startswith(_OWN_DIR or "\0"):
        return True
    torch_dir = _TORCH_DIR or _dir_of(getattr(sys.modules.get("torch"), "__file__", None))
    return torch_dir is not None and filename.startswith(torch_dir)


def _in_library(filename: str) -> bool:
    return filename.startswith(_LIBRARY_DIRS)


def source_lines() -> tuple[str, str | None]:
    """(innermost frame outside torch/torchtpu, innermost user frame if that one is a library's)."""
    f = sys._getframe(1)
    where = None
    engine = _engine_entry()
    while f is not None:
        if f.f_code is engine and where is None:  # an autograd node's op, no user code in it
            return _backward_node(), None
        name = f.f_code.co_filename
        if not _internal(name):
            here = f"{name}:{f.f_lineno}"
            if where is None:
                where = here
                if not _in_library(name):
                    return where, None
            elif not _in_library(name):
                return where, here
        f = f.f_back
    return where or _backward_node(), None


def _engine_entry() -> object:
    """The code of the frame that enters the autograd engine (``loss.backward()`` runs the
    nodes below it on the calling thread): what a backward node runs is named after the
    node, not after the line that called ``backward()``."""
    import torch

    run = getattr(torch.autograd.graph, "_engine_run_backward", None)
    return getattr(run, "__code__", None)


def _backward_node() -> str:
    """No user frame: a backward op (on the calling thread or an autograd device thread); name its node."""
    import torch

    node = torch._C._current_autograd_node()
    return f"backward ({node.name()})" if node is not None else "<unknown>"


class Recorder:
    """Counts calls per (category, op) and keeps the source line of the first one."""

    def __init__(self, cpu_fallback: bool = False) -> None:
        self.entries: dict[tuple[str, str], Entry] = {}
        self.cpu_fallback = cpu_fallback  # ran with TORCHTPU_CPU_FALLBACK=1 (said in the report)
        self._quiet = 0

    def record(self, category: str, name: str, detail: str = "") -> None:
        if self._quiet:
            return
        entry = self.entries.get((category, name))
        if entry is None:
            where, user_where = source_lines()
            self.entries[(category, name)] = Entry(category, name, 1, where, user_where, detail)
        else:
            entry.calls += 1

    def host_sync(self, reason: str) -> None:
        self.record(HOST_SYNC, SYNC_NAMES.get(reason, reason))

    @contextmanager
    def quiet(self) -> Iterator[None]:
        """Inside, nothing is recorded (the host copies a CPU fallback makes are part of it)."""
        self._quiet += 1
        try:
            yield
        finally:
            self._quiet -= 1

    def by_category(self, category: str) -> list[Entry]:
        return [e for e in self.entries.values() if e.category == category]

    def format(self) -> str:
        return format_report(list(self.entries.values()), self.cpu_fallback)


recorder: Recorder | None = None  # the hooks test this; None: nothing is recorded


def start(cpu_fallback: bool = False) -> Recorder:
    global recorder
    recorder = Recorder(cpu_fallback)
    return recorder


def stop() -> Recorder | None:
    global recorder
    done, recorder = recorder, None
    return done


@contextmanager
def quiet() -> Iterator[None]:
    """Suspend recording (a no-op when nothing records)."""
    if recorder is None:
        yield
        return
    with recorder.quiet():
        yield


def _describe(e: Entry) -> str:
    if e.category == MISSING and e.detail:
        return f"{MISSING} ({e.detail})"
    return e.category


def _location(e: Entry) -> str:
    return f"{e.user_where} (via {e.where})" if e.user_where else e.where


def format_report(entries: list[Entry], cpu_fallback: bool) -> str:
    order = {c: i for i, c in enumerate(CATEGORIES)}
    entries = sorted(entries, key=lambda e: (order.get(e.category, len(order)), e.name))
    lines = ["torchtpu op report" + (" (TORCHTPU_CPU_FALLBACK=1: ops without a lowering ran on the CPU)" if cpu_fallback else "")]
    if not entries:
        return "\n".join([*lines, "  no tpu ops ran"])
    name_w = max(len("op"), *(len(e.name) for e in entries))
    how_w = max(len("how"), *(len(_describe(e)) for e in entries))
    lines.append(f"  {'op':<{name_w}}  {'how':<{how_w}}  {'calls':>6}  first call")
    for e in entries:
        lines.append(f"  {e.name:<{name_w}}  {_describe(e):<{how_w}}  {e.calls:>6}  {_location(e)}")
    counts = {c: sum(1 for e in entries if e.category == c) for c in CATEGORIES}
    lines.append("  " + ", ".join(f"{counts[c]} {c}" for c in reversed(CATEGORIES)) + " (distinct ops)")
    if counts[MISSING]:
        lines.append(
            "  missing ops need a lowering rule (torchtpu/lowering/rules) or a decomposition (torchtpu/lowering/decomp.py); "
            "until then TORCHTPU_CPU_FALLBACK=1 runs them on the host"
        )
    return "\n".join(lines)


def enable_from_env() -> None:
    """TORCHTPU_OP_REPORT=1: record this whole run and print the report (to stderr) at exit."""
    from . import config

    if recorder is not None or not config.flag("TORCHTPU_OP_REPORT"):
        return
    import atexit

    rec = start(cpu_fallback=config.flag("TORCHTPU_CPU_FALLBACK"))
    atexit.register(lambda: print(rec.format(), file=sys.stderr))
