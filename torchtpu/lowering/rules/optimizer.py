"""Optimizer paths: the ``_foreach_*`` ops and the fused Adam/AdamW/SGD/Adagrad kernels.

Each call is ONE program: a ``_foreach_*`` rule lowers the matching single-tensor op
(``_foreach_add.List`` -> ``aten.add.Tensor``) once per list element into the same
builder, and the fused rules write PyTorch's fused-kernel math for every parameter.
Hyper-parameters (lr, betas, ...) arrive as device scalar operands and the Adam step
count is read from the ``state_steps`` tensors inside the program, so repeated steps
reuse the compiled program.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch

from ...stablehlo.builder import Value, prod
from ...stablehlo.types import is_float
from ..context import NodeLowering, ScalarValue
from ..registry import register

aten = torch.ops.aten


# -- generic foreach -----------------------------------------------------------------------------
def _single_op(base: str, overload: str, element_args: Sequence[Any]) -> Any:
    """The single-tensor overload that ``_foreach_<base>.<overload>`` applies per element."""
    packet = getattr(aten, base)
    if overload == "default":
        return packet.default
    if base == "pow":
        if overload == "ScalarAndTensor":
            return packet.Scalar
        return (
            packet.Tensor_Tensor
            if isinstance(element_args[1], Value) and not isinstance(element_args[1], ScalarValue)
            else packet.Tensor_Scalar
        )
    if base in ("maximum", "minimum"):
        if overload == "List":
            return packet.default
        return aten.clamp_min.default if base == "maximum" else aten.clamp_max.default
    if base in ("clamp_min", "clamp_max"):
        return packet.Tensor if overload == "List" else packet.default
    if base in ("addcmul", "addcdiv"):
        return packet.default
    if base == "lerp":
        return packet.Tensor if overload == "List" else packet.Scalar
    # add / sub / mul / div
    other = element_args[1]
    return packet.Tensor if isinstance(other, Value) and not isinstance(other, ScalarValue) else packet.Scalar


def _is_per_element(x: Any, n: int) -> bool:
    return isinstance(x, (list, tuple)) and len(x) == n


def _element(x: Any, i: int, n: int) -> Any:
    return x[i] if _is_per_element(x, n) else x


def _foreach_rule(base: str, overload: str) -> Any:
    def rule(L: NodeLowering, *args: Any, **kwargs: Any) -> list[Value]:
        lists = [a for a in args if isinstance(a, (list, tuple))]
        n = len(lists[0]) if lists else 0
        outs = []
        for i in range(n):
            eargs = [_element(a, i, n) for a in args]
            ekwargs = {k: _element(v, i, n) for k, v in kwargs.items()}
            if overload == "Tensor" and base in ("addcmul", "addcdiv"):
                # one scalar per element, given as a 1-d device tensor
                s = eargs[3]
                s = L.b.reshape(L.b.slice(s, [i], [i + 1]), ()) if s.rank else s
                eargs[3] = ScalarValue(s.name, s.dtype, float if is_float(s.dtype) else int)
            op = _single_op(base, overload, eargs)
            if base in ("addcmul", "addcdiv") and len(eargs) > 3:
                ekwargs["value"] = eargs.pop(3)
            if base == "copy":
                ekwargs.pop("non_blocking", None)
                eargs = eargs[:2]
            outs.append(L.lower(op, *eargs, **ekwargs))
        return outs

    return rule


_FOREACH_SKIP = {"norm", "max", "mm", "powsum"}  # own rules below, or not supported


def _register_foreach() -> None:
    names = sorted({n[6:].split(".")[0] for n in torch._C._dispatch_get_all_op_names() if n.startswith("aten::_foreach_")})
    for name in names:
        if name.endswith("_"):
            continue
        base = name[len("_foreach_") :]
        if base in _FOREACH_SKIP or not hasattr(aten, base):
            continue
        packet = getattr(aten, name)
        for overload in packet.overloads():
            if "out" in overload:
                continue
            register(getattr(packet, overload))(_foreach_rule(base, overload))


_register_foreach()


def _lowest(dtype: torch.dtype) -> Any:
    if dtype is torch.bool:
        return False
    return float("-inf") if is_float(dtype) else torch.iinfo(dtype).min


def _highest(dtype: torch.dtype) -> Any:
    if dtype is torch.bool:
        return True
    return float("inf") if is_float(dtype) else torch.iinfo(dtype).max


def _reduce_all(L: NodeLowering, x: Value, kind: str) -> Value:
    b = L.b
    dtype = x.dtype
    if kind == "add":
        init = b.constant(0, dtype)
    elif kind == "maximum":
        init = b.constant(_lowest(dtype), dtype)
    else:
        init = b.constant(_highest(dtype), dtype)
    (r,) = b.reduce([x], [init], list(range(x.rank)), lambda a, y: [b.binary(kind, a, y)])
    return r


@register(aten._foreach_norm.Scalar, static_scalars=True)
def foreach_norm(L: NodeLowering, xs: list[Value], ord: Any = 2, dtype: torch.dtype | None = None) -> list[Value]:  # noqa: A002
    b = L.b
    outs = []
    p = float(ord)
    for x, spec in zip(xs, L.out, strict=True):
        out_dtype = spec.dtype
        cdt = torch.float32 if out_dtype in (torch.float16, torch.bfloat16) else out_dtype
        a = b.unary("abs", L.to(x, cdt))
        if p == float("inf"):
            r = _reduce_all(L, a, "maximum")
        elif p == float("-inf"):
            r = _reduce_all(L, a, "minimum")
        elif p == 0:
            r = _reduce_all(L, L.to(b.compare(a, L.zeros(a.shape, cdt), "NE"), cdt), "add")
        elif p == 1:
            r = _reduce_all(L, a, "add")
        elif p == 2:
            r = b.unary("sqrt", _reduce_all(L, b.binary("multiply", a, a), "add"))
        else:
            s = _reduce_all(L, b.binary("power", a, L.full(p, a.shape, cdt)), "add")
            r = b.binary("power", s, b.constant(1.0 / p, cdt))
        outs.append(L.to(r, out_dtype))
    return outs


@register(aten._foreach_max.default)
def foreach_max(L: NodeLowering, xs: list[Value]) -> list[Value]:
    return [_reduce_all(L, x, "maximum") for x in xs]


# -- fused optimizers ----------------------------------------------------------------------------
_meta_libs: list[Any] = []


def _register_missing_meta_kernels() -> None:
    """PyTorch has no Meta kernel for the in-place ``_fused_sgd_`` (and the tensor_lr
    Adam overloads), so the output metadata of their functional variants (composites
    over the in-place op) cannot be computed. The in-place op changes no metadata:
    register a no-op."""
    names = [
        "_fused_sgd_",
        "_fused_sgd_.tensor_lr",
        "_fused_adam_.tensor_lr",
        "_fused_adamw_.tensor_lr",
        "_fused_adagrad_",
        "_fused_adagrad_.tensor_lr",
    ]
    missing = [n for n in names if not torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{n}", "Meta")]
    if not missing:
        return
    lib = torch.library.Library("aten", "IMPL")

    def noop(*args: Any, **kwargs: Any) -> None:
        return None

    for n in missing:
        lib.impl(n, noop, "Meta")
    _meta_libs.append(lib)


_register_missing_meta_kernels()


def _opmath(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _s(L: NodeLowering, x: Any, dtype: torch.dtype) -> Value:
    """A 0-d Value of ``dtype`` from a number, a ScalarValue or a 1-element tensor Value."""
    if isinstance(x, Value):
        if x.rank:
            x = L.b.reshape(x, ())
        return L.to(x, dtype)
    return L.b.constant(x, dtype)


def _bc(L: NodeLowering, v: Value, shape: Sequence[int]) -> Value:
    return L.b.broadcast_in_dim(v, tuple(shape), [])


def _is_zero(x: Any) -> bool:
    return not isinstance(x, Value) and x == 0


def _unscale(L: NodeLowering, g: Value, grad_scale: Value | None, cdt: torch.dtype) -> Value:
    g = L.to(g, cdt)
    if grad_scale is not None:
        g = L.b.binary("divide", g, _bc(L, _s(L, grad_scale, cdt), g.shape))
    return g


def _skip(L: NodeLowering, found_inf: Value | None) -> Value | None:
    """0-d bool: True when found_inf says to skip the step."""
    if found_inf is None:
        return None
    f = _s(L, found_inf, torch.float32)
    return L.b.compare(f, L.b.constant(1, torch.float32), "EQ")


def _keep_if(L: NodeLowering, skip: Value | None, new: Value, old: Value) -> Value:
    if skip is None:
        return new
    return L.b.select(_bc(L, skip, new.shape), old, new)


class _ParamStep(NamedTuple):
    """One parameter's inputs to a fused optimizer step, in its opmath dtype."""

    param: Value
    grad: Value  # what the update reads: unscaled, negated for maximize, plus L2 weight decay
    unscaled: Value  # the unscaled gradient, which a GradScaler step writes back into grads
    const: Callable[[Any], Value]  # a number or 0-d value broadcast to the parameter


