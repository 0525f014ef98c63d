"""Eager execution: one cached single-op program per (op, geometry, dtypes, static args).

The dispatcher calls ``run`` for every op on tpu tensors. The hot path builds a cache
key from what the program depends on (never the values of Python numbers other than
0/1/-1, which are passed as device operands), finds the compiled program, enqueues it
asynchronously and wraps the outputs. On a miss, ``_build`` writes the program through
``oplower.lower_op`` (shared with DeferAndFuse): materialise the input views from their
storages, lower the op's functional form, write in-place results back.

Under DeferAndFuse (``modes.DEFER``) ``run`` records the call instead (``deferred.py``);
under ``launch_blocking`` it waits for every program and raises at the failing call.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils._pytree import tree_flatten

from .. import _spans, config, metrics, op_report
from ..errors import TpuError, TpuRuntimeError
from ..lowering import registry
from ..lowering.strided import buffer_shape, storage_result
from ..runner import checks
from ..runner.bounded import BoundedCache
from ..runner.precision import current as current_precision
from ..runner.program import OutputSpec, ProgramBuilder, StorageProgram, device_scalar, execute, take_pending, write_back
from ..runtime import memory, pjrt
from ..stablehlo.types import numpy_dtype
from ..tensor import storage
from ..tensor.storage import Cell, cell_of, collect_call, configure_collect, donatable, eager_keys, input_buffers, new_tensor
from . import buckets, deferred, growth, modes, rng, scalar_range, validate
from .oplower import RUNTIME_OFFSET, lifted, lower_single, scalar_list_dtype
from .plan import (
    KIND_SCALAR,
    KIND_SCALAR_LIST,
    KIND_TENSOR,
    KIND_TENSOR_LIST,
    OpPlan,
    plan_for,
)


class Program:
    """An op's storage program and how to wrap its new results as tensors."""

    __slots__ = ("storage", "outputs", "rebuild", "shapes")

    def __init__(
        self,
        storage: StorageProgram,
        outputs: list[OutputSpec | None],
        rebuild: Callable[[list], Any] | None,
        shapes: list[tuple[int, ...] | None],
    ):
        self.storage = storage
        self.outputs = outputs  # per new output; None for an absent one
        self.rebuild = rebuild  # the op's new (non-mutated) outputs, flat, as its plain returns; None: a flat list
        self.shapes = shapes  # per new output, its storage buffer's shape (result_buffer_shape); None for an absent one


_CACHE = BoundedCache("eager op programs")


def cache_size() -> int:
    return len(_CACHE)


def clear_cache() -> None:
    _CACHE.clear()


# static arguments that key a program as they are (hashable, never a tensor or generator):
# returned before ``isinstance(v, torch.Generator)``, a Python-level __instancecheck__ that
# took 7 us for ``ones_like``'s memory_format inside a training step
_KEYED_AS_THEMSELVES = frozenset({torch.dtype, torch.memory_format, torch.layout, torch.device, str, type(None)})


def _freeze(v: Any) -> Any:
    tp = type(v)
    if tp is int or tp is bool:  # the common case first (isinstance of torch.Generator is a Python check)
        return (tp, v)
    if tp in _KEYED_AS_THEMSELVES:
        return v
    if isinstance(v, list):
        return tuple(_freeze(x) for x in v)
    if isinstance(v, torch.Tensor):
        raise TypeError("unexpected tensor in a static argument")
    if isinstance(v, torch.Generator):  # its state is the op's RNG operand, not part of the program
        return "generator"
    if isinstance(v, float):
        if v != v:
            return ("nan",)
        if v == 0.0 and math.copysign(1.0, v) < 0:  # -0.0 == 0.0: x * -0.0 would reuse x * 0.0's program
            return ("-0.0",)
    return (type(v), v) if isinstance(v, (bool, int, float)) else v


if configure_collect is not None:  # collect_call's Python helpers
    configure_collect(RUNTIME_OFFSET, device_scalar, _freeze)


