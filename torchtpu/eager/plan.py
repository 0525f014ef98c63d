"""Per-op plans: what the eager kernel needs to know about an op's schema, worked out once.

For an op that mutates (``add_``, ``add.out``, ``_foreach_mul_``, ``_fused_adamw_``), the
plan finds its functional variant (``add``, ``_foreach_mul``, ``_fused_adamw``): that
is what gets lowered, and its extra results are written back into the mutated tensors
(the same convention torch.func.functionalize uses).
"""

from __future__ import annotations

from typing import Any

import torch

from ..lowering import registry

KIND_TENSOR, KIND_TENSOR_LIST, KIND_SCALAR, KIND_SCALAR_LIST, KIND_STATIC = range(5)
_MISSING = object()
# out= ops whose CPU kernels take the computation dtype from out when dtype= is None
_DTYPE_FROM_OUT = {"sum", "nansum", "prod", "cumsum", "cumprod"}


def _kind(t: Any) -> int:
    if isinstance(t, torch._C.OptionalType):
        t = t.getElementType()
    if isinstance(t, torch._C.TensorType):
        return KIND_TENSOR
    if isinstance(t, torch._C.ListType):
        e = t.getElementType()
        if isinstance(e, torch._C.OptionalType):
            e = e.getElementType()
        if isinstance(e, torch._C.TensorType):
            return KIND_TENSOR_LIST
        if isinstance(e, torch._C.NumberType):
            return KIND_SCALAR_LIST
        return KIND_STATIC
    if isinstance(t, (torch._C.NumberType, torch._C.FloatType)):
        return KIND_SCALAR
    return KIND_STATIC


def _is_write(a: Any) -> bool:
    return a.alias_info is not None and a.alias_info.is_write


def _signature(schema: Any, drop_out: bool) -> list[tuple[str, str]]:
    return [(a.name, str(a.type)) for a in schema.arguments if not (drop_out and a.kwarg_only and _is_write(a))]


_FACTORY_EXTRAS = {"dtype", "layout", "device", "pin_memory"}


def _matches(candidate: list[tuple[str, str]], want: list[tuple[str, str]], schema: Any) -> bool:
    """Same arguments, or (for factory out= ops) the same plus the optional
    dtype/layout/device/pin_memory keywords of the functional form."""
    if candidate == want:
        return True
    extra = [c for c in candidate if c not in want]
    return [c for c in candidate if c in want] == want and all(name in _FACTORY_EXTRAS for name, _ in extra)


def functional_variant(op: torch._ops.OpOverload) -> torch._ops.OpOverload | None:
    """``add_.Tensor -> add.Tensor``, ``add.out -> add.Tensor``, ``_fused_adamw_ -> _fused_adamw``,
    ``normal_ -> normal_functional``, ``_native_batch_norm_legit -> ..._functional``,
    ``__ilshift__.Scalar -> __lshift__.Scalar``."""
    schema = op._schema
    if not any(_is_write(a) for a in schema.arguments):
        return op
    base = schema.name.split("::")[1]
    want = _signature(schema, drop_out=True)
    stem = base[:-1] if base.endswith("_") and not base.endswith("__") else base
    if base.startswith("__i") and base.endswith("__"):  # __ilshift__ -> __lshift__ (x <<= n)
        stem = "__" + base[3:]
    for cand in dict.fromkeys([stem, stem + "_functional", base + "_functional", stem.lstrip("_")]):
        packet = getattr(torch.ops.aten, cand, None)
        if packet is None:
            continue
        for name in packet.overloads():
            ov = getattr(packet, name)
            if ov is op or any(_is_write(a) for a in ov._schema.arguments):
                continue
            if _matches(_signature(ov._schema, drop_out=False), want, ov._schema):
                return ov
    return None


