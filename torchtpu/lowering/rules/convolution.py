"""Convolutions: ``aten.convolution`` (and the ``_convolution`` / ``convolution_overrideable``
entry points PrivateUse1 tensors reach), transposed convolutions and ``convolution_backward``.

Everything is one ``stablehlo.convolution`` with PyTorch's layouts (``NC<spatial>`` inputs,
``OI<spatial>`` weights). The backward passes and the transposed convolution are the
transposes of a regular convolution, expressed as convolutions exactly as JAX's
``_conv_general_dilated_transpose_lhs/rhs`` do. 16-bit inputs accumulate in f32.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ...stablehlo.builder import Value, i64_array
from ..context import NodeLowering
from ..registry import register
from .reduction import acc_dtype

aten = torch.ops.aten

_LOW_PRECISION = (torch.bfloat16, torch.float16)


def _dil(size: int, d: int) -> int:
    """Size of a dimension of ``size`` elements dilated by ``d``."""
    return 0 if size == 0 else 1 + d * (size - 1)


def _spec(layout: str, nsp: int) -> str:
    """``"bf"`` -> ``[b, f, 0, 1]``; ``"fb"`` -> ``[f, b, 0, 1]`` (first two dims, then spatial)."""
    return "[" + ", ".join([*layout, *(str(i) for i in range(nsp))]) + "]"


def conv_general(
    L: NodeLowering,
    lhs: Value,
    rhs: Value,
    out_spatial: Sequence[int],
    *,
    strides: Sequence[int],
    padding: Sequence[tuple[int, int]],
    lhs_dilation: Sequence[int],
    rhs_dilation: Sequence[int],
    feature_groups: int = 1,
    batch_groups: int = 1,
    lhs_layout: str = "bf",
    rhs_layout: str = "oi",
    out_layout: str = "bf",
    out_dtype: torch.dtype | None = None,
    reversed_kernel: bool = False,
) -> Value:
    """One ``stablehlo.convolution``. Layout strings name the first two dimensions of each
    operand (the rest are spatial, in order); ``reversed_kernel``: the kernel is read
    reversed along its spatial dims (an input gradient's). Returns ``out_dtype`` (default:
    lhs dtype); 16-bit inputs accumulate in f32."""
    nsp = lhs.rank - 2
    out_dtype = out_dtype or lhs.dtype
    if lhs.dtype != rhs.dtype:
        common = torch.promote_types(lhs.dtype, rhs.dtype)
        lhs, rhs = L.to(lhs, common), L.to(rhs, common)
    acc = torch.float32 if lhs.dtype in _LOW_PRECISION else lhs.dtype
    # output shape: out_layout's first two dims come from lhs batch / rhs output feature
    lb = lhs.shape[lhs_layout.index("b")]
    ro = rhs.shape[rhs_layout.index("o")]
    first = {"b": lb // batch_groups, "f": ro}
    shape = [first[out_layout[0]], first[out_layout[1]], *out_spatial]
    window = _Window(tuple(out_spatial), tuple(strides), tuple(tuple(p) for p in padding), tuple(lhs_dilation),
                     tuple(rhs_dilation), reversed_kernel)
    ungrouped_on_cpu = L.ctx.platform == "cpu" and feature_groups * batch_groups == 1
    plan = _cpu_plan(lhs, rhs, window, lhs_layout, rhs_layout, shape) if ungrouped_on_cpu else None
    if plan is not None:
        return L.to(plan(L, lhs, rhs, window, lhs_layout, rhs_layout, out_layout, acc), out_dtype)
    if reversed_kernel:
        rhs = _reverse(L, rhs, range(2, 2 + nsp))
    prec = L.ctx.precision
    pad = ", ".join(f"[{int(lo)}, {int(hi)}]" for lo, hi in padding)
    attrs = (
        f"batch_group_count = {batch_groups} : i64, "
        f"dimension_numbers = #stablehlo.conv<{_spec(lhs_layout, nsp)}x{_spec(rhs_layout, nsp)}->{_spec(out_layout, nsp)}>, "
        f"feature_group_count = {feature_groups} : i64, "
        f"lhs_dilation = {i64_array(lhs_dilation)}, "
        f"padding = dense<[{pad}]> : tensor<{nsp}x2xi64>, "
        f"rhs_dilation = {i64_array(rhs_dilation)}, "
        f"window_strides = {i64_array(strides)}, "
        f"precision_config = [#stablehlo<precision {prec}>, #stablehlo<precision {prec}>]"
    )
    if nsp == 0:
        attrs = attrs.replace(f"padding = dense<[]> : tensor<{nsp}x2xi64>, ", "")
    r = L.b.op1("stablehlo.convolution", [lhs, rhs], shape, acc, attrs)
    return L.to(r, out_dtype)


@dataclass(frozen=True)
class _Window:
    """Where a convolution's kernel goes over its (padded, dilated) image."""

    out_spatial: tuple[int, ...]
    strides: tuple[int, ...]
    padding: tuple[tuple[int, int], ...]
    lhs_dilation: tuple[int, ...]
    rhs_dilation: tuple[int, ...]
    reversed_kernel: bool = False  # the kernel read reversed along its spatial dims