def _to_device_scalar_tensor(t: torch.Tensor) -> torch.Tensor:
    if t.dim() == 0 and t.device.type == "cpu":
        return t.to(storage.DEVICE)
    raise RuntimeError(
        f"Expected all tensors to be on the same device, but found at least two devices, tpu:0 and {t.device}! "
        "Move the tensor with .to('tpu') first."
    )


class _Call:
    """The operands of one call, gathered while its cache key is built.

    A view's nonzero storage offset is a runtime operand (one more entry of ``scalars``, in
    argument order, where ``oplower.lower_op`` takes it) instead of part of the key, so one
    program serves ``ids[:, -1:]`` or ``cache[i]`` wherever the view starts."""

    __slots__ = ("key", "cells", "slot_of", "tensors", "scalars", "scalar_types", "padded")

    def __init__(self, padded: buckets.Padded | None = None) -> None:
        self.padded = padded  # the call runs padded to a bucket (buckets.py)
        self.key: list = []
        self.cells: list[Cell] = []
        self.slot_of: dict[int, int] = {}
        self.tensors: list[torch.Tensor] = []
        self.scalars: list[Any] = []
        self.scalar_types: list[type | str] = []

    def device_tensors(self, ts: Sequence[torch.Tensor | None]) -> tuple | None:
        """The key entries of ``ts`` (None stays None), ``tensor``'s in C++: None where it is
        not built, the call runs padded, or one of ``ts`` is not a tpu tensor (then nothing is
        recorded) or has no device buffer (which ``tensor`` raises for)."""
        if eager_keys is None or self.padded is not None:
            return None
        offsets: list[int] = []
        entries = eager_keys(ts, self.cells, self.slot_of, self.tensors, RUNTIME_OFFSET, offsets)
        if offsets and entries is not None:
            for offset in offsets:
                self.scalars.append(device_scalar(offset, int))
                self.scalar_types.append(RUNTIME_OFFSET)
        return entries

    def tensor(self, t: torch.Tensor) -> tuple:
        try:
            cell = t.untyped_storage()._cell  # cell_of, inlined: once per tensor argument
        except AttributeError:
            cell = cell_of(t)  # raises the explanation
        slot = self.slot_of.get(id(cell))
        if slot is None:
            slot = self.slot_of[id(cell)] = len(self.cells)
            self.cells.append(cell)
        self.tensors.append(t)
        shape, offset = tuple(t.shape), t.storage_offset()
        if self.padded is not None:
            shape = self.padded.padded_shape(t)
        if offset:
            self.scalars.append(device_scalar(offset, int))
            self.scalar_types.append(RUNTIME_OFFSET)
            offset = RUNTIME_OFFSET
        return (slot, t.dtype, shape, key_strides(shape, t.stride()), offset, t.is_conj(), t.is_neg())

    def scalar(self, v: Any, lift: bool) -> Any:
        tp = type(v)
        if lifted(v, lift):
            self.scalars.append(device_scalar(v, tp))
            self.scalar_types.append(tp)
            return ("s", tp)
        return _freeze(v)


def key_strides(shape: tuple[int, ...], strides: tuple[int, ...]) -> tuple[int, ...]:
    """A view's strides as a key: a size-1 dimension's stride never addresses anything, so
    it is replaced by the contiguous one (``ids[:, -1:]`` of a (1, n) tensor has strides
    (n, 1) and would otherwise be a new key for every n)."""
    if 1 not in shape:
        return strides
    out, acc = list(strides), 1
    for d in range(len(shape) - 1, -1, -1):
        if shape[d] == 1:
            out[d] = acc
        acc *= max(shape[d], 1)
    return tuple(out)


