"""Storage programs: the one way eager, DeferAndFuse and torch.compile build and run XLA programs.

A storage program reads storage cells and Python numbers and writes storage cells:

- **parameters**: one flat (or parameter-shaped) buffer per storage that holds a value,
  then the device scalars, then whatever the path appends (an RNG state);
- **results**: the new buffers the caller wraps as tensors, then one new buffer per
  storage the program rewrites (``updates``), then one flag per device-side check.

:class:`ProgramBuilder` writes one (the caller lowers its op, graph or FX graph between
:meth:`~ProgramBuilder.storage` and :meth:`~ProgramBuilder.finish`); :func:`execute` runs
one and hands the results back with the check flags taken and the rewritten storages
swapped into their cells. Executables live in the bounded ``runtime/cache.py``; a
program keeps its text to compile again if it was evicted.

A program with collectives (a compiled graph's functional collectives) is built with a
``group``: the global ranks it spans. It is compiled in replica mode over their devices
and run through the group launch path (``runtime/distributed.py``); :func:`execute` waits
for it, so a dead or hung peer fails the call that ran it, named.
"""

from __future__ import annotations

import math
import sys
import weakref
from collections.abc import Iterable, Sequence
from time import perf_counter
from typing import Any, NamedTuple

import numpy as np
import torch

from .. import metrics
from ..lowering.context import ProgramContext
from ..lowering.strided import storage_param, storage_result
from ..runtime import cache, pjrt
from ..runtime import distributed as rdist
from ..stablehlo.builder import Value
from ..stablehlo.types import numpy_dtype
from ..tensor.storage import native_write_back
from . import checks
from .bounded import BoundedCache
from .precision import current as current_precision


class OutputSpec(NamedTuple):
    """How to wrap one new result buffer as a tensor."""

    sizes: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: torch.dtype
    numel: int


class StorageProgram:
    """A compiled storage program and the layout of its results."""

    __slots__ = (
        "key", "text", "what", "n_results", "updates", "check_messages", "check_spans", "result_types", "group", "n_kept",
        "_handlers",
    )

    def __init__(
        self,
        key: str,
        text: str,
        what: str,
        n_results: int,
        updates: tuple[int, ...],
        check_messages: list,
        result_types: list[tuple[tuple[int, ...], Any]],
        group: tuple[int, ...] | None = None,
        n_kept: int = 0,
        check_spans: tuple[tuple[int, int], ...] | None = None,
    ):
        self.key = key  # the executable lives in runtime/cache.py (bounded): executable()
        self.text = text
        self.what = what
        self.n_results = n_results  # new buffers first...
        self.updates = updates  # ...then one per rewritten storage slot, in this order...
        self.check_messages = check_messages  # ...then one flag per device-side check, or
        # with several, one int64 vector holding them all: check i is [start, stop) of it
        self.check_spans = check_spans
        self.result_types = result_types  # (shape, numpy dtype) of every result
        self.group = group  # global ranks of a program with collectives (replica i on group[i]), or None
        self.n_kept = n_kept  # ...then the values kept alive (ProgramContext.keep), dropped by execute
        self._handlers: Any = None

    def executable(self) -> Any:
        if self.group is not None:
            return rdist.group_executable(self.key, self.text, self.group, self.what)
        return cache.fetch(self.key, self.text, f"{self.what} (evicted from the executable cache)")

    def handlers(self) -> Any:
        """How the runtime wraps this program's results (made on the first run)."""
        if self._handlers is None:
            self._handlers = pjrt.get().result_handlers(self.result_types)
        return self._handlers


