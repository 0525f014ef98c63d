"""Registering kernels with the PyTorch dispatcher for the PrivateUse1 ("tpu") key.

At autoload only the runtime kernels (allocation, copies, views) and the safety-net
fallback are registered; the op kernels are registered on first device use, so that
``import torch`` stays cheap.
"""

from __future__ import annotations

import threading
import warnings
from typing import Any

import torch

from .. import config, op_report
from ..errors import not_implemented

_libs: list[torch.library.Library] = []
_ops_registered = False
_lock = threading.Lock()
REGISTERED_OPS: set[Any] = set()


def _is_view(op: torch._ops.OpOverload) -> bool:
    rets = op._schema.returns
    return bool(rets) and rets[0].alias_info is not None and not rets[0].alias_info.is_write


def _fallback(op: Any, *args: Any, **kwargs: Any) -> Any:
    """Every op without a tpu kernel lands here."""
    if not _ops_registered:
        # a factory op (torch.tril_indices(..., device="tpu")) as the process's first tpu
        # op reaches the dispatcher before the op kernels are registered: register, retry
        ensure_op_kernels()
        if op in REGISTERED_OPS:
            return op(*args, **kwargs)
    if config.flag("TORCHTPU_CPU_FALLBACK"):
        from .fallback import run_on_cpu

        return run_on_cpu(op, args, kwargs)
    name = op.name() if hasattr(op, "name") else str(op)
    if name.startswith(("aten::_to_sparse", "aten::to_sparse")):  # dense -> sparse: no sparse layouts on tpu
        raise sparse_not_supported(name)
    if op_report.recorder is not None:
        op_report.recorder.record(op_report.MISSING, name, "raised NotImplementedError")
    if getattr(op, "namespace", "aten") not in ("aten", "prims", "_"):  # a third-party op: say how to lower it
        raise not_implemented(name, "give it a lowering with torchtpu.library.register_lowering")
    raise not_implemented(name)


_SPARSE_LAYOUTS = "sparse_coo, sparse_csr, sparse_csc, sparse_bsr, sparse_bsc"


def sparse_not_supported(op_name: str) -> NotImplementedError:
    return NotImplementedError(
        f"torchtpu: sparse tensors ({_SPARSE_LAYOUTS} layouts) are not supported on the tpu device "
        f"(in {op_name}). Convert with .to_dense() before moving the tensor to tpu, "
        "or keep the sparse computation on the CPU and move its dense result with .to('tpu')."
    )


def _sparse_fallback(op: Any, *args: Any, **kwargs: Any) -> Any:
    """Every op on (or creating) a sparse tpu tensor: our message, not the dispatcher's
    'Could not run ... from the SparsePrivateUse1 backend'."""
    raise sparse_not_supported(op.name() if hasattr(op, "name") else str(op))


def _quantized_fallback(op: Any, *args: Any, **kwargs: Any) -> Any:
    """Every op on (or creating) a quantized tpu tensor (``torch.quantize_per_tensor``'s
    qint8/quint8/qint32 layouts, which CUDA has only for a few ops either): our message, not
    the dispatcher's 'Could not run ... from the Quantizedtpu backend'."""
    name = op.name() if hasattr(op, "name") else str(op)
    raise NotImplementedError(
        f"torchtpu: quantized tensors are not supported on the tpu device (in {name}). Dequantize with "
        ".dequantize() before moving the tensor to tpu, or keep the quantized computation on the CPU."
    )


def _strided_nested_fallback(op: Any, *args: Any, **kwargs: Any) -> Any:
    """Every op on a strided nested tpu tensor without a kernel of its own (eager/nested.py
    has the transformer fast path's and to_padded_tensor): a message that names the layout
    that does work, not the dispatcher's 'Could not run ... from the NestedTensortpu backend'."""
    name = op.name() if hasattr(op, "name") else str(op)
    raise NotImplementedError(
        f"torchtpu: {name} is not implemented for strided nested tensors on the tpu device (torch.nested.nested_tensor's "
        "default layout: tpu runs nn.TransformerEncoder's nested fast path and to_padded_tensor on them). Build the "
        "nested tensor with layout=torch.jagged, whose ops run as ordinary tpu ops, or pad it with nt.to_padded_tensor(...)."
    )