def _collect(plan: OpPlan, values: list[Any], padded: buckets.Padded | None = None) -> _Call:
    """The call's operands and cache key: in C++ (``collect_call``) where every argument
    is one it handles, else by the Python loop below, which gives the same key."""
    call = _Call(padded)
    key = call.key
    key.append(plan)  # the op, hashed by identity (OpOverload.__hash__ is Python)
    lift = plan.lift_scalars
    if collect_call is not None and padded is None:
        if collect_call(plan.kinds, values, lift, key, call.cells, call.slot_of, call.tensors, call.scalars, call.scalar_types):
            key.append(current_precision())
            return call
        call = _Call(padded)  # the C++ loop stopped part-way: start again in Python
        key = call.key
        key.append(plan)
    for i, (kind, v) in enumerate(zip(plan.kinds, values)):
        if kind == KIND_TENSOR:
            if v is None:
                key.append(None)
            elif isinstance(v, torch.Tensor):
                entries = call.device_tensors((v,))
                if entries is None:
                    if v.device.type != "tpu":  # a CPU 0-d tensor is moved (as CUDA does); others raise
                        v = values[i] = _to_device_scalar_tensor(v)
                    entries = (call.tensor(v),)
                key.append(entries[0])
            else:  # a Python number where the schema says Tensor (e.g. x.mul_(0.9))
                key.append(call.scalar(v, lift))
        elif kind == KIND_TENSOR_LIST:
            entries = call.device_tensors(v)
            if entries is None:  # CPU 0-d tensors are moved (as CUDA does); others raise
                if any(t is not None and t.device.type != "tpu" for t in v):
                    v = values[i] = [t if t is None or t.device.type == "tpu" else _to_device_scalar_tensor(t) for t in v]
                entries = tuple(None if t is None else call.tensor(t) for t in v)
            key.append(entries)
        elif kind == KIND_SCALAR:
            key.append(call.scalar(v, lift))
        elif kind == KIND_SCALAR_LIST and lift and v:
            types = tuple(map(type, v))
            arr = np.asarray(v, numpy_dtype(scalar_list_dtype(types)))
            call.scalars.append(pjrt.get().put(arr))
            call.scalar_types.append(types)
            key.append(("sl", types))
        else:
            if isinstance(v, torch.Tensor) or (isinstance(v, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in v)):
                raise TpuError(f"torchtpu: unexpected tensor argument to {plan.name}")
            key.append(_freeze(v))
    key.extend([(c.shape, c.dtype, c._buf is not None or c.lazy is not None) for c in call.cells])  # Cell.initialized, inlined
    key.append(current_precision())  # dot/conv precision_config is baked into the program
    if padded is not None:  # the true length is the last operand; the bucket is in the key
        call.scalars.append(device_scalar(padded.n, int))
        call.scalar_types.append(RUNTIME_OFFSET)
        key.append(padded.key)
    return call


