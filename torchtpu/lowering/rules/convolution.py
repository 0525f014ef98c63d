"""Convolutions: ``aten.convolution`` (and the ``_convolution`` / ``convolution_overrideable``
entry points PrivateUse1 tensors reach), transposed convolutions and ``convolution_backward``.

Everything is one ``stablehlo.convolution`` with PyTorch's layouts (``NC<spatial>`` inputs,
``OI<spatial>`` weights). The backward passes and the transposed convolution are the
transposes of a regular convolution, expressed as convolutions exactly as JAX's
``_conv_general_dilated_transpose_lhs/rhs`` do. 16-bit inputs accumulate in f32.
"""

from __future__ import annotations

from collections.abc import Sequence
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
) -> Value:
    """One ``stablehlo.convolution``. Layout strings name the first two dimensions of each
    operand (the rest are spatial, in order). Returns ``out_dtype`` (default: lhs dtype);
    16-bit inputs accumulate in f32."""
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
    sp = list(range(2, 2 + nsp))
    if groups > 1:
        # (O, I, k) -> (g, O/g, I, k) -> (O/g, g, I, k) -> (O/g, g*I, k): the group axis
        # moves into the transposed kernel's output-feature dim.
        o, i = w.shape[0], w.shape[1]
        w = L.b.reshape(w, (groups, o // groups, i, *k))
        w = L.b.transpose(w, [1, 0, 2, *range(3, 3 + nsp)])
        w = L.b.reshape(w, (o // groups, groups * i, *k))
    w = _reverse(L, w, sp)
    padding = []
    for j in range(nsp):
        before = _dil(k[j], dil[j]) - pad_lo[j] - 1
        after = _dil(in_spatial[j], 1) + _dil(k[j], dil[j]) - 1 - _dil(g.shape[2 + j], stride[j]) - before
        padding.append((before, after))
    # the weight's "o" dim (dim 0) now plays the input-feature role and vice versa
    return conv_general(
        L, g, w, in_spatial, strides=[1] * nsp, padding=padding, lhs_dilation=stride, rhs_dilation=dil,
        feature_groups=groups, rhs_layout="io", out_dtype=out_dtype,
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
