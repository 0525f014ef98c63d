"""Why a run compiled what it compiled, where the host waited, and what ran on the CPU.

Record a region, then ask::

    with torchtpu.debug.explaining():
        for batch in loader:
            train_step(batch)
    torchtpu.debug.explain()          # prints the report and returns it (a Report)

or record a whole run with ``TORCHTPU_EXPLAIN=1`` (the report prints to stderr at exit).
``explain()`` reports the recording under way, else the last one. ``explaining()`` inside
a recording (e.g. under the env var) adds to it; otherwise it starts a fresh one and stops
it at the end. ``start()`` / ``stop()`` do the same by hand.

The report lists

- every new program, grouped by cause: *new op* (first use of an op, the first fused
  graph, the first program of a torch.compile graph), *new shape*, *new dtype*, *new
  strides/layout*, *new static argument* (a Python value baked into the program), *new
  graph structure* (DeferAndFuse: another op sequence, length or wiring), *guard failure*
  (torch.compile: Dynamo traced the function again; its reason). A program's cause comes
  from comparing its cache key with the closest earlier key of the same op (eager), the
  first node where the fused graph differs from the closest earlier graph (DeferAndFuse),
  or the earlier keys of the same compiled graph and Dynamo's recompile reason
  (``torch._dynamo.utils.get_compilation_metrics``) (torch.compile). Each says which cache
  tier served it: compiled by XLA, loaded from the disk cache, or already built in memory;
- every host sync (``.item()``, ``.cpu()``/print, a data-dependent op) with the source line
  that caused it;
- every CPU fallback (``TORCHTPU_CPU_FALLBACK=1``);

with a line of advice per group. When nothing records, each of these events costs one
``is None`` test (``torchtpu._spans.explain``).
"""

from __future__ import annotations

import os
import sys
import threading
import types
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from .. import _spans, config, op_report

NEW_OP = "new op"
NEW_SHAPE = "new shape"
NEW_DTYPE = "new dtype"
NEW_LAYOUT = "new strides/layout"
NEW_STATIC = "new static argument"
NEW_STRUCTURE = "new graph structure"
GUARD_FAILURE = "guard failure"
EVICTED = "evicted and rebuilt"
PRINT = "print / str(tensor)"  # the host syncs of formatting a tensor, counted as one cause
_TENSOR_STR = os.path.join("torch", "_tensor_str.py")
CAUSES = (GUARD_FAILURE, NEW_SHAPE, NEW_DTYPE, NEW_LAYOUT, NEW_STATIC, NEW_STRUCTURE, EVICTED, NEW_OP)
_RANK = {c: i for i, c in enumerate((NEW_DTYPE, NEW_SHAPE, NEW_LAYOUT, NEW_STATIC, NEW_STRUCTURE))}
_SIZE_ARGS = {"size", "sizes", "shape"}  # static arguments that are shapes (factories, view, expand)

ADVICE = {
    NEW_OP: "expected once per op or graph (warm-up); a later run loads them from the disk cache (TORCHTPU_CACHE_DIR).",
    NEW_SHAPE: "sizes change between calls: pad or bucket them to a few fixed sizes (e.g. sequence lengths to a "
    "multiple of 64, DataLoader(drop_last=True)); under torch.compile mark the dimension dynamic "
    "(torchtpu.mark_dynamic(t, dim, max_size) or torch._dynamo.mark_dynamic).",
    NEW_DTYPE: "the same op sees different dtypes: cast inputs once, before the loop (e.g. .float()), and keep "
    "autocast regions the same from step to step.",
    NEW_LAYOUT: "the same op sees differently laid-out inputs (transposed, sliced, channels-last, views of "
    "larger storages): call .contiguous() (or one memory_format) on them before the loop.",
    NEW_STATIC: "a Python value baked into the program changed (a dim, a size list, a flag, a number used as a "
    "shape): keep it fixed, or pass a changing number as a tensor.",
    NEW_STRUCTURE: "the pending graph ends at different points: a sync in the middle of a step (.item(), print, "
    "a data-dependent op) or a changing op sequence splits it; sync once per step (torch.tpu.synchronize()).",
    GUARD_FAILURE: "Dynamo traced the function again because a guard failed (reason shown): make changing sizes "
    "dynamic (torch._dynamo.mark_dynamic / torchtpu.mark_dynamic) and keep Python values the guards read fixed.",
    EVICTED: "more live programs than TORCHTPU_MAX_EXECUTABLES: raise it, or reduce the number of shapes.",
}
SYNC_ADVICE = (
    "each sync waits for the device and stops DeferAndFuse graphs: keep values on the device in the loop "
    "(accumulate the loss as a tensor, log every N steps), and replace data-dependent ops (nonzero, boolean-mask "
    "indexing, unique) with static-shape ones (torch.where, masked arithmetic)."
)
FALLBACK_ADVICE = (
    "these ops have no tpu lowering and ran on the host with copies both ways: avoid them in the hot loop, or "
    "report them (python -m torchtpu.check_model lists every missing op)."
)


