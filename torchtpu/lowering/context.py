"""Lowering one op call (or a whole FX graph) into the builder, through the registry.

``lower_call`` is the single entry point every consumer uses: it finds the rule for an
OpOverload, or traces PyTorch's decomposition of it into ops that have rules, and
lowers those.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch.utils._pytree import tree_flatten, tree_map

from ..errors import CheckMessage, not_implemented
from ..stablehlo.builder import Builder, Value
from ..stablehlo.types import FLOAT8, is_complex, is_float
from . import registry

if TYPE_CHECKING:  # lowering/collectives.py is a sibling that rules import; no cycle at run time
    from .collectives import ReplicaLayout

aten = torch.ops.aten


class ScalarValue(Value):
    """A Python number passed to the program as a 0-d operand (so that its value is
    not part of the cache key). It promotes like the Python number it stands for."""

    __slots__ = ("pytype",)

    def __init__(self, name: str, dtype: torch.dtype, pytype: type):
        super().__init__(name, (), dtype)
        self.pytype = pytype


class TensorSpec:
    __slots__ = ("shape", "dtype")

    def __init__(self, shape: Sequence[int], dtype: torch.dtype):
        self.shape = tuple(int(d) for d in shape)
        self.dtype = dtype

    def __repr__(self) -> str:
        return f"TensorSpec({self.shape}, {self.dtype})"


class PlatformFacts(Protocol):
    """What the platform a program runs on can do, as the runtime client reports it."""

    platform: str  # "cpu" | "tpu" | "cuda"
    supports_f64: bool
    has_lapack: bool  # XLA's LAPACK custom calls (linalg) are registered


class ProgramContext:
    """State shared by every node of one program."""

    def __init__(self, builder: Builder | None = None, precision: str = "DEFAULT"):
        self.b = builder or Builder()
        # "DEFAULT" | "HIGH" | "HIGHEST" for dot and conv: the program's builder passes the
        # precision in effect (runner/precision.py), which is also part of its cache key
        self.precision = precision
        self.rng_state: Value | None = None  # u64[2] threaded through random ops
        self.checks: list[tuple[Value, str]] = []  # (any-true flag, message): see runner/checks.py
        # platform capabilities: the cpu client's until the program's builder (eager/,
        # compile/) calls set_platform; rules read these and never ask the runtime
        self.platform = "cpu"
        self.supports_f64 = True
        self.has_lapack = True
        # a program with collectives: the ranks it spans and each process group's replica
        # groups (lowering/collectives.py; set by compile/, which asks torch.distributed)
        self.replica_layout: ReplicaLayout | None = None
        # values the program must compute even if nothing reads them: a collective whose
        # result this rank slices to nothing would be deleted by XLA, and its peers would
        # wait for it forever (the program returns these last; the runner drops them)
        self.keep: list[Value] = []

    def set_platform(self, facts: PlatformFacts) -> None:
        """Take the capabilities rules may ask about from the runtime client ``facts``."""
        self.platform, self.supports_f64, self.has_lapack = facts.platform, facts.supports_f64, facts.has_lapack

    def new_rng_param(self) -> Value:
        self.rng_state = self.b.param((2,), torch.uint64)
        return self.rng_state


# the integer type a float goes through on its way to each integer type (NodeLowering.to);
# uint32 and uint64 keep XLA's conversion
_CPU_CAST_VIA = {
    torch.int64: torch.int64,
    torch.uint8: torch.int64,
    torch.int32: torch.int32,
    torch.int16: torch.int32,
    torch.int8: torch.int32,
    torch.uint16: torch.int32,
}


def _spec_of(meta: Any) -> TensorSpec | None:
    if isinstance(meta, torch.Tensor):
        return TensorSpec(meta.shape, meta.dtype)
    return None


class NodeLowering:
    """What a rule receives as ``L``: builder, output specs, helpers."""

    def __init__(self, ctx: ProgramContext, op: Any, out_meta: Any):
        self.ctx = ctx
        self.b = ctx.b
        self.op = op
        self.out_meta = out_meta
        flat, _ = tree_flatten(out_meta)
        self.out: list[TensorSpec | None] = [_spec_of(m) for m in flat]

    # -- scalars and dtypes -------------------------------------------------------
    def check(self, bad: Value, message: str, *, exc: type[Exception] = RuntimeError, values: Sequence[Value] = ()) -> None:
        """Report ``message`` (asynchronously, at the user's next wait) if any element of
        the boolean ``bad`` is true; the program still runs and returns its results.

        ``exc`` is the type the CPU raises for the same input (the user gets an exception
        that is both a ``TpuAsyncError`` and an ``exc``). ``values`` (integer-valued, each
        broadcastable to ``bad``) are read at the first true element of ``bad`` in row-major order
        and fill the ``{}`` fields of ``message``, as the CPU names the offending value
        ("Target 5 is out of bounds."). The flag is then an int64 vector: any, values..."""
        b = self.b
        msg = CheckMessage(message, exc, len(values))
        if not values:
            if bad.shape:
                dims = list(range(len(bad.shape)))
                (bad,) = b.reduce([bad], [b.constant(False, torch.bool)], dims, lambda acc, x: [b.binary("or", acc, x)])
            self.ctx.checks.append((bad, msg))
            return
        n = 1
        for d in bad.shape:
            n *= int(d)
        i64 = torch.int64
        flat_bad = b.reshape(bad, (n,))
        zeros = self.zeros((n,), i64)
        # one variadic reduce finds the first true position and carries the values there
        # (0 where nothing failed: every value is masked); two reduces, a minimum and a
        # masked sum per value, took XLA's CPU compiler twice as long (~40 ms against ~20
        # for nll_loss's check) and read the input twice
        pos = b.select(flat_bad, b.iota((n,), 0, i64), self.full(n, (n,), i64))
        picked = [b.select(flat_bad, b.reshape(self.to(self.broadcast_to(v, bad.shape), i64), (n,)), zeros) for v in values]

        def earlier(*scalars: Value) -> list[Value]:  # (position, values...) of the accumulator, then of x
            acc, x = scalars[: len(values) + 1], scalars[len(values) + 1 :]
            take = b.compare(acc[0], x[0], "LE")
            return [b.select(take, a, y) for a, y in zip(acc, x)]

        first, *at_first = b.reduce([pos, *picked], [b.constant(n, i64)] + [b.constant(0, i64)] * len(values), [0], earlier)
        parts = [b.convert(b.compare(first, b.constant(n, i64), "LT"), i64), *at_first]
        flag = b.concatenate([b.reshape(p, (1,)) for p in parts], 0)
        self.ctx.checks.append((flag, msg))

    def scalar(self, x: Any, dtype: torch.dtype) -> Value:
        """A 0-d Value of ``dtype`` from a Python number, a ScalarValue or a 0-d Value."""
        if isinstance(x, Value):
            return self.b.convert(x, dtype)
        return self.b.constant(x, dtype)

    def full(self, x: Any, shape: Sequence[int], dtype: torch.dtype) -> Value:
        s = self.scalar(x, dtype)
        return self.b.broadcast_in_dim(s, tuple(shape), [])

    def to(self, x: Value, dtype: torch.dtype) -> Value:
        if x.dtype == dtype:
            return x
        if dtype is torch.bool:
            return self.b.compare(x, self.b.broadcast_in_dim(self.b.constant(0, x.dtype), x.shape, []), "NE")
        if x.dtype is torch.bool and (is_float(dtype) or is_complex(dtype)):
            return self.b.convert(self.b.convert(x, torch.int32), dtype)
        if is_complex(x.dtype) and not is_complex(dtype):
            x = self.b.op1("stablehlo.real", [x], x.shape, torch.float32 if x.dtype is torch.complex64 else torch.float64)
        if dtype in _CPU_CAST_VIA and is_float(x.dtype):
            return self._float_to_int(x, dtype)
        if dtype is torch.float8_e4m3fn:
            return self.b.convert(self._saturated_for_e4m3fn(x), dtype)
        return self.b.convert(x, dtype)

    def _saturated_for_e4m3fn(self, x: Value) -> Value:
        """``x`` with its magnitudes above float8_e4m3fn's largest, 448, made 448: PyTorch's
        conversion (c10's, on the CPU and CUDA alike) saturates finite overflow and
        infinity, where XLA's gives NaN (the type has no infinity). NaN stays NaN (it
        compares false both ways)."""
        b = self.b
        if x.dtype in (torch.bool, torch.int8, torch.uint8, torch.float8_e4m3fn):
            return x  # nothing out of range
        if x.dtype in FLOAT8:
            x = b.convert(x, torch.float32)  # exact
        top, bottom = self.full(448, x.shape, x.dtype), self.full(-448, x.shape, x.dtype)
        x = b.select(b.compare(x, top, "GT"), top, x)
        return b.select(b.compare(x, bottom, "LT"), bottom, x)

    def _float_to_int(self, x: Value, dtype: torch.dtype) -> Value:
        """A float converted to an integer type as the CPU converts it: out of the type's
        range, NaN and infinity included, what x86's truncating conversion gives, where
        XLA's conversion would saturate. The CPU converts to int64 directly (and to uint8
        through int64, PyTorch's rule on every device: -1.0 is 255, 300.0 is 44); to int32
        and the narrower types through int32; either conversion gives the type's minimum
        out of range, and the narrow types keep its low bits. uint32 and uint64 keep XLA's
        conversion."""
        via = _CPU_CAST_VIA[dtype]
        b = self.b
        nan_is_zero = x.dtype in (torch.float8_e4m3fnuz, torch.float8_e5m2fnuz)  # their NaN, 0x80, reads as -0
        if x.dtype.itemsize <= 2:  # float16, bfloat16, the float8 types
            x = b.convert(x, torch.float32)  # exact
        if nan_is_zero:
            x = b.select(b.compare(x, x, "NE"), self.full(0.0, x.shape, x.dtype), x)
        low, high = (-(2.0**63), 2.0**63) if via is torch.int64 else (-(2.0**31), 2.0**31)
        in_range = b.binary(
            "and",
            b.compare(x, self.full(low, x.shape, x.dtype), "GE"),
            b.compare(x, self.full(high, x.shape, x.dtype), "LT"),
        )  # false for NaN
        wide = b.select(in_range, b.convert(x, via), self.full(int(low), x.shape, via))
        return wide if via is dtype else b.convert(wide, dtype)  # integer narrowing keeps the low bits

    def broadcast_to(self, x: Value, shape: Sequence[int]) -> Value:
        """NumPy broadcasting of ``x`` to ``shape``."""
        shape = tuple(int(d) for d in shape)
        if x.shape == shape:
            return x
        lead = len(shape) - x.rank
        if lead < 0:
            raise ValueError(f"cannot broadcast {x.shape} to {shape}")
        squeeze = [d for i, d in enumerate(x.shape) if not (d == 1 and shape[lead + i] != 1)]
        dims = [lead + i for i, d in enumerate(x.shape) if not (d == 1 and shape[lead + i] != 1)]
        if len(squeeze) != x.rank:
            x = self.b.reshape(x, squeeze)
        return self.b.broadcast_in_dim(x, shape, dims)

    def result_type(self, *args: Any) -> torch.dtype:
        """torch.result_type over tensors (Values), Python numbers and ScalarValues."""
        stand_ins = []
        for a in args:
            if isinstance(a, ScalarValue):
                stand_ins.append(a.pytype(1))
            elif isinstance(a, Value):
                stand_ins.append(torch.empty((1,) * min(a.rank, 1), dtype=a.dtype, device="meta"))
            elif isinstance(a, (bool, int, float, complex)):
                stand_ins.append(a)
        if len(stand_ins) == 1:
            s = stand_ins[0]
            return s.dtype if isinstance(s, torch.Tensor) else torch.result_type(torch.empty((), device="meta"), s)
        dtype = torch.result_type(stand_ins[0], stand_ins[1])
        for s in stand_ins[2:]:
            # fold left; torch.result_type takes two operands
            dtype = torch.promote_types(dtype, torch.result_type(torch.empty((1,), dtype=dtype, device="meta"), s))
        return dtype

    def promote(self, *args: Any, dtype: torch.dtype | None = None, shape: Sequence[int] | None = None) -> list[Value]:
        """Convert every argument to ``dtype`` and broadcast it to ``shape``
        (defaults: the promoted dtype and the first output's shape)."""
        if dtype is None:
            dtype = self.result_type(*args)
        if shape is None:
            shape = self.out[0].shape if self.out and self.out[0] is not None else broadcast_shapes(args)
        out = []
        for a in args:
            v = self.to(a, dtype) if isinstance(a, Value) else self.b.constant(a, dtype)
            out.append(self.broadcast_to(v, shape))
        return out

    def any_true(self, flags: Value) -> Value:
        """A 0-d bool: is any element of ``flags`` true (a while loop's "keep going" test)."""
        if not flags.shape:
            return flags
        b = self.b
        (out,) = b.reduce(
            [flags], [b.constant(False, torch.bool)], list(range(flags.rank)), lambda acc, v: [b.binary("or", acc, v)]
        )
        return out

    def zeros(self, shape: Sequence[int], dtype: torch.dtype) -> Value:
        return self.full(0, shape, dtype)

    # -- sub-lowering ---------------------------------------------------------------
    def lower(self, op: Any, *args: Any, **kwargs: Any) -> Any:
        """Lower another op inside this rule (its output shapes come from its meta kernel)."""
        return lower_call(self.ctx, op, args, kwargs, None)


def conform(ctx: ProgramContext, v: Value, dtype: torch.dtype, shape: tuple[int, ...]) -> Value:
    """``v`` as exactly the dtype and shape PyTorch promised for a result (a rule may
    return a wider dtype, a broadcastable shape, or the same elements in more dims)."""
    L = NodeLowering(ctx, None, None)
    if v.dtype != dtype:
        v = L.to(v, dtype)
    if v.shape != shape:
        v = L.broadcast_to(v, shape) if v.rank <= len(shape) else ctx.b.reshape(v, shape)
    return v


def broadcast_shapes(args: Sequence[Any]) -> tuple[int, ...]:
    shapes = [a.shape for a in args if isinstance(a, Value)]
    return tuple(torch.broadcast_shapes(*shapes)) if shapes else ()


def op_name(op: Any) -> str:
    return op.name() if isinstance(op, torch._ops.OpOverload) else str(op)


def meta_of(x: Any) -> Any:
    """A meta tensor (or Python stand-in) for a lowering argument."""
    if isinstance(x, ScalarValue):
        return x.pytype(1)
    if isinstance(x, Value):
        return torch.empty(x.shape, dtype=x.dtype, device="meta")
    return x


def infer_meta(op: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    margs = tree_map(meta_of, list(args))
    mkwargs = tree_map(meta_of, kwargs)
    if mkwargs.get("device") is not None:  # _to_copy(x, device="tpu") of a meta value would copy data
        mkwargs = {**mkwargs, "device": "meta"}
    return registry.META.get(op, op)(*margs, **mkwargs)


def lower_call(ctx: ProgramContext, op: Any, args: Sequence[Any], kwargs: dict[str, Any], out_meta: Any) -> Any:
    """Lower ``op(*args, **kwargs)``; returns Values in the structure of the op's outputs."""
    rule = registry.RULES.get(op)
    if rule is not None:
        if out_meta is None:
            out_meta = infer_meta(op, args, kwargs)
        return rule(NodeLowering(ctx, op, out_meta), *args, **kwargs)
    from .decomp import decomposition_for

    decomp = decomposition_for(op)
    if decomp is None:
        raise not_implemented(op_name(op))
    return lower_decomposition(ctx, op, decomp, args, kwargs)


def lower_decomposition(ctx: ProgramContext, op: Any, decomp: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    from .graph import lower_graph, trace_decomposition

    flat, spec = tree_flatten((list(args), dict(kwargs)))
    value_pos = [i for i, a in enumerate(flat) if isinstance(a, Value)]
    for i in value_pos:
        if isinstance(flat[i], ScalarValue):
            raise AssertionError(f"decomposition of {op} received a device scalar operand; make the scalar static")
    gm = trace_decomposition(decomp, flat, spec, value_pos)
    return lower_graph(ctx, gm, [flat[i] for i in value_pos], context_op=op)
