"""The refusals the CPU makes from a call's metadata alone, raised with PyTorch's messages.

Every rule here reads only what an eager cache key holds (each tensor's dtype, sizes,
strides, storage offset and which storage it views), so the dispatcher runs ``check`` on
a cache miss only and DeferAndFuse once per distinct op key: the hot path pays nothing.

- arguments: the reductions the CPU refuses on zero-size input (``torch.empty(0).max()``),
  the matmul family's shape/dtype checks, negative factory sizes, inputs that must share
  a dtype; worded as the CPU kernels word them (PyTorch's meta functions, which we
  otherwise rely on, word them differently or let mixed dtypes through);
- memory overlap: ``at::assert_no_internal_overlap`` / ``assert_no_partial_overlap`` /
  ``assert_no_overlap`` on the tensors an op writes, as each CPU kernel applies them;
- results: an in-place self must have the broadcast result's shape, and every written
  tensor must hold the result's dtype: safely castable to it for TensorIterator's kernels,
  the exact dtype for most others, each with its own message.

Which kernel checks what comes from sweeping OpInfo's in-place and out= variants on the
CPU (tests/test_errors.py keeps that sweep); an op not in the overlap table is not
checked, an op not in the dtype table gets TensorIterator's rule.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch._prims_common import can_safe_cast_to
from torch.utils._pytree import tree_flatten

from ..lowering.strided import dense_order
from ..tensor.storage import cell_of
from .minimal import check_not_pinned
from .plan import KIND_TENSOR, KIND_TENSOR_LIST, OpPlan

aten = torch.ops.aten

INTERNAL_OVERLAP = (
    "unsupported operation: more than one element of the written-to tensor refers to a single memory location. "
    "Please clone() the tensor before performing the operation."
)
PARTIAL_OVERLAP = (
    "unsupported operation: some elements of the input tensor and the written-to tensor refer to a single memory location. "
    "Please clone() the tensor before performing the operation."
)


F = TypeVar("F", bound=Callable[..., None])


def _as_the_cpu_says(fn: F) -> F:
    """Mark what ``fn`` raises as already worded for tpu like the CPU's error (naming
    torch.tpu tensor types), so eager/cpu_errors.py does not ask the CPU to say it again."""

    @functools.wraps(fn)
    def checked(*args: Any) -> None:
        try:
            fn(*args)
        except Exception as e:
            e.torchtpu_as_cpu = True  # type: ignore[attr-defined]
            raise

    return checked  # type: ignore[return-value]


@_as_the_cpu_says
def check(plan: OpPlan, values: list[Any]) -> None:
    """Raise what the CPU raises for this call's metadata, in the CPU's order (arguments,
    then overlap, then what the written tensors can hold). Runs once per cache key."""
    arguments(plan, values)
    written = [t for t in plan.mutated_tensors(values) if isinstance(t, torch.Tensor)]
    if written:
        overlap(plan, values, written)
        results(plan, values)


@_as_the_cpu_says
def before_resize(plan: OpPlan, values: list[Any]) -> None:
    """The overlap checks on out= tensors as the caller passed them: the CPU makes them
    before it resizes out (the dispatcher resizes before the call is keyed)."""
    written = [t for t in plan.mutated_tensors(values) if isinstance(t, torch.Tensor)]
    overlap(plan, values, written)


def rule_name(plan: OpPlan) -> str:
    """The op's name without overload or in-place underscore: add_.Tensor, add.out -> add;
    a foreach op is its per-tensor op (_foreach_mul_ -> mul), as the CPU runs it."""
    name = plan.op._opname
    if name.endswith("_") and not name.endswith("__"):
        name = name[:-1]
    return name.removeprefix("_foreach_")


# ----------------------------------------------------------------------------------------
# dtype names as c10 prints them
# ----------------------------------------------------------------------------------------
@functools.cache
def scalar_name(dtype: torch.dtype) -> str:
    """c10::ScalarType's name: Float, Long, ComplexFloat, BFloat16."""
    return torch.empty(0, dtype=dtype).type()[len("torch.") : -len("Tensor")]


_TYPE_META = {
    torch.float32: "float",
    torch.float64: "double",
    torch.float16: "c10::Half",
    torch.bfloat16: "c10::BFloat16",
    torch.complex32: "c10::complex<c10::Half>",
    torch.complex64: "c10::complex<float>",
    torch.complex128: "c10::complex<double>",
    torch.int8: "signed char",
    torch.uint8: "unsigned char",
    torch.int16: "short int",
    torch.int32: "int",
    torch.int64: "long int",
    torch.bool: "bool",
}


def type_meta_name(dtype: torch.dtype) -> str:
    """caffe2::TypeMeta's name (the C++ type): float, long int, c10::complex<float>."""
    return _TYPE_META.get(dtype, scalar_name(dtype))


def _sizes(t: torch.Tensor) -> str:
    return "[" + ", ".join(str(s) for s in t.shape) + "]"


# ----------------------------------------------------------------------------------------
# arguments: shapes and input dtypes the CPU kernels check
# ----------------------------------------------------------------------------------------
@_as_the_cpu_says
def arguments(plan: OpPlan, values: list[Any]) -> None:
    """The argument rules of ops whose CPU kernels check more than (or word it differently
    from) their meta functions: empty reductions, the matmul family, factories' sizes,
    inputs that must share a dtype. Also called when a meta function refuses a call
    (plan.functional_meta), so the CPU's message wins over the meta's. Only aten ops: the
    rules go by op name, and a library's ``mylib::scatter`` is not aten's scatter."""
    if plan.op.namespace != "aten":
        return
    if "pin_memory" in plan.names:
        check_not_pinned(values[plan.names.index("pin_memory")])
    rule = _shape_rules().get(plan.functional)
    if rule is None and plan.functional._opname in _FACTORIES:
        rule = _factory_size
    named = _INPUT_RULES.get(rule_name(plan))
    if rule is None and named is None:
        return
    args = dict(zip(plan.names, values))
    if rule is not None:
        rule(plan, args)
    if named is not None:
        named(plan, args)


# factory ops with a size argument (their meta functions refuse a negative size wordlessly)
_FACTORIES = {"empty", "empty_strided", "empty_permuted", "zeros", "ones", "full", "rand", "randn", "randint", "normal"}
_FACTORIES |= {"new_" + n for n in ("empty", "empty_strided", "zeros", "ones", "full")}