class OpPlan:
    def __repr__(self) -> str:
        return str(self.op)  # "aten.mm.default": what a program cache key shows for its op

    def __init__(self, op: torch._ops.OpOverload):
        schema = op._schema
        self.op = op
        self.name = op.name()
        args = schema.arguments
        self.names = [a.name for a in args]
        self.kwarg_only = [a.kwarg_only for a in args]
        self.defaults = [a.default_value if a.has_default_value() else _MISSING for a in args]
        self.kinds = [_kind(a.type) for a in args]
        self.scalar_positions = tuple(i for i, k in enumerate(self.kinds) if k == KIND_SCALAR)
        writes = [i for i, a in enumerate(args) if _is_write(a)]
        self.out_positions = [i for i in writes if args[i].kwarg_only]
        # The functional variant returns its results (which the out= tensors receive) before
        # the other mutated arguments: _native_batch_norm_legit.out(..., running_mean,
        # running_var, out=, save_mean=, save_invstd=) -> _functional's (out, save_mean,
        # save_invstd, new_running_mean, new_running_var).
        self.mutable = self.out_positions + [i for i in writes if not args[i].kwarg_only]
        functional = functional_variant(op)
        if functional is None:
            raise NotImplementedError(f"torchtpu: no functional variant found for {self.name}")
        self.functional = functional
        fschema = functional._schema
        self.f_args = [(a.name, a.kwarg_only, self.names.index(a.name) if a.name in self.names else -1, a) for a in fschema.arguments]
        self.functional_returns_tuple = len(fschema.returns) != 1
        self.n_plain = sum(1 for r in schema.returns if not (r.alias_info is not None and r.alias_info.is_write))
        self.return_sources = self._return_sources(schema)
        self.single_return = len(schema.returns) == 1
        self.returns_one_new = self.return_sources == [("new", 0)]  # most ops: ``returns`` is plain[0]
        self.lift_scalars = functional in registry.RULES and functional not in registry.STATIC_SCALARS
        # sum(x, 0, out=long_tensor): the CPU computes in out's dtype when dtype= is not given
        self.dtype_from_out = bool(self.out_positions) and schema.name.split("::")[1] in _DTYPE_FROM_OUT
        self.random = functional in registry.RANDOM
        self.generator_position = self.names.index("generator") if "generator" in self.names else None

    def _return_sources(self, schema: Any) -> list[tuple[str, int]]:
        sources = []
        plain = 0
        for r in schema.returns:
            if r.alias_info is not None and r.alias_info.is_write:
                sets = r.alias_info.before_set
                idx = next(i for i, a in enumerate(schema.arguments) if a.alias_info is not None and a.alias_info.before_set == sets)
                sources.append(("arg", idx))
            else:
                sources.append(("new", plain))
                plain += 1
        return sources

    # -- arguments -------------------------------------------------------------
    def bind(self, args: tuple, kwargs: dict) -> list[Any]:
        values = list(args)
        for i in range(len(args), len(self.names)):
            v = kwargs.get(self.names[i], _MISSING)
            if v is _MISSING:
                v = self.defaults[i]
                if v is _MISSING:
                    raise TypeError(f"{self.name}: missing argument {self.names[i]!r}")
            values.append(v)
        return values

    def functional_args(self, values: list[Any]) -> tuple[list[Any], dict[str, Any]]:
        fargs, fkwargs = [], {}
        for name, kwonly, idx, a in self.f_args:
            if idx >= 0:
                v = values[idx]
                if v is None and self.dtype_from_out and name == "dtype":
                    v = values[self.out_positions[0]].dtype
            elif name == "dtype" and self.out_positions:  # factory out=: the result takes out's dtype
                v = values[self.out_positions[0]].dtype
            else:
                v = a.default_value if a.has_default_value() else None
            if kwonly:
                fkwargs[name] = v
            else:
                fargs.append(v)
        return fargs, fkwargs

    def functional_meta(self, values: list[Any]) -> list[Any]:
        metas = [_meta(v) for v in values]
        fargs, fkwargs = self.functional_args(metas)
        try:
            out = registry.META.get(self.functional, self.functional)(*fargs, **fkwargs)
        except Exception:
            from .validate import arguments  # the CPU's own message where its kernel words the refusal differently

            arguments(self, values)
            raise
        if self.functional is _CONVOLUTION:
            out = _conv_output_layout(out, metas[0], metas[1])
        if out is None:  # no results (torch._assert_async: its program only checks)
            return []
        return list(out) if self.functional_returns_tuple else [out]

    def mutated_tensors(self, values: list[Any]) -> list[Any]:
        out = []
        for i in self.mutable:
            v = values[i]
            out.extend(v if isinstance(v, (list, tuple)) else [v])
        return out

    def returns(self, values: list[Any], plain: list[Any]) -> Any:
        if self.returns_one_new:
            return plain[0]
        res = [values[i] if kind == "arg" else plain[i] for kind, i in self.return_sources]
        if not res:
            return None
        return res[0] if self.single_return else tuple(res)


_META = torch.device("meta")
_CONVOLUTION = torch.ops.aten.convolution.default


def _conv_output_layout(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """A convolution's output in CUDA's memory format: channels-last when the input or the
    weight is (cuDNN's rule; the CPU's oneDNN follows the input). The meta kernel, given
    meta tensors, always answers contiguous, which made a channels-last model's
    activations contiguous after its first convolution."""
    formats = {4: torch.channels_last, 5: torch.channels_last_3d}
    fmt = formats.get(out.dim())
    if fmt is None or out.is_contiguous(memory_format=fmt):
        return out
    if x.is_contiguous(memory_format=fmt) and not x.is_contiguous() or (
        weight.is_contiguous(memory_format=fmt) and not weight.is_contiguous()
    ):
        return torch.empty_like(out, memory_format=fmt)
    return out


def _meta(v: Any) -> Any:
    if isinstance(v, torch.device):
        return _META if v.type == "tpu" else v
    if isinstance(v, torch.Tensor):
        return torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="meta")
    if isinstance(v, (list, tuple)) and v and any(isinstance(x, torch.Tensor) for x in v):
        return type(v)(_meta(x) for x in v)
    if isinstance(v, torch.Generator):  # shapes never depend on it; refs (exponential_...) refuse one
        return None
    return v


def plan_for(op: torch._ops.OpOverload) -> OpPlan:
    """The op's plan, made once and kept on the op: a dictionary keyed by the op would hash
    it through ``OpOverload.__hash__``, a Python method, on every call."""
    try:
        return op._torchtpu_plan
    except AttributeError:
        plan = op._torchtpu_plan = OpPlan(op)
        return plan
