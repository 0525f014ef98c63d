"""``torch.autocast("tpu")``: PyTorch's CUDA autocast policy on the tpu device.

PyTorch 2.13 registers no kernel for the ``AutocastPrivateUse1`` dispatch key (its
``KERNEL_PRIVATEUSEONE`` macros are only there for C++ backends to use), so without this
module autocast on "tpu" casts nothing. Here each op on CUDA's lists gets a Python kernel
on that key that casts its tensor arguments as ``aten/src/ATen/autocast_mode.{h,cpp}`` do
for ``AutocastCUDA`` and calls the op again with the autocast key excluded (what the C++
wrappers do with ``ExcludeDispatchKeyGuard``). Every other op falls through (the
fallthrough fallback is registered in ``eager/register.py``).

The lists below are ``AT_FORALL_*`` of torch 2.13's ``ATen/autocast_mode.h``, as the CUDA
registration uses them: a bare name is the op's default overload (``KERNEL1``), a dotted
name one overload (``KERNEL2``). Composite ops not listed (``conv2d.padding``,
``upsample_nearest2d.vec``, ...) reach a listed op through their decomposition, as on
CUDA. ``cat``/``stack``/``index_copy`` are not on CUDA's list: they promote to the widest
input dtype natively.

The default autocast dtype of the device is bfloat16 (``set_default_dtype``);
``torch.autocast("tpu", dtype=torch.float16)`` works too.
"""

from __future__ import annotations

import functools
import warnings
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch._subclasses.fake_tensor import is_fake

# -- the policy, as data ---------------------------------------------------------------------
# Cast every floating-point tpu argument to the autocast dtype.
LOWER_PRECISION_FP: tuple[str, ...] = (
    "_convolution.deprecated", "_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc",
    "conv_transpose1d", "conv_transpose2d.input", "conv_transpose3d.input", "convolution",
    "prelu", "addmm", "addmv", "addr", "matmul", "einsum", "mm", "mv", "linalg_vecdot",
    "linear", "addbmm", "baddbmm", "bmm", "chain_matmul", "linalg_multi_dot",
    "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell", "lstm_cell", "gru_cell",
    "rnn_tanh_cell", "rnn_relu_cell", "_scaled_dot_product_flash_attention",
    "scaled_dot_product_attention",
    # registered for CUDA only, next to the AT_FORALL list; never reached on tpu
    "cudnn_convolution", "cudnn_convolution_transpose",
)  # fmt: skip

# Cast every floating-point tpu argument to float32.
FP32: tuple[str, ...] = (
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p",
    "reciprocal", "rsqrt", "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor",
    "pow.Scalar", "softplus", "layer_norm", "native_layer_norm", "rms_norm", "group_norm",
    "frobenius_norm.dim", "nuclear_norm", "nuclear_norm.dim", "cosine_similarity",
    "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d",
    "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss",
    "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss",
    "triplet_margin_loss", "multi_margin_loss", "binary_cross_entropy_with_logits", "dist",
    "pdist", "cdist", "renorm", "logsumexp", "upsample_nearest1d", "_upsample_nearest_exact1d",
    "upsample_nearest2d", "_upsample_nearest_exact2d", "upsample_nearest3d",
    "_upsample_nearest_exact3d", "upsample_linear1d", "upsample_bilinear2d",
    "_upsample_bilinear2d_aa", "upsample_trilinear3d", "upsample_bicubic2d",
    "_upsample_bicubic2d_aa",
)  # fmt: skip

# Ops with an optional ``dtype`` argument: when the first argument is eligible and no dtype
# was given, run with dtype=float32 (the inputs are not cast).
FP32_SET_OPT_DTYPE: tuple[str, ...] = (
    "prod", "prod.dim_int", "softmax.int", "log_softmax.int", "cumprod", "cumsum",
    "linalg_vector_norm", "linalg_matrix_norm", "linalg_matrix_norm.str_ord", "sum",
    "sum.dim_IntList",
)  # fmt: skip

# Overloads without a dtype argument, redirected to their dtype-taking sibling with
# dtype=float32 (or the input's own dtype when it is not eligible).
FP32_APPEND_DTYPE: dict[str, str] = {
    "norm.Scalar": "norm.ScalarOpt_dtype",
    "norm.ScalarOpt_dim": "norm.ScalarOpt_dim_dtype",
}