class ProgramBuilder:
    """Builds one storage program: ``storage()`` per slot, lower, then ``finish()``.
    ``group``: the global ranks a program with collectives spans (see the module doc);
    ``agree``: whether building it checks that each rank's n-th program over the group has
    the same collectives (``runtime/distributed.py: agree_on_collectives``)."""

    def __init__(self, group: Sequence[int] | None = None, agree: bool = True) -> None:
        self.ctx = ProgramContext(precision=current_precision())
        self.ctx.set_platform(pjrt.get())
        self.b = self.ctx.b
        self.group = tuple(group) if group is not None else None
        self.agree = agree
        self._param_of: dict[int, int] = {}  # slot -> parameter index

    def storage(self, slot: int, shape: tuple[int, ...], numel: int, dtype: torch.dtype, initialized: bool) -> Value:
        """The flat value of storage ``slot``: a parameter, or zeros for a storage never
        written (PyTorch's uninitialised memory; zeros keep programs deterministic)."""
        if not initialized:
            return self.b.broadcast_in_dim(self.b.constant(0, dtype), (numel,), [])
        self._param_of[slot] = len(self.b.params)
        return storage_param(self.b, shape, numel, dtype)

    def finish(
        self,
        results: list[Value],
        updates: Sequence[tuple[int, Value, tuple[int, ...]]],
        what: str,
        donate: Iterable[int] = (),
    ) -> StorageProgram:
        """Compile: ``results`` first, then each ``(slot, flat value, buffer shape)`` of
        ``updates``. The old buffer of each slot in ``donate`` is given to XLA for its
        update (``tf.aliasing_output``), so a rewritten storage does not double memory."""
        outputs = list(results)
        position = {slot: len(results) + k for k, (slot, _, _) in enumerate(updates)}
        outputs += [storage_result(self.b, value, shape) for _, value, shape in updates]
        for slot in donate:
            self.b.set_param_attr(self._param_of[slot], f"tf.aliasing_output = {position[slot]} : i32")
        flags = [flag for flag, _ in self.ctx.checks]
        spans = None
        if len(flags) > 1:  # read back as one buffer at the next wait, not one per check
            packed, spans = pack_flags(self.b, flags)
            flags = [packed]
        outputs += flags
        outputs += self.ctx.keep
        text = self.b.module(outputs)
        if self.group is None:
            key, _ = cache.compile_keyed(text, what)
        else:  # compiled now, like every other program, not at its first run
            if self.agree:
                rdist.agree_on_collectives(text, self.group, what)
            key = cache.program_key(text)
            rdist.group_executable(key, text, self.group, what)
        messages = [m for _, m in self.ctx.checks]
        types = [(tuple(v.shape), numpy_dtype(v.dtype)) for v in outputs]
        slots = tuple(slot for slot, _, _ in updates)
        return StorageProgram(key, text, what, len(results), slots, messages, types, self.group, len(self.ctx.keep), spans)

    def has_param(self, slot: int) -> bool:
        return slot in self._param_of


def pack_flags(b: Any, flags: list[Value]) -> tuple[Value, tuple[tuple[int, int], ...]]:
    """Check flags (a bool, or an int64 vector ``[failed, values...]``) as one int64 vector,
    and where each one lies in it."""
    parts, spans, start = [], [], 0
    for flag in flags:
        n = math.prod(flag.shape)
        parts.append(b.reshape(b.convert(flag, torch.int64), (n,)))
        spans.append((start, start + n))
        start += n
    return b.concatenate(parts, 0), tuple(spans)


class Blame(NamedTuple):
    """Whom a failed device-side check is reported against."""

    op: str
    where: checks.SourceLine | str  # the user's source line, or "" for the caller's current line


def execute(program: StorageProgram, inputs: list[Any], blame: str | Sequence[Blame]) -> list[Any]:
    """Run ``program`` on ``inputs`` asynchronously; its results without the check flags,
    which are kept to be read at the user's next wait (``checks``), blamed on ``blame``:
    an op name for every check, or one :class:`Blame` per check."""
    t0 = perf_counter()
    if program.group is None:
        outs, done = pjrt.get().execute(program.executable(), inputs, program.handlers())
        metrics.executed(perf_counter() - t0)
    else:  # counts its execution itself; its results are ready when this returns
        outs, done = rdist.run_for_group(program.executable(), inputs, blame if isinstance(blame, str) else program.what), None
        metrics.add("execute_seconds", perf_counter() - t0)
    if program.n_kept:
        outs = outs[: -program.n_kept]
    messages = program.check_messages
    if messages:
        spans = program.check_spans
        n = 1 if spans else len(messages)
        bufs, outs = outs[-n:], outs[:-n]
        flags = [checks.Flag(bufs[0], span) for span in spans] if spans else [checks.Flag(buf) for buf in bufs]
        if isinstance(blame, str):
            checks.add(flags, blame, messages, checks.user_source_line(skip=1))
        else:
            for flag, message, who in zip(flags, messages, blame):
                checks.add([flag], who.op, [message], who.where or checks.user_source_line(skip=1))
    track(outs, done)
    return outs


def write_back(program: StorageProgram, cells: Sequence[Any], outs: list[Any]) -> list[Any]:
    """Swap each rewritten storage's new buffer into its cell; the new results."""
    n = program.n_results
    if native_write_back is not None:
        native_write_back(program.updates, cells, outs, n)
    else:
        for slot, buf in zip(program.updates, outs[n:]):
            cells[slot].set(buf)
    return outs[:n]


_CLAIMS = BoundedCache("buffer claims")


def claim(cell: Any) -> bool:
    """Make ``cell``'s buffer its own, to be written in place outside XLA: when nothing
    but the cell holds its buffer, give it to an identity program that donates it. XLA
    starts that program only once every program already reading the old buffer is done,
    and its result -- the same memory, or a private copy when a host view still holds
    the old one -- is the cell's new buffer, which no program reads yet. False (nothing
    changed) when another holder (a storage or a pending graph sharing the buffer) exists."""
    buf = cell._buf
    # references: the cell's, ``buf`` and getrefcount's argument (as dispatch._donatable)
    if buf is None or cell.lazy is not None or sys.getrefcount(buf) != 3:
        return False
    key = (cell.shape, cell.numel, cell.dtype)
    prog = _CLAIMS.get(key)
    if prog is None:
        pb = ProgramBuilder()
        value = pb.storage(0, cell.shape, cell.numel, cell.dtype, True)
        prog = _CLAIMS[key] = pb.finish([], [(0, value, cell.shape)], "claim", donate=[0])
    del buf
    write_back(prog, [cell], execute(prog, [cell._buf], "claim"))
    return True