def _param_step(L: NodeLowering, p: Value, g: Value, grad_scale: Value | None, maximize: bool, weight_decay: Any) -> _ParamStep:
    """The prologue every fused kernel shares (``weight_decay`` 0: none, or decoupled)."""
    b, cdt, shape = L.b, _opmath(p.dtype), p.shape

    def const(x: Any) -> Value:
        return _bc(L, _s(L, x, cdt), shape)

    unscaled = _unscale(L, g, grad_scale, cdt)
    grad = b.unary("negate", unscaled) if maximize else unscaled
    param = L.to(p, cdt)
    if not _is_zero(weight_decay):
        grad = b.binary("add", grad, b.binary("multiply", param, const(weight_decay)))
    return _ParamStep(param, grad, unscaled, const)


def _grad_out(L: NodeLowering, skip: Value | None, g: Value, step: _ParamStep, grad_scale: Value | None) -> Value:
    """The grads entry after the step: unscaled in place when a GradScaler passed its scale."""
    return g if grad_scale is None else _keep_if(L, skip, L.to(step.unscaled, g.dtype), g)


def _fused_adam(
    L: NodeLowering,
    params: list[Value],
    grads: list[Value],
    exp_avgs: list[Value],
    exp_avg_sqs: list[Value],
    max_exp_avg_sqs: list[Value],
    state_steps: list[Value],
    *,
    lr: Any,
    beta1: Any,
    beta2: Any,
    weight_decay: Any,
    eps: Any,
    amsgrad: bool,
    maximize: bool,
    grad_scale: Value | None = None,
    found_inf: Value | None = None,
    adamw: bool,
) -> tuple[list[Value], ...]:
    b = L.b
    f64 = torch.float64 if L.ctx.supports_f64 else torch.float32
    skip = _skip(L, found_inf)
    new_p, new_g, new_m, new_v, new_vmax = [], [], [], [], []
    for i, (p, g, m, v, step) in enumerate(zip(params, grads, exp_avgs, exp_avg_sqs, state_steps, strict=True)):
        ps = _param_step(L, p, g, grad_scale, maximize, 0 if adamw else weight_decay)
        c, cdt, grad, param = ps.const, _opmath(p.dtype), ps.grad, ps.param

        # scalar math in double, like the kernels' host-side bias corrections
        step_d = _s(L, step, f64)
        one = b.constant(1, f64)
        bc1 = b.binary("subtract", one, b.binary("power", _s(L, beta1, f64), step_d))
        bc2 = b.binary("subtract", one, b.binary("power", _s(L, beta2, f64), step_d))
        step_size = b.binary("divide", _s(L, lr, f64), bc1)
        bc2_sqrt = b.unary("sqrt", bc2)

        if adamw and not _is_zero(weight_decay):  # decoupled: the parameter decays, not the gradient
            decay = b.binary("multiply", _s(L, lr, f64), _s(L, weight_decay, f64))
            param = b.binary("subtract", param, b.binary("multiply", param, c(decay)))
        m_c, v_c = L.to(m, cdt), L.to(v, cdt)
        one_c = c(1)
        # exp_avg.lerp_(grad, 1 - beta1); exp_avg_sq = beta2 * exp_avg_sq + (1 - beta2) * grad^2
        w1 = b.binary("subtract", one_c, c(beta1))
        m_new = b.binary("add", m_c, b.binary("multiply", w1, b.binary("subtract", grad, m_c)))
        w2 = b.binary("subtract", one_c, c(beta2))
        v_new = b.binary("add", b.binary("multiply", v_c, c(beta2)), b.binary("multiply", w2, b.binary("multiply", grad, grad)))
        if amsgrad:
            vmax_new = b.binary("maximum", L.to(max_exp_avg_sqs[i], cdt), v_new)
            denom_src = vmax_new
        else:
            denom_src = v_new
        denom = b.binary("add", b.binary("divide", b.unary("sqrt", denom_src), c(bc2_sqrt)), c(eps))
        p_new = b.binary("subtract", param, b.binary("multiply", c(step_size), b.binary("divide", m_new, denom)))

        new_p.append(_keep_if(L, skip, L.to(p_new, p.dtype), p))
        new_m.append(_keep_if(L, skip, L.to(m_new, m.dtype), m))
        new_v.append(_keep_if(L, skip, L.to(v_new, v.dtype), v))
        if amsgrad:
            vm = max_exp_avg_sqs[i]
            new_vmax.append(_keep_if(L, skip, L.to(vmax_new, vm.dtype), vm))
        new_g.append(_grad_out(L, skip, g, ps, grad_scale))
    if not amsgrad:
        new_vmax = list(max_exp_avg_sqs)
    return new_p, new_g, new_m, new_v, new_vmax