# A dot's intermediate (patches, or the overlap-add's products) of at most this many
# elements may replace a convolution on the cpu platform; past it the native convolution
# keeps the memory down.
_MAX_INTERMEDIATE_ELEMENTS = 1 << 24


def _cpu_plan(
    lhs: Value, rhs: Value, window: _Window, lhs_layout: str, rhs_layout: str, out_shape: Sequence[int]
) -> Callable[..., Value] | None:
    """How an ungrouped convolution runs fastest on XLA's CPU client: as patches and one dot
    (_conv_as_patches), as one dot and an overlap-add (_conv_as_overlap_add), or natively
    (None). Measured on ResNet-18's last stages (3x3 kernels, 256-512 channels, 2x2-4x4
    maps), a dot wins in two cases:

    - XLA would swap the operands (_swapped_on_cpu): Eigen then ran a 512-channel 3x3
      convolution on 2x2 maps in 51 ms, the patches and dot in 2 ms;
    - the dot's intermediate is no larger than the kernel and the output together: the
      native path copies both anyway (Eigen wants the kernel HWIO and writes the output
      NHWC; a weight gradient's [512, 512, 3, 3] output took 4.6 ms to transpose), while
      the dots read the kernel as it is stored and write a weight gradient in place.
    """
    features = lhs.shape[lhs_layout.index("f")]
    batch = lhs.shape[lhs_layout.index("b")]
    kernel_positions, rhs_size = math.prod(rhs.shape[2:]), math.prod(rhs.shape)
    plans = {_conv_as_patches: batch * features * kernel_positions * math.prod(window.out_spatial)}
    if rhs_layout == "io":  # the patches' dot would copy this kernel into [O, I*Q] first
        plans[_conv_as_patches] += rhs_size
        plans[_conv_as_overlap_add] = batch * math.prod(lhs.shape[2:]) * rhs.shape[1] * kernel_positions
    plan, cost = min(plans.items(), key=lambda item: item[1])
    if not 0 < cost <= _MAX_INTERMEDIATE_ELEMENTS:
        return None
    return plan if cost <= rhs_size + math.prod(out_shape) or _swapped_on_cpu(lhs, rhs, window) else None


def _swapped_on_cpu(lhs: Value, rhs: Value, window: _Window) -> bool:
    """Whether XLA's CPU pipeline would swap this convolution's operands (its
    ConvOperandSwapper: the kernel becomes the image when the kernel's window has more
    positions than the image, as a 3x3 kernel over 2x2 feature maps). Mirrors the swapper's
    test on each spatial dim: dims where the window covers the whole image without padding
    do not count."""
    window_product = swapped_product = 1
    for j, (size, n) in enumerate(zip(rhs.shape[2:], lhs.shape[2:])):
        stride, lhs_dil = window.strides[j], window.lhs_dilation[j]
        plain = window.padding[j] == (0, 0) and window.rhs_dilation[j] == 1
        if plain and ((lhs_dil == size and stride == size - 1) or (size == n and lhs_dil == 1 and stride == 1)):
            continue
        window_product *= size
        full_pad = n == 1 and stride == 1 and window.rhs_dilation[j] == 1 and window.padding[j] == (size - 1, size - 1)
        swapped_product *= size if full_pad else n
    return window_product > swapped_product


