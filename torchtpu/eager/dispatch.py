"""Eager execution: one cached single-op program per (op, geometry, dtypes, static args).

The dispatcher calls ``run`` for every op on tpu tensors. The hot path builds a cache
key from what the program depends on (never the values of Python numbers other than
0/1/-1, which are passed as device operands), finds the compiled program, enqueues it
asynchronously and wraps the outputs. On a miss, ``_build`` writes the program:
materialise the input views from their storages, lower the op's functional form
through the registry, then write in-place results back into their storages.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from .. import config, metrics
from ..device.matmul_precision import current as current_precision
from ..errors import TpuError
from ..lowering import registry
from ..lowering.context import ProgramContext, ScalarValue, lower_call
from ..lowering.strided import apply_math_bits, flatten_for_strides, read_view, write_view
from ..runtime import cache, pjrt
from ..stablehlo.builder import Value
from ..tensor import storage
from ..tensor.storage import Cell, cell_of, new_tensor
from . import rng
from .plan import (
    KIND_SCALAR,
    KIND_SCALAR_LIST,
    KIND_TENSOR,
    KIND_TENSOR_LIST,
    OpPlan,
    plan_for,
)

_SPECIAL_SCALARS = (0, 1, -1)


class Program:
    __slots__ = ("exe", "outputs", "n_outputs", "out_tree", "updates", "text", "n_inputs")

    def __init__(self, exe: Any, outputs: list, out_tree: Any, updates: list[int], text: str, n_inputs: int):
        self.exe = exe
        self.out_tree = out_tree  # pytree spec of the op's new (non-mutated) outputs
        self.outputs = outputs  # per new output: (sizes, strides, dtype, numel), None for an absent one
        self.n_outputs = sum(1 for o in outputs if o is not None)
        self.updates = updates  # slots whose storage the program rewrites
        self.text = text
        self.n_inputs = n_inputs


_CACHE: dict[tuple, Program] = {}
_scalar_bufs: dict[tuple, Any] = {}
_pending: list[Any] = []  # recent output buffers, for synchronize()


def cache_size() -> int:
    return len(_CACHE)


def clear_cache() -> None:
    _CACHE.clear()


# --------------------------------------------------------------------------
# operands
# --------------------------------------------------------------------------
def _device_scalar(value: Any, pytype: type) -> Any:
    key = (pytype, value)
    buf = _scalar_bufs.get(key)
    if buf is None:
        rt = pjrt.get()
        if pytype is float:
            arr = np.asarray(value, np.float64 if rt.supports_f64 else np.float32)
        elif pytype is complex:
            arr = np.asarray(value, np.complex128 if rt.supports_f64 else np.complex64)
        else:
            arr = np.asarray(value, np.int64)
        buf = rt.put(arr)
        if len(_scalar_bufs) > 4096:
            _scalar_bufs.clear()
        _scalar_bufs[key] = buf
    return buf


def _scalar_dtype(pytype: type) -> torch.dtype:
    f64 = pjrt.get().supports_f64
    if pytype is float:
        return torch.float64 if f64 else torch.float32
    if pytype is complex:
        return torch.complex128 if f64 else torch.complex64
    return torch.int64


def _lifted(v: Any, lift: bool) -> bool:
    """Is this Python number passed as a device operand (not baked into the program)?"""
    tp = type(v)
    return lift and (tp is float or tp is int or tp is complex) and v not in _SPECIAL_SCALARS


def _freeze(v: Any) -> Any:
    if isinstance(v, list):
        return tuple(_freeze(x) for x in v)
    if isinstance(v, torch.Tensor):
        raise TypeError("unexpected tensor in a static argument")
    if isinstance(v, float) and v != v:
        return ("nan",)
    return (type(v), v) if isinstance(v, (bool, int, float)) else v


def _to_device_scalar_tensor(t: torch.Tensor) -> torch.Tensor:
    if t.dim() == 0 and t.device.type == "cpu":
        return t.to(storage.DEVICE)
    raise RuntimeError(
        f"Expected all tensors to be on the same device, but found at least two devices, tpu:0 and {t.device}! "
        "Move the tensor with .to('tpu') first."
    )


class _Call:
    """The operands of one call, gathered while its cache key is built."""

    __slots__ = ("key", "cells", "slot_of", "tensors", "scalars", "scalar_types", "values")

    def __init__(self) -> None:
        self.key: list = []
        self.cells: list[Cell] = []
        self.slot_of: dict[int, int] = {}
        self.tensors: list[torch.Tensor] = []
        self.scalars: list[Any] = []
        self.scalar_types: list[type] = []

    def tensor(self, t: torch.Tensor) -> tuple:
        if t.device.type != "tpu":
            t = _to_device_scalar_tensor(t)
        cell = cell_of(t)
        slot = self.slot_of.get(id(cell))
        if slot is None:
            slot = self.slot_of[id(cell)] = len(self.cells)
            self.cells.append(cell)
        self.tensors.append(t)
        return (slot, t.dtype, tuple(t.shape), t.stride(), t.storage_offset(), t.is_conj(), t.is_neg())

    def scalar(self, v: Any, lift: bool) -> Any:
        tp = type(v)
        if _lifted(v, lift):
            self.scalars.append(_device_scalar(v, tp))
            self.scalar_types.append(tp)
            return ("s", tp)
        return _freeze(v)


def _collect(plan: OpPlan, values: list[Any]) -> _Call:
    call = _Call()
    key = call.key
    key.append(plan.op)
    lift = plan.lift_scalars
    for kind, v in zip(plan.kinds, values):
        if kind == KIND_TENSOR:
            if v is None:
                key.append(None)
            elif isinstance(v, torch.Tensor):
                key.append(call.tensor(v))
            else:  # a Python number where the schema says Tensor (e.g. x.mul_(0.9))
                key.append(call.scalar(v, lift))
        elif kind == KIND_TENSOR_LIST:
            key.append(tuple(None if t is None else call.tensor(t) for t in v))
        elif kind == KIND_SCALAR:
            key.append(call.scalar(v, lift))
        elif kind == KIND_SCALAR_LIST and lift and v:
            arr = np.asarray(v, np.float64 if pjrt.get().supports_f64 else np.float32)
            call.scalars.append(pjrt.get().put(arr))
            call.scalar_types.append(list)
            key.append(("sl", len(v)))
        else:
            if isinstance(v, torch.Tensor) or (isinstance(v, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in v)):
                raise TpuError(f"torchtpu: unexpected tensor argument to {plan.name}")
            key.append(_freeze(v))
    key.extend((c.numel, c.dtype, c.buf is not None) for c in call.cells)
    key.append(current_precision())  # dot/conv precision_config is baked into the program
    return call


# --------------------------------------------------------------------------
# the hot path
# --------------------------------------------------------------------------
def run(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Any:
    plan = plan_for(op)
    values = plan.bind(args, kwargs)
    if plan.out_positions:
        _resize_outs(plan, values)
    call = _collect(plan, values)
    key = tuple(call.key)
    if plan.random:
        key = key + (rng.STATE_KEY,)
    prog = _CACHE.get(key)
    if prog is None:
        try:
            prog = _build(plan, values, call)
        except NotImplementedError:
            if config.flag("TORCHTPU_CPU_FALLBACK"):
                from .fallback import run_on_cpu

                return run_on_cpu(op, args, kwargs)
            raise
        _CACHE[key] = prog
    else:
        metrics.add("cache_hits")
    inputs = [c.buf for c in call.cells if c.buf is not None]
    inputs.extend(call.scalars)
    if plan.random:
        inputs.append(rng.next_state_buffer())
    outs = pjrt.get().execute(prog.exe, inputs)
    metrics.add("executions")
    _track(outs)
    n_new = prog.n_outputs
    for slot, buf in zip(prog.updates, outs[n_new:]):
        call.cells[slot].set(buf)
    if n_new == len(prog.outputs):
        new = [
            new_tensor(Cell(numel, dtype, buf), sizes, strides, 0, dtype)
            for (sizes, strides, dtype, numel), buf in zip(prog.outputs, outs)
        ]
    else:
        bufs = iter(outs)
        new = [None if spec is None else new_tensor(Cell(spec[3], spec[2], next(bufs)), spec[0], spec[1], 0, spec[2]) for spec in prog.outputs]
    if prog.out_tree is None:
        return plan.returns(values, new)
    return plan.returns(values, tree_unflatten(new, prog.out_tree))


def _track(outs: list[Any]) -> None:
    _pending.extend(outs)
    if len(_pending) > 256:
        keep = [b for b in _pending[-64:] if not pjrt.Runtime.is_ready(b)]
        _pending.clear()
        _pending.extend(keep)


def synchronize() -> None:
    if not pjrt.started():
        return
    bufs = [b for b in _pending if not b.is_deleted()]
    _pending.clear()
    pjrt.get().block(bufs)


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
            t.resize_(m.shape)


# --------------------------------------------------------------------------
# building a program (cache miss)
# --------------------------------------------------------------------------
def _build(plan: OpPlan, values: list[Any], call: _Call) -> Program:
    ctx = ProgramContext()
    ctx.supports_f64 = pjrt.get().supports_f64
    b = ctx.b
    bases = []
    for cell in call.cells:
        if cell.buf is None:
            bases.append(b.broadcast_in_dim(b.constant(0, cell.dtype), (cell.numel,), []))
        else:
            bases.append(b.param((cell.numel,), cell.dtype))
    scalar_params = []
    for tp in call.scalar_types:
        if tp is list:
            scalar_params.append(b.param((0,), _scalar_dtype(float)))  # length set by _scalar_list
        else:
            p = b.param((), _scalar_dtype(tp))
            scalar_params.append(ScalarValue(p.name, p.dtype, tp))
    if plan.random:
        ctx.new_rng_param()

    geometry = {}
    tensor_iter = iter(call.tensors)
    scalar_iter = iter(scalar_params)
    lowered: list[Any] = []
    for kind, v in zip(plan.kinds, values):
        if kind == KIND_TENSOR and v is not None and not isinstance(v, torch.Tensor):
            lowered.append(next(scalar_iter) if _lifted(v, plan.lift_scalars) else v)
        elif kind == KIND_TENSOR:
            lowered.append(None if v is None else _view(b, bases, call, next(tensor_iter), geometry))
        elif kind == KIND_TENSOR_LIST:
            lowered.append([None if t is None else _view(b, bases, call, next(tensor_iter), geometry) for t in v])
        elif kind == KIND_SCALAR and _lifted(v, plan.lift_scalars):
            lowered.append(next(scalar_iter))
        elif kind == KIND_SCALAR_LIST and plan.lift_scalars and v:
            lowered.append(_scalar_list(b, next(scalar_iter), len(v)))
        else:
            lowered.append(v)

    fargs, fkwargs = plan.functional_args(lowered)
    out_meta = plan.functional_meta(values)
    result = lower_call(ctx, plan.functional, fargs, fkwargs, out_meta if len(out_meta) != 1 or plan.functional_returns_tuple else out_meta[0])
    results = list(result) if isinstance(result, (tuple, list)) and plan.functional_returns_tuple else [result]

    outputs, out_specs = [], []
    flat_new, out_tree = tree_flatten(results[: plan.n_plain])
    flat_new_meta, _ = tree_flatten(list(out_meta[: plan.n_plain]))
    for v, m in zip(flat_new, flat_new_meta):
        if v is None or m is None:  # an optional output PyTorch also leaves out (e.g. no weight grad)
            out_specs.append(None)
            continue
        v = _fix(ctx, v, m)
        flat, strides = flatten_for_strides(b, v, m.stride())
        outputs.append(flat)
        out_specs.append((tuple(m.shape), strides, m.dtype, flat.shape[0]))

    current = list(bases)
    updated: list[int] = []
    flat_mut, _ = tree_flatten(results[plan.n_plain :])
    flat_mut_meta, _ = tree_flatten(list(out_meta[plan.n_plain :]))
    mut_tensors = plan.mutated_tensors(values)
    for v, m, t in zip(flat_mut, flat_mut_meta, mut_tensors):
        if t is None or v is None:
            continue
        slot, sizes, strides, offset = geometry[id(t)]
        v = _fix(ctx, v, m, dtype=t.dtype, shape=tuple(t.shape))
        if t.is_conj() or t.is_neg():  # lazy conj/neg views store conj/neg of their values
            v = apply_math_bits(b, v, t.is_conj(), t.is_neg())
        current[slot] = write_view(b, current[slot], sizes, strides, offset, v)
        if slot not in updated:
            updated.append(slot)
    outputs.extend(current[s] for s in updated)
    text = b.module(outputs)
    exe = cache.compile(text, f"{plan.name} {[tuple(t.shape) for t in call.tensors]}")
    # a flat list of plain tensors needs no pytree rebuild on the hot path
    simple = all(isinstance(r, Value) for r in results[: plan.n_plain]) and None not in out_specs
    return Program(exe, out_specs, None if simple else out_tree, updated, text, len(b.params))


def _scalar_list(b: Any, param: Any, n: int) -> list[ScalarValue]:
    dtype = param.dtype
    param.shape = (n,)
    out = []
    for i in range(n):
        s = b.reshape(b.slice(param, [i], [i + 1]), ())
        out.append(ScalarValue(s.name, dtype, float))
    return out


def _view(b: Any, bases: list, call: _Call, t: torch.Tensor, geometry: dict) -> Any:
    slot = call.slot_of[id(cell_of(t))]
    sizes, strides, offset = tuple(t.shape), t.stride(), t.storage_offset()
    geometry[id(t)] = (slot, sizes, strides, offset)
    x = read_view(b, bases[slot], sizes, strides, offset, t.dtype)
    if t.is_conj() or t.is_neg():
        x = apply_math_bits(b, x, t.is_conj(), t.is_neg())
    return x


def _fix(ctx: ProgramContext, v: Any, meta: torch.Tensor, dtype: torch.dtype | None = None, shape: tuple | None = None) -> Any:
    """Make a rule's result exactly the dtype and shape PyTorch promised."""
    from ..lowering.context import NodeLowering

    L = NodeLowering(ctx, None, None)
    dtype = dtype or meta.dtype
    shape = shape if shape is not None else tuple(meta.shape)
    if v.dtype != dtype:
        v = L.to(v, dtype)
    if v.shape != shape:
        v = L.broadcast_to(v, shape)
    return v


def registered_rule(op: torch._ops.OpOverload) -> bool:
    return op in registry.RULES


_UTILITY: dict[tuple, Any] = {}


def run_utility(key: tuple, build: Any, inputs: list[Any]) -> list[Any]:
    """Run a small internal program (not an ATen op), built once per ``key``."""
    exe = _UTILITY.get(key)
    if exe is None:
        from ..stablehlo.builder import Builder

        b = Builder()
        outs = build(b)
        exe = _UTILITY[key] = cache.compile(b.module(outs), str(key[0]))
    outs = pjrt.get().execute(exe, inputs)
    metrics.add("executions")
    _track(outs)
    return outs