@register(aten._fused_adam.default, aten._fused_adam.tensor_lr)
def fused_adam(L: NodeLowering, *args: Any, **kwargs: Any) -> tuple[list[Value], ...]:
    return _fused_adam(L, *args, **kwargs, adamw=False)


@register(aten._fused_adamw.default, aten._fused_adamw.tensor_lr)
def fused_adamw(L: NodeLowering, *args: Any, **kwargs: Any) -> tuple[list[Value], ...]:
    return _fused_adam(L, *args, **kwargs, adamw=True)


@register(aten._fused_sgd.default, aten._fused_sgd.tensor_lr)
def fused_sgd(
    L: NodeLowering,
    params: list[Value],
    grads: list[Value],
    momentum_buffer_list: list[Value],
    *,
    weight_decay: Any,
    momentum: Any,
    lr: Any,
    dampening: Any,
    nesterov: bool,
    maximize: bool,
    is_first_step: bool,
    grad_scale: Value | None = None,
    found_inf: Value | None = None,
) -> tuple[list[Value], ...]:
    b = L.b
    skip = _skip(L, found_inf)
    use_momentum = not _is_zero(momentum) and len(momentum_buffer_list) == len(params)
    new_p, new_g, new_buf = [], [], []
    for i, (p, g) in enumerate(zip(params, grads, strict=True)):
        ps = _param_step(L, p, g, grad_scale, maximize, weight_decay)
        c, cdt, grad, param = ps.const, _opmath(p.dtype), ps.grad, ps.param
        if use_momentum:
            buf = momentum_buffer_list[i]
            if is_first_step:
                buf_new = grad
            else:
                damp = b.binary("subtract", c(1), c(dampening)) if not _is_zero(dampening) else None
                scaled = grad if damp is None else b.binary("multiply", grad, damp)
                buf_new = b.binary("add", b.binary("multiply", L.to(buf, cdt), c(momentum)), scaled)
            grad = b.binary("add", grad, b.binary("multiply", buf_new, c(momentum))) if nesterov else buf_new
            new_buf.append(_keep_if(L, skip, L.to(buf_new, buf.dtype), buf))
        p_new = b.binary("subtract", param, b.binary("multiply", c(lr), grad))
        new_p.append(_keep_if(L, skip, L.to(p_new, p.dtype), p))
        new_g.append(_grad_out(L, skip, g, ps, grad_scale))
    if not use_momentum:
        new_buf = list(momentum_buffer_list)
    return new_p, new_g, new_buf