def _conv_as_patches(
    L: NodeLowering, lhs: Value, rhs: Value, window: _Window, lhs_layout: str, rhs_layout: str, out_layout: str,
    acc: torch.dtype,
) -> Value:
    """The convolution as one dot over patches (im2col): the image's [B, I, Q, P] patch
    matrix (Q kernel positions, P output positions) contracted with the kernel's [O, I*Q]
    over I*Q. Ungrouped only; returns ``acc``."""
    b = L.b
    nsp = lhs.rank - 2
    sp = list(range(2, 2 + nsp))
    if lhs_layout == "fb":
        lhs = b.transpose(lhs, [1, 0, *sp])
    if window.reversed_kernel:
        rhs = _reverse(L, rhs, sp)
    if rhs_layout == "io":
        rhs = b.transpose(rhs, [1, 0, *sp])
    batch, o = lhs.shape[0], rhs.shape[0]
    patches = _patches(L, lhs, rhs.shape[2:], window)
    patches = b.reshape(patches, (batch, patches.shape[1] * patches.shape[2], patches.shape[3]))
    # [O, I*Q] is a bitcast of the OIHW kernel: with two contracting dims XLA's CPU pipeline
    # would first copy the kernel into [I*Q, O] (a transposing copy slower than the dot)
    kernel = b.reshape(rhs, (o, patches.shape[1]))
    prec = L.ctx.precision
    if out_layout == "fb":  # a weight gradient: [O, B, P] is its OIHW layout already
        y = b.dot_general(kernel, patches, [1], [1], out_dtype=acc, precision=prec)
        return b.reshape(y, (o, batch, *window.out_spatial))
    y = b.dot_general(patches, kernel, [1], [1], out_dtype=acc, precision=prec)  # [B, P, O]
    return b.reshape(b.transpose(y, [0, 2, 1]), (batch, o, *window.out_spatial))


def _conv_as_overlap_add(
    L: NodeLowering, lhs: Value, rhs: Value, window: _Window, lhs_layout: str, rhs_layout: str, out_layout: str,
    acc: torch.dtype,
) -> Value:
    """The convolution of an "io" kernel (an input gradient's) as one dot and an overlap-add
    (col2im): every image position times the kernel's [I, O*Q] (a bitcast, so the kernel is
    read as stored, reversed or not), then the Q products each padded and dilated like the
    image, sliced at their kernel position and summed. Ungrouped only; returns ``acc``."""
    assert rhs_layout == "io", rhs_layout
    b = L.b
    nsp = lhs.rank - 2
    batch, image = lhs.shape[lhs_layout.index("b")], lhs.shape[2:]
    i, o, kernel = rhs.shape[0], rhs.shape[1], rhs.shape[2:]
    q = math.prod(kernel)
    products = b.dot_general(
        lhs, b.reshape(rhs, (i, o * q)), [lhs_layout.index("f")], [0], out_dtype=acc, precision=L.ctx.precision
    )  # [B, *image, O*Q]
    products = b.reshape(products, (batch, *image, o, q))
    low, high = zip(*window.padding)
    interior = [d - 1 for d in window.lhs_dilation]
    products = b.pad(products, b.constant(0, acc), [0, *low, 0, 0], [0, *high, 0, 0], [0, *interior, 0, 0])
    y = None
    taps = range(q - 1, -1, -1) if window.reversed_kernel else range(q)  # row-major: reversing every dim reverses it
    for tap, position in zip(taps, itertools.product(*(range(size) for size in kernel))):
        start = [k * d for k, d in zip(position, window.rhs_dilation)]
        limit = [s + (n - 1) * st + 1 for s, n, st in zip(start, window.out_spatial, window.strides)]
        part = b.slice(products, [0, *start, 0, tap], [batch, *limit, o, tap + 1], [1, *window.strides, 1, 1])
        y = part if y is None else b.binary("add", y, part)
    y = b.reshape(y, (batch, *window.out_spatial, o))
    first = [0, nsp + 1] if out_layout == "bf" else [nsp + 1, 0]
    return b.transpose(y, [*first, *range(1, nsp + 1)])


