"""A custom kernel as a real PyTorch op: schema, fake kernel, CPU kernel, tpu lowering.

Each kernel is a ``torch.library.custom_op`` in the ``torchtpu_kernels`` namespace, so
eager dispatch, DeferAndFuse recording and Dynamo/AOTAutograd all see one op:

- its fake (meta) kernel gives the output shapes from the shape function (or, for a JAX
  kernel without one, from the kernel's lowered signature);
- its CPU kernel is the user's ``cpu=`` reference, or raises a clear NotImplementedError;
- its tpu lowering (``torchtpu.library.register_lowering``) adds the kernel's functions
  to the program as private functions and emits one ``func.call``: in eager mode the
  program is the kernel alone, in DeferAndFuse and torch.compile it sits in the fused
  program with the ops around it.

The kernel's text is produced once per input signature (shapes, dtypes, static
arguments), checked against the call and the shape function, and (for hand-written
StableHLO) compiled once on its own, so a malformed text is reported at the call that
used it, not when a fused graph fails to compile later.
"""

from __future__ import annotations

import inspect
import itertools
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from ..errors import TpuRuntimeError
from ..stablehlo.types import element_type, is_supported, tensor_type
from ._mlir import KernelError, KernelModule

NAMESPACE = "torchtpu_kernels"
_STATIC_KINDS = {bool: "bool", int: "int", float: "float", str: "str"}


class Spec(NamedTuple):
    """A tensor's shape and dtype: what shape functions and text functions receive
    (``.type`` is its MLIR type, e.g. ``tensor<4x8xf32>``), and what shape functions return."""

    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def type(self) -> str:
        return tensor_type(self.shape, self.dtype)

    @property
    def element_type(self) -> str:
        return element_type(self.dtype)

    @property
    def ndim(self) -> int:
        return len(self.shape)


@dataclass(frozen=True)
class Param:
    name: str
    kind: str  # "Tensor" | "bool" | "int" | "float" | "str"
    default: Any = inspect.Parameter.empty
    keyword_only: bool = False


def params_of(fn: Callable, what: str) -> list[Param]:
    """The op's arguments from ``fn``'s signature: parameters without a default (or
    annotated as tensors) are tensors; those annotated or defaulting to bool/int/float/str
    are static arguments, baked into the kernel's text."""
    out = []
    for p in inspect.signature(fn).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise KernelError(f"{what}: *args and **kwargs are not supported in a kernel's signature; name every argument")
        ann = p.annotation
        if isinstance(ann, str):  # from __future__ import annotations
            ann = {"bool": bool, "int": int, "float": float, "str": str}.get(ann, ann)
        kind = _STATIC_KINDS.get(ann) if isinstance(ann, type) else None
        if kind is None and p.default is not p.empty:
            kind = _STATIC_KINDS.get(type(p.default))
            if kind is None:
                raise KernelError(
                    f"{what}: argument {p.name!r} has a default of type {type(p.default).__name__}; "
                    "static arguments must be bool, int, float or str"
                )
        out.append(Param(p.name, kind or "Tensor", p.default, p.kind == p.KEYWORD_ONLY))
    if not any(p.kind == "Tensor" for p in out):
        raise KernelError(f"{what}: a kernel needs at least one tensor argument")
    return out


def schema_of(params: Sequence[Param], n_out: int) -> str:
    parts, star = [], False
    for p in params:
        if p.keyword_only and not star:
            parts.append("*")
            star = True
        default = "" if p.default is inspect.Parameter.empty else f"={_literal(p.default)}"
        parts.append(f"{p.kind} {p.name}{default}")
    rets = "Tensor" if n_out == 1 else "(" + ", ".join(["Tensor"] * n_out) + ")"
    return f"({', '.join(parts)}) -> {rets}"


def _literal(v: Any) -> str:
    if isinstance(v, bool):
        return "True" if v else "False"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return repr(v)


_WIDE = {torch.float64, torch.int64, torch.uint64, torch.complex128}


def needs_x64(specs: Sequence[Spec]) -> bool:
    """jax traces with 32-bit types unless its x64 mode is on: a JAX kernel turns it on
    exactly when an input is 64-bit (part of the lowered text's cache key)."""
    return any(s.dtype in _WIDE for s in specs)


Signature = tuple[tuple[Spec, ...], tuple[tuple[str, Any], ...]]