# Run in the widest floating dtype among the (eligible) tensor arguments.
PROMOTE: tuple[str, ...] = (
    "addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler",
    "index_put", "tensordot", "scatter_add",
)  # fmt: skip

BANNED: dict[str, str] = {
    "binary_cross_entropy": (
        "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n"
        "Many models use a sigmoid layer right before the binary cross entropy layer.\n"
        "In this case, combine the two layers using torch.nn.functional.binary_cross_entropy_with_logits\n"
        "or torch.nn.BCEWithLogitsLoss.  binary_cross_entropy_with_logits and BCEWithLogits are\n"
        "safe to autocast."
    ),
}

POLICIES: dict[str, tuple[str, ...]] = {
    "lower_precision_fp": LOWER_PRECISION_FP,
    "fp32": FP32,
    "fp32_set_opt_dtype": FP32_SET_OPT_DTYPE,
    "fp32_append_dtype": tuple(FP32_APPEND_DTYPE),
    "promote": PROMOTE,
}

DEVICE = "tpu"
# the autocast dispatch key of each device the kernels can be made for: tpu's, and the
# CPU's, where tests apply CUDA's policy to a CPU reference (tests/models/cuda_policy.py)
AUTOCAST_KEYS: dict[str, str] = {"tpu": "AutocastPrivateUse1", "cpu": "AutocastCPU"}


@functools.cache
def _key_set(device: str) -> torch._C.DispatchKeySet:
    return torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, AUTOCAST_KEYS[device]))


def policy_of(name: str) -> str | None:
    """The cast policy of an overload name ("mm", "pow.Scalar"), or None if autocast leaves it alone."""
    name = name.removeprefix("aten::").removesuffix(".default")
    for policy, names in POLICIES.items():
        if name in names:
            return policy
    return "banned" if name in BANNED else None


# -- casting, as in at::autocast::cached_cast ---------------------------------------------------
def _eligible(x: Any, device: str = DEVICE) -> bool:
    return isinstance(x, torch.Tensor) and x.device.type == device and x.is_floating_point() and x.dtype != torch.float64


# source TensorImpl id -> (weakref to the source, its cast); cleared when the outermost
# autocast region exits (see _install_cache_clearing)
_cast_cache: dict[int, tuple[weakref.ref, torch.Tensor]] = {}


def clear_cache() -> None:
    _cast_cache.clear()


def _cacheable(x: torch.Tensor, to: torch.dtype, device: str) -> bool:
    """Apex's heuristic, kept by PyTorch: cache the low-precision casts of fp32 weights (leaves)."""
    return (
        to == torch.get_autocast_dtype(device)
        and x.dtype == torch.float32
        and x.requires_grad
        and x.is_leaf
        and not x._is_view()
        and torch.is_autocast_cache_enabled()
        and not torch._C._is_cached_tensor(x)
        # Dynamo's fake-tensor propagation runs with the cache on: keep no fake tensor alive
        and not is_fake(x)
    )


def _cast_tensor(x: torch.Tensor, to: torch.dtype, device: str) -> torch.Tensor:
    if not _eligible(x, device) or x.dtype == to:
        return x
    if not _cacheable(x, to, device):
        return x.to(to)
    hit = _cast_cache.get(id(x))
    if hit is not None and hit[0]() is x:
        return hit[1]
    cast = x.to(to)
    _cast_cache[id(x)] = (weakref.ref(x), cast)
    return cast


# -- argument kinds from the schema ---------------------------------------------------------------
_TENSOR, _OPTIONAL_TENSOR, _TENSOR_LIST, _OTHER = "tensor", "optional", "list", "other"


def _kind(t: Any) -> str:
    if isinstance(t, torch.TensorType):
        return _TENSOR
    if isinstance(t, torch.OptionalType) and isinstance(t.getElementType(), torch.TensorType):
        return _OPTIONAL_TENSOR
    if isinstance(t, torch.ListType) and isinstance(t.getElementType(), torch.TensorType):
        return _TENSOR_LIST
    return _OTHER  # includes Tensor?[] (index_put's indices), which C++ autocast leaves alone