def _patches(L: NodeLowering, lhs: Value, kernel: Sequence[int], window: _Window) -> Value:
    """The [B, I, Q, P] patches of the [B, I, *spatial] image under ``window``: one strided
    slice of the padded image per kernel position, or per output position where there are
    fewer of those (a weight gradient's output is its kernel, a handful of positions)."""
    b = L.b
    zero = b.constant(0, lhs.dtype)
    low, high = zip(*window.padding)
    lhs = b.pad(lhs, zero, [0, 0, *low], [0, 0, *high], [0, 0, *(d - 1 for d in window.lhs_dilation)])
    n, f = lhs.shape[:2]
    q, p = math.prod(kernel), math.prod(window.out_spatial)
    # slice once per position of the shorter loop; each slice walks the other one
    if q <= p:
        outer, outer_step, inner, inner_step, axis = kernel, window.rhs_dilation, window.out_spatial, window.strides, 2
    else:
        outer, outer_step, inner, inner_step, axis = window.out_spatial, window.strides, kernel, window.rhs_dilation, 3
    tap_shape = (n, f, 1, p) if axis == 2 else (n, f, q, 1)
    taps = []
    for position in itertools.product(*(range(size) for size in outer)):
        start = [x * step for x, step in zip(position, outer_step)]
        limit = [s + (m - 1) * step + 1 for s, m, step in zip(start, inner, inner_step)]
        taps.append(b.reshape(b.slice(lhs, [0, 0, *start], [n, f, *limit], [1, 1, *inner_step]), tap_shape))
    return b.concatenate(taps, axis)


def _reverse(L: NodeLowering, x: Value, dims: Sequence[int]) -> Value:
    dims = [d for d in dims if x.shape[d] > 1]
    if not dims:
        return x
    return L.b.op1("stablehlo.reverse", [x], x.shape, x.dtype, f"dimensions = {i64_array(dims)}")


# -- the three primitives -------------------------------------------------------------------
# A "regular" convolution C(x, w) -> y with NCHW x, OIHW w, stride s, low padding p,
# dilation d, groups g. Its transposes are T_lhs (gradient wrt x, and PyTorch's transposed
# convolution) and T_rhs (gradient wrt w). Output sizes are always passed explicitly, so
# the high paddings follow from the shapes.


def _forward(L, x, w, out_spatial, stride, pad_lo, dil, groups, out_dtype=None):
    """C(x, w) with output spatial size ``out_spatial``."""
    k = w.shape[2:]
    padding = []
    for i, o in enumerate(out_spatial):
        hi = (o - 1) * stride[i] + _dil(k[i], dil[i]) - x.shape[2 + i] - pad_lo[i]
        padding.append((pad_lo[i], hi))
    nsp = len(k)
    return conv_general(
        L, x, w, out_spatial, strides=stride, padding=padding, lhs_dilation=[1] * nsp, rhs_dilation=dil,
        feature_groups=groups, out_dtype=out_dtype,
    )