class Kernel:
    """What the op's fake kernel and lowering rule need: the kernel's text per signature."""

    def __init__(
        self,
        name: str,
        params: list[Param],
        n_out: int,
        source: Callable[[tuple[Spec, ...], dict[str, Any]], KernelModule],
        shape: Callable | None,
        verify: bool,
    ):
        self.name = name
        self.params = params
        self.n_out = n_out
        self.source = source  # signature -> parsed text
        self.shape = shape
        self.verify = verify
        self.what = f"kernel {name!r}"
        self._modules: dict[Signature, KernelModule] = {}
        self._lock = threading.Lock()

    # -- arguments --------------------------------------------------------------------------
    def bind(self, args: Sequence[Any], kwargs: dict[str, Any]) -> list[Any]:
        values = list(args)
        for p in self.params[len(values) :]:
            v = kwargs.get(p.name, p.default)
            if v is inspect.Parameter.empty:
                raise TypeError(f"{self.what}: missing argument {p.name!r}")
            values.append(v)
        return values

    def split(self, values: Sequence[Any], spec_of: Callable[[Any], Spec]) -> tuple[tuple[Spec, ...], dict[str, Any]]:
        specs, statics = [], {}
        for p, v in zip(self.params, values):
            if p.kind == "Tensor":
                specs.append(spec_of(v))
            else:
                statics[p.name] = v
        return tuple(specs), statics

    def call_user(self, fn: Callable, specs: Sequence[Any], statics: dict[str, Any]) -> Any:
        """``fn`` called like the kernel: positional arguments in order, keyword-only by name."""
        it = iter(specs)
        args, kwargs = [], {}
        for p in self.params:
            v = next(it) if p.kind == "Tensor" else statics[p.name]
            if p.keyword_only:
                kwargs[p.name] = v
            else:
                args.append(v)
        return fn(*args, **kwargs)

    # -- shapes ---------------------------------------------------------------------------------
    def out_specs(self, specs: tuple[Spec, ...], statics: dict[str, Any]) -> list[Spec]:
        if self.shape is not None:
            try:
                result = self.call_user(self.shape, specs, statics)
            except KernelError:
                raise
            except Exception as e:
                raise KernelError(f"{self.what}: its shape function raised {type(e).__name__}: {e}") from e
            return as_specs(result, self.n_out, f"{self.what}: its shape function")
        if not all(isinstance(d, int) for s in specs for d in s.shape):
            raise KernelError(
                f"{self.what}: called with symbolic shapes {list(specs)}; pass shape= to the kernel "
                "so its output shapes can be computed without lowering it"
            )
        return [Spec(*t) for t in self.module(specs, statics).result_types()]

    def fake(self, *args: Any, **kwargs: Any) -> Any:
        values = self.bind(args, kwargs)
        specs, statics = self.split(values, lambda t: Spec(tuple(t.shape), t.dtype))
        device = next(v.device for p, v in zip(self.params, values) if p.kind == "Tensor")
        outs = [torch.empty(s.shape, dtype=s.dtype, device=device) for s in self.out_specs(specs, statics)]
        return outs[0] if self.n_out == 1 else tuple(outs)

    # -- the text ---------------------------------------------------------------------------------
    def module(self, specs: tuple[Spec, ...], statics: dict[str, Any]) -> KernelModule:
        """The kernel's functions for this signature, checked against it (once per signature)."""
        key = (specs, tuple(sorted(statics.items())))
        km = self._modules.get(key)
        if km is None:
            with self._lock:
                km = self._modules.get(key)
                if km is None:
                    km = self._modules[key] = self._checked(specs, statics)
        return km

    def _checked(self, specs: tuple[Spec, ...], statics: dict[str, Any]) -> KernelModule:
        km = self.source(specs, statics)
        got = [Spec(*t) for t in km.arg_types()]
        if got != list(specs):
            raise KernelError(
                f"{self.what}: its function @{km.entry.name} takes ({_types(got)}) but was called with ({_types(specs)}); "
                "the text must be written for the shapes and dtypes it is called with (write a function that "
                "returns the text for each signature)"
            )
        results = [Spec(*t) for t in km.result_types()]
        if len(results) != self.n_out:
            raise KernelError(
                f"{self.what}: @{km.entry.name} returns {len(results)} tensors but the kernel was "
                f"declared with {self.n_out} output(s) (num_outputs=)"
            )
        if self.shape is not None:
            promised = self.out_specs(specs, statics)
            if promised != results:
                raise KernelError(
                    f"{self.what}: its shape function says the outputs are ({_types(promised)}) for inputs "
                    f"({_types(specs)}), but @{km.entry.name} returns ({_types(results)}); fix the shape function"
                )
        if self.verify:
            _verify(km, specs, results, self.what)
        return km

    # -- the lowering rule ------------------------------------------------------------------------
    def rule(self, L: Any, *args: Any, **kwargs: Any) -> Any:
        from ..stablehlo.builder import Value

        values = self.bind(args, kwargs)
        for p, v in zip(self.params, values):
            if p.kind != "Tensor" and isinstance(v, Value):
                raise KernelError(
                    f"{self.what}: static argument {p.name!r} reached the program as a device value; "
                    "pass it as a Python constant (torch.compile: not a traced input)"
                )
        specs, statics = self.split(values, lambda v: Spec(v.shape, v.dtype))
        km = self.module(specs, statics)
        outs = [(tuple(s.shape), s.dtype) for s in L.out]
        if [Spec(*o) for o in outs] != [Spec(*t) for t in km.result_types()]:
            raise KernelError(
                f"{self.what}: PyTorch expects outputs ({_types([Spec(*o) for o in outs])}) "
                f"but the kernel returns ({_types([Spec(*t) for t in km.result_types()])})"
            )
        symbol = L.b.add_functions(km.key, km.render)
        tensors = [v for p, v in zip(self.params, values) if p.kind == "Tensor"]
        results = L.b.call(symbol, tensors, outs)
        return results[0] if self.n_out == 1 else tuple(results)