# --------------------------------------------------------------------------
# the hot path
# --------------------------------------------------------------------------
def run(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Any:
    plan = plan_for(op)
    values = plan.bind(args, kwargs)
    mode = modes.current()
    if op is _CAT:
        append = growth.plan_append(values[0], values[1])
        if append is not None:
            if op_report.recorder is not None:
                _report(plan)
            if mode == modes.DEFER:
                return deferred.record_append(append, _int_operand)
            return growth.run_append(append, run_utility, _int_operand)
    if plan.out_positions:
        _resize_outs(plan, values)
    padded = buckets.plan_padded(plan, values) if buckets._CELLS or buckets._TWINS else None
    if padded is not None:
        values = padded.values  # uploaded ids read from their bucketed twins
    call = _collect(plan, values, padded)
    key = tuple(call.key)
    if plan.scalar_positions and scalar_range.suspect(plan, values):
        scalar_range.check(plan, values, args, kwargs, key)
    generator = None
    if plan.random:
        if plan.generator_position is not None:
            generator = rng.device_generator(values[plan.generator_position])
        key = key + (rng.STATE_KEY,)
    donate = _donatable(plan, values, call) if plan.mutable and mode != modes.DEFER else ()
    if donate:
        key = key + (("donate", donate),)
    if mode == modes.DEFER:
        try:
            out = deferred.record(plan, values, call, key, generator)
        except NotImplementedError:
            return _cpu_fallback_or_raise(op, args, kwargs)
        if op_report.recorder is not None:
            _report(plan)
        return out
    prog = _CACHE.get(key)
    if prog is None:
        try:
            validate.check(plan, values)  # the CPU's metadata checks, once per key
            prog = _build(plan, values, call, donate)
        except NotImplementedError:
            return _cpu_fallback_or_raise(op, args, kwargs)
        if _spans.explain is not None:  # why a new program: compare with this op's other keys
            _spans.explain.eager_program(plan, key, _CACHE)
        _CACHE[key] = prog
    else:
        metrics.add("cache_hits")
    if op_report.recorder is not None:
        _report(plan)
    inputs = [c.buf for c in call.cells if c.initialized] if input_buffers is None else input_buffers(call.cells)
    inputs.extend(call.scalars)
    if plan.random:
        inputs.append(rng.next_state_buffer(generator))
    if memory.cap is not None:  # torch.tpu.set_per_process_memory_fraction: refuse before running
        memory.ensure_room(memory.new_bytes(prog.outputs))
    outs = execute(prog.storage, inputs, plan.name)
    if mode == modes.BLOCKING:
        _wait_for_call(plan, outs)
    return wrap_outputs(plan, values, prog.outputs, prog.rebuild, write_back(prog.storage, call.cells, outs), padded, prog.shapes)


_CAT = torch.ops.aten.cat.default


def _int_operand(n: int) -> Any:
    return device_scalar(n, int)


def _report(plan: OpPlan) -> None:
    """Tell the op report whether this op ran through its own rule or a decomposition."""
    lowered = plan.functional in registry.RULES
    op_report.recorder.record(op_report.LOWERED if lowered else op_report.DECOMPOSED, plan.name)


def _cpu_fallback_or_raise(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Any:
    if not config.flag("TORCHTPU_CPU_FALLBACK"):
        if op_report.recorder is not None:
            op_report.recorder.record(op_report.MISSING, op.name(), "raised NotImplementedError")
        raise  # noqa: PLE0704 - re-raise the NotImplementedError being handled
    from .fallback import run_on_cpu

    return run_on_cpu(op, args, kwargs)


def wrap_outputs(
    plan: OpPlan,
    values: list[Any],
    specs: list,
    rebuild: Callable[[list], Any] | None,
    bufs: Any,
    padded: buckets.Padded | None,
    shapes: list[tuple[int, ...] | None],
) -> Any:
    """The op's return value: new tensors over ``bufs`` (one per non-None spec, each buffer
    of its entry in ``shapes``), rebuilt into its returns by ``rebuild`` (None: a flat
    list). ``padded``: ``specs`` are the bucket's; the results take the true length and
    bucketed storages."""
    if padded is not None:
        new = padded.new_results(specs, bufs)
    elif rebuild is None and None not in specs:
        new = [
            new_tensor(Cell(numel, dtype, buf, shape), sizes, strides, 0, dtype)
            for (sizes, strides, dtype, numel), buf, shape in zip(specs, bufs, shapes)
        ]
    else:
        it = iter(bufs)
        new = [
            None if spec is None else new_tensor(Cell(spec[3], spec[2], next(it), shape), spec[0], spec[1], 0, spec[2])
            for spec, shape in zip(specs, shapes)
        ]
    return plan.returns(values, new if rebuild is None else rebuild(new))


def _wait_for_call(plan: OpPlan, outs: list[Any]) -> None:
    """launch_blocking: finish this op now and blame it (and the user's line) on failure."""
    try:
        pjrt.get().block(outs)
    except TpuRuntimeError as e:
        raise TpuRuntimeError(f"torchtpu: {plan.name} failed (called at {checks.user_source_line()}): {e}") from e
    checks.raise_pending(blocking=True)


def synchronize() -> None:
    """Run pending deferred work, wait for every enqueued program, surface async errors."""
    if not pjrt.started():
        return
    deferred.flush("synchronize")
    pjrt.get().wait(take_pending())
    checks.raise_pending()


def _resize_outs(plan: OpPlan, values: list[Any]) -> None:
    """out= tensors take the result's shape (as on CPU) before the program is keyed."""
    metas = plan.functional_meta(values)
    flat_meta, _ = tree_flatten(metas[plan.n_plain :])
    outs = []
    for i in plan.out_positions:
        v = values[i]
        outs.extend(v if isinstance(v, (list, tuple)) else [v])
    for t, m in zip(outs, flat_meta):
        if isinstance(t, torch.Tensor) and isinstance(m, torch.Tensor) and t.shape != m.shape:
            validate.before_resize(plan, values)  # the CPU checks memory overlap on out as given
            t.resize_(m.shape)


# --------------------------------------------------------------------------
# building a program (cache miss)
# --------------------------------------------------------------------------
def _build(plan: OpPlan, values: list[Any], call: _Call, donate: tuple[int, ...] = ()) -> Program:
    pb, low = lower_single(plan, values, call)
    updates = [(slot, v, call.cells[slot].shape) for slot, v in low.updates.items()]
    what = f"{plan.name} {[tuple(t.shape) for t in call.tensors]}"
    donate = [s for s in donate if s in low.updates and pb.has_param(s)]
    padded = call.padded is not None  # a padded call's results are bucketed storages, read flat (buckets.Padded)
    shapes = [None if s is None else (s[3],) if padded else result_buffer_shape(s) for s in low.specs]
    results = [storage_result(pb.b, v, shape) for v, shape in zip(low.outputs, [x for x in shapes if x is not None])]
    return Program(pb.finish(results, updates, what, donate), low.specs, low.rebuild(), shapes)


def result_buffer_shape(spec: OutputSpec) -> tuple[int, ...]:
    """The buffer shape of an eager result's new storage: its tensor's own when it fills the
    storage row-major with no dim of size 1 (strided.buffer_shape), else flat. Then a relu's
    (64, 1024) output keys the next addmm as the uploaded batch before it did (one program
    where there were two), and an in-place update of it (an optimizer's state, made by its
    first step) needs no reshape of a flat buffer, which XLA pays with a copy. A size-1 dim
    stays out: a (1, 1) result would no longer share the programs of (1,) uploads (a decode
    loop's appended token and position, tests/test_growth.py)."""
    shape = buffer_shape(spec.sizes, spec.strides, spec.numel)
    return shape if 1 not in shape else (spec.numel,)


def _donatable(plan: OpPlan, values: list[Any], call: _Call) -> tuple[int, ...]:
    """Slots of the storages this in-place (or out=) op rewrites whose buffer nothing else
    holds: XLA then updates them in place. Without it, writing a slice of a large tensor
    (``bucket[i:j].copy_(grad)``, a KV-cache update) copies the whole buffer."""
    if donatable is not None:  # the same in C++: an optimizer's foreach op rewrites ~100 storages
        return donatable(plan.mutated_tensors(values), call.slot_of)
    slots = []
    for t in plan.mutated_tensors(values):
        if not isinstance(t, torch.Tensor):
            continue
        cell = t.untyped_storage()._cell
        buf = cell._buf
        # references: the cell's, ``buf``'s and getrefcount's argument; any other holder (a
        # storage sharing the buffer, a pending DeferAndFuse result) forbids donation
        if buf is not None and cell.lazy is None and sys.getrefcount(buf) == 3:
            slots.append(call.slot_of[id(cell)])
    return tuple(slots)


def registered_rule(op: torch._ops.OpOverload) -> bool:
    return op in registry.RULES


_UTILITY = BoundedCache("internal programs")


def run_utility(key: tuple, build: Any, inputs: list[Any]) -> list[Any]:
    """Run a small internal program (not an ATen op), built once per ``key``."""
    prog = _UTILITY.get(key)
    if prog is None:
        pb = ProgramBuilder()
        prog = _UTILITY[key] = pb.finish(build(pb.b), [], str(key[0]))
    return execute(prog, inputs, str(key[0]))