@dataclass
class ProgramEntry:
    mode: str  # "eager", "defer_and_fuse", "compiled", or "internal" (a runtime helper program)
    name: str  # the op, fused graph or compiled graph
    cause: str
    detail: str
    tier: str  # "compiled" (by XLA), "disk" (loaded from the disk cache), "memory" (already built)
    where: str  # the source line that led to it
    compile_id: str | None = None  # torch.compile: Dynamo's frame compile id
    first_of_graph: bool = False  # torch.compile: its graph's first program (the cause is Dynamo's)


@dataclass
class SyncEntry:
    cause: str  # ".item()", ".cpu() / print", "aten::nonzero (data-dependent shape)", ...
    where: str
    calls: int = 0


@dataclass
class FallbackEntry:
    op: str
    where: str
    calls: int = 0


class Recorder:
    """Receives the events (through ``torchtpu._spans.explain``) while a recording runs.

    The executable cache reports each program it hands out (``served``: what and from which
    tier); the path that asked for it then says why (``eager_program``, ``graph_program``,
    ``compiled_program``), which fills in the entry just served. Helper programs nobody
    explains (``run_utility``) stay "internal"."""

    def __init__(self) -> None:
        self.programs: list[ProgramEntry] = []
        self.syncs: dict[tuple[str, str], SyncEntry] = {}
        self.fallbacks: dict[tuple[str, str], FallbackEntry] = {}
        self._quiet = 0
        self._lock = threading.RLock()

    # -- programs ------------------------------------------------------------------------
    def served(self, what: str, tier: str) -> None:
        cause = EVICTED if "evicted from the executable cache" in what else NEW_OP
        with self._lock:
            self.programs.append(ProgramEntry("internal", what, cause, "", tier, _where(), None))

    def _claim(self, mode: str, name: str, cause: str, detail: str, compile_id: str | None = None) -> ProgramEntry:
        with self._lock:
            entry = self.programs[-1] if self.programs else None
            if entry is None or entry.mode != "internal":  # nothing served it (should not happen): record anyway
                entry = ProgramEntry(mode, name, cause, detail, "compiled", _where())
                self.programs.append(entry)
            entry.mode, entry.name, entry.cause, entry.detail, entry.compile_id = mode, name, cause, detail, compile_id
            return entry

    def eager_program(self, plan: Any, key: tuple, cache: dict) -> None:
        """A new eager program for ``key``; ``cache`` holds the keys built before."""
        op = key[0]
        earlier = [k for k in cache if k[0] is op]
        if not earlier:
            self._claim("eager", plan.name, NEW_OP, f"first call of {plan.name}")
            return
        cause, detail = _closest(key, earlier, lambda old: _eager_diffs(plan, old, key))
        self._claim("eager", plan.name, cause, detail)

    def graph_program(self, nodes: list, gkey: tuple, graphs: list[tuple]) -> None:
        """A new DeferAndFuse program for the graph ``nodes`` keyed ``gkey`` (each node by its
        full op key); ``graphs``: the keys of the graphs built before, alike."""
        name = f"fused graph of {len(nodes)} ops"
        cause, detail = _graph_cause(nodes, gkey, list(graphs))
        self._claim("defer_and_fuse", name, cause, detail)

    def compiled_program(self, graph: Any, key: tuple) -> None:
        """A new program for torch.compile graph ``graph`` (a fx_lowering.CompiledGraph)."""
        if not graph.programs:  # its first: the cause is Dynamo's (resolved in the report)
            entry = self._claim("compiled", graph.name, NEW_OP, f"first program of compiled graph {graph.name}", graph.compile_id)
            entry.first_of_graph = True
            return
        cause, detail = _closest(key, list(graph.programs), lambda old: _compiled_diffs(old, key))
        self._claim("compiled", graph.name, cause, detail, graph.compile_id)

    # -- syncs and fallbacks ---------------------------------------------------------------
    def host_sync(self, cause: str) -> None:
        if self._quiet:
            return
        if _printing():  # printing a tensor reads it several times (.item(), masked_select): one cause
            cause = PRINT
        where = _where()
        with self._lock:
            entry = self.syncs.setdefault((cause, where), SyncEntry(cause, where))
            entry.calls += 1

    def cpu_fallback(self, op: str) -> None:
        where = _where()
        with self._lock:
            entry = self.fallbacks.setdefault((op, where), FallbackEntry(op, where))
            entry.calls += 1

    @contextmanager
    def quiet(self) -> Iterator[None]:
        """Inside, host syncs are not recorded (a CPU fallback's copies are part of it)."""
        self._quiet += 1
        try:
            yield
        finally:
            self._quiet -= 1

    def report(self) -> Report:
        with self._lock:
            programs = [ProgramEntry(**vars(p)) for p in self.programs]
            syncs, fallbacks = list(self.syncs.values()), list(self.fallbacks.values())
        _resolve_dynamo(programs)
        return Report(programs, syncs, fallbacks)