def _types(specs: Sequence[Spec]) -> str:
    return ", ".join(s.type if all(isinstance(d, int) for d in s.shape) else f"{tuple(s.shape)}:{s.dtype}" for s in specs)


def as_specs(result: Any, n_out: int, what: str) -> list[Spec]:
    """A shape function's answer as Specs: one spec-like (anything with ``.shape`` and
    ``.dtype``, or a ``(shape, dtype)`` pair) or a sequence of them."""
    if _spec_like(result):
        items = [result]
    elif isinstance(result, (list, tuple)) and all(_spec_like(r) for r in result):
        items = list(result)
    else:
        raise KernelError(
            f"{what} returned {result!r}; return a Spec(shape, dtype) (or an input's Spec), or a list of them, one per output"
        )
    specs = []
    for r in items:
        shape, dtype = (r.shape, r.dtype) if hasattr(r, "shape") and hasattr(r, "dtype") else r
        shape = tuple(shape)
        if not isinstance(dtype, torch.dtype) or not is_supported(dtype):
            raise KernelError(f"{what} returned dtype {dtype!r}; expected a torch dtype the tpu device supports")
        if not all(isinstance(d, (int, torch.SymInt)) and not isinstance(d, bool) for d in shape) or any(
            isinstance(d, int) and d < 0 for d in shape
        ):
            raise KernelError(f"{what} returned shape {shape!r}; expected non-negative ints")
        specs.append(Spec(shape, dtype))
    if len(specs) != n_out:
        raise KernelError(f"{what} returned {len(specs)} output spec(s) but the kernel has {n_out} output(s) (num_outputs=)")
    return specs


def _spec_like(r: Any) -> bool:
    if isinstance(r, Spec) or (hasattr(r, "shape") and hasattr(r, "dtype") and not isinstance(r, (list, tuple))):
        return True
    return isinstance(r, tuple) and len(r) == 2 and isinstance(r[1], torch.dtype)  # a (shape, dtype) pair


def _verify(km: KernelModule, specs: Sequence[Spec], results: Sequence[Spec], what: str) -> None:
    """Compile the kernel on its own: XLA's parser and verifier judge the text here, at the
    call that used it (DeferAndFuse would otherwise fail at a later flush)."""
    from ..runtime import cache
    from ..stablehlo.builder import Builder

    b = Builder()
    params = [b.param(s.shape, s.dtype) for s in specs]
    symbol = b.add_functions(km.key, km.render)
    outs = b.call(symbol, params, [(s.shape, s.dtype) for s in results])
    try:
        cache.compile(b.module(outs), f"custom {what}")
    except TpuRuntimeError as e:
        detail = str(e.__cause__ or e).strip()[:3000]
        raise KernelError(f"{what}: XLA rejected the kernel's StableHLO:\n{detail}") from None


# ----------------------------------------------------------------------------------------
# defining the op
# ----------------------------------------------------------------------------------------
_names_lock = threading.Lock()
_counter = itertools.count(1)


def _op_name(name: str, explicit: bool) -> str:
    if not explicit:  # a function's name: "<lambda>" becomes "_lambda_"
        name = re.sub(r"\W", "_", name)
        name = name if name.isidentifier() else f"k_{name}"
    if not name.isidentifier():
        raise KernelError(f"kernel name {name!r} is not a valid identifier; pass name=")
    if not _exists(name):
        return name
    if explicit:
        raise KernelError(f"a kernel named {name!r} ({NAMESPACE}::{name}) is already defined; choose another name=")
    while True:
        candidate = f"{name}_{next(_counter)}"
        if not _exists(candidate):
            return candidate


def _exists(name: str) -> bool:
    return hasattr(getattr(torch.ops, NAMESPACE), name)


def define(
    kernel_of: Callable[[str], Kernel],
    name: str,
    explicit_name: bool,
    cpu: Callable | None,
    backward: Callable | None,
    setup_context: Callable | None,
) -> Any:
    """Define the op for ``kernel_of(final name)`` and register its kernels."""
    from ..library import register_lowering

    with _names_lock:
        name = _op_name(name, explicit_name)
        kernel = kernel_of(name)
        schema = schema_of(kernel.params, kernel.n_out)

        def no_cpu(*args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError(
                f"torchtpu {kernel.what} runs on tpu tensors only; move the inputs with .to('tpu'), or give the kernel "
                "a CPU reference implementation with cpu=<function> when you define it"
            )

        op = torch.library.custom_op(f"{NAMESPACE}::{name}", cpu or no_cpu, mutates_args=(), device_types="cpu", schema=schema)
    op.register_fake(kernel.fake)
    register_lowering(op, kernel.rule)
    if backward is not None:
        op.register_autograd(backward, setup_context=setup_context)
    return op