# --------------------------------------------------------------------------
# device scalars: Python numbers as program operands
# --------------------------------------------------------------------------
_scalars = BoundedCache("device scalars")


def device_scalar(value: Any, pytype: type, dtype: Any = None) -> Any:
    """A device buffer holding ``value`` (float64/complex128/int64 where the platform has
    them, or ``dtype``), shared by every program that takes the same number."""
    key = (pytype, value, dtype)
    if value == 0 and pytype is float and math.copysign(1.0, value) < 0:
        key = (pytype, "-0.0", dtype)  # -0.0 == 0.0 as a key, but not as a value
    buf = _scalars.get(key)
    if buf is None:
        buf = _scalars[key] = pjrt.get().put(np.asarray(value, dtype or numpy_dtype(scalar_dtype(pytype))))
    return buf


def scalar_dtype(pytype: type) -> torch.dtype:
    """The dtype a Python number is passed to programs in: 64-bit where the platform has it."""
    f64 = pjrt.get().supports_f64
    if pytype is float:
        return torch.float64 if f64 else torch.float32
    if pytype is complex:
        return torch.complex128 if f64 else torch.complex64
    return torch.int64


# --------------------------------------------------------------------------
# what torch.tpu.synchronize() waits for
# --------------------------------------------------------------------------
# One entry per execution: weak references to its results (a strong one would make every
# recent result look shared to the donation checks of eager/dispatch.py and
# eager/deferred.py, which count a buffer's references) and its runtime token, which waits
# for it without holding a result: a program whose outputs were all dropped at once
# (``model(x)`` in a timing loop) still has to finish before synchronize() returns.
class _Pending(NamedTuple):
    results: tuple[weakref.ref, ...]
    done: Any  # pjrt.Launched.done; None for an execution already finished when tracked


_pending: list[_Pending] = []
_TRIM_AT = 256
_trim_at = _TRIM_AT
# At most this many executions unaccounted for: past it the host waits for the oldest
# half, as a CUDA launch queue blocks when full (a loop whose results are all dropped at
# once, never synchronized, would otherwise grow the list without end).
_MAX_PENDING = 4096


def track(outs: list[Any], done: Any) -> None:
    """Remember an execution so that ``synchronize()`` can wait for it."""
    global _trim_at
    if done is None:
        return
    _pending.append(_Pending._make((tuple(map(weakref.ref, outs)), done)))  # _make: no Python-level __new__
    if len(_pending) > _trim_at:  # forget finished executions; amortized O(1) per call
        _pending[:] = _unfinished(_pending)
        _trim_at = max(_TRIM_AT, 2 * len(_pending))


def _unfinished(entries: list[_Pending]) -> list[_Pending]:
    """The entries not known to have finished. An execution has when one of its results
    is ready (they become ready together); one whose results are gone has when a later
    one has (the device runs its programs in order: waiting for its token is then
    immediate), else it stays."""
    ready = [_ready(e) for e in entries]
    last = max((i for i, r in enumerate(ready) if r), default=-1)
    out, done = [], []
    for i, (entry, r) in enumerate(zip(entries, ready)):
        if r:
            continue
        if i < last and _live(entry.results) is None:
            done.append(entry.done)
            continue
        out.append(entry)
    if len(out) > _MAX_PENDING:
        oldest, out = out[: len(out) - _MAX_PENDING // 2], out[len(out) - _MAX_PENDING // 2 :]
        done.extend(e.done for e in oldest)
    if done:
        pjrt.get().wait(done)
    return out


def _ready(entry: _Pending) -> bool:
    buf = _live(entry.results)
    return buf is not None and pjrt.Runtime.is_ready(buf)


def _live(refs: tuple[weakref.ref, ...]) -> Any:
    """A result of one execution that is still alive and not donated, or None."""
    for ref in refs:
        buf = ref()
        if buf is not None and not buf.is_deleted():
            return buf
    return None


def mark() -> list[_Pending]:
    """The executions enqueued so far and not yet waited for: an event's mark
    (``finished`` says whether one has run without waiting; ``pjrt.Runtime.wait`` on their
    ``done`` waits for all of them, those whose results are gone included)."""
    return list(_pending)


def finished(entry: _Pending) -> bool:
    """Whether ``entry`` has run, as far as can be told without waiting: its live result is
    ready, or it has none left (donated to a later execution, or dropped)."""
    buf = _live(entry.results)
    return buf is None or pjrt.Runtime.is_ready(buf)


def take_pending() -> list[Any]:
    """What waits for every execution not yet waited for (``pjrt.Runtime.wait``), and
    forget them."""
    done = [e.done for e in _pending]
    _pending.clear()
    return done
