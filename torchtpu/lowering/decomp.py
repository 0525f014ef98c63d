"""Decompositions: PyTorch's tables for ops without a rule, plus our own (in ``OWN``)."""

from __future__ import annotations

import functools
import itertools
import math
from typing import Any

import torch

from . import registry

# Our own decompositions, for ops PyTorch's tables miss or decompose badly.
OWN: dict[Any, Any] = {}


def register_own(*ops: Any) -> Any:
    def deco(fn: Any) -> Any:
        for op in ops:
            OWN[op] = fn
        return fn

    return deco


@functools.cache
def _pytorch_tables() -> tuple[dict, dict]:
    from torch._decomp import core_aten_decompositions, decomposition_table

    return dict(core_aten_decompositions()), dict(decomposition_table)


def _fma(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    return a * b + c


# Ops made by libraries we do not import, found by name. Dynamo writes ``x.addcmul_(t1, t2,
# value=v)`` (every single-tensor Adam step) as inductor's ``prims.fma(t1 * t2, v, x)``
# whatever the backend (torch._dynamo.config.enable_dynamo_decompositions).
_BY_NAME = {"prims::fma": _fma}


def decomposition_for(op: Any) -> Any:
    """The decomposition used for ``op`` when it has no rule (None if there is none)."""
    if op in OWN:
        return OWN[op]
    if isinstance(op, torch._ops.OpOverload) and op.name() in _BY_NAME:
        return _BY_NAME[op.name()]
    core, full = _pytorch_tables()
    fn = core.get(op) or full.get(op)
    if fn is None and isinstance(op, torch._ops.OpOverload):
        # CompositeImplicitAutograd ops decompose through their own kernel when traced.
        if torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd"):
            return functools.partial(_composite_implicit, op)
        if _composite_explicit_on_tpu(op):
            return functools.partial(_composite_explicit, op)
    return None if fn is None else functools.partial(_plain_tuple, fn)


def _composite_explicit_on_tpu(op: torch._ops.OpOverload) -> bool:
    """Whether eager runs aten ``op`` on tpu through a composite kernel written in other aten
    ops (CompositeExplicitAutograd or ...NonFunctional), as CUDA does: ``cholesky_solve``,
    ``nn.Bilinear``'s ``_trilinear``, ``linalg_pinv``. A compiled graph keeps such an op
    whole (AOTAutograd decomposes only implicit composites), so its lowering traces that
    same kernel. Only aten's: another library's kernel (a ``custom_op``) is opaque Python,
    run as written (compile/backend.py ``opaque_custom_operators``)."""
    name = op.name()
    if op.namespace != "aten" or torch._C._dispatch_has_kernel_for_dispatch_key(name, "PrivateUse1"):
        return False  # a tpu kernel of our own (a host op) is what eager runs, not the composite
    return any(
        torch._C._dispatch_has_kernel_for_dispatch_key(name, key)
        for key in ("CompositeExplicitAutograd", "CompositeExplicitAutogradNonFunctional")
    )


# The key whose kernel eager runs: for an op without a tpu kernel of its own, the composite.
# (``_op_dk`` with the composite's alias key reaches the dispatcher's fallback, which
# recorded the op itself again under make_fx: a lowering that recursed without end.)
_TPU_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.PrivateUse1)


def _composite_explicit(op: Any, *args: Any, **kwargs: Any) -> Any:
    return op.redispatch(_TPU_KEYS, *args, **kwargs)