@register(aten._fused_adagrad.default, aten._fused_adagrad.tensor_lr)
def fused_adagrad(
    L: NodeLowering,
    params: list[Value],
    grads: list[Value],
    state_sums: list[Value],
    state_steps: list[Value],
    *,
    lr: Any,
    lr_decay: Any,
    weight_decay: Any,
    eps: Any,
    maximize: bool,
    grad_scale: Value | None = None,
    found_inf: Value | None = None,
) -> tuple[list[Value], ...]:
    """``Adagrad(fused=True)``: the step count is already incremented by the optimizer."""
    b = L.b
    f64 = torch.float64 if L.ctx.supports_f64 else torch.float32
    skip = _skip(L, found_inf)
    new_p, new_g, new_sum = [], [], []
    for p, g, state_sum, step in zip(params, grads, state_sums, state_steps, strict=True):
        ps = _param_step(L, p, g, grad_scale, maximize, weight_decay)
        c, cdt, grad, param = ps.const, _opmath(p.dtype), ps.grad, ps.param
        # clr = lr / (1 + (step - 1) * lr_decay), in double as the kernel's host side
        one = b.constant(1, f64)
        decayed = b.binary("multiply", b.binary("subtract", _s(L, step, f64), one), _s(L, lr_decay, f64))
        clr = b.binary("divide", _s(L, lr, f64), b.binary("add", one, decayed))
        sum_new = b.binary("add", L.to(state_sum, cdt), b.binary("multiply", grad, grad))
        std = b.binary("add", b.unary("sqrt", sum_new), c(eps))
        p_new = b.binary("subtract", param, b.binary("divide", b.binary("multiply", c(clr), grad), std))
        new_p.append(_keep_if(L, skip, L.to(p_new, p.dtype), p))
        new_sum.append(_keep_if(L, skip, L.to(sum_new, state_sum.dtype), state_sum))
        new_g.append(_grad_out(L, skip, g, ps, grad_scale))
    return new_p, new_g, new_sum, list(state_steps)