def native_view_ops() -> set[torch._ops.OpOverload]:
    """The view ops whose tpu kernels the C++ fast paths register (torchtpu/csrc/fast.cpp:
    the Meta key's kernels, which minimal.VIEW_OPS redispatch to from Python); none where
    they were not built."""
    from ..tensor.storage import _fast

    if _fast is None:
        return set()
    ops = set()
    for name in _fast.register_view_kernels():
        packet, _, overload = name.partition(".")
        ops.add(getattr(getattr(torch.ops.aten, packet), overload or "default"))
    return ops


def register_runtime_kernels() -> None:
    from .minimal import kernels

    native = native_view_ops()
    lib = torch.library.Library("aten", "IMPL")
    for op, fn in kernels().items():
        if op not in native:
            lib.impl(op, fn, "PrivateUse1")
    fb = torch.library.Library("_", "IMPL")
    fb.fallback(_fallback, "PrivateUse1")
    autocast = torch.library.Library("_", "IMPL")
    autocast.fallback(torch.library.fallthrough_kernel, "AutocastPrivateUse1")
    sparse = torch.library.Library("_", "IMPL")
    for key in ("SparsePrivateUse1", "SparseCsrPrivateUse1"):
        sparse.fallback(_sparse_fallback, key)
    sparse.fallback(_strided_nested_fallback, "NestedTensorPrivateUse1")
    sparse.fallback(_quantized_fallback, "QuantizedPrivateUse1")
    _libs.extend([lib, fb, autocast, sparse])


_tracing_state = torch._C._get_tracing_state


