"""A fused RMSNorm for the tpu device, written three ways (see run.py):

- ``rms_norm_stablehlo``: hand-written StableHLO text (torchtpu.kernels.stablehlo);
- ``rms_norm_jax`` / ``rms_norm_pallas``: a JAX function and a Pallas kernel
  (torchtpu.kernels.jax; needs ``pip install 'torchtpu[jax]'``), lowered once per shape;
- ``rms_norm_op``: a library's own ``torch.library.custom_op`` given a tpu lowering rule
  (torchtpu.library.register_lowering), written with the builder torchtpu's rules use.

Each is one PyTorch op: it runs in eager mode, fuses with the ops around it under
DeferAndFuse and stays one node under torch.compile(backend="tpu"). All of them compute
``x * rsqrt(mean(x**2, -1) + eps) * w`` in float32, and share one backward written in
plain PyTorch ops.
"""

from __future__ import annotations

import functools
import importlib.util

import torch
import torch.nn.functional as F

import torchtpu.kernels
import torchtpu.library

HAVE_JAX = importlib.util.find_spec("jax") is not None


# -- the backward all routes share (plain PyTorch ops: they run on tpu like any others) ----
def _setup_context(ctx: torch.autograd.function.FunctionCtx, inputs: tuple, output: torch.Tensor) -> None:
    x, w, eps = inputs
    ctx.save_for_backward(x, w)
    ctx.eps = eps


def _backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor) -> tuple:
    x, w = ctx.saved_tensors
    rows = list(range(x.dim() - 1))
    r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + ctx.eps)
    xhat = x * r
    grad_w = (grad * xhat).sum(rows) if rows else grad * xhat
    g = grad * w
    grad_x = r * (g - xhat * (g * xhat).mean(-1, keepdim=True))
    return grad_x, grad_w, None


AUTOGRAD = {"backward": _backward, "setup_context": _setup_context}


# -- 1. StableHLO text, written for each input shape -----------------------------------------
def _rms_shape(x: torchtpu.kernels.Spec, w: torchtpu.kernels.Spec, eps: float = 1e-6) -> torchtpu.kernels.Spec:
    return x  # the output has the input's shape and dtype


@torchtpu.kernels.stablehlo(shape=_rms_shape, **AUTOGRAD)
def rms_norm_stablehlo(x: torchtpu.kernels.Spec, w: torchtpu.kernels.Spec, eps: float = 1e-6) -> str:
    if x.dtype != torch.float32 or w.dtype != torch.float32:
        raise TypeError(f"this RMSNorm kernel takes float32 tensors, got {x.dtype} and {w.dtype}")
    last = x.ndim - 1
    rows = x.shape[:-1]
    r = f"tensor<{''.join(f'{d}x' for d in rows)}f32>"  # the per-row statistics
    row_dims = ", ".join(str(d) for d in range(last))
    return f"""
func.func @main(%x: {x.type}, %w: {w.type}) -> {x.type} {{
  %sq = stablehlo.multiply %x, %x : {x.type}
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %sum = stablehlo.reduce(%sq init: %zero) applies stablehlo.add across dimensions = [{last}] : ({x.type}, tensor<f32>) -> {r}
  %n = stablehlo.constant dense<{float(x.shape[-1]):.1f}> : {r}
  %mean = stablehlo.divide %sum, %n : {r}
  %eps = stablehlo.constant dense<{eps:.9e}> : {r}
  %shifted = stablehlo.add %mean, %eps : {r}
  %inv = stablehlo.rsqrt %shifted : {r}
  %inv_b = stablehlo.broadcast_in_dim %inv, dims = [{row_dims}] : ({r}) -> {x.type}
  %w_b = stablehlo.broadcast_in_dim %w, dims = [{last}] : ({w.type}) -> {x.type}
  %normed = stablehlo.multiply %x, %inv_b : {x.type}
  %out = stablehlo.multiply %normed, %w_b : {x.type}
  return %out : {x.type}
}}"""


# -- 2. JAX: a jax.numpy function and a Pallas kernel -----------------------------------------
# jax is imported inside the functions: a run whose lowerings are in the disk cache
# (TORCHTPU_CACHE_DIR) never imports it.
@torchtpu.kernels.jax(shape=_rms_shape, **AUTOGRAD)
def rms_norm_jax(x, w, eps: float = 1e-6):  # noqa: ANN001, ANN201 - jax arrays
    import jax
    import jax.numpy as jnp

    xf = x.astype(jnp.float32)
    ms = jnp.mean(xf * xf, axis=-1, keepdims=True)
    return (xf * jax.lax.rsqrt(ms + eps) * w.astype(jnp.float32)).astype(x.dtype)


def _pallas_body(x_ref, w_ref, o_ref, *, eps: float) -> None:  # noqa: ANN001 - Pallas refs
    import jax
    import jax.numpy as jnp

    x = x_ref[...].astype(jnp.float32)
    ms = jnp.mean(x * x, axis=-1, keepdims=True)
    o_ref[...] = (x * jax.lax.rsqrt(ms + eps) * w_ref[...]).astype(o_ref.dtype)


@torchtpu.kernels.jax(shape=_rms_shape, **AUTOGRAD)
def rms_norm_pallas(x, w, eps: float = 1e-6):  # noqa: ANN001, ANN201 - jax arrays
    import jax
    from jax.experimental import pallas as pl

    # interpret=True runs the kernel body as ordinary StableHLO (the cpu platform); on a
    # TPU, Pallas compiles it with Mosaic instead
    body = functools.partial(_pallas_body, eps=eps)
    return pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), interpret=torchtpu.platform() != "tpu")(x, w)


# -- 3. A library's own op, given a tpu lowering rule -----------------------------------------
@torch.library.custom_op("custom_kernels_example::rms_norm", mutates_args=())
def rms_norm_op(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), w, eps)  # the library's CPU (and every other device's) kernel


@rms_norm_op.register_fake
def _(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return torch.empty_like(x)


rms_norm_op.register_autograd(_backward, setup_context=_setup_context)


@torchtpu.library.register_lowering(rms_norm_op)
def _(
    L: torchtpu.library.NodeLowering, x: torchtpu.library.Value, w: torchtpu.library.Value, eps: float = 1e-6
) -> torchtpu.library.Value:
    b, f32 = L.b, torch.float32
    last = x.rank - 1
    xf = L.to(x, f32)
    (total,) = b.reduce([b.binary("multiply", xf, xf)], [b.constant(0, f32)], [last], lambda acc, v: [b.binary("add", acc, v)])
    mean = b.binary("divide", total, L.full(x.shape[-1], total.shape, f32))
    inv = b.unary("rsqrt", b.binary("add", mean, L.full(eps, total.shape, f32)))
    normed = b.binary("multiply", xf, b.broadcast_in_dim(inv, xf.shape, list(range(last))))
    out = b.binary("multiply", normed, b.broadcast_in_dim(L.to(w, f32), xf.shape, [last]))
    return L.to(out, x.dtype)


ROUTES = {
    "stablehlo": rms_norm_stablehlo,
    "jax": rms_norm_jax,
    "pallas": rms_norm_pallas,
    "library": rms_norm_op,
}