def _factory_size(plan: OpPlan, a: dict[str, Any]) -> None:
    """at::check_size_nonnegative (torch.randn(-1))."""
    size = a.get("size")
    if isinstance(size, (list, tuple)):
        for s in size:
            if isinstance(s, int) and s < 0:
                if plan.functional._opname == "zeros":  # the CPU's zeros checks the sizes itself first
                    raise RuntimeError("zeros: Dimension size must be non-negative.")
                raise RuntimeError(f"Trying to create tensor with negative dimension {s}: {list(size)}")


def _wrap(dim: int, ndim: int) -> int:
    return dim % ndim if ndim and -ndim <= dim < ndim else dim


def _nonzero_dim(x: torch.Tensor, dim: int, label: str, wrap: bool = True) -> None:
    """at::native::zero_numel_check_dims for one dim."""
    if x.numel() != 0 or x.dim() == 0:
        return
    d = _wrap(dim, x.dim())
    if 0 <= d < x.dim() and x.shape[d] == 0:
        raise IndexError(f"{label}: Expected reduction dim {d if wrap else dim} to have non-zero size.")


def _unspecified(label: str, suffix: bool = True) -> str:
    tail = " Specify the reduction dim with the 'dim' argument." if suffix else ""
    return f"{label}: Expected reduction dim to be specified for input.numel() == 0.{tail}"


def _max_min_all(plan: OpPlan, a: dict[str, Any]) -> None:
    # max.unary_out (same functional) returns -inf for an empty input on the CPU
    if plan.op._overloadname == "unary_out":
        return
    if a["self"].numel() == 0:
        raise RuntimeError(_unspecified(f"{plan.functional._opname}()"))


def _max_min_dim(plan: OpPlan, a: dict[str, Any]) -> None:
    _nonzero_dim(a["self"], a["dim"], f"{plan.functional._opname}()")


def _amax_amin(plan: OpPlan, a: dict[str, Any]) -> None:
    x, dims, label = a["self"], a["dim"], f"{plan.functional._opname}()"
    if x.numel() == 0 and not dims:
        raise RuntimeError(_unspecified(label))
    for d in dims:
        _nonzero_dim(x, d, label, wrap=False)  # amax names the dim as given


def _argmax_argmin(plan: OpPlan, a: dict[str, Any]) -> None:
    x, dim, label = a["self"], a["dim"], f"{plan.functional._opname}()"
    if dim is None:
        if x.numel() == 0:
            raise IndexError(_unspecified(label, suffix=False))
    else:
        _nonzero_dim(x, dim, label)


def _aminmax(plan: OpPlan, a: dict[str, Any]) -> None:
    x, dim = a["self"], a["dim"]
    if dim is None:
        if x.numel() == 0:
            raise RuntimeError("aminmax(): cannot compute aminmax over an empty dimension as the operation has no identity.")
    else:
        _nonzero_dim(x, dim, "aminmax")


def _dim_reduction(label: str) -> Callable[[OpPlan, dict[str, Any]], None]:
    def rule(plan: OpPlan, a: dict[str, Any]) -> None:
        _nonzero_dim(a["self"], a["dim"], label)

    return rule


def _topk(plan: OpPlan, a: dict[str, Any]) -> None:
    x, k, dim = a["self"], a["k"], a["dim"]
    ndim = max(x.dim(), 1)  # a 0-d tensor takes dim 0 or -1
    if isinstance(k, int) and -ndim <= dim < ndim:
        size = x.shape[dim % x.dim()] if x.dim() else 1
        if not 0 <= k <= size:
            raise RuntimeError("selected index k out of range")


def _matrix_product(m1: torch.Tensor, m2: torch.Tensor) -> None:
    if m1.shape[1] != m2.shape[0]:
        raise RuntimeError(
            f"mat1 and mat2 shapes cannot be multiplied ({m1.shape[0]}x{m1.shape[1]} and {m2.shape[0]}x{m2.shape[1]})"
        )


def _expand_to(x: torch.Tensor, sizes: list[int]) -> None:
    """at::expand_size's refusals (inferExpandGeometry)."""
    target = "[" + ", ".join(map(str, sizes)) + "]"
    if x.dim() > len(sizes):
        raise RuntimeError(
            f"expand({x.type()}{{{_sizes(x)}}}, size={target}): the number of sizes provided ({len(sizes)}) "
            f"must be greater or equal to the number of dimensions in the tensor ({x.dim()})"
        )
    for i in range(len(sizes) - 1, -1, -1):
        j = i - (len(sizes) - x.dim())
        if j >= 0 and x.shape[j] != 1 and x.shape[j] != sizes[i]:
            raise RuntimeError(
                f"The expanded size of the tensor ({sizes[i]}) must match the existing size ({x.shape[j]}) at "
                f"non-singleton dimension {i}.  Target sizes: {target}.  Tensor sizes: {_sizes(x)}"
            )


def _mm(plan: OpPlan, a: dict[str, Any]) -> None:
    m1, m2 = a["self"], a["mat2"]
    if m1.dim() != 2:
        raise RuntimeError("self must be a matrix")
    if m2.dim() != 2:
        raise RuntimeError("mat2 must be a matrix")
    _matrix_product(m1, m2)
    if m1.dtype != m2.dtype:
        raise RuntimeError(
            f"expected m1 and m2 to have the same dtype, but got: {type_meta_name(m1.dtype)} != {type_meta_name(m2.dtype)}"
        )


def _addmm_dtypes(x: torch.Tensor, m1: torch.Tensor, m2: torch.Tensor) -> None:
    if x.dtype != m2.dtype:
        raise RuntimeError(f"self and mat2 must have the same dtype, but got {scalar_name(x.dtype)} and {scalar_name(m2.dtype)}")
    if m1.dtype != m2.dtype:
        raise RuntimeError(f"mat1 and mat2 must have the same dtype, but got {scalar_name(m1.dtype)} and {scalar_name(m2.dtype)}")


def _addmm(plan: OpPlan, a: dict[str, Any]) -> None:
    x, m1, m2 = a["self"], a["mat1"], a["mat2"]
    _addmm_dtypes(x, m1, m2)
    for name, m in (("mat1", m1), ("mat2", m2)):
        if m.dim() != 2:
            raise RuntimeError(f"{name} must be a matrix, got {m.dim()}-D tensor")
    _matrix_product(m1, m2)
    if plan.op is plan.functional or plan.out_positions:  # addmm_ has its own in-place check
        _expand_to(x, [m1.shape[0], m2.shape[1]])