def _printing() -> bool:
    """Whether torch is formatting a tensor (print, str, repr, f-strings) up the stack."""
    f = sys._getframe(2)
    while f is not None:
        if f.f_code.co_filename.endswith(_TENSOR_STR):
            return True
        f = f.f_back
    return False


def _where() -> str:
    where, user_where = op_report.source_lines()
    return f"{user_where} (via {where})" if user_where else where


# -- comparing keys ----------------------------------------------------------------------------
def _closest(key: tuple, earlier: list[tuple], diffs_of: Any) -> tuple[str, str]:
    """(cause, detail) against the earlier key that differs from ``key`` in the fewest places."""
    best = min(reversed(earlier), key=lambda old: _distance(old, key))
    return _summarize(diffs_of(best))


def _distance(a: Any, b: Any) -> int:
    if not (isinstance(a, tuple) and isinstance(b, tuple)):
        return int(a != b)
    return sum(x != y for x, y in zip(a, b)) + abs(len(a) - len(b))


def _summarize(diffs: list[tuple[str, str]]) -> tuple[str, str]:
    if not diffs:
        return NEW_STATIC, "a key field outside the arguments changed"
    cause = min((c for c, _ in diffs), key=lambda c: _RANK.get(c, len(_RANK)))
    return cause, "; ".join(d for _, d in diffs)


def _is_tensor_entry(v: Any) -> bool:
    return isinstance(v, tuple) and len(v) in (5, 7) and isinstance(v[1], torch.dtype)


def _dtype(d: torch.dtype) -> str:
    return str(d).removeprefix("torch.")


def _tensor_diffs(label: str, a: tuple, b: tuple) -> list[tuple[str, str]]:
    """Eager entries are (slot, dtype, shape, strides, offset, conj, neg); compiled ones
    (slot, dtype, shape, stride, offset)."""
    from ..lowering.strided import contiguous_strides

    out = []
    if a[1] != b[1]:
        out.append((NEW_DTYPE, f"{label}: dtype {_dtype(a[1])} -> {_dtype(b[1])}"))
    if a[2] != b[2]:
        out.append((NEW_SHAPE, f"{label}: shape {tuple(a[2])} -> {tuple(b[2])}"))
    dense = [tuple(e[3]) == contiguous_strides(e[2]) for e in (a, b)]
    if a[3] != b[3] and (a[2] == b[2] or dense[0] != dense[1]):  # not just the new shape's own strides
        out.append((NEW_LAYOUT, f"{label}: strides {tuple(a[3])} -> {tuple(b[3])}"))
    if a[4:] != b[4:]:
        out.append((NEW_LAYOUT, f"{label}: storage offset or conj/neg bit {a[4:]} -> {b[4:]}"))
    if a[0] != b[0] and not out:
        out.append((NEW_LAYOUT, f"{label}: shares a storage with another argument differently"))
    return out