class _Signature:
    """Which positional/keyword arguments of an overload are tensors, and of what kind."""

    def __init__(self, op: torch._ops.OpOverload):
        args = op._schema.arguments
        self.kinds = [_kind(a.type) for a in args]
        self.names = [a.name for a in args]
        self.kind_of = dict(zip(self.names, self.kinds, strict=True))

    def cast(self, args: Sequence[Any], kwargs: dict[str, Any], to: torch.dtype, device: str) -> tuple[list[Any], dict[str, Any]]:
        new_args = [_cast_arg(a, k, to, device) for a, k in zip(args, self.kinds, strict=False)]
        new_kwargs = {n: _cast_arg(v, self.kind_of.get(n, _OTHER), to, device) for n, v in kwargs.items()}
        return new_args, new_kwargs

    def promote_type(self, args: Sequence[Any], kwargs: dict[str, Any], device: str) -> torch.dtype:
        """at::autocast::promote_type: Tensor and Tensor[] arguments vote, Tensor? do not."""
        current = torch.get_autocast_dtype(device)
        pairs = [*zip(args, self.kinds, strict=False), *((v, self.kind_of.get(n, _OTHER)) for n, v in kwargs.items())]
        for value, kind in pairs:
            if kind == _TENSOR:
                current = _prioritize(current, value, device)
            elif kind == _TENSOR_LIST:
                for t in value:
                    current = _prioritize(current, t, device)
        return current


def _cast_arg(value: Any, kind: str, to: torch.dtype, device: str) -> Any:
    if kind in (_TENSOR, _OPTIONAL_TENSOR):
        return _cast_tensor(value, to, device) if value is not None else None
    if kind == _TENSOR_LIST:
        return [_cast_tensor(t, to, device) for t in value]
    return value


def _prioritize(current: torch.dtype, x: Any, device: str) -> torch.dtype:
    if not (isinstance(x, torch.Tensor) and x.device.type == device and x.is_floating_point()):
        return current
    lower = torch.get_autocast_dtype(device)
    if x.dtype == torch.float64:
        return current  # double tensors are ignored
    if current == torch.float32 or x.dtype == torch.float32:
        return torch.float32
    if current == lower and x.dtype == lower:
        return lower
    raise RuntimeError("Unexpected floating ScalarType in at::autocast::prioritize")


# -- one kernel per policy ------------------------------------------------------------------------
def _below_autocast(op: torch._ops.OpOverload, args: Sequence[Any], kwargs: dict[str, Any], device: str) -> Any:
    with torch._C._ExcludeDispatchKeyGuard(_key_set(device)):
        return op(*args, **kwargs)


def _cast_kernel(op: torch._ops.OpOverload, to: Callable[[], torch.dtype], device: str) -> Callable[..., Any]:
    sig = _Signature(op)
    keys = _key_set(device)

    def kernel(*args: Any, **kwargs: Any) -> Any:
        with torch._C._ExcludeDispatchKeyGuard(keys):
            new_args, new_kwargs = sig.cast(args, kwargs, to(), device)
            return op(*new_args, **new_kwargs)

    return kernel


def _promote_kernel(op: torch._ops.OpOverload, device: str) -> Callable[..., Any]:
    sig = _Signature(op)
    keys = _key_set(device)

    def kernel(*args: Any, **kwargs: Any) -> Any:
        with torch._C._ExcludeDispatchKeyGuard(keys):
            new_args, new_kwargs = sig.cast(args, kwargs, sig.promote_type(args, kwargs, device), device)
            return op(*new_args, **new_kwargs)

    return kernel


def _set_opt_dtype_kernel(op: torch._ops.OpOverload, device: str) -> Callable[..., Any]:
    names = [a.name for a in op._schema.arguments]
    at = names.index("dtype")

    def kernel(*args: Any, **kwargs: Any) -> Any:
        # An explicit dtype is respected; an ineligible input runs unchanged (setting a
        # dtype there could change the op's own promotion).
        if _eligible(args[0], device):
            if len(args) > at:
                if args[at] is None:
                    args = (*args[:at], torch.float32, *args[at + 1 :])
            elif kwargs.get("dtype") is None:
                kwargs = {**kwargs, "dtype": torch.float32}
        return _below_autocast(op, args, kwargs, device)

    return kernel


def _append_dtype_kernel(op: torch._ops.OpOverload, target: torch._ops.OpOverload, device: str) -> Callable[..., Any]:
    names = [a.name for a in op._schema.arguments]
    defaults = [a.default_value if a.has_default_value() else None for a in op._schema.arguments]

    def kernel(*args: Any, **kwargs: Any) -> Any:
        full = [*args, *(kwargs.get(n, d) for n, d in zip(names[len(args) :], defaults[len(args) :], strict=True))]
        dtype = torch.float32 if _eligible(full[0], device) else full[0].dtype
        return _below_autocast(target, full, {"dtype": dtype}, device)

    return kernel