def _addbmm(plan: OpPlan, a: dict[str, Any]) -> None:
    # the CPU's addbmm runs addmm_ per batch: its dtype messages are addmm's
    _addmm_dtypes(a["self"], a["batch1"], a["batch2"])


def _bmm_dtypes(x: torch.Tensor | None, b1: torch.Tensor, b2: torch.Tensor) -> None:
    if x is not None and x.dtype != b1.dtype:
        raise RuntimeError(
            f"Input dtypes must be the same, got: input {type_meta_name(x.dtype)}, batch1: {type_meta_name(b1.dtype)}, "
            f"batch2: {type_meta_name(b2.dtype)}"
        )
    if b1.dtype != b2.dtype:
        raise RuntimeError(f"expected scalar type {scalar_name(b1.dtype)} but found {scalar_name(b2.dtype)}")


def _bmm(plan: OpPlan, a: dict[str, Any]) -> None:
    b1, b2 = a["self"], a["mat2"]
    if b1.dim() == 3 and b2.dim() == 3 and tuple(b2.shape[:2]) == (b1.shape[0], b1.shape[2]):
        _bmm_dtypes(None, b1, b2)


def _baddbmm(plan: OpPlan, a: dict[str, Any]) -> None:
    x, b1, b2 = a["self"], a["batch1"], a["batch2"]
    if b1.dim() != 3 or b2.dim() != 3 or tuple(b2.shape[:2]) != (b1.shape[0], b1.shape[2]):
        return  # the meta function words these as the CPU does
    if plan.op is plan.functional or plan.out_positions:
        _expand_to(x, [b1.shape[0], b1.shape[1], b2.shape[2]])
    _bmm_dtypes(x, b1, b2)


def _addmv_checks(x: torch.Tensor, mat: torch.Tensor, vec: torch.Tensor, input_size: int | None) -> None:
    if not (mat.dim() == 2 and vec.dim() == 1 and x.dim() <= 1):
        raise RuntimeError(f"vector + matrix @ vector expected, got {x.dim()}, {mat.dim()}, {vec.dim()}")
    if mat.shape[1] != vec.shape[0] or not (mat.shape[0] == x.numel() or x.numel() == 1):
        if input_size is None and x.dim() == 0:  # the CPU's message reads self.size(0)
            raise IndexError("Dimension specified as 0 but tensor has no dimensions")
        size = input_size if input_size is not None else x.shape[0]
        raise RuntimeError(f"size mismatch, got input ({size}), mat ({mat.shape[0]}x{mat.shape[1]}), vec ({vec.shape[0]})")
    if not x.dtype == mat.dtype == vec.dtype:
        names = [scalar_name(t.dtype) for t in (x, mat, vec)]
        raise RuntimeError(f"addmv input tensors must have the same dtype, but got {names[0]}, {names[1]}, and {names[2]}")


def _mv(plan: OpPlan, a: dict[str, Any]) -> None:
    mat, vec = a["self"], a["vec"]
    if mat.dim() == 0:  # the CPU sizes the result by self.size(0) first
        raise IndexError("Dimension specified as 0 but tensor has no dimensions")
    # the CPU's mv is addmv_ into a fresh 1-D result with the vector's dtype
    result = torch.empty(mat.shape[:1] if mat.dim() else (1,), dtype=vec.dtype, device="meta")
    _addmv_checks(result, mat, vec, mat.shape[0] if mat.dim() else None)


def _addmv(plan: OpPlan, a: dict[str, Any]) -> None:
    _addmv_checks(a["self"], a["mat"], a["vec"], None)


def _dot(plan: OpPlan, a: dict[str, Any]) -> None:
    x, y = a["self"], a["tensor" if "tensor" in a else "other"]
    if x.dim() != 1 or y.dim() != 1:
        raise RuntimeError(f"1D tensors expected, but got {x.dim()}D and {y.dim()}D tensors")
    if x.dtype != y.dtype:
        raise RuntimeError(
            f"dot : expected both vectors to have same dtype, but found {scalar_name(x.dtype)} and {scalar_name(y.dtype)}"
        )
    if x.numel() != y.numel():
        raise RuntimeError(
            f"inconsistent tensor size, expected tensor [{x.numel()}] and src [{y.numel()}] to have the same number of "
            f"elements, but got {x.numel()} and {y.numel()} elements respectively"
        )


@functools.cache
def _shape_rules() -> dict[Any, Callable[[OpPlan, dict[str, Any]], None]]:
    rules: dict[Any, Callable[[OpPlan, dict[str, Any]], None]] = {
        aten.max.default: _max_min_all,
        aten.min.default: _max_min_all,
        aten.max.dim: _max_min_dim,
        aten.min.dim: _max_min_dim,
        aten.amax.default: _amax_amin,
        aten.amin.default: _amax_amin,
        aten.argmax.default: _argmax_argmin,
        aten.argmin.default: _argmax_argmin,
        aten.aminmax.default: _aminmax,
        aten.median.dim: _dim_reduction("median()"),
        aten.nanmedian.dim: _dim_reduction("median()"),
        aten.mode.default: _dim_reduction("mode()"),
        aten.kthvalue.default: _dim_reduction("kthvalue()"),
        aten.topk.default: _topk,
        aten.mm.default: _mm,
        aten.addmm.default: _addmm,
        aten._addmm_activation.default: _addmm,
        aten.addbmm.default: _addbmm,
        aten.bmm.default: _bmm,
        aten.baddbmm.default: _baddbmm,
        aten.mv.default: _mv,
        aten.addmv.default: _addmv,
        aten.dot.default: _dot,
        aten.vdot.default: _dot,
    }
    return rules


# ----------------------------------------------------------------------------------------
# input dtypes the CPU kernels check (by rule_name)
# ----------------------------------------------------------------------------------------
def _same_dtype(arg: str, message: str) -> Callable[[OpPlan, dict[str, Any]], None]:
    """In place, ``self`` and ``arg`` must share a dtype (the indexing kernels' checks).
    {S}/{A}: their ScalarType names, {s}/{a}: their C++ type names."""

    def rule(plan: OpPlan, a: dict[str, Any]) -> None:
        x, y = a.get("self"), a.get(arg)
        if plan.out_positions or not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor) or x.dtype == y.dtype:
            return
        names = {"S": scalar_name(x.dtype), "A": scalar_name(y.dtype), "s": type_meta_name(x.dtype), "a": type_meta_name(y.dtype)}
        raise RuntimeError(message.format(**names))

    return rule