def _static(v: Any) -> Any:
    """A frozen static argument as the user wrote it ((int, 3) -> 3)."""
    if isinstance(v, tuple) and len(v) == 2 and isinstance(v[0], type):
        return v[1]
    if isinstance(v, tuple):
        return tuple(_static(x) for x in v)
    return v


def _shown(v: Any) -> str:
    return "a tensor" if _is_tensor_entry(v) else repr(_static(v))


def _value_diffs(label: str, a: Any, b: Any) -> list[tuple[str, str]]:
    if a == b:
        return []
    if _is_tensor_entry(a) and _is_tensor_entry(b):
        return _tensor_diffs(label, a, b)
    if isinstance(a, tuple) and isinstance(b, tuple) and a and b and all(map(_is_tensor_entry, a + b)):
        if len(a) != len(b):
            return [(NEW_STATIC, f"{label}: {len(a)} -> {len(b)} tensors")]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _value_diffs(f"{label}[{i}]", x, y)]
    if _is_tensor_entry(a) or _is_tensor_entry(b):  # None (or a number) where a tensor was
        return [(NEW_STATIC, f"{label}: {_shown(a)} -> {_shown(b)}")]
    cause = NEW_SHAPE if label in _SIZE_ARGS else NEW_DTYPE if label == "dtype" else NEW_STATIC
    return [(cause, f"{label}: {_static(a)!r} -> {_static(b)!r}")]


def _eager_diffs(plan: Any, old: tuple, new: tuple) -> list[tuple[str, str]]:
    """An eager key is (op, one entry per argument, one (shape, dtype, initialized) per
    storage, matmul precision[, "rng"]) (eager/dispatch.py ``_collect``)."""
    n = len(plan.names)
    out = [d for i in range(n) for d in _value_diffs(plan.names[i], old[1 + i], new[1 + i])]
    old_tail, new_tail = _strip_rng(old)[1 + n :], _strip_rng(new)[1 + n :]
    if old_tail[-1:] != new_tail[-1:]:
        out.append((NEW_STATIC, f"matmul precision {old_tail[-1]} -> {new_tail[-1]}"))
    if not out and old_tail[:-1] != new_tail[:-1]:
        out.append((NEW_LAYOUT, "the arguments view storages of other sizes or dtypes"))
    return out


def _strip_rng(key: tuple) -> tuple:
    from ..eager import rng

    return key[:-1] if key and key[-1] == rng.STATE_KEY else key


def _compiled_diffs(old: tuple, new: tuple) -> list[tuple[str, str]]:
    """A compiled-graph key is (one entry per argument, storages, matmul precision)
    (compile/fx_lowering.py ``_collect``): ("i", n) entries are sizes of dynamic dims."""
    out: list[tuple[str, str]] = []
    for i, (a, b) in enumerate(zip(old[:-2], new[:-2])):
        if a != b and isinstance(a, tuple) and a[:1] == ("i",) and b[:1] == ("i",):
            out.append((NEW_SHAPE, f"input {i} (a dynamic size): {a[1]} -> {b[1]}"))
        else:
            out.extend(_value_diffs(f"input {i}", a, b))
    if len(old) != len(new):
        out.append((NEW_STATIC, f"{len(old) - 2} -> {len(new) - 2} inputs"))
    if old[-1] != new[-1]:
        out.append((NEW_STATIC, f"matmul precision {old[-1]} -> {new[-1]}"))
    if not out and old[-2] != new[-2]:
        out.append((NEW_LAYOUT, "the inputs view storages of other sizes or dtypes"))
    return out


def _node_name(node: Any) -> str:
    return node.name


def _graph_cause(nodes: list, gkey: tuple, earlier: list[tuple]) -> tuple[str, str]:
    """A graph key is (per node (eager key, graph slots), input storage kinds, live outputs,
    donated inputs) (eager/deferred.py ``_run``): find the closest earlier graph (longest
    common prefix of nodes) and the first node where they differ."""
    keys = gkey[0]
    if not earlier:
        return NEW_OP, f"first fused graph ({len(nodes)} ops, from {_node_name(nodes[0])})"
    best = max(reversed(earlier), key=lambda old: _common_prefix(old[0], keys))
    i, old = _common_prefix(best[0], keys), best[0]
    if i < len(keys) and i < len(old):
        return _node_cause(i, nodes[i], old[i], keys[i], earlier)
    if len(keys) != len(old):
        return NEW_STRUCTURE, f"{len(old)} -> {len(keys)} ops, the same up to node {i - 1}: the graph ran at another point"
    return _graph_io_cause(best, gkey)