def _banned_kernel(message: str) -> Callable[..., Any]:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(message)

    return kernel


def _overload(name: str) -> torch._ops.OpOverload:
    packet, _, overload = name.partition(".")
    return getattr(getattr(torch.ops.aten, packet), overload or "default")


def kernels(device: str = DEVICE) -> dict[str, Callable[..., Any]]:
    """Overload name -> the autocast kernel of ``device`` (its key: ``AUTOCAST_KEYS``), for
    every op of CUDA's policy."""
    out: dict[str, Callable[..., Any]] = {}
    for name in LOWER_PRECISION_FP:
        out[name] = _cast_kernel(_overload(name), lambda: torch.get_autocast_dtype(device), device)
    for name in FP32:
        out[name] = _cast_kernel(_overload(name), lambda: torch.float32, device)
    for name in FP32_SET_OPT_DTYPE:
        out[name] = _set_opt_dtype_kernel(_overload(name), device)
    for name, target in FP32_APPEND_DTYPE.items():
        out[name] = _append_dtype_kernel(_overload(name), _overload(target), device)
    for name in PROMOTE:
        out[name] = _promote_kernel(_overload(name), device)
    for name, message in BANNED.items():
        out[name] = _banned_kernel(message)
    return out


# -- registration ---------------------------------------------------------------------------------
_libs: list[torch.library.Library] = []


def _install_cache_clearing() -> None:
    """``torch.autocast.__exit__`` calls ``torch.clear_autocast_cache()`` when the outermost
    region ends; that clears PyTorch's C++ cache only, so clear ours there too."""
    original = torch.clear_autocast_cache
    if getattr(original, "_torchtpu", False):
        return

    def clear_autocast_cache() -> None:
        original()
        clear_cache()

    clear_autocast_cache._torchtpu = True  # type: ignore[attr-defined]
    clear_autocast_cache.__doc__ = original.__doc__
    torch.clear_autocast_cache = clear_autocast_cache


def register() -> None:
    """Register the AutocastPrivateUse1 kernels and make bfloat16 the default autocast dtype.

    The default dtype is thread-local in PyTorch: this sets it for the importing thread;
    another thread starting ``torch.autocast("tpu")`` without a dtype gets PyTorch's
    PrivateUse1 default (float16) unless it calls ``set_default_dtype()``."""
    if _libs:
        return
    lib = torch.library.Library("aten", "IMPL")
    for name, kernel in kernels().items():
        lib.impl(name, kernel, AUTOCAST_KEYS[DEVICE])
    _libs.append(lib)
    _install_cache_clearing()
    set_default_dtype()


def set_default_dtype(dtype: torch.dtype = torch.bfloat16) -> None:
    """The dtype ``torch.autocast("tpu")`` uses when given none (this thread)."""
    torch.set_autocast_dtype(DEVICE, dtype)


# -- torch.tpu.amp's user-facing names, as torch.cuda.amp has them ----------------------------
# Code ported from CUDA by renaming the device writes ``torch.tpu.amp.autocast()`` and
# ``torch.tpu.amp.GradScaler()``. Like CUDA's, they are the device-bound spellings of
# torch.amp's classes, deprecated in favour of those, with the same warning.
def _deprecated(old: str, new: str) -> None:
    warnings.warn(f"`torch.tpu.amp.{old}(args...)` is deprecated. Please use `{new}` instead.", FutureWarning, stacklevel=3)


class autocast(torch.amp.autocast_mode.autocast):  # noqa: N801 - torch.cuda.amp's name
    """``torch.autocast("tpu", ...)``; ``dtype`` defaults to the device's autocast dtype."""

    def __init__(self, enabled: bool = True, dtype: torch.dtype | None = None, cache_enabled: bool = True) -> None:
        _deprecated("autocast", "torch.amp.autocast('tpu', args...)")
        super().__init__(DEVICE, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)


class GradScaler(torch.amp.GradScaler):
    """``torch.amp.GradScaler("tpu", ...)``."""

    def __init__(
        self,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        enabled: bool = True,
    ) -> None:
        _deprecated("GradScaler", "torch.amp.GradScaler('tpu', args...)")
        super().__init__(DEVICE, init_scale, growth_factor, backoff_factor, growth_interval, enabled)


custom_fwd = functools.partial(torch.amp.custom_fwd, device_type=DEVICE)
custom_bwd = functools.partial(torch.amp.custom_bwd, device_type=DEVICE)