def _plain_tuple(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """PyTorch's decompositions may return a named tuple (aminmax, log_sigmoid_forward);
    tracing would record its constructor as a graph node: return a plain tuple instead."""
    out = fn(*args, **kwargs)
    if isinstance(out, tuple) and hasattr(out, "_fields"):
        return tuple(out)
    return out


def _composite_implicit(op: Any, *args: Any, **kwargs: Any) -> Any:
    return op.decompose(*args, **kwargs)


def has_decomposition(op: Any) -> bool:
    return decomposition_for(op) is not None


def tracing_table() -> dict:
    """What make_fx may decompose while tracing: every op that has no rule."""
    return _tracing_table(len(registry.RULES), len(OWN))


@functools.cache
def _tracing_table(_n_rules: int, _n_own: int) -> dict:
    core, full = _pytorch_tables()
    table = {**full, **core, **OWN}
    return {op: fn for op, fn in table.items() if op not in registry.RULES}


aten = torch.ops.aten

# Ops whose decomposition runs a torch.func transform (``_grad_through``): traced by our
# own make_fx when lowered (``lower_decomposition``), never inside AOTAutograd's trace,
# where the transform's wrapped tensors reach FakeTensorMode ("Please convert all Tensors
# to FakeTensors first": every compiled grid_sample backward, RAFT's). They keep their
# node in a compiled graph (PyTorch has their meta kernels) and are lowered like eager's.
_LOWERED_NOT_TRACED = (aten.grid_sampler_2d_backward.default, aten.grid_sampler_3d_backward.default)


def compile_table() -> dict:
    """What AOTAutograd may decompose while tracing a compiled graph: ``tracing_table``
    less the decompositions that must be traced by the lowering."""
    return _compile_table(len(registry.RULES), len(OWN))


@functools.cache
def _compile_table(_n_rules: int, _n_own: int) -> dict:
    table = {op: fn for op, fn in tracing_table().items() if op not in _LOWERED_NOT_TRACED}
    table.update(_COMPILE_ONLY)
    return table


def _pnorm_last(d: torch.Tensor, p: float) -> torch.Tensor:
    """The p-norm over the last dimension of differences ``d``, as torch.cdist defines it."""
    if p == 0:
        return (d != 0).to(d.dtype).sum(-1)
    if p == float("inf"):
        return d.abs().amax(-1)
    if p == 1:
        return d.abs().sum(-1)
    if p == 2:
        return (d * d).sum(-1).sqrt()
    return d.abs().pow(p).sum(-1).pow(1.0 / p)


@register_own(aten._cdist_forward.default)
def _cdist_forward(x1: torch.Tensor, x2: torch.Tensor, p: float, compute_mode: Any = None) -> torch.Tensor:
    # Direct differences: exact like the CPU kernel's p != 2 path (and more accurate than
    # the matmul formulation the CPU may pick for p == 2).
    return _pnorm_last(x1.unsqueeze(-2) - x2.unsqueeze(-3), p)


@register_own(aten._pdist_forward.default)
def _pdist_forward(x: torch.Tensor, p: float = 2.0) -> torch.Tensor:
    n = x.shape[0]
    if n < 2:
        return x.new_zeros((0,))
    full = _pnorm_last(x.unsqueeze(1) - x.unsqueeze(0), p)
    # the strict upper triangle, row by row (static slices: no index tensor needed)
    return torch.cat([full[i, i + 1 :] for i in range(n - 1)])


@register_own(aten._cdist_backward.default)
def _cdist_backward(grad: torch.Tensor, x1: torch.Tensor, x2: torch.Tensor, p: float, dist: torch.Tensor) -> torch.Tensor:
    """d cdist / d x1, like the CPU kernel: pairs at distance 0 contribute nothing."""
    d = x1.unsqueeze(-2) - x2.unsqueeze(-3)  # [..., n1, n2, m]
    if d.numel() == 0:  # the CPU kernel's answer for empty inputs
        return torch.zeros_like(x1)
    dist = dist.unsqueeze(-1)
    g = grad.unsqueeze(-1)
    if p == 0:
        return torch.zeros_like(x1)
    if p == 1:
        w = d.sign()
    elif p == float("inf"):
        w = d.sign() * (d.abs() == dist).to(d.dtype)
    elif p == 2:
        w = d / dist
    else:
        w = d.sign() * d.abs().pow(p - 1) / dist.pow(p - 1)
    w = torch.where(dist == 0, torch.zeros_like(w), w)
    # like the CPU kernel, the result has the *broadcast* batch shape (autograd then sums
    # it to x1's shape); summing here as well would count broadcast batches twice
    return (g * w).sum(-2)


# -- shrink backward ---------------------------------------------------------------------------
# PyTorch has no decomposition for these (and the dispatcher would otherwise land on their
# out= overload, softshrink_backward.grad_input, which nothing implements).
@register_own(aten.softshrink_backward.default, aten.hardshrink_backward.default)
def _shrink_backward(grad: torch.Tensor, x: torch.Tensor, lambd: float) -> torch.Tensor:
    # the CPU kernels: (x >= -lambd && x <= lambd) ? 0 : grad (so NaN passes the gradient)
    inside = (x >= -lambd) & (x <= lambd)
    return torch.where(inside, torch.zeros((), dtype=grad.dtype, device=grad.device), grad)


# -- _efficientzerotensor ---------------------------------------------------------------------------
@register_own(aten._efficientzerotensor.default)
def _efficientzerotensor(size: Any, *, dtype: Any = None, layout: Any = None, device: Any = None, pin_memory: Any = None) -> torch.Tensor:
    """Autograd's zero gradient (sgn/sign of real inputs, ...): a plain zero tensor on
    tpu (no ZeroTensor dispatch key: the values are what matters). The device is the
    program's, so the traced factory is left on the default device."""
    return torch.zeros(size, dtype=dtype)


def _efficientzerotensor_on_its_device(
    size: Any, *, dtype: Any = None, layout: Any = None, device: Any = None, pin_memory: Any = None
) -> torch.Tensor:
    """The same zeros in a compiled graph, which AOTAutograd traces on fake tensors of the
    real device: there the factory must keep its device, or the graph returns a CPU tensor
    (a compiled ``torch.sgn``'s backward: "CompiledFunctionBackward returned an invalid
    gradient at index 0 - expected device tpu:0 but got cpu")."""
    return torch.zeros(size, dtype=dtype, device=device)


# Decompositions for AOTAutograd's trace of a compiled graph that differ from the lowering's.
_COMPILE_ONLY = {aten._efficientzerotensor.default: _efficientzerotensor_on_its_device}


# -- _pdist_backward --------------------------------------------------------------------------------
def _condensed_to_square(v: torch.Tensor, n: int) -> torch.Tensor:
    """pdist's condensed vector (the strict upper triangle, row by row) as a symmetric
    n x n matrix with a zero diagonal (static slices, like _pdist_forward)."""
    rows, start = [], 0
    for i in range(n):
        k = n - i - 1
        rows.append(torch.cat([v.new_zeros((i + 1,)), v[start : start + k]]))
        start += k
    upper = torch.stack(rows)
    return upper + upper.t()


@register_own(aten._pdist_backward.default)
def _pdist_backward(grad: torch.Tensor, x: torch.Tensor, p: float, pdist: torch.Tensor) -> torch.Tensor:
    """d pdist / d x: x_i gets sum_j g_ij * w(x_i - x_j) over both orders of each pair,
    which is cdist's backward with x against itself and the gradient (and distances)
    laid out as symmetric matrices; the CPU's rules (dist 0 -> 0, p = 0/1/2/inf) apply."""
    n = x.shape[0]
    if n < 2 or x.shape[1] == 0:
        return torch.zeros_like(x)
    return _cdist_backward(_condensed_to_square(grad, n), x, x, p, _condensed_to_square(pdist, n))


# -- backwards as autograd through the forward's decomposition ------------------------------------
def _grad_through(forward: Any, inputs: list[torch.Tensor], wanted: list[bool], grad_out: torch.Tensor) -> list[Any]:
    """The gradients of ``forward(*inputs)`` for the wanted inputs, by running autograd
    over PyTorch's decomposition of the forward inside the trace (the traced graph then
    holds the backward's plain ops). None for the inputs not wanted."""
    _, vjp = torch.func.vjp(forward, *inputs)  # a functorch transform: the trace is one too
    grads = vjp(grad_out)
    return [g if w else None for g, w in zip(grads, wanted)]


@register_own(aten.grid_sampler_2d_backward.default, aten.grid_sampler_3d_backward.default)
def _grid_sampler_backward(
    grad: torch.Tensor, x: torch.Tensor, grid: torch.Tensor, mode: int, padding: int, align_corners: bool, mask: list[bool]
) -> tuple[Any, Any]:
    """Bilinear and nearest (2-d and 3-d): autograd through ``_grid_sample`` (the CPU's
    gradient at the borders); 2-d bicubic, whose taps are clipped as integers: through
    PyTorch's decomposition."""
    from torch._decomp.decompositions import grid_sampler_2d

    forward = _grid_sample if mode in (_BILINEAR, _NEAREST) else grid_sampler_2d
    gx, gg = _grad_through(lambda a, g: forward(a, g, mode, padding, align_corners), [x, grid], list(mask), grad)
    return gx, gg if gg is not None else torch.zeros_like(grid)


_BILINEAR, _NEAREST = 0, 1  # grid_sampler's interpolation modes
_ZEROS, _REFLECTION = 0, 2  # and padding modes


def _source_position(coord: torch.Tensor, size: int, padding: int, align_corners: bool) -> torch.Tensor:
    """A normalized grid coordinate as a position in an input of ``size`` pixels: the CPU
    kernel's arithmetic (GridSamplerKernel.cpp), then border or reflection padding. A
    padded position passes gradient only strictly inside [0, size - 1]: the CPU and CUDA
    kernels count the borders as outside when they clip (``clip_coordinates_set_grad``), so
    a grid point exactly on the border -- every edge pixel of an identity affine_grid --
    gets none (a clamp would pass the interpolation's slope there)."""
    pos = (coord + 1) * ((size - 1) / 2) if align_corners else (coord + 1) * (size / 2) - 0.5
    if padding == _ZEROS:
        return pos
    if padding == _REFLECTION:
        pos = _reflect(pos, 0.0 if align_corners else -0.5, (size - 1) if align_corners else size - 0.5)
    inside = (pos > 0) & (pos < size - 1)
    return torch.where(inside, pos, pos.detach().clamp(0, size - 1))


def _reflect(pos: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """Reflect ``pos`` into [low, high] (the decomposition's reflect_coordinates)."""
    span = high - low
    if span == 0:
        return torch.zeros_like(pos)
    dist = (pos - low).abs()
    extra = torch.fmod(dist, span)
    odd = torch.floor(dist / span).remainder(2) == 1
    return torch.where(odd, high - extra, low + extra)


@register_own(aten.grid_sampler_3d.default)
def _grid_sample(x: torch.Tensor, grid: torch.Tensor, mode: int, padding: int, align_corners: bool) -> torch.Tensor:
    """Bilinear/trilinear (mode 0) or nearest (mode 1, ties to even) sampling of ``x``
    (N, C, *spatial: 2 or 3 dims) at ``grid`` (N, *out, k: x, y[, z] in [-1, 1]), as gathers
    of the 2^k (or 1) taps around each position; a tap outside the input reads zero."""
    if x.dtype in (torch.float16, torch.bfloat16):  # positions and weights in float32, as CUDA's opmath
        return _grid_sample(x.float(), grid.float(), mode, padding, align_corners).to(x.dtype)
    k = x.dim() - 2
    torch._check(
        k in (2, 3) and grid.dim() == x.dim() and grid.shape[-1] == k and x.shape[0] == grid.shape[0],
        lambda: "grid_sampler: bad shapes",
    )
    torch._check(mode in (_BILINEAR, _NEAREST), lambda: "grid_sampler(): bicubic interpolation only supports 4D input")
    n, c, sizes = x.shape[0], x.shape[1], list(x.shape[2:])  # (D,) H, W
    out_shape = grid.shape[1:-1]
    # positions per spatial dim, outermost first; grid's last axis runs innermost first (x, y, z)
    pos = [_source_position(grid[..., k - 1 - d], sizes[d], padding, align_corners) for d in range(k)]
    flat = x.reshape(n, c, -1)

    def tap(idx: list[torch.Tensor], weight: torch.Tensor) -> torch.Tensor:
        inside, index = None, None
        for i, size in zip(idx, sizes):
            ok = (i >= 0) & (i < size)
            inside = ok if inside is None else inside & ok
            i = i.clamp(0, size - 1)
            index = i if index is None else index * size + i
        values = flat.gather(2, index.reshape(n, 1, -1).expand(n, c, -1)).reshape(n, c, *out_shape)
        return values * torch.where(inside, weight, 0).unsqueeze(1)

    if mode == _NEAREST:
        return tap([p.round().long() for p in pos], torch.ones_like(pos[0]))
    lows = [p.floor() for p in pos]
    fracs = [p - lo for p, lo in zip(pos, lows)]
    lows = [lo.long() for lo in lows]
    out = None
    for corner in itertools.product((0, 1), repeat=k):
        weight = None
        for bit, f in zip(corner, fracs):
            w = f if bit else 1 - f
            weight = w if weight is None else weight * w
        term = tap([lo + bit for lo, bit in zip(lows, corner)], weight)
        out = term if out is None else out + term
    return out


@register_own(aten.affine_grid_generator.default)
def _affine_grid_generator(theta: torch.Tensor, size: list[int], align_corners: bool) -> torch.Tensor:
    """The CPU's affine grid, with its arithmetic: the base grid from ``linspace(-1, 1, n)``
    (times (n - 1), over n without align_corners), then one batched matmul with theta.
    PyTorch's decomposition builds the base grid as ``linspace(-a, a, n)``, a rounding
    apart: for an identity theta (a spatial transformer at its init) the grid differed from
    the CPU's by an ulp, and grid_sample's gradient, which jumps at integer positions, then
    took the other side at many pixels."""
    n, spatial = size[0], list(size[2:])  # (D,) H, W
    k = len(spatial)
    axes = []
    for d, steps in enumerate(reversed(spatial)):  # x (width) first, as the grid's last axis
        if steps == 1:  # (sizes are positive: F.affine_grid checks)
            line = torch.zeros(1, dtype=theta.dtype)
        else:
            line = torch.linspace(-1, 1, steps, dtype=theta.dtype)
            if not align_corners:
                line = line * (steps - 1) / steps
        shape = [1] * k
        shape[k - 1 - d] = steps
        axes.append(line.reshape(shape).expand(spatial))
    base = torch.stack([*axes, torch.ones(spatial, dtype=theta.dtype)], dim=-1)
    grid = base.reshape(1, -1, k + 1).expand(n, -1, -1).bmm(theta.transpose(1, 2))
    return grid.reshape(n, *spatial, k)


def _multi_margin_loss_shape(x: torch.Tensor, target: torch.Tensor, reduction: int) -> tuple[int, ...]:
    """The CPU kernel's loss shape: one value per sample unreduced, none (0-dim) when reduced
    or when the target is a 0-dim class index (of a vector input)."""
    return (x.shape[0] if x.dim() == 2 else 1,) if reduction == 0 and target.dim() > 0 else ()


@register_own(aten.multi_margin_loss.default)
def _multi_margin_loss(
    x: torch.Tensor, target: torch.Tensor, p: Any = 1, margin: Any = 1, weight: Any = None, reduction: int = 1
) -> torch.Tensor:
    """PyTorch's decomposition, in the CPU kernel's shape: it gives a vector input's
    unreduced loss against a 0-dim target the shape [1] (the CPU: [])."""
    from torch._decomp import decomposition_table

    loss = decomposition_table[aten.multi_margin_loss.default](x, target, p, margin, weight, reduction)
    return loss.reshape(_multi_margin_loss_shape(x, target, reduction))


@registry.register_meta(aten.multi_margin_loss.default)
def _multi_margin_loss_meta(
    x: torch.Tensor, target: torch.Tensor, p: Any = 1, margin: Any = 1, weight: Any = None, reduction: int = 1
) -> torch.Tensor:
    return x.new_empty(_multi_margin_loss_shape(x, target, reduction))


@register_own(aten.multi_margin_loss_backward.default)
def _multi_margin_loss_backward(
    grad: torch.Tensor, x: torch.Tensor, target: torch.Tensor, p: Any, margin: Any, weight: Any = None, reduction: int = 1
) -> torch.Tensor:
    (gx,) = _grad_through(lambda a: _multi_margin_loss(a, target, p, margin, weight, reduction), [x], [True], grad)
    return gx


@register_own(aten.multilabel_margin_loss_forward.default)
def _multilabel_margin_loss_forward(x: torch.Tensor, target: torch.Tensor, reduction: int) -> tuple[torch.Tensor, torch.Tensor]:
    """PyTorch's decomposition, with the fix it lacks: the target slots after the first -1
    must not count (it gathers input[0] for them and adds their hinge terms, so any row
    shorter than ``dim`` targets gives a wrong loss)."""
    shape = target.shape
    x2, t2 = torch.atleast_2d(x), torch.atleast_2d(target)
    dim = x2.shape[1]
    idx = torch.arange(dim, device=t2.device)
    end = torch.amin(torch.where(t2 == -1, idx, dim), dim=-1, keepdim=True)
    valid = idx < end  # (N, dim): the target slots that count
    u = torch.gather(x2, -1, torch.where(valid, t2, 0))  # input at each target
    is_target = torch.any(idx == torch.where(valid, t2, -1).unsqueeze(-1), dim=1)  # (N, dim)
    z = (1.0 - u.T.unsqueeze(-1) + x2).clamp_min(0) / dim  # (slot, N, class)
    z = torch.where(is_target | ~valid.T.unsqueeze(-1), 0, z)
    if reduction == 1:
        loss = z.sum(dim=(0, -1)).mean()
    elif reduction == 2:
        loss = z.sum()
    else:
        loss = z.sum(dim=(0, -1))
        if x.dim() < 2:
            loss = loss.reshape(())
    return loss, is_target.to(x.dtype).reshape(shape)


@registry.register_meta(aten.multilabel_margin_loss_forward.default)
def _multilabel_margin_loss_forward_meta(x: torch.Tensor, target: torch.Tensor, reduction: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The CPU kernel's result shapes: an unreduced loss has one value per row of a matrix
    and none (a 0-dim tensor) for a vector. PyTorch's meta function (its decomposition) gives
    a vector's unreduced loss the shape [1], so the eager result had it too."""
    loss_shape = (x.shape[0],) if reduction == 0 and x.dim() == 2 else ()
    return x.new_empty(loss_shape), x.new_empty(target.shape)


@register_own(aten.multilabel_margin_loss_backward.default)
def _multilabel_margin_loss_backward(grad: torch.Tensor, x: torch.Tensor, target: torch.Tensor, reduction: int, is_target: torch.Tensor) -> torch.Tensor:
    (gx,) = _grad_through(lambda a: _multilabel_margin_loss_forward(a, target, reduction)[0], [x], [True], grad)
    return gx


def _fractional_starts(sample: torch.Tensor, size: int, out: int, pool: int) -> torch.Tensor:
    """The window starts of fractional max pooling for each plane's ``sample`` (CPU kernel's
    generate_intervals, in the sample's dtype: ``alpha = (size - pool) / (out - 1)``, start
    ``i`` is ``int((i + sample) * alpha) - int(sample * alpha)``, the last ``size - pool``)."""
    dt = sample.dtype
    steps = torch.arange(out - 1, device=sample.device).to(dt)
    if out > 1:
        alpha = torch.full((), size - pool, dtype=dt, device=sample.device) / torch.full((), out - 1, dtype=dt, device=sample.device)
        s = sample.unsqueeze(-1)
        starts = torch.trunc((steps + s) * alpha).to(torch.int64) - torch.trunc(s * alpha).to(torch.int64)
    else:
        starts = torch.zeros((*sample.shape, 0), dtype=torch.int64, device=sample.device)
    last = torch.full((*sample.shape, 1), size - pool, dtype=torch.int64, device=sample.device)
    return torch.cat([starts, last], dim=-1)


def _fractional_max_pool(x: torch.Tensor, kernel_size: Any, output_size: Any, samples: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fractional_max_pool2d/3d: the max of each window and its index in the plane. The CPU
    kernel keeps the first of equal maxima, and the last NaN of a window (``val > max ||
    isnan(val)``); a window of -inf gives its first position. Samples: one per spatial
    dim and plane, the first for the last dim in 2-d (W, H), in order in 3-d (T, H, W)."""
    k = len(output_size)
    spatial = list(x.shape[-k:])
    for o, kk, n in zip(output_size, kernel_size, spatial):
        if o + kk - 1 > n:
            raise RuntimeError(f"fractional_max_pool{k}d(): pool size {kk} too large relative to input size {n} for output size {o}")
    batched = x.dim() == k + 2
    xb = x if batched else x.unsqueeze(0)
    n, c = xb.shape[:2]
    samples = samples[:n].reshape(n, c, k)  # the CPU kernel reads the first n rows: more may be given
    order = [1, 0] if k == 2 else [0, 1, 2]  # which sample goes with which spatial dim
    flat = torch.zeros((), dtype=torch.int64, device=x.device)
    strides = [1] * k
    for d in range(k - 2, -1, -1):
        strides[d] = strides[d + 1] * spatial[d + 1]
    for d in range(k):  # the plane index of every (output position, window offset)
        starts = _fractional_starts(samples[..., order[d]], spatial[d], output_size[d], kernel_size[d])  # (n, c, out_d)
        pos = starts.unsqueeze(-1) + torch.arange(kernel_size[d], device=x.device)  # (n, c, out_d, k_d)
        shape = [n, c] + [1] * (2 * k)
        shape[2 + d], shape[2 + k + d] = output_size[d], kernel_size[d]
        flat = flat + (pos * strides[d]).reshape(shape)
    window = math.prod(kernel_size)
    idx = flat.reshape(n, c, *output_size, window)
    vals = xb.reshape(n, c, -1).gather(2, idx.reshape(n, c, -1)).reshape(idx.shape)
    nan = torch.isnan(vals)
    first_max = torch.argmax(torch.where(nan, float("-inf"), vals), dim=-1, keepdim=True)
    last_nan = window - 1 - torch.argmax(nan.flip(-1).to(torch.int32), dim=-1, keepdim=True)
    choice = torch.where(nan.any(-1, keepdim=True), last_nan, first_max)
    out, indices = vals.gather(-1, choice).squeeze(-1), idx.gather(-1, choice).squeeze(-1)
    return (out, indices) if batched else (out.squeeze(0), indices.squeeze(0))


@register_own(aten.fractional_max_pool2d.default, aten.fractional_max_pool3d.default)
def _fractional_max_pool_nd(x: torch.Tensor, kernel_size: Any, output_size: Any, samples: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return _fractional_max_pool(x, list(kernel_size), list(output_size), samples)


@register_own(aten.fractional_max_pool2d_backward.default, aten.fractional_max_pool3d_backward.default)
def _fractional_max_pool_backward(grad: torch.Tensor, x: torch.Tensor, kernel_size: Any, output_size: Any, indices: torch.Tensor) -> torch.Tensor:
    """Each output's gradient added at its max's position in the plane."""
    k = len(output_size)
    lead = x.shape[:-k]
    planes = math.prod(lead)
    out = torch.zeros(planes, math.prod(x.shape[-k:]), dtype=grad.dtype, device=grad.device)
    out = out.scatter_add(1, indices.reshape(planes, -1), grad.reshape(planes, -1))
    return out.reshape(x.shape)


def _same_shape_meta(grad: torch.Tensor, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    return x.new_empty(x.shape)


_META = torch.library.Library("aten", "IMPL")


def meta_where_missing(name: str, fn: Any) -> None:
    """Register ``fn`` as the Meta kernel of ``aten::name`` unless PyTorch has one: the eager
    path takes a result's shape from it."""
    if not torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{name}", "Meta"):
        _META.impl(name, fn, "Meta")


# PyTorch has no Meta kernel for these backwards (the gradient has the input's shape)
for _name in ("multi_margin_loss_backward", "multilabel_margin_loss_backward", "fractional_max_pool3d_backward"):
    meta_where_missing(_name, _same_shape_meta)


# registered on import: fake quantization (quantization-aware training), the fast paths
# of nn.MultiheadAttention and nn.TransformerEncoderLayer, and jagged nested tensors
from . import decomp_nested, decomp_quant, decomp_transformer  # noqa: E402, F401