def _common_prefix(a: tuple, b: tuple) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _node_cause(i: int, node: Any, old: tuple, new: tuple, earlier: list[tuple]) -> tuple[str, str]:
    (old_key, old_slots), (new_key, new_slots) = old, new
    where = f"node {i} ({_node_name(node)})"
    if old_key[0] != new_key[0]:
        seen = any(k[0][0] == new_key[0] for g in earlier for k in g[0])
        if not seen:
            return NEW_OP, f"{where}: first fused use of the op"
        return NEW_STRUCTURE, f"{where}: another op sequence (the closest earlier graph has another op here)"
    if old_key != new_key:
        if node.plan is None:  # a flat append, a collective or a compiled graph
            return NEW_SHAPE, f"{where}: its storages' sizes or its inputs' geometry changed"
        cause, detail = _summarize(_eager_diffs(node.plan, old_key, new_key))
        return cause, f"{where}: {detail}"
    return NEW_STRUCTURE, f"{where}: reads or writes other storages of the graph (slots {old_slots} -> {new_slots})"


def _graph_io_cause(old: tuple, new: tuple) -> tuple[str, str]:
    if old[1] != new[1]:
        kinds = [(a, b) for a, b in zip(old[1], new[1]) if a != b]
        (a, b) = kinds[0] if kinds else (len(old[1]), len(new[1]))
        return NEW_LAYOUT, f"same ops, other input storages ({a} -> {b})"
    if old[2] != new[2]:
        return NEW_STRUCTURE, "same ops, other results still alive afterwards (a tensor kept or dropped)"
    return NEW_STRUCTURE, "same ops, other inputs donated (another holder of an overwritten buffer)"


# -- torch.compile: Dynamo's reasons -------------------------------------------------------------
def _dynamo_metrics() -> list[Any]:
    if "torch._dynamo" not in sys.modules:
        return []
    from torch._dynamo.utils import get_compilation_metrics

    return get_compilation_metrics()


def _resolve_dynamo(programs: list[ProgramEntry]) -> None:
    """The first program of each compiled graph: a guard failure (with Dynamo's reason)
    when its frame was compiled again, a new op otherwise."""
    frames = {m.compile_id: m for m in _dynamo_metrics() if m.compile_id}
    for p in programs:
        if not p.first_of_graph or p.compile_id is None:
            continue
        m = frames.get(p.compile_id)
        fn = f" of {m.co_name} ({m.co_filename}:{m.co_firstlineno})" if m is not None else ""
        reason = m.recompile_reason if m is not None else None
        if reason or (m is None and not p.compile_id.endswith("/0")):
            p.cause = GUARD_FAILURE
            p.detail = f"Dynamo compiled frame {p.compile_id}{fn} again: {reason or 'reason no longer recorded'}"
        else:
            p.detail = f"{p.detail}, frame {p.compile_id}{fn}"


# -- the report ------------------------------------------------------------------------------------
@dataclass
class Report:
    programs: list[ProgramEntry] = field(default_factory=list)
    syncs: list[SyncEntry] = field(default_factory=list)
    fallbacks: list[FallbackEntry] = field(default_factory=list)
    recording: bool = True  # False: nothing was ever recorded

    def by_cause(self) -> dict[str, list[ProgramEntry]]:
        """New programs grouped by cause, in the report's order (what to fix first)."""
        groups: dict[str, list[ProgramEntry]] = {}
        for cause in CAUSES:
            group = [p for p in self.programs if p.cause == cause]
            if group:
                groups[cause] = group
        return groups

    @property
    def host_syncs(self) -> int:
        return sum(s.calls for s in self.syncs)

    @property
    def cpu_fallbacks(self) -> int:
        return sum(f.calls for f in self.fallbacks)

    def __str__(self) -> str:
        return format_report(self)


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