def _run_untraced(run: Any, op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Any:
    """``run`` with TorchScript's tracer paused: it has recorded the op already, and while
    it is on, every size read in Python is a traced tensor (``torch.jit.trace`` of a conv
    failed in the meta function's shape check: "cond must be a bool, but got a Tensor")."""
    state = _tracing_state()
    torch._C._set_tracing_state(None)
    try:
        return run(op, args, kwargs)
    finally:
        torch._C._set_tracing_state(state)


_CONVOLUTION = torch.ops.aten.convolution.default


def _convolution_as_traced(*args: Any, **kwargs: Any) -> Any:
    """TorchScript's tracer records no node for ``aten::convolution``: it records the
    ``aten::_convolution`` that convolution's generic kernel calls on the CPU and CUDA. The
    tpu kernel runs convolution whole, so while tracing take the generic route, whose
    device-specific end, ``convolution_overrideable``, runs ours (without it a traced conv
    output was unknown to the trace: "Cannot insert a Tensor that requires grad as a
    constant")."""
    x, weight, bias, stride, padding, dilation, transposed, output_padding, groups = args
    cudnn = torch.backends.cudnn
    deterministic = cudnn.deterministic or torch.are_deterministic_algorithms_enabled()
    return torch.ops.aten._convolution(
        x, weight, bias, stride, padding, dilation, transposed, output_padding, groups,
        cudnn.benchmark, deterministic, cudnn.enabled, cudnn.allow_tf32,
    )  # fmt: skip


def _convolution_overrideable(*args: Any) -> Any:
    from .dispatch import run

    return _run_untraced(run, _CONVOLUTION, args, {})


def _make_kernel(op: torch._ops.OpOverload) -> Any:
    from ..errors import TpuOutOfMemoryError
    from ..runner.checks import TpuAsyncError
    from .cpu_errors import raise_as_cpu
    from .dispatch import run
    from .minimal import check_device

    def kernel(*args: Any, **kwargs: Any) -> Any:
        try:
            if _tracing_state() is not None:
                if op is _CONVOLUTION:
                    return _convolution_as_traced(*args, **kwargs)
                return _run_untraced(run, op, args, kwargs)
            return run(op, args, kwargs)
        except (NotImplementedError, TpuAsyncError, TpuOutOfMemoryError):
            # a missing lowering (our message says what to do); an earlier op's device-side
            # check; the device out of memory (asking the CPU would allocate the same there)
            raise
        except Exception as e:  # noqa: BLE001 - the arguments were refused: say it as the CPU does
            raise_as_cpu(op, args, kwargs, e)

    kernel.__name__ = f"tpu_{op.name()}"
    if not any(a.name == "device" and a.kwarg_only for a in op._schema.arguments):
        return kernel

    def factory_kernel(*args: Any, **kwargs: Any) -> Any:
        # device="tpu:1" reaches a factory's kernel as it is (no device guard runs for a
        # Python kernel): refused, as CUDA refuses an ordinal it has not, instead of
        # making the tensor on tpu:0
        check_device(kwargs.get("device"))
        return kernel(*args, **kwargs)

    factory_kernel.__name__ = kernel.__name__
    return factory_kernel


def register_lowered_op(op: torch._ops.OpOverload) -> None:
    """The tpu kernel of an op given a lowering rule at run time (torchtpu.library.
    register_lowering, torchtpu.kernels): ``dispatch.run``, as for aten ops, in every eager
    mode. Errors stay the rule's own: a third-party op's CPU kernel is no referee of its
    arguments (it may not exist, or run a different algorithm)."""
    if op in REGISTERED_OPS:  # an aten op that already runs through the registry
        return
    from .dispatch import run

    def kernel(*args: Any, **kwargs: Any) -> Any:
        return run(op, args, kwargs)

    kernel.__name__ = f"tpu_{op.name()}"
    lib = torch.library.Library(op.namespace, "IMPL")
    lib.impl(op, kernel, "PrivateUse1")
    _libs.append(lib)
    REGISTERED_OPS.add(op)


def _returns_a_python_value(op: torch._ops.OpOverload) -> bool:
    """``is_same_size`` -> bool: its composite kernel reads metadata only (forward-mode AD
    asks it of every tangent), which a program cannot return."""
    return any(isinstance(r.type, (torch._C.BoolType, torch._C.IntType, torch._C.FloatType)) for r in op._schema.returns)


def _has_kernel(qualified: str, key: str) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(qualified, key)


def supported_ops() -> list[torch._ops.OpOverload]:
    """Every aten overload the eager path can run: it (or its functional variant) has a
    rule or a decomposition, and the dispatcher would not decompose it before us."""
    from ..lowering import registry
    from ..lowering.decomp import OWN, _pytorch_tables
    from .minimal import kernels
    from .plan import functional_variant

    registry._load_rules()
    core, full = _pytorch_tables()
    from .host_ops import kernels as host_kernels

    runtime = set(kernels()) | set(host_kernels())
    supported_packets = {
        op.name().split("::")[-1].split(".")[0] for op in [*registry.RULES, *core, *full, *OWN] if isinstance(op, torch._ops.OpOverload)
    }
    out = []
    for qualified in torch._C._dispatch_get_all_op_names():
        if not qualified.startswith("aten::"):
            continue
        name, _, overload = qualified[6:].partition(".")
        stem = name[:-1] if name.endswith("_") else name
        if name not in supported_packets and stem not in supported_packets and stem + "_functional" not in supported_packets:
            continue
        # A composite runs on tpu as its parts, like on CUDA; but where the CPU has its own
        # kernel (silu_backward, mish_backward: a fused 16-bit-in-float32 computation), we
        # take the op whole, so its lowering can round once as that kernel does.
        if _has_kernel(qualified, "CompositeImplicitAutograd") and not _has_kernel(qualified, "CPU"):
            continue
        try:
            op = getattr(getattr(torch.ops.aten, name), overload or "default")
        except AttributeError:
            continue
        if op in runtime or _is_view(op) or (_returns_a_python_value(op) and _has_kernel(qualified, "CompositeExplicitAutograd")):
            continue
        try:
            fop = functional_variant(op)
        except Exception:  # noqa: BLE001 - schema oddities: not supported
            continue
        if fop is None:
            continue
        if fop in registry.RULES or fop in OWN or fop in core or fop in full:
            out.append(op)
    return out


def _native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps):  # noqa: A002
    """native_batch_norm updates the running stats without saying so in its schema; route
    it to the _native_batch_norm_legit ops, whose schemas declare the mutation."""
    aten = torch.ops.aten
    if running_mean is None:
        return aten._native_batch_norm_legit.no_stats(input, weight, bias, training, momentum, eps)
    if training:
        return aten._native_batch_norm_legit.default(input, weight, bias, running_mean, running_var, True, momentum, eps)
    out = aten._native_batch_norm_legit_no_training.default(input, weight, bias, running_mean, running_var, momentum, eps)[0]
    # in eval mode the CPU and CUDA kernels return empty save_mean/save_invstd
    empty = input.new_empty((0,), dtype=running_mean.dtype)
    return out, empty, empty.clone()