_index_put_values = _same_dtype(
    "values", "Index put requires the source and destination dtypes match, got {S} for the destination and {A} for the source."
)


def fills_a_mask(a: dict[str, Any]) -> bool:
    """index_put_ that the CPU runs as masked_fill_ (x[mask] = one value), which takes any
    dtype and checks no overlap (the dispatcher has moved a CPU 0-d value here already, so
    a tpu 0-d value passes too)."""
    masks = [i for i in a["indices"] if i is not None and i.dtype in (torch.bool, torch.uint8)]
    return len(masks) == 1 and not a.get("accumulate") and a["values"].dim() == 0


def _index_put(plan: OpPlan, a: dict[str, Any]) -> None:
    if not fills_a_mask(a):
        _index_put_values(plan, a)


def _sub(plan: OpPlan, a: dict[str, Any]) -> None:
    def is_bool(v: Any) -> bool:
        return v.dtype == torch.bool if isinstance(v, torch.Tensor) else isinstance(v, bool)

    x, y = is_bool(a.get("self")), is_bool(a.get("other"))
    if x and y:
        raise RuntimeError(
            "Subtraction, the `-` operator, with two bool tensors is not supported. Use the `^` or `logical_xor()` operator instead."
        )
    if x or y:
        raise RuntimeError(
            "Subtraction, the `-` operator, with a bool tensor is not supported. If you are trying to invert a mask, "
            "use the `~` or `logical_not()` operator instead."
        )


def _assert_async(plan: OpPlan, a: dict[str, Any]) -> None:
    """The CPU reads the condition as a Python bool would (``bool(tensor)``)."""
    n = a["self"].numel()
    if n != 1:
        raise RuntimeError(f"Boolean value of Tensor with {'no values' if n == 0 else 'more than one value'} is ambiguous")


def _heaviside(plan: OpPlan, a: dict[str, Any]) -> None:
    x, y, out = a["self"], a["values"], a.get("out")
    tensors = [t for t in (x, y, out) if isinstance(t, torch.Tensor)]
    if any(t.is_complex() for t in tensors):
        raise RuntimeError("heaviside is not yet implemented for complex tensors.")
    if any(t.dtype != x.dtype for t in tensors):
        raise RuntimeError("heaviside is not yet implemented for tensors with different dtypes.")


def _continuous(label: str, type_meta: bool) -> Callable[[OpPlan, dict[str, Any]], None]:
    """exponential_/cauchy_ into an integer tensor."""

    def rule(plan: OpPlan, a: dict[str, Any]) -> None:
        x = a["self"]
        if not x.is_floating_point():
            name = type_meta_name(x.dtype) if type_meta else scalar_name(x.dtype)
            raise RuntimeError(
                f"{label} distribution is a continuous probability distribution. dtype must be a floating point but you specified {name}"
            )

    return rule


def _floating_input(plan: OpPlan, a: dict[str, Any]) -> None:
    x = a["self"]
    if isinstance(x, torch.Tensor) and not (x.is_floating_point() or x.is_complex()):
        raise RuntimeError(
            f"linalg.vector_norm: Expected a floating point or complex tensor as input. Got {scalar_name(x.dtype)}"
        )


def _vector_norm(plan: OpPlan, a: dict[str, Any]) -> None:
    _floating_input(plan, a)
    x, ord_, dims = a["self"], a["ord"], a["dim"]
    if x.numel() != 0 or not isinstance(ord_, (int, float)) or not (ord_ < 0 or ord_ == float("inf")):
        return
    shown = str(int(ord_)) if math.isfinite(ord_) and ord_ == int(ord_) else str(ord_)
    for d in [dims] if isinstance(dims, int) else dims or ():
        if 0 <= _wrap(d, x.dim()) < x.dim() and x.shape[_wrap(d, x.dim())] == 0:
            # the CPU's message, missing space included
            raise RuntimeError(
                f"linalg.vector_norm cannot compute the {shown} norm on the dimension {d}because this dimension is empty "
                "and the operation does not have an identity"
            )


def _addr(plan: OpPlan, a: dict[str, Any]) -> None:
    x = a["self"]
    if not plan.out_positions and plan.op is not plan.functional and x.dim() != 2:  # addr_ writes self
        raise RuntimeError(f"2D tensor expected, got {x.dim()}D tensor for input")


def _complex(plan: OpPlan, a: dict[str, Any]) -> None:
    real, imag = a["real"], a["imag"]
    if not {real.dtype, imag.dtype} <= {torch.float16, torch.float32, torch.float64}:
        raise RuntimeError(
            "Expected both inputs to be Half, Float or Double tensors but got "
            f"{scalar_name(real.dtype)} and {scalar_name(imag.dtype)}"
        )
    if real.dtype != imag.dtype:
        raise RuntimeError(
            f"Expected object of scalar type {scalar_name(real.dtype)} but got scalar type "
            f"{scalar_name(imag.dtype)} for second argument"
        )


_masked_scatter_source = _same_dtype(
    "source", "masked_scatter: expected self and source to have same dtypes but got{S} and {A}"
)


def _masked_scatter(plan: OpPlan, a: dict[str, Any]) -> None:
    mask = a["mask"]
    if mask.dtype != torch.bool:
        raise RuntimeError(f"masked_scatter_ only supports boolean masks, but got mask with dtype {scalar_name(mask.dtype)}")
    _masked_scatter_source(plan, a)


def _integral_only(kernel: str) -> Callable[[OpPlan, dict[str, Any]], None]:
    """Bitwise ops, shifts, gcd and lcm have no floating-point kernel on any device: the
    CPU's dispatch refuses the computation dtype (XLA refused the program instead)."""

    def rule(plan: OpPlan, a: dict[str, Any]) -> None:
        operands = [a[k] for k in ("self", "other") if a.get(k) is not None]
        dtype = torch.result_type(*operands) if len(operands) == 2 else operands[0].dtype
        if dtype.is_floating_point or dtype.is_complex:
            raise NotImplementedError(f"\"{kernel}_cpu\" not implemented for '{scalar_name(dtype)}'")

    return rule