def _tiers(programs: list[ProgramEntry]) -> str:
    n = {t: sum(1 for p in programs if p.tier == t) for t in ("compiled", "disk", "memory")}
    return f"{n['compiled']} compiled by XLA, {n['disk']} loaded from the disk cache, {n['memory']} already built"


def _program_rows(group: list[ProgramEntry]) -> list[str]:
    """One row per (mode, name, source line): how many, and the first one's detail."""
    rows: dict[tuple[str, str, str], list[ProgramEntry]] = {}
    for p in group:
        rows.setdefault((p.mode, p.name, p.where), []).append(p)
    lines = []
    for (mode, name, where), ps in rows.items():
        count = f" x{len(ps)}" if len(ps) > 1 else ""
        more = f" (and {len(ps) - 1} more)" if len(ps) > 1 and any(p.detail != ps[0].detail for p in ps[1:]) else ""
        lines.append(f"    [{mode}] {name}{count}: {ps[0].detail}{more}")
        lines.append(f"        at {where}")
    return lines


def format_report(r: Report) -> str:
    if not r.recording:
        return "torchtpu explain: nothing recorded; run the code under torchtpu.debug.explaining() or with TORCHTPU_EXPLAIN=1"
    lines = [
        f"torchtpu explain: {_n(len(r.programs), 'new program')} ({_tiers(r.programs)}), "
        f"{_n(r.host_syncs, 'host sync')}, {_n(r.cpu_fallbacks, 'CPU fallback')}"
    ]
    for cause, group in r.by_cause().items():
        lines.append(f"  {cause}: {_n(len(group), 'program')} ({_tiers(group)})")
        lines.extend(_program_rows(group))
        lines.append(f"    advice: {ADVICE[cause]}")
    if r.syncs:
        lines.append(f"  host syncs: {r.host_syncs}")
        for s in sorted(r.syncs, key=lambda s: -s.calls):
            lines.append(f"    {s.cause} x{s.calls} at {s.where}")
        lines.append(f"    advice: {SYNC_ADVICE}")
    if r.fallbacks:
        lines.append(f"  CPU fallbacks: {r.cpu_fallbacks}")
        for f in sorted(r.fallbacks, key=lambda f: -f.calls):
            lines.append(f"    {f.op} x{f.calls} at {f.where}")
        lines.append(f"    advice: {FALLBACK_ADVICE}")
    return "\n".join(lines)


# -- recording ------------------------------------------------------------------------------------
_last: Recorder | None = None  # the latest recording (running or stopped)


def start() -> None:
    """Start a fresh recording (dropping the previous one)."""
    global _last
    _last = Recorder()
    _spans.explain = _last


def stop() -> Report:
    """Stop recording; returns the report (``explain()`` prints it later too)."""
    _spans.explain = None
    return _last.report() if _last is not None else Report(recording=False)


def recording() -> bool:
    return _spans.explain is not None


@contextmanager
def explaining() -> Iterator[None]:
    """Record the block (into the recording under way, if any); ``explain()`` reports it."""
    if recording():
        yield
        return
    start()
    try:
        yield
    finally:
        stop()


def explain(file: Any = None) -> Report:
    """The report of the recording under way (else the last one), printed to ``file``
    (default stdout) and returned (``str(report)`` is the text)."""
    report = _last.report() if _last is not None else Report(recording=False)
    print(format_report(report), file=file or sys.stdout)
    return report


def enable_from_env() -> None:
    """TORCHTPU_EXPLAIN=1: record the whole run and print the report to stderr at exit."""
    if recording() or not config.flag("TORCHTPU_EXPLAIN"):
        return
    import atexit

    start()
    atexit.register(lambda: explain(sys.stderr))


# ``torchtpu.debug.explain`` names both this module and its function, and which one the
# package attribute holds depends on import order (importing the submodule sets it to the
# module). Both answer the same calls: ``explain()``, ``explain.explaining()``,
# ``explain.start()``, ``explain.stop()``.
explain.start = start  # type: ignore[attr-defined]
explain.stop = stop  # type: ignore[attr-defined]
explain.explaining = explaining  # type: ignore[attr-defined]
explain.recording = recording  # type: ignore[attr-defined]


class _CallableModule(types.ModuleType):
    def __call__(self, file: Any = None) -> Report:
        return explain(file)


sys.modules[__name__].__class__ = _CallableModule