def _transpose_lhs(L, g, w, in_spatial, stride, pad_lo, dil, groups, out_dtype=None):
    """The gradient of C wrt x (shape ``[N, Cin, *in_spatial]``) given the cotangent ``g``
    of y; also PyTorch's transposed convolution of g with weight w."""
    nsp = w.rank - 2
    k = w.shape[2:]
    if groups > 1:
        # (O, I, k) -> (g, O/g, I, k) -> (O/g, g, I, k) -> (O/g, g*I, k): the group axis
        # moves into the transposed kernel's output-feature dim.
        o, i = w.shape[0], w.shape[1]
        w = L.b.reshape(w, (groups, o // groups, i, *k))
        w = L.b.transpose(w, [1, 0, 2, *range(3, 3 + nsp)])
        w = L.b.reshape(w, (o // groups, groups * i, *k))
    padding = []
    for j in range(nsp):
        before = _dil(k[j], dil[j]) - pad_lo[j] - 1
        after = _dil(in_spatial[j], 1) + _dil(k[j], dil[j]) - 1 - _dil(g.shape[2 + j], stride[j]) - before
        padding.append((before, after))
    # the weight's "o" dim (dim 0) now plays the input-feature role and vice versa
    return conv_general(
        L, g, w, in_spatial, strides=[1] * nsp, padding=padding, lhs_dilation=stride, rhs_dilation=dil,
        feature_groups=groups, rhs_layout="io", out_dtype=out_dtype, reversed_kernel=True,
    )


def _transpose_rhs(L, g, x, k, stride, pad_lo, dil, groups, out_dtype=None):
    """The gradient of C wrt w (shape ``[Cout, Cin/groups, *k]``) given x and the cotangent
    ``g`` of y."""
    nsp = x.rank - 2
    padding = []
    for j in range(nsp):
        lo = pad_lo[j]
        hi = (_dil(g.shape[2 + j], stride[j]) - _dil(x.shape[2 + j], 1)) + (_dil(k[j], dil[j]) - lo - 1)
        padding.append((lo, hi))
    return conv_general(
        L, x, g, k, strides=dil, padding=padding, lhs_dilation=[1] * nsp, rhs_dilation=stride,
        batch_groups=groups, lhs_layout="fb", rhs_layout="io", out_layout="fb", out_dtype=out_dtype,
    )


# -- aten ops -----------------------------------------------------------------------------------
def _expand(v: Sequence[int], n: int) -> list[int]:
    v = [int(a) for a in v]
    return v * n if len(v) == 1 else v


def _add_bias(L: NodeLowering, y: Value, bias: Value | None) -> Value:
    if bias is None:
        return y
    bias = L.to(bias, y.dtype)
    return L.b.binary("add", y, L.b.broadcast_in_dim(bias, y.shape, [1]))


@register(aten.convolution.default, aten._convolution.default, aten.convolution_overrideable.default)
def convolution(
    L: NodeLowering,
    x: Value,
    w: Value,
    bias: Value | None,
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    transposed: bool,
    output_padding: Sequence[int],
    groups: int,
    *_flags: Any,
) -> Value:
    out = L.out[0]
    nsp = w.rank - 2
    unbatched = x.rank == nsp + 1
    if unbatched:
        x = L.b.reshape(x, (1, *x.shape))
    stride, padding, dilation = _expand(stride, nsp), _expand(padding, nsp), _expand(dilation, nsp)
    out_spatial = list(out.shape[-nsp:]) if nsp else []
    # 16-bit convolutions accumulate in float32 and add the bias before rounding once, as
    # the CPU (oneDNN) does; rounding first put the bias one bf16 ulp off
    acc = acc_dtype(out.dtype)
    if transposed:
        y = _transpose_lhs(L, x, w, out_spatial, stride, padding, dilation, groups, out_dtype=acc)
    else:
        y = _forward(L, x, w, out_spatial, stride, padding, dilation, groups, out_dtype=acc)
    y = L.to(_add_bias(L, y, bias), out.dtype)
    if unbatched:
        y = L.b.reshape(y, y.shape[1:])
    return y


def _sum_bias(L: NodeLowering, g: Value, dtype: torch.dtype) -> Value:
    acc = torch.float32 if g.dtype in _LOW_PRECISION else g.dtype
    g = L.to(g, acc)
    zero = L.b.constant(0, acc)
    dims = [d for d in range(g.rank) if d != 1]
    (s,) = L.b.reduce([g], [zero], dims, lambda a, b: [L.b.binary("add", a, b)])
    return L.to(s, dtype)


@register(aten.convolution_backward.default, aten.convolution_backward_overrideable.default)
def convolution_backward(
    L: NodeLowering,
    grad: Value,
    x: Value,
    w: Value,
    *args: Any,
) -> tuple[Value | None, Value | None, Value | None]:
    if L.op is aten.convolution_backward_overrideable.default:
        stride, padding, dilation, transposed, output_padding, groups, output_mask = args
    else:
        _bias_sizes, stride, padding, dilation, transposed, output_padding, groups, output_mask = args
    nsp = w.rank - 2
    stride, padding, dilation = _expand(stride, nsp), _expand(padding, nsp), _expand(dilation, nsp)
    unbatched = x.rank == nsp + 1
    if unbatched:
        x = L.b.reshape(x, (1, *x.shape))
        grad = L.b.reshape(grad, (1, *grad.shape))
    gi = gw = gb = None
    if output_mask[0]:
        if transposed:
            # y = T_lhs(x, w) of the regular conv y -> x, so dx = C(dy, w)
            gi = _forward(L, grad, w, x.shape[2:], stride, padding, dilation, groups, out_dtype=x.dtype)
        else:
            gi = _transpose_lhs(L, grad, w, x.shape[2:], stride, padding, dilation, groups, out_dtype=x.dtype)
        if unbatched:
            gi = L.b.reshape(gi, gi.shape[1:])
    if output_mask[1]:
        k = w.shape[2:]
        if transposed:
            # <dy, T_lhs(x, w)> = <C(dy, w), x>: the regular conv's weight gradient, with dy
            # as its input and x as its output cotangent
            gw = _transpose_rhs(L, x, grad, k, stride, padding, dilation, groups, out_dtype=w.dtype)
        else:
            gw = _transpose_rhs(L, grad, x, k, stride, padding, dilation, groups, out_dtype=w.dtype)
    if output_mask[2]:
        gb = _sum_bias(L, grad, L.out[2].dtype if L.out[2] is not None else grad.dtype)
    return gi, gw, gb