def _indices(arg: str, position: int, checking: str) -> Callable[[OpPlan, dict[str, Any]], None]:
    """at::checkScalarTypes on an embedding's indices: Long or Int."""

    def rule(plan: OpPlan, a: dict[str, Any]) -> None:
        t = a.get(arg)
        if isinstance(t, torch.Tensor) and t.dtype not in (torch.int64, torch.int32):
            raise RuntimeError(
                f"Expected tensor for argument #{position} '{arg}' to have one of the following scalar types: Long, Int; "
                f"but got {t.type()} instead (while checking arguments for {checking})"
            )

    return rule


def _pow(plan: OpPlan, a: dict[str, Any]) -> None:
    """The CPU's pow has no bool kernel: bool ** bool and True ** a bool tensor are refused
    (bool ** True and ** False are copies and ones, which it special-cases)."""
    x, y = a.get("self"), a.get("exponent")
    if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
        dtype = torch.result_type(x, y)
    elif isinstance(y, torch.Tensor):
        dtype = torch.result_type(y, x)
    else:
        return  # a tensor to a Scalar power
    if dtype is torch.bool:
        raise NotImplementedError("\"pow\" not implemented for 'Bool'")


def _clamp_bool(plan: OpPlan, a: dict[str, Any]) -> None:
    """Clamping a bool tensor to Python-number bounds: the CPU's scalar kernels have no bool
    version (tensor bounds are accepted)."""
    x = a.get("self")
    if not isinstance(x, torch.Tensor) or x.dtype is not torch.bool:
        return
    bounds = {k: a.get(k) for k in ("min", "max") if k in a}
    if any(isinstance(v, torch.Tensor) for v in bounds.values()) or all(v is None for v in bounds.values()):
        return
    given = [k for k, v in bounds.items() if v is not None]
    kernel = "clamp" if len(given) == 2 else f"clamp_{given[0]}"
    raise NotImplementedError(f"\"{kernel}_scalar_cpu\" not implemented for 'Bool'")


_put_source = _same_dtype(
    "source", "put_(): self and source expected to have the same dtype, but got self.dtype = {S} and source.dtype = {A}"
)


def _put(plan: OpPlan, a: dict[str, Any]) -> None:
    index = a["index"]
    if index.dtype != torch.int64:  # tpu wrote through a float index
        raise RuntimeError(f"put_(): Expected a long tensor for index, but got {scalar_name(index.dtype)}")
    _put_source(plan, a)


def _index_select(plan: OpPlan, a: dict[str, Any]) -> None:
    index = a["index"]
    if index.dim() > 1:  # the CPU checks the rank first
        raise IndexError("index_select(): Index is supposed to be a vector")
    if index.dtype not in (torch.int64, torch.int32):
        raise RuntimeError("index_select(): Expected dtype int32 or int64 for index")


def _bucketize(plan: OpPlan, a: dict[str, Any]) -> None:
    boundaries = a["boundaries"]
    if boundaries.dim() != 1:
        raise RuntimeError(f"boundaries tensor must be 1 dimension, but got dim({boundaries.dim()})")


def _diagonal_scatter(plan: OpPlan, a: dict[str, Any]) -> None:
    x, src = a["self"], a["src"]
    slice_shape = list(torch.diagonal(torch.empty(x.shape, device="meta"), a["offset"], a["dim1"], a["dim2"]).shape)
    if list(src.shape) != slice_shape:
        raise RuntimeError(
            f"expected src to have a size equal to the slice of self. src size = {list(src.shape)}, slice size = {slice_shape}"
        )


def _grid_sampler(plan: OpPlan, a: dict[str, Any]) -> None:
    """The CPU kernel reads the grid as the input's dtype and refuses any other (a bfloat16
    model sampling at float32 coordinates, as RAFT's under ``.to(torch.bfloat16)``)."""
    x, grid = a["input"], a["grid"]
    if x.dtype != grid.dtype:
        raise RuntimeError(f"expected scalar type {scalar_name(x.dtype)} but found {scalar_name(grid.dtype)}")


_INPUT_RULES: dict[str, Callable[[OpPlan, dict[str, Any]], None]] = {
    **{name: _integral_only(name) for name in ("bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not", "gcd", "lcm")},
    **{name: _integral_only("lshift") for name in ("bitwise_left_shift", "__lshift__", "__ilshift__")},
    **{name: _integral_only("rshift") for name in ("bitwise_right_shift", "__rshift__", "__irshift__")},
    "index_select": _index_select,
    "pow": _pow,
    "clamp": _clamp_bool,
    "clamp_min": _clamp_bool,
    "clamp_max": _clamp_bool,
    "embedding_renorm": _indices("indices", 2, "embedding_renorm_"),
    "embedding_dense_backward": _indices("indices", 2, "embedding_backward"),
    "bucketize": _bucketize,
    "diagonal_scatter": _diagonal_scatter,
    "index_add": _same_dtype("source", "index_add_(): self ({S}) and source ({A}) must have the same scalar type"),
    "index_reduce": _same_dtype("source", "index_reduce_(): self ({S}) and source ({A}) must have the same scalar type"),
    "index_copy": _same_dtype(
        "source", "index_copy_(): self and source expected to have the same dtype, but got (self) {S} and (source) {A}"
    ),
    "index_put": _index_put,
    "put": _put,
    "scatter": _same_dtype("src", "scatter(): Expected self.dtype to be equal to src.dtype"),
    "scatter_add": _same_dtype("src", "scatter(): Expected self.dtype to be equal to src.dtype"),
    "scatter_reduce": _same_dtype("src", "scatter(): Expected self.dtype to be equal to src.dtype"),
    "masked_scatter": _masked_scatter,
    "complex": _complex,
    "lerp": _same_dtype("end", "expected dtype {s} for `end` but got dtype {a}"),
    "sub": _sub,
    "rsub": _sub,
    "heaviside": _heaviside,
    "_assert_async": _assert_async,
    "exponential": _continuous("Exponential", type_meta=False),
    "cauchy": _continuous("Cauchy", type_meta=True),
    "linalg_vector_norm": _vector_norm,
    "renorm": _floating_input,
    "addr": _addr,
    "grid_sampler_2d": _grid_sampler,
    "grid_sampler_3d": _grid_sampler,
}