def _lu_layout_kernel(name: str) -> Any:
    """The tpu kernel of ``_linalg_det``/``_linalg_slogdet``, whose LU's layout depends on
    A's strides, which a rule cannot see. PyTorch's CPU kernels factor A^T when A is
    contiguous and real (A otherwise), and the backward formulas re-derive that choice
    from A's strides to reuse the LU. The rules (lowering/rules/linalg.py) factor A^T for
    a real A (the layout a compiled graph's contiguous inputs have); for a strided real A
    this kernel hands them A^T instead: same determinant, and the LU of A itself."""
    op = getattr(torch.ops.aten, name).default

    def kernel(A: torch.Tensor) -> Any:  # noqa: N803 - schema name
        # the generic kernel: refusals in the CPU's words (the determinant of a vector)
        return _make_kernel(op)(A.mT if A.dim() >= 2 and not A.is_contiguous() and not A.is_complex() else A)

    return kernel


# Ops whose tpu kernel is another op (registered after the generic kernels).
_REMAPS = {
    "native_batch_norm": _native_batch_norm,
    "_linalg_det": _lu_layout_kernel("_linalg_det"),
    "_linalg_slogdet": _lu_layout_kernel("_linalg_slogdet"),
}


def ensure_op_kernels() -> None:
    global _ops_registered
    if _ops_registered:
        return
    with _lock:
        if _ops_registered:
            return
        lib = torch.library.Library("aten", "IMPL")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for op in supported_ops():
                lib.impl(op, _make_kernel(op), "PrivateUse1")
                REGISTERED_OPS.add(op)
            if torch.ops.aten.convolution_overrideable.default not in REGISTERED_OPS:
                lib.impl("convolution_overrideable", _convolution_overrideable, "PrivateUse1")  # the traced route
            for name, fn in _REMAPS.items():
                lib.impl(name, fn, "PrivateUse1")
                REGISTERED_OPS.add(getattr(torch.ops.aten, name).default)
            from .host_ops import kernels as host_kernels
            from .sync_batch_norm import kernels as sync_batch_norm_kernels

            # data-dependent shapes (synced with the host), and nn.SyncBatchNorm's per-device ops
            for op, fn in {**host_kernels(), **sync_batch_norm_kernels()}.items():
                lib.impl(op, fn, "PrivateUse1")
                REGISTERED_OPS.add(op)
            from .attention import register_kernels as attention_kernels

            _libs.extend(attention_kernels())  # fused scaled_dot_product_attention (+ its own ops)
        _libs.append(lib)
        _ops_registered = True