# -- GradScaler (torch.amp.GradScaler("tpu")) -----------------------------------------------------
def _check_one_float(v: Value, name: str) -> None:
    """The checks of PyTorch's CPU kernels, with their messages."""
    if prod(v.shape) != 1:
        raise RuntimeError(f"{name} must be a 1-element tensor.")
    if v.dtype != torch.float32:
        raise RuntimeError(f"{name} must be a float tensor.")


@register(aten._amp_foreach_non_finite_check_and_unscale.default)
def amp_foreach_non_finite_check_and_unscale(
    L: NodeLowering, grads: list[Value], found_inf: Value, inv_scale: Value
) -> tuple[list[Value], Value]:
    """Each grad times inv_scale (in float32 for half types, like the CPU kernel's opmath);
    found_inf becomes 1.0 if any grad holds an inf or a NaN, and is otherwise left as it was."""
    _check_one_float(inv_scale, "inv_scale")
    _check_one_float(found_inf, "found_inf")
    b = L.b
    out, any_bad = [], None
    for g in grads:
        if not is_float(g.dtype):
            raise NotImplementedError(f'"_amp_foreach_non_finite_check_and_unscale_cpu" not implemented for {g.dtype}')
        cdt = _opmath(g.dtype)
        v = L.to(g, cdt)
        bad = L.any_true(b.unary("not", b.op1("stablehlo.is_finite", [v], v.shape, torch.bool)))
        any_bad = bad if any_bad is None else b.binary("or", any_bad, bad)
        out.append(L.to(b.binary("multiply", v, _bc(L, _s(L, inv_scale, cdt), v.shape)), g.dtype))
    if any_bad is None:
        return out, found_inf
    one = L.full(1.0, found_inf.shape, torch.float32)
    return out, b.select(_bc(L, any_bad, found_inf.shape), one, found_inf)


@register(aten._amp_update_scale.default)
def amp_update_scale(
    L: NodeLowering,
    scale: Value,
    growth_tracker: Value,
    found_inf: Value,
    growth_factor: Any,
    backoff_factor: Any,
    growth_interval: Any,
) -> tuple[Value, Value]:
    """PyTorch's _amp_update_scale_ CPU kernel: back off (and reset the tracker) after an
    inf/NaN step, otherwise count the step and grow the scale every growth_interval steps
    unless the grown scale would overflow float32. The products are taken in double, as
    the kernel's float * double does."""
    if prod(growth_tracker.shape) != 1:
        raise RuntimeError("growth_tracker must be a 1-element tensor.")
    if prod(scale.shape) != 1:
        raise RuntimeError("current_scale must be a 1-element tensor.")
    _check_one_float(found_inf, "found_inf")
    if growth_tracker.dtype != torch.int32:
        raise RuntimeError("growth_tracker must be an int tensor.")
    if scale.dtype != torch.float32:
        raise RuntimeError("current_scale must be a float tensor.")
    b = L.b
    wide = torch.float64 if L.ctx.supports_f64 else torch.float32
    shape, tshape = scale.shape, growth_tracker.shape
    found = b.compare(b.reshape(found_inf, shape), L.zeros(shape, torch.float32), "NE")  # NaN counts as found

    def times(factor: Any) -> Value:
        return L.to(b.binary("multiply", L.to(scale, wide), _bc(L, _s(L, factor, wide), shape)), torch.float32)

    backed_off, grown = times(backoff_factor), times(growth_factor)
    successful = b.binary("add", growth_tracker, L.full(1, tshape, torch.int32))
    grow_now = b.compare(successful, _bc(L, _s(L, growth_interval, torch.int32), tshape), "EQ")
    grow_now_s = b.reshape(grow_now, shape)
    can_grow = b.binary("and", grow_now_s, b.op1("stablehlo.is_finite", [grown], shape, torch.bool))
    new_scale = b.select(found, backed_off, b.select(can_grow, grown, scale))
    found_t = b.reshape(found, tshape)
    zero = L.zeros(tshape, torch.int32)
    new_tracker = b.select(found_t, zero, b.select(grow_now, zero, successful))
    return new_scale, new_tracker