# ----------------------------------------------------------------------------------------
# memory overlap
# ----------------------------------------------------------------------------------------
def assert_no_internal_overlap(t: torch.Tensor) -> None:
    """at::assert_no_internal_overlap: only a stride-0 dim of size > 1 is a sure overlap;
    other non-dense layouts are TOO_HARD, which the CPU lets through."""
    if torch._debug_has_internal_overlap(t) == 1:
        raise RuntimeError(INTERNAL_OVERLAP)


NO, PARTIAL, FULL, TOO_HARD = range(4)


def overlap_status(a: torch.Tensor, b: torch.Tensor) -> int:
    """at::get_overlap_status on the view metadata (byte ranges within one storage)."""
    if a.numel() == 0 or b.numel() == 0:
        return NO
    # c10's compute_non_overlapping_and_dense (some permutation of the dims is contiguous),
    # which agrees with dense_order once no dim is empty
    if dense_order(a.shape, a.stride()) is None or dense_order(b.shape, b.stride()) is None:
        return TOO_HARD
    if cell_of(a) is not cell_of(b):
        return NO
    a0, b0 = a.storage_offset() * a.element_size(), b.storage_offset() * b.element_size()
    a1, b1 = a0 + a.numel() * a.element_size(), b0 + b.numel() * b.element_size()
    if a0 == b0 and a1 == b1:
        return FULL if a.stride() == b.stride() else PARTIAL
    return PARTIAL if a0 < b1 and b0 < a1 else NO


def assert_no_partial_overlap(written: torch.Tensor, read: torch.Tensor) -> None:
    if overlap_status(written, read) == PARTIAL:
        raise RuntimeError(PARTIAL_OVERLAP)


def assert_no_overlap(written: torch.Tensor, read: torch.Tensor) -> None:
    if overlap_status(written, read) in (PARTIAL, FULL):
        raise RuntimeError(PARTIAL_OVERLAP)


class Overlap:
    """Which overlap checks an op's CPU kernel makes: ``internal`` on what it writes;
    ``partial``: the inputs (argument names, or ALL) that may not partially overlap what
    it writes; ``full``: inputs that may not overlap it at all (at::assert_no_overlap)."""

    __slots__ = ("internal", "partial", "full", "unless", "expanded")

    def __init__(
        self,
        internal: bool,
        partial: tuple[str, ...] | str = (),
        full: tuple[str, ...] = (),
        unless: Callable[[dict[str, Any]], bool] | None = None,
        expanded: bool = False,
    ):
        self.internal, self.partial, self.full = internal, partial, full
        self.unless = unless  # the arguments for which the kernel takes a path that checks nothing
        self.expanded = expanded  # the kernel checks the input broadcast to the output's shape


ALL = "*"
_TENSOR_ITERATOR = Overlap(True, ALL)


def overlap(plan: OpPlan, values: list[Any], written: list[torch.Tensor]) -> None:
    """The CPU's memory-overlap refusals for what this call writes."""
    rule = _OVERLAP.get(rule_name(plan))
    if rule is None:
        return  # kernels we have not seen check: let them through, as the CPU may
    if rule.unless is not None and rule.unless(dict(zip(plan.names, values))):
        return
    if rule.internal:
        for w in written:
            assert_no_internal_overlap(w)
    foreach = plan.op._opname.startswith("_foreach_")
    mutable = set(plan.mutable)
    for i, (name, kind, v) in enumerate(zip(plan.names, plan.kinds, values)):
        if i in mutable or kind not in (KIND_TENSOR, KIND_TENSOR_LIST) or v is None:
            continue
        full = name in rule.full
        if not full and not (rule.partial == ALL or name in rule.partial):
            continue
        check_pair = assert_no_overlap if full else assert_no_partial_overlap
        reads = list(v) if isinstance(v, (list, tuple)) else [v]
        for j, w in enumerate(written):
            # a foreach op works tensor by tensor: tensors[j] against others[j]
            for r in [reads[j]] if foreach and j < len(reads) else [] if foreach else reads:
                if isinstance(r, torch.Tensor):
                    check_pair(w, _broadcast(r, w) if rule.expanded else r)


def _broadcast(r: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``r`` expanded to ``w``'s shape, as the kernel reads it (a stride-0 view: TOO_HARD)."""
    try:
        return r.expand(w.shape)
    except RuntimeError:
        return r


# What the sweep of OpInfo's in-place and out= variants (expanded self, partially and fully
# overlapping inputs) shows each CPU kernel checks. Not listed: no check (fill_, zero_,
# masked_fill_, tril_/triu_, threshold_, the linalg and copy-family out= ops).
_OVERLAP: dict[str, Overlap] = {
    name: _TENSOR_ITERATOR
    for name in """
    abs acos acosh add addcdiv addcmul addr angle asin asinh atan atan2 atanh bernoulli bitwise_and
    bitwise_left_shift bitwise_not bitwise_or bitwise_right_shift bitwise_xor cauchy ceil celu clamp clamp_max
    clamp_min copysign cos cosh cumprod cumsum deg2rad digamma div elu eq erf erfc erfinv exp exp2 expm1
    exponential floor floor_divide fmax fmin fmod frac gcd ge gelu geometric gt hardshrink hardsigmoid
    heaviside hypot i0 igamma igammac lcm le leaky_relu lerp lgamma log log10 log1p log2 log_normal logaddexp
    logaddexp2 logical_and logical_not logical_or logical_xor logit lt maximum minimum mish mul nan_to_num ne
    neg nextafter normal polygamma pow rad2deg reciprocal remainder renorm round rsqrt sgn sigmoid sign silu
    sin sinc sinh softplus softshrink sqrt sub tan tanh trunc uniform where xlogy relu hardtanh hardswish
    rrelu_with_noise
    special_airy_ai special_bessel_j0 special_bessel_j1 special_bessel_y0 special_bessel_y1
    special_chebyshev_polynomial_t special_chebyshev_polynomial_u special_chebyshev_polynomial_v
    special_chebyshev_polynomial_w special_entr special_erfcx special_hermite_polynomial_h
    special_hermite_polynomial_he special_i0e special_i1 special_i1e special_laguerre_polynomial_l
    special_legendre_polynomial_p special_log_ndtr special_modified_bessel_i0 special_modified_bessel_i1
    special_modified_bessel_k0 special_modified_bessel_k1 special_ndtri special_scaled_modified_bessel_k0
    special_scaled_modified_bessel_k1 special_shifted_chebyshev_polynomial_t special_shifted_chebyshev_polynomial_u
    special_shifted_chebyshev_polynomial_v special_shifted_chebyshev_polynomial_w special_spherical_bessel_j0
    special_xlog1py special_zeta
    """.split()
}
_OVERLAP.update(
    {
        "copy": Overlap(True, ("src",)),
        "conj_physical": Overlap(False, ALL),
        "logcumsumexp": Overlap(False, ALL),
        "ldexp": Overlap(True, ("self",)),  # mul_out(out, self, pow(2, other)): other is never read in place
        "mvlgamma": Overlap(True),
        "masked_scatter": Overlap(True),
        # out= copies self, broadcast, into out first (copy_'s partial check); nothing else is checked
        "addmm": Overlap(True, ("self",), expanded=True),
        "addbmm": Overlap(True, ("self",), expanded=True),
        "addmv": Overlap(False, ("self",), expanded=True),
        "baddbmm": Overlap(False, ("self",), expanded=True),
        "linear": Overlap(False, ("bias",), expanded=True),
        "sort": Overlap(False, ("self",)),
        "linalg_solve_triangular": Overlap(False, ("B",)),
        # the indexing kernels' own asserts
        "index_copy": Overlap(True, ("self",), ("index", "source")),
        "index_add": Overlap(True, ("self",), ("index", "source")),
        "index_reduce": Overlap(True, ("self",), ("index", "source")),
        "index_fill": Overlap(True, ("self",), ("index",)),
        "index_select": Overlap(True, (), ("self", "index")),
        "gather": Overlap(True, ("index",), ("self",)),
        "scatter": Overlap(True, ("self",), ("index", "src")),
        "scatter_add": Overlap(True, ("self",), ("index", "src")),
        "scatter_reduce": Overlap(True, ("self",), ("index", "src")),
        "index_put": Overlap(False, ("values",), ("indices",), unless=fills_a_mask),  # an expanded self only warns
        "put": Overlap(True, (), ("index", "source")),
        "take": Overlap(True, (), ("self", "index")),
        "linalg_cross": Overlap(False, (), ("self", "other")),
        "cat": Overlap(True, (), ("tensors",)),  # cat's meta: out against every input
    }
)


# ----------------------------------------------------------------------------------------
# results: the written tensors against the functional results
# ----------------------------------------------------------------------------------------
SAFE, EXACT, FLOATING, ANY = range(4)
_TENSOR_ITERATOR_DTYPE = (SAFE, "result type {R} can't be cast to the desired output type {O}")
_STRUCTURED = (EXACT, "Expected out tensor to have dtype {r}, but got {o} instead")
_UNARY_SAME = (EXACT, "Found dtype {O} but expected {R}")  # unary TensorIterator ops that keep the dtype


def results(plan: OpPlan, values: list[Any]) -> None:
    """Each written tensor against the functional result it receives: an in-place self must
    have the broadcast result's shape, and its dtype must be able to hold the result's
    (TensorIterator's canCast by default; the exact dtype for most other kernels).
    {R}/{O}: the result's/written tensor's ScalarType names, {r}/{o} their C++ type
    names, {S}/{s} self's."""
    metas = plan.functional_meta(values)
    produced, _ = tree_flatten(list(metas[plan.n_plain :]))
    rules = _DTYPE_RULES.get(plan.op.name().removeprefix("aten::")) or _DTYPE_RULES.get(rule_name(plan), _TENSOR_ITERATOR_DTYPE)
    n_out = len(tree_flatten([values[i] for i in plan.out_positions])[0])
    x = dict(zip(plan.names, values)).get("self")
    for i, (t, m) in enumerate(zip(plan.mutated_tensors(values), produced)):
        if not isinstance(t, torch.Tensor) or not isinstance(m, torch.Tensor):
            continue
        kind, message = rules[min(i, len(rules) - 1)] if isinstance(rules, list) else rules
        if i >= n_out and rule_name(plan) in _CASTS_STATE:
            continue
        if i >= n_out and t.shape != m.shape:  # written in place: out= tensors were resized
            if message is _STRUCTURED[1]:
                raise RuntimeError(
                    f"Bad in-place call: input tensor size {_sizes(t)} and output tensor size {_sizes(m)} should match"
                )
            raise RuntimeError(f"output with shape {_sizes(t)} doesn't match the broadcast shape {_sizes(m)}")
        if _holds(kind, t.dtype, m.dtype):
            continue
        s = x.dtype if isinstance(x, torch.Tensor) else m.dtype
        names = {"R": scalar_name(m.dtype), "O": scalar_name(t.dtype), "r": type_meta_name(m.dtype), "o": type_meta_name(t.dtype)}
        names.update(
            S=scalar_name(s),
            s=type_meta_name(s),
            name=rule_name(plan),
            flag=str(bool(dict(zip(plan.names, values)).get("out_int32"))),
        )
        raise RuntimeError(message.format(**names))


# Kernels that update state in place in whatever dtype it has: batch norm's running
# statistics (a bfloat16 model's float32 statistics, or bfloat16 ones) take the update cast.
_CASTS_STATE = {"native_batch_norm", "_native_batch_norm_legit"}


def _holds(kind: int, written: torch.dtype, result: torch.dtype) -> bool:
    if kind == SAFE:
        return written == result or can_safe_cast_to(cast_to=written, cast_from=result)
    if kind == FLOATING:
        return written.is_floating_point or written.is_complex or written == result
    return kind == ANY or written == result


def _safe(what: str, op: str) -> tuple[int, str]:
    return (SAFE, f"{op}: Expected {what} to be safely castable from {{R}} dtype, but got {what} with dtype {{O}}")


# How each kernel checks the dtype of what it writes, by rule_name (or op name with its
# overload where overloads differ); a list gives one rule per written tensor. Not listed:
# TensorIterator's canCast rule. From the OpInfo sweep of out= and in-place variants.
_DTYPE_RULES: dict[str, Any] = {
    name: _STRUCTURED
    for name in """
    _linalg_det _linalg_eigh _linalg_slogdet _linalg_solve_ex _linalg_svd _addmm_activation addmm addmv baddbmm
    bmm mm mv linear alias_copy as_strided_copy diag_embed diagonal_copy expand_copy permute_copy squeeze_copy
    t_copy transpose_copy unfold_copy unsqueeze_copy view_copy unbind_copy split_with_sizes_copy slice_scatter
    aminmax argmax argmin max min avg_pool2d avg_pool3d gather scatter scatter_add scatter_reduce index_add
    index_copy index_reduce isin linalg_cholesky_ex linalg_cross linalg_inv_ex linalg_lu linalg_lu_factor_ex
    linalg_lu_solve linalg_qr linalg_vector_norm log_softmax softmax _log_softmax _softmax lu_unpack renorm sort
    topk triangular_solve tril triu
    """.split()
}
_DTYPE_RULES.update(
    {
        name: _UNARY_SAME
        for name in "abs bitwise_not ceil floor frac neg round sgn sign trunc conj_physical gelu hardshrink softplus softshrink".split()
    }
)
_DTYPE_RULES.update(
    {name: (EXACT, "{name} does not support non-boolean outputs.") for name in ("signbit", "isposinf", "isneginf")}
)
_DTYPE_RULES.update({name: (EXACT, "{name} only supports bool tensor for result, got: {O}") for name in ("all", "any")})
_DTYPE_RULES.update(
    {
        "bernoulli": (ANY, ""),  # samples into any dtype
        "max.unary_out": (
            SAFE,
            "Expected canCast( typeMetaToScalarType(self.dtype()), typeMetaToScalarType(out.dtype())) to be true, but got false.  "
            "(Could this error message be improved?  If so, please report an enhancement request to PyTorch.)",
        ),
        "mean.dtype_out": (SAFE, "mean.dtype_out(): input types can't be cast to the desired output type {O}"),
        "ldexp": (SAFE, "ldexp can't be cast to the desired output type {O}"),
        "addbmm": (EXACT, "self and mat2 must have the same dtype, but got {O} and {R}"),
        "dot": (EXACT, "result dtype {O} does not match input dtype {S}"),
        "vdot": (EXACT, "result dtype {O} does not match input dtype {S}"),
        "amax": (EXACT, "Expected the dtype for input and out to match, but got {S} for input's dtype and {O} for out's dtype."),
        "amin": (EXACT, "Expected the dtype for input and out to match, but got {S} for input's dtype and {O} for out's dtype."),
        "complex": (EXACT, "Expected object of scalar type {R} but got scalar type {O} for argument 'out'"),
        "polar": (EXACT, "Expected object of scalar type {R} but got scalar type {O} for argument 'out'"),
        "cummax": (EXACT, "expected scalar_type {R} but found {O}"),
        "cummin": (EXACT, "expected scalar_type {R} but found {O}"),
        "logcumsumexp": (EXACT, "expected scalar_type {R} but found {O}"),
        "native_batch_norm": (EXACT, "expected scalar type {R} but found {O}"),
        "_native_batch_norm_legit": (EXACT, "expected scalar type {R} but found {O}"),
        "log_sigmoid_forward": (EXACT, "expected scalar type {R} but found {O}"),
        "linalg_solve_triangular": (EXACT, "expected scalar type {R} but found {O}"),
        "kthvalue": [
            (EXACT, "output values must be of same type as input"),
            (EXACT, "output indices must be of scalar type Long"),
        ],
        "mode": [
            (EXACT, "expected scalar type '{R}' but got '{O}' for values output"),
            (EXACT, "expected scalar type '{R}' but got '{O}' for indices output"),
        ],
        "frexp": [
            (EXACT, "torch.frexp() expects mantissa to have dtype {r} but got {o}"),
            (EXACT, "torch.frexp() expects exponent to have int dtype but got {o}"),
        ],
        "narrow_copy": (
            EXACT,
            "Expected self.dtype() == output.dtype() to be true, but got false.  "
            "(Could this error message be improved?  If so, please report an enhancement request to PyTorch.)",
        ),
        "ormqr": (
            EXACT,
            "torch.ormqr: Expected input and result to have the same dtype, but input has dtype{S} and result has dtype {O}",
        ),
        "nan_to_num": (EXACT, "nan_to_num: dtype of out: {O} should be same as input: {S}"),
        "index_select": (EXACT, "index_select(): self and result must have the same scalar type"),
        "take": (EXACT, "take(): self and out expected to have the same dtype, but got self.dtype = {S} and out.dtype = {O}"),
        "multinomial": (EXACT, "multinomial expects Long tensor out, got: {O}"),
        "histc": (
            EXACT,
            "torch.histogram: input tensor and hist tensor should have the same dtype, but got input {s} and hist {o}",
        ),
        "where": (EXACT, "Expected out type to be {R} but got {O}"),
        "hash_tensor": (EXACT, "Expected result to be of dtype uint64, but got {O}"),
        "logsumexp": (FLOATING, "logsumexp(): Expected floating point type for result tensor, but got: {O}"),
        "cholesky": _safe("result", "cholesky"),
        "cholesky_inverse": _safe("result", "cholesky_inverse"),
        "geqrf": [_safe("a", "torch.geqrf"), _safe("tau", "torch.geqrf")],
        "linalg_eig": [_safe("eigenvalues", "torch.linalg.eig"), _safe("eigenvectors", "torch.linalg.eig")],
        "linalg_eigvals": _safe("eigenvalues", "torch.linalg.eigvals"),
        "linalg_householder_product": _safe("result", "torch.linalg.householder_product"),
        "linalg_lstsq": [_safe("solution", "torch.linalg.lstsq"), _TENSOR_ITERATOR_DTYPE],
    }
)
_SEARCHSORTED = (
    EXACT,
    "torch.searchsorted(): output tensor's dtype is wrong, it can only be Int(int32) or Long(int64) depending on whether "
    "out_int32 flag is True, but we got output tensor's dtype {O} and out_int32 flag is {flag}",
)
_DTYPE_RULES.update({"searchsorted": _SEARCHSORTED, "bucketize": _SEARCHSORTED})
_DTYPE_RULES["min.unary_out"] = _DTYPE_RULES["max.unary_out"]
for _name in ("clamp", "clamp_min", "clamp_max"):  # the Scalar overloads (the Tensor ones are TensorIterator's)
    _DTYPE_RULES[_name + "_"] = (SAFE, "result type {R} can't be cast to the desired output type {o}")
    _DTYPE_RULES[_name + ".out"] = _UNARY_SAME
