"""Errors the CPU raises from a call's metadata, raised the same way on tpu (torchtpu/eager/validate.py):
the dtype rules of out= and in-place ops, memory overlap, reductions over nothing, the matmul family's
messages, negative sizes; and our own message for sparse layouts.

Each case runs on the CPU and on tpu (eager and DeferAndFuse) and must raise the same exception type with
the same message, or succeed on both with the same values."""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from utils import assert_close

import torchtpu
from torchtpu.eager import deferred, dispatch, validate

Case = Callable[[str], Any]


@pytest.fixture(params=["eager", "defer_and_fuse"])
def mode(request: pytest.FixtureRequest) -> Any:
    with torchtpu.eager_mode(request.param):
        yield request.param


def _outcome(fn: Case, device: str) -> tuple[str, Any]:
    torch.manual_seed(0)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = fn(device)
            if device == "tpu":
                torch.tpu.synchronize()
    except Exception as e:  # noqa: BLE001 - the exception is the result
        return type(e).__name__, str(e).split("\n")[0]
    return "ok", out


def same_as_cpu(fn: Case) -> None:
    cpu, tpu = _outcome(fn, "cpu"), _outcome(fn, "tpu")
    if cpu[0] == "ok" and tpu[0] == "ok":
        assert_close(tpu[1], cpu[1])
    else:
        assert tpu == cpu


def _r(*shape: int, dtype: torch.dtype = torch.float32) -> Callable[[str], torch.Tensor]:
    return lambda d: torch.randn(*shape).to(dtype).to(d)  # drawn on the CPU: the same values on both


def _long(*shape: int) -> Callable[[str], torch.Tensor]:
    return lambda d: torch.arange(int(torch.tensor(shape).prod()), device=d).reshape(shape)


def _empty(shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> Callable[[str], torch.Tensor]:
    return lambda d: torch.empty(shape, dtype=dtype, device=d)


def _written(fn: Callable[[torch.Tensor], Any], make: Callable[[str], torch.Tensor]) -> Case:
    """A case returning what an in-place op leaves in its self."""

    def case(d: str) -> torch.Tensor:
        x = make(d)
        fn(x)
        return x

    return case


L, F32, F64, B = torch.long, torch.float32, torch.float64, torch.bool

# -- 1. dtype rules of out= and in-place ops -------------------------------------------------------------
DTYPES: dict[str, Case] = {
    "add_out_long": lambda d: torch.add(_r(3)(d), _r(3)(d), out=_empty((3,), L)(d)),
    "add_out_bool_from_long": lambda d: torch.add(_long(3)(d), 1, out=_empty((3,), B)(d)),
    "long_mul__half": lambda d: torch.ones(3, dtype=L, device=d).mul_(0.5),
    "long_div_": lambda d: torch.ones(3, dtype=L, device=d).div_(2),
    "bool_add_": lambda d: torch.zeros(3, dtype=B, device=d).add_(1),
    "long_add__long": _written(lambda x: x.add_(2), _long(3)),
    "float_out_for_long_result": lambda d: torch.add(_long(3)(d), 1, out=_empty((0,), F32)(d)),
    "double_out_for_float_result": lambda d: torch.mul(_r(3)(d), 2, out=_empty((0,), F64)(d)),
    "comparison_into_float_out": lambda d: torch.lt(_r(4)(d), 0, out=_empty((0,), F32)(d)),
    "comparison_in_place_float": _written(lambda x: x.lt_(0), _r(4)),
    "copy__float_into_long": _written(lambda x: x.copy_(torch.full((3,), 2.7, device=x.device)), _long(3)),
    "fill__long_with_float": _written(lambda x: x.fill_(2.5), _long(3)),
    "index_put__long": _written(
        lambda x: x.index_put_((torch.tensor([0], device=x.device),), torch.tensor(7, device=x.device)), _long(3)
    ),
    "index_add__dtype": lambda d: _long(3)(d).index_add_(0, torch.tensor([0], device=d), _r(1)(d)),
    "index_copy__dtype": lambda d: _long(3)(d).index_copy_(0, torch.tensor([0], device=d), _r(1)(d)),
    "scatter__dtype": lambda d: _long(3)(d).scatter_(0, torch.tensor([0], device=d), _r(1)(d)),
    "clamp__long_float_bound": lambda d: _long(3)(d).clamp_(0.5),
    "sub_bool": lambda d: torch.ones(2, dtype=B, device=d) - torch.ones(2, dtype=B, device=d),
    "sub_bool_scalar": lambda d: torch.ones(2, dtype=B, device=d) - 1,
    "heaviside_mixed": lambda d: torch.heaviside(_r(3)(d), _r(3, dtype=F64)(d)),
    "exponential__long": lambda d: _long(3)(d).exponential_(),
    "vector_norm_long": lambda d: torch.linalg.vector_norm(_long(3)(d)),
    # the out tensor's dtype chooses the computation: the CPU casts the input first
    "sum_into_long": lambda d: torch.sum(torch.tensor([0.6, 0.6, 0.7], device=d), 0, out=_empty((0,), L)(d)),
    "cumsum_into_long": lambda d: torch.cumsum(torch.tensor([0.6, 0.6, -0.7], device=d), 0, out=_empty((0,), L)(d)),
    "prod_into_long": lambda d: torch.prod(torch.tensor([1.6, 1.6, 0.4], device=d), 0, out=_empty((0,), L)(d)),
    "sum_into_double": lambda d: torch.sum(_r(5)(d), 0, out=_empty((0,), F64)(d)),
    "mean_into_long": lambda d: torch.mean(_r(2, 3)(d), 0, out=_empty((0,), L)(d)),
    "mean_all_into_long": lambda d: torch.mean(_r(2, 3)(d), out=_empty((0,), L)(d)),
    "mean_into_double": lambda d: torch.mean(_r(2, 3)(d), 0, out=_empty((0,), F64)(d)),
    # outside TensorIterator: the exact dtype, in each kernel's words
    "abs_into_double": lambda d: torch.abs(_r(3)(d), out=_empty((0,), F64)(d)),
    "mm_into_double": lambda d: torch.mm(_r(2, 3)(d), _r(3, 4)(d), out=_empty((0,), F64)(d)),
    "argmax_into_float": lambda d: torch.argmax(_r(3, 4)(d), 1, out=_empty((0,), F32)(d)),
    "max_dim_indices_into_float": lambda d: torch.max(_r(3, 4)(d), 1, out=(_empty((0,))(d), _empty((0,))(d))),
    "max_unary_into_long": lambda d: torch.max(_r(3, 4)(d), out=_empty((0,), L)(d)),
    "amax_into_double": lambda d: torch.amax(_r(3, 4)(d), 1, out=_empty((0,), F64)(d)),
    "all_into_long": lambda d: torch.all(_r(3)(d), out=_empty((0,), L)(d)),
    "where_into_double": lambda d: torch.where(_r(3)(d) > 0, _r(3)(d), 0.0, out=_empty((0,), F64)(d)),
    "logsumexp_into_long": lambda d: torch.logsumexp(_r(3, 2)(d), 0, out=_empty((0,), L)(d)),
    "logsumexp_into_complex": lambda d: torch.logsumexp(_r(3, 2)(d), 0, out=_empty((0,), torch.complex64)(d)),
    "bernoulli_into_long": lambda d: torch.bernoulli(torch.ones(3, device=d), out=_empty((0,), L)(d)),
    "foreach_mul__long_half": lambda d: torch._foreach_mul_([_long(3)(d)], 0.5),
    # an in-place self must already have the broadcast shape
    "add__broadcast_shape": lambda d: torch.zeros(5, 1, device=d).add_(torch.zeros(5, device=d)),
    "addcmul__broadcast_shape": lambda d: torch.zeros(5, 1, device=d).addcmul_(
        torch.zeros(5, device=d), torch.zeros(1, device=d)
    ),
    "addmm__shape": lambda d: torch.zeros(1, 4, device=d).addmm_(_r(2, 3)(d), _r(3, 4)(d)),
}


@pytest.mark.parametrize("name", DTYPES)
def test_dtype_rules(name: str, mode: str) -> None:
    same_as_cpu(DTYPES[name])


# -- 2. memory overlap ------------------------------------------------------------------------------------------
def _arange(n: int) -> Callable[[str], torch.Tensor]:
    return lambda d: torch.arange(float(n), device=d)


def _expanded(d: str) -> torch.Tensor:
    return torch.zeros(1, device=d).expand(3)


def _shifted_views(d: str) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.arange(8.0, device=d)
    return x[1:5], x[0:4]


OVERLAP: dict[str, Case] = {
    "expanded_add_": lambda d: _expanded(d).add_(1),
    "expanded_copy_": lambda d: _expanded(d).copy_(torch.ones(3, device=d)),
    "expanded_exp_": lambda d: _expanded(d).exp_(),
    "expanded_uniform_": lambda d: _expanded(d).uniform_(),
    "expanded_index_add_": lambda d: _expanded(d).index_add_(0, torch.tensor([0], device=d), torch.ones(1, device=d)),
    "expanded_out": lambda d: torch.add(_r(3)(d), 1, out=torch.zeros(1, device=d).expand(3)),
    "expanded_foreach_add_": lambda d: torch._foreach_add_([_expanded(d)], 1),
    # the CPU does not check these
    "expanded_fill_": lambda d: _expanded(d).fill_(2).clone(),
    "expanded_zero_": lambda d: _expanded(d).zero_().clone(),
    "expanded_masked_fill_": lambda d: _expanded(d).masked_fill_(torch.ones(3, dtype=B, device=d), 1.0).clone(),
    "expanded_addmv_": lambda d: torch.zeros(1, device=d).expand(2).addmv_(_r(2, 3)(d), _r(3)(d)).shape,  # values: undefined
    "stride_0_size_1_add_": lambda d: torch.zeros(1, device=d).expand(1, 1).add_(1).clone(),
    # partial overlap between what is written and what is read
    "copy__shifted": lambda d: (lambda a, b: a.copy_(b))(*_shifted_views(d)),
    "add__shifted": lambda d: (lambda a, b: a.add_(b))(*_shifted_views(d)),
    "add_out_shifted": lambda d: (lambda a, b: torch.add(b, 1, out=a))(*_shifted_views(d)),
    "copy__transposed": lambda d: (lambda x: x.copy_(x.t()))(torch.arange(4.0, device=d).view(2, 2)),
    "add_out_before_resize": lambda d: (lambda x: torch.add(x, 1, out=x.view(3, 2)))(torch.arange(6.0, device=d).view(2, 3)),
    "foreach_add__shifted": lambda d: (lambda a, b: torch._foreach_add_([a], [b]))(*_shifted_views(d)),
    "index_copy__source_is_self": lambda d: (lambda x: x.index_copy_(0, torch.tensor([0, 1], device=d), x))(
        torch.zeros(2, device=d)
    ),
    "index_select_out_is_self": lambda d: (lambda x: torch.index_select(x, 0, torch.tensor([1, 0], device=d), out=x))(
        _arange(2)(d)
    ),
    # full overlap (the same memory, the same strides) and TOO_HARD layouts go through, as on the CPU
    "add__self": _written(lambda x: x.add_(x), _arange(4)),
    "add_out_is_input": lambda d: (lambda x: torch.add(x, 1, out=x))(_arange(4)(d)),
    "strided_copy__no_shared_elements": _written(lambda x: x[0:8:2].copy_(x[1:9:2]), _arange(10)),
    "disjoint_views_copy_": _written(lambda x: x[0:4].copy_(x[4:8]), _arange(8)),
    "addmm__reads_of_self_storage": _written(
        lambda x: x[0:2].view(1, 2).addmm_(x[1:3].view(1, 2), torch.eye(2, device=x.device)), _arange(4)
    ),
}


@pytest.mark.parametrize("name", OVERLAP)
def test_memory_overlap(name: str, mode: str) -> None:
    same_as_cpu(OVERLAP[name])


# -- 3. reductions over nothing ------------------------------------------------------------------------------
E0, E03 = _empty((0,)), _empty((0, 3))
EMPTY: dict[str, Case] = {
    "max": lambda d: E0(d).max(),
    "min": lambda d: E0(d).min(),
    "max_long": lambda d: _empty((0,), L)(d).max(),
    "max_dim0": lambda d: E03(d).max(0),
    "max_dim_negative": lambda d: E03(d).max(-2),
    "max_dim1_ok": lambda d: E03(d).max(1),
    "max_dim_out": lambda d: torch.max(E03(d), 0, out=(_empty((0,))(d), _empty((0,), L)(d))),
    "max_unary_out_ok": lambda d: torch.max(E0(d), out=_empty((0,))(d)),
    "min_dim0": lambda d: E03(d).min(0),
    "amax": lambda d: E0(d).amax(),
    "amin": lambda d: E0(d).amin(),
    "amax_dim0": lambda d: E03(d).amax(0),
    "amax_dim_negative": lambda d: E03(d).amax(-2),
    "amax_dims": lambda d: E03(d).amax((1, 0)),
    "amax_dim1_ok": lambda d: E03(d).amax(1),
    "amax_out": lambda d: torch.amax(E0(d), out=_empty((0,))(d)),
    "argmax": lambda d: E0(d).argmax(),
    "argmin": lambda d: E0(d).argmin(),
    "argmax_dim0": lambda d: E03(d).argmax(0),
    "argmax_dim0_keepdim": lambda d: E03(d).argmax(0, keepdim=True),
    "argmax_3x0": lambda d: torch.empty(3, 0, device=d).argmax(),
    "argmax_3x0_dim0_ok": lambda d: torch.empty(3, 0, device=d).argmax(0),
    "aminmax": lambda d: torch.aminmax(E0(d)),
    "aminmax_dim0": lambda d: torch.aminmax(E03(d), dim=0),
    "median_dim0": lambda d: E03(d).median(0),
    "nanmedian_dim0": lambda d: E03(d).nanmedian(0),
    "mode_dim0": lambda d: E03(d).mode(0),
    "mode": lambda d: E0(d).mode(),
    "kthvalue_dim0": lambda d: E03(d).kthvalue(1, 0),
    "topk_too_many": lambda d: _r(3)(d).topk(5),
    "topk_empty": lambda d: E0(d).topk(1),
    "vector_norm_inf_dim": lambda d: torch.linalg.vector_norm(E03(d), float("inf"), dim=0),
    "vector_norm_minus_one_dim": lambda d: torch.linalg.vector_norm(E03(d), -1, dim=(1, 0)),
    "vector_norm_inf": lambda d: torch.linalg.vector_norm(E0(d), float("inf")),
    "sum_ok": lambda d: E0(d).sum(),
    "logsumexp_ok": lambda d: E03(d).logsumexp(0),
    "cummax_ok": lambda d: E03(d).cummax(0),
}


@pytest.mark.parametrize("name", EMPTY)
def test_empty_reductions(name: str, mode: str) -> None:
    same_as_cpu(EMPTY[name])


@pytest.mark.parametrize("name", ["median", "nanmedian"])
def test_median_of_nothing_is_nan(name: str) -> None:
    same_as_cpu(lambda d: getattr(torch.empty(0, device=d), name)())


# -- 4. messages: the matmul family and negative sizes ---------------------------------------------------------
MATMUL: dict[str, Case] = {
    "mm": lambda d: torch.mm(_r(2, 3)(d), _r(5, 4)(d)),
    "mm_out": lambda d: torch.mm(_r(2, 3)(d), _r(5, 4)(d), out=_empty((0,))(d)),
    "mm_3d": lambda d: torch.mm(_r(2, 2, 3)(d), _r(3, 4)(d)),
    "mm_1d_mat2": lambda d: torch.mm(_r(2, 3)(d), _r(3)(d)),
    "mm_dtypes": lambda d: torch.mm(_r(2, 3)(d), _r(3, 4, dtype=F64)(d)),
    "mm_long_float": lambda d: torch.mm(_r(2, 3, dtype=L)(d), _r(3, 4)(d)),
    "mm_shape_before_dtype": lambda d: torch.mm(_r(2, 3)(d), _r(5, 4, dtype=F64)(d)),
    "addmm": lambda d: torch.addmm(_r(2, 4)(d), _r(2, 3)(d), _r(5, 4)(d)),
    "addmm_": lambda d: _r(2, 4)(d).addmm_(_r(2, 3)(d), _r(5, 4)(d)),
    "addmm_out": lambda d: torch.addmm(_r(2, 4)(d), _r(2, 3)(d), _r(5, 4)(d), out=_empty((0,))(d)),
    "addmm_bias": lambda d: torch.addmm(_r(3, 4)(d), _r(2, 3)(d), _r(3, 4)(d)),
    "addmm_bias_out": lambda d: torch.addmm(_r(3, 4)(d), _r(2, 3)(d), _r(3, 4)(d), out=_empty((0,))(d)),
    "addmm_mat1_3d": lambda d: torch.addmm(_r(2, 4)(d), _r(2, 2, 3)(d), _r(3, 4)(d)),
    "addmm_self_dtype": lambda d: torch.addmm(_r(2, 4, dtype=F64)(d), _r(2, 3)(d), _r(3, 4)(d)),
    "addmm_mat1_dtype": lambda d: torch.addmm(_r(2, 4)(d), _r(2, 3, dtype=F64)(d), _r(3, 4)(d)),
    "matmul_2d": lambda d: _r(2, 3)(d) @ _r(5, 4)(d),
    "matmul_3d_2d": lambda d: _r(7, 2, 3)(d) @ _r(5, 4)(d),
    "matmul_2d_3d": lambda d: _r(2, 3)(d) @ _r(7, 5, 4)(d),
    "matmul_batch": lambda d: _r(7, 2, 3)(d) @ _r(6, 3, 4)(d),
    "matmul_1d_1d": lambda d: _r(3)(d) @ _r(4)(d),
    "matmul_1d_2d": lambda d: _r(3)(d) @ _r(4, 5)(d),
    "matmul_2d_1d": lambda d: _r(5, 3)(d) @ _r(4)(d),
    "matmul_out": lambda d: torch.matmul(_r(2, 3)(d), _r(5, 4)(d), out=_empty((0,))(d)),
    "matmul_dtypes": lambda d: torch.matmul(_r(5, 2, 3)(d), _r(3, 4, dtype=F64)(d)),
    "linear": lambda d: F.linear(_r(2, 3)(d), _r(4, 5)(d)),
    "linear_bias": lambda d: F.linear(_r(6, 2, 3)(d), _r(4, 5)(d), _r(4)(d)),
    "linear_bias_dtype": lambda d: F.linear(_r(2, 3)(d), _r(4, 3)(d), _r(4, dtype=F64)(d)),
    "nn_linear": lambda d: torch.nn.Linear(5, 4).to(d)(_r(2, 3)(d)),
    "bmm": lambda d: torch.bmm(_r(2, 2, 3)(d), _r(2, 5, 4)(d)),
    "bmm_dtypes": lambda d: torch.bmm(_r(2, 2, 3)(d), _r(2, 3, 4, dtype=F64)(d)),
    "baddbmm_self_dtype": lambda d: torch.baddbmm(_r(2, 2, 4, dtype=F64)(d), _r(2, 2, 3)(d), _r(2, 3, 4)(d)),
    "baddbmm_batch2_dtype": lambda d: torch.baddbmm(_r(2, 2, 4)(d), _r(2, 2, 3)(d), _r(2, 3, 4, dtype=F64)(d)),
    "baddbmm_bias": lambda d: torch.baddbmm(_r(3, 2, 4)(d), _r(2, 2, 3)(d), _r(2, 3, 4)(d)),
    "addbmm_dtypes": lambda d: torch.addbmm(_r(2, 4)(d), _r(2, 2, 3, dtype=F64)(d), _r(2, 3, 4)(d)),
    "addbmm_shapes": lambda d: torch.addbmm(_r(2, 4)(d), _r(2, 2, 3)(d), _r(2, 5, 4)(d)),
    "mv": lambda d: torch.mv(_r(2, 3)(d), _r(5)(d)),
    "mv_dtypes": lambda d: torch.mv(_r(2, 3, dtype=F64)(d), _r(3)(d)),
    "mv_1d": lambda d: torch.mv(_r(3)(d), _r(3)(d)),
    "addmv": lambda d: torch.addmv(_r(2)(d), _r(2, 3)(d), _r(5)(d)),
    "addmv_self": lambda d: torch.addmv(_r(4)(d), _r(2, 3)(d), _r(3)(d)),
    "addmv_2d_self": lambda d: torch.addmv(_r(2, 2)(d), _r(2, 3)(d), _r(3)(d)),
    "addmv_dtypes": lambda d: torch.addmv(_r(2, dtype=F64)(d), _r(2, 3)(d), _r(3)(d)),
    "dot": lambda d: torch.dot(_r(3)(d), _r(5)(d)),
    "dot_dtypes": lambda d: torch.dot(_r(3)(d), _r(3, dtype=F64)(d)),
    "dot_2d": lambda d: torch.dot(_r(3, 1)(d), _r(3)(d)),
    "vdot": lambda d: torch.vdot(_r(3)(d), _r(5)(d)),
    "einsum": lambda d: torch.einsum("ij,jk->ik", _r(2, 3)(d), _r(5, 4)(d)),
    "multi_dot": lambda d: torch.linalg.multi_dot([_r(2, 3)(d), _r(5, 4)(d)]),
}


@pytest.mark.parametrize("name", MATMUL)
def test_matmul_messages(name: str, mode: str) -> None:
    same_as_cpu(MATMUL[name])


def test_addmm_bias_with_too_many_dims_names_the_tpu_tensor_type() -> None:
    # the CPU prints its tensor type, torch.FloatTensor (CUDA: torch.cuda.FloatTensor)
    message = "expand(torch.tpu.FloatTensor{[1, 2, 4]}, size=[2, 4]): the number of sizes provided (2) must be greater or equal"
    with pytest.raises(RuntimeError, match=re.escape(message)):
        torch.addmm(torch.randn(1, 2, 4, device="tpu"), torch.randn(2, 3, device="tpu"), torch.randn(3, 4, device="tpu"))


# -- arguments no kernel accepts: floats for bitwise ops, float or 2-D indices, boundaries, sizes ------------
_I = torch.int32
ARGUMENTS: dict[str, Case] = {
    "bitwise_and_floats": lambda d: torch.bitwise_and(_r(3)(d), _r(3)(d)),
    "bitwise_and_long_float": lambda d: torch.bitwise_and(_long(3)(d), _r(3)(d)),
    "bitwise_and_bool_float": lambda d: torch.bitwise_and(torch.ones(3, dtype=B, device=d), _r(3)(d)),
    "bitwise_or_scalar": lambda d: torch.bitwise_or(_r(3)(d), 1),
    "bitwise_xor_": lambda d: _r(3)(d).bitwise_xor_(_r(3)(d)),
    "bitwise_not_float": lambda d: torch.bitwise_not(_r(3)(d)),
    "lshift_float": lambda d: _r(3)(d) << 1,
    "lshift_by_float": lambda d: torch.ones(3, dtype=_I, device=d) << _r(3)(d),
    "rshift_float": lambda d: torch.bitwise_right_shift(_r(3)(d), 1),
    "gcd_float": lambda d: torch.gcd(_r(3)(d), _r(3)(d)),
    "lcm_float": lambda d: torch.lcm(_r(3)(d), _r(3)(d)),
    "bitwise_and_longs": lambda d: torch.bitwise_and(_long(3)(d), 6),  # accepted: the same values
    "index_select_float_index": lambda d: _r(3, 2)(d).index_select(0, torch.tensor([0.0], device=d)),
    "index_select_2d_index": lambda d: _r(3, 2)(d).index_select(0, torch.tensor([[0]], device=d)),
    "index_select_2d_float_index": lambda d: _r(3, 2)(d).index_select(0, torch.tensor([[0.0]], device=d)),
    "bucketize_2d_boundaries": lambda d: torch.bucketize(_r(3)(d), _r(2, 2)(d)),
    "diagonal_scatter_size": lambda d: torch.diagonal_scatter(_r(3, 3)(d), _r(2)(d)),
    "put_float_index": lambda d: _r(3)(d).put_(torch.tensor([0.0], device=d), _r(1)(d)),
    "put_int_index": lambda d: _r(3)(d).put_(torch.tensor([0], dtype=_I, device=d), _r(1)(d)),
    "pow_bool_bool": lambda d: torch.tensor([True, False], device=d) ** torch.tensor([True, True], device=d),
    "pow_true_bool": lambda d: True ** torch.tensor([True, False], device=d),
    "pow_two_bool": lambda d: 2 ** torch.tensor([True, False], device=d),  # accepted: int64
    "clamp_bool_min": lambda d: torch.clamp(torch.tensor([True, False], device=d), min=True),
    "clamp_bool_both": lambda d: torch.clamp(torch.tensor([True, False], device=d), min=False, max=True),
    "clamp_max_bool": lambda d: torch.clamp_max(torch.tensor([True, False], device=d), True),
    "clamp_bool_tensor_bound": lambda d: torch.clamp(torch.tensor([True, False], device=d), min=torch.tensor(True, device=d)),
    "mv_of_a_scalar": lambda d: torch.mv(torch.tensor(1.0, device=d), torch.tensor(1.0, device=d)),
    "det_of_a_scalar": lambda d: torch.linalg.det(torch.tensor(1.0, device=d)),
    "slogdet_of_a_vector": lambda d: torch.linalg.slogdet(_r(3)(d)),
    "det_of_a_transposed_matrix": lambda d: torch.linalg.det(_r(3, 3)(d).mT),  # accepted: the same value
    # a bfloat16 model sampling at float32 coordinates (RAFT's in bfloat16): tpu sampled it
    "grid_sample_float_grid_bf16": lambda d: F.grid_sample(_r(1, 2, 4, 4, dtype=torch.bfloat16)(d), _r(1, 3, 3, 2)(d)),
    "grid_sample_3d_double_grid": lambda d: F.grid_sample(_r(1, 2, 3, 4, 4)(d), _r(1, 2, 3, 3, 3, dtype=torch.float64)(d)),
    "grid_sample_same_dtype": lambda d: F.grid_sample(_r(1, 2, 4, 4)(d), _r(1, 3, 3, 2)(d).tanh()),  # accepted
}


@pytest.mark.parametrize("name", ARGUMENTS)
def test_arguments_no_kernel_accepts(name: str, mode: str) -> None:
    """tpu computed gcd and lcm of floats, index_select with float indices and embedding_renorm_
    with float indices without a word; XLA refused the bitwise programs (a 'torchtpu bug' error)."""
    same_as_cpu(ARGUMENTS[name])


@pytest.mark.parametrize("op", ["embedding_backward", "embedding_renorm_"])
def test_float_embedding_indices_name_the_tpu_tensor_type(op: str, mode: str) -> None:
    # the CPU names its tensor type, torch.FloatTensor (CUDA: torch.cuda.FloatTensor)
    x, indices = torch.randn(3, 2, device="tpu"), torch.zeros(3, device="tpu")
    message = "Expected tensor for argument #2 'indices' to have one of the following scalar types: Long, Int; but got "
    with pytest.raises(RuntimeError, match=re.escape(message + f"torch.tpu.FloatTensor instead (while checking arguments for {op})")):
        if op == "embedding_renorm_":
            torch.embedding_renorm_(x, indices, 1.0, 2.0)
        else:
            torch.ops.aten.embedding_dense_backward(x, indices, 3, -1, False)
        torch.tpu.synchronize()


NEGATIVE: dict[str, Case] = {
    "empty": lambda d: torch.empty(-1, device=d),
    "empty_2d": lambda d: torch.empty(2, -3, device=d),
    "empty_channels_last": lambda d: torch.empty(1, -1, 2, 2, device=d, memory_format=torch.channels_last),
    "ones": lambda d: torch.ones(3, -1, device=d),
    "full": lambda d: torch.full((-2,), 1.0, device=d),
    "rand": lambda d: torch.rand(-1, device=d),
    "randn": lambda d: torch.randn(-1, device=d),
    "randint": lambda d: torch.randint(3, (-1,), device=d),
    "normal": lambda d: torch.normal(0.0, 1.0, (-1,), device=d),
    "new_empty": lambda d: torch.zeros(2, device=d).new_empty(-1),
    "new_zeros": lambda d: torch.zeros(2, device=d).new_zeros((-1, 2)),
    "new_full": lambda d: torch.zeros(2, device=d).new_full((-1,), 2.0),
    "empty_strided": lambda d: torch.empty_strided((2, -1), (1, 1), device=d),
    "new_empty_strided": lambda d: torch.zeros(2, device=d).new_empty_strided((-1,), (1,)),
}


@pytest.mark.parametrize("name", NEGATIVE)
def test_negative_sizes(name: str) -> None:
    torch.zeros(1, device="tpu")  # also once the op kernels are registered
    same_as_cpu(NEGATIVE[name])


def test_zeros_negative_size_is_the_cpus_error() -> None:
    # the CPU's zeros words it differently from empty's; eager/cpu_errors.py asks the CPU
    same_as_cpu(lambda d: torch.zeros(-1, device=d))


# -- sparse layouts ------------------------------------------------------------------------------------------------
SPARSE: dict[str, Callable[[], Any]] = {
    "coo_to_tpu": lambda: torch.randn(2, 2).to_sparse().to("tpu"),
    "sparse_coo_tensor": lambda: torch.sparse_coo_tensor(
        torch.tensor([[0, 1], [1, 0]]), torch.tensor([1.0, 2.0]), (2, 2), device="tpu"
    ),
    "zeros_sparse_layout": lambda: torch.zeros(2, 2, layout=torch.sparse_coo, device="tpu"),
    "dense_to_sparse": lambda: torch.randn(2, 2, device="tpu").to_sparse(),
    "dense_to_csr": lambda: torch.randn(2, 2, device="tpu").to_sparse_csr(),
    "csr_matmul": lambda: torch.randn(2, 2).to_sparse_csr().to("tpu") @ torch.randn(2, 2, device="tpu"),
    "csr_to_dense": lambda: torch.randn(2, 2).to_sparse_csr().to("tpu").to_dense(),
}


@pytest.mark.parametrize("name", SPARSE)
def test_sparse_layouts_raise_our_message(name: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(NotImplementedError, match=r"torchtpu: sparse tensors .* are not supported on the tpu device") as info:
            SPARSE[name]()
    assert ".to_dense()" in str(info.value) and "Could not run" not in str(info.value)


def test_quantized_tensors_and_dtypes_the_device_lacks_raise_our_message() -> None:
    """A quantized tensor moved to tpu gave the dispatcher's "Could not run
    'aten::empty_quantized' ... 'Quantizedtpu' backend", and a complex32 or float8_e8m0fnu
    tensor moved there numpy's "Got unsupported ScalarType ComplexHalf"."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(NotImplementedError, match=r"torchtpu: quantized tensors are not supported .*\.dequantize\(\)"):
            torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.qint8).to("tpu")
        for dtype in (torch.float8_e8m0fnu, torch.complex32):
            with pytest.raises(TypeError, match=rf"torchtpu: dtype {dtype} is not supported on the tpu device; use one of"):
                torch.ones(2).to(dtype).to("tpu")


# -- the checks run once per cache key -----------------------------------------------------------------------
def test_checks_run_on_a_cache_miss_only(monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    calls = []
    check = validate.check
    monkeypatch.setattr(validate, "check", lambda plan, values: (calls.append(plan.name), check(plan, values)))
    dispatch.clear_cache()
    deferred.clear_cache()
    x, y = torch.randn(4, 3, device="tpu"), torch.randn(4, 3, device="tpu")
    for _ in range(3):
        x.add_(y)
        torch.tpu.synchronize()
    assert calls.count("aten::add_.Tensor") == 1
    with pytest.raises(RuntimeError, match="more than one element"):
        torch.zeros(1, device="tpu").expand(3).add_(1)
    with pytest.raises(RuntimeError, match="more than one element"):  # a refused key is checked again
        torch.zeros(1, device="tpu").expand(3).add_(1)


# -- OpInfo: the in-place and out= variants with a written dtype other than the result's -----------------------------
def _opinfo_dtype_cases() -> list[Any]:
    from torchtpu.testing import opinfo

    cases = []
    for op in opinfo.op_db():
        if op.inplace_variant is not None and torch.float32 in op.supported_dtypes("cpu"):
            cases.append(pytest.param(op, "inplace", torch.int64, id=f"{opinfo.op_id(op)}-inplace-int64"))
        if op.supports_out and torch.float32 in op.supported_dtypes("cpu"):
            for dtype in (torch.int64, torch.float64):
                cases.append(pytest.param(op, "out", dtype, id=f"{opinfo.op_id(op)}-out-{str(dtype)[6:]}"))
    return cases


# Where the CPU raises for a reason that is not a rule (a kernel missing for the dtype) or an op this backend
# runs as a composite of others, the tpu may differ; the rest must match.
_DIFFERS = {"masked_select", "nonzero", "linalg.ldl_factor", "linalg.ldl_factor_ex", "linalg.ldl_solve", "histogram", "mvlgamma"}
_DIFFERS |= {"sparse.sampled_addmm", "linalg.lstsq"}


def _first_sample_on(op: Any, device: str) -> Any:
    from torchtpu.testing import opinfo

    sample = next(iter(op.sample_inputs("cpu", torch.float32)))
    return sample if device == "cpu" else opinfo._on_tpu(sample, op)


def _skip_unless_comparable(op: Any) -> None:
    if op.name in _DIFFERS or op.name.split(".")[0] in _DIFFERS:
        pytest.skip("differs from the CPU for reasons outside the static rules (see _DIFFERS)")


def _compare(run: Case) -> None:
    """Raise/no-raise and the message (the values of these variants are compared in test_opinfo_sweep_variants)."""
    cpu, tpu = _outcome(run, "cpu"), _outcome(run, "tpu")
    if cpu[0] == "NotImplementedError" and "not implemented for" in cpu[1]:
        pytest.skip(f"the CPU has no kernel for this dtype: {cpu[1]}")
    if tpu[0] == "NotImplementedError" and tpu[1].startswith("torchtpu: operator"):
        pytest.skip(f"not lowered: {tpu[1][:80]}")
    if cpu[0] == "ok" or tpu[0] == "ok":
        assert (cpu[0], tpu[0]) == ("ok", "ok"), f"CPU: {cpu}, tpu: {tpu}"
    else:
        assert tpu == cpu


# The sweeps below run every OpInfo entry's first sample on both devices (about two minutes): `slow`.
@pytest.mark.slow
@pytest.mark.parametrize("op, variant, dtype", _opinfo_dtype_cases())
def test_opinfo_written_dtype(op: Any, variant: str, dtype: torch.dtype) -> None:
    from torch.utils._pytree import tree_flatten

    _skip_unless_comparable(op)
    sample = _first_sample_on(op, "cpu")
    if not isinstance(sample.input, torch.Tensor):
        pytest.skip("not a tensor input")
    if variant == "out":
        functional = op(sample.input, *sample.args, **sample.kwargs)
        flat = tree_flatten(functional)[0]
        if not flat or not all(isinstance(t, torch.Tensor) for t in flat):
            pytest.skip("non-tensor outputs")

        def run(d: str) -> Any:
            s = _first_sample_on(op, d)
            outs = [torch.empty(0, dtype=dtype, device=d) for _ in flat]
            op(s.input, *s.args, out=outs[0] if len(outs) == 1 else tuple(outs), **s.kwargs)
            return outs
    else:

        def run(d: str) -> Any:
            s = _first_sample_on(op, d)
            target = s.input.clone().to(dtype)
            op.inplace_variant(target, *s.args, **s.kwargs)
            return target

    _compare(run)


def _opinfo_overlap_cases() -> list[Any]:
    from torchtpu.testing import opinfo

    cases = []
    for op in opinfo.op_db():
        if torch.float32 not in op.supported_dtypes("cpu"):
            continue
        if op.inplace_variant is not None:
            cases.append(pytest.param(op, "expanded", id=f"{opinfo.op_id(op)}-inplace-expanded"))
        if op.supports_out:
            cases.append(pytest.param(op, "out-overlapping-input", id=f"{opinfo.op_id(op)}-out-overlapping-input"))
    return cases


def _overlapping(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Tensors shaped like ``a`` and ``b`` in one storage, ``b`` starting one element before ``a``."""
    buf = torch.zeros(max(a.numel(), b.numel()) + 1, dtype=a.dtype, device=a.device)
    x, y = buf[1 : 1 + a.numel()].view(a.shape), buf[: b.numel()].view(b.shape)
    y.copy_(b)
    return x, y


@pytest.mark.slow
@pytest.mark.parametrize("op, variant", _opinfo_overlap_cases())
def test_opinfo_memory_overlap(op: Any, variant: str) -> None:
    _skip_unless_comparable(op)
    sample = _first_sample_on(op, "cpu")
    x = sample.input
    if not isinstance(x, torch.Tensor) or x.numel() < 2:
        pytest.skip("needs a tensor input with two elements")
    if variant == "expanded":
        dim = next((i for i, n in enumerate(x.shape) if n > 1), None)

        def run(d: str) -> Any:
            s = _first_sample_on(op, d)
            op.inplace_variant(s.input.clone().narrow(dim, 0, 1).expand(s.input.shape), *s.args, **s.kwargs)
            return None  # what lands in an expanded tensor is undefined

    else:
        result = op(x, *sample.args, **sample.kwargs)
        if not isinstance(result, torch.Tensor) or result.dtype != x.dtype or result.numel() == 0:
            pytest.skip("needs one result of the input's dtype")

        def run(d: str) -> Any:
            s = _first_sample_on(op, d)
            out, inp = _overlapping(result.to(d), s.input)
            op(inp, *s.args, out=out, **s.kwargs)
            return None  # partially overlapping operands that the CPU accepts give undefined values

    _compare(run)


# -- an op whose program cannot be built raises the CPU's exception (eager/cpu_errors.py) ---
_REFUSED_WHILE_BUILDING = {
    # PyTorch's Python reference words it differently ("Number of dimensions of tensors must match")
    "hstack_ranks": lambda d: torch.hstack([torch.randn(3, device=d), torch.randn(1, 2, 3, 4, device=d)]),
    # the convolution shape helper divided by the stride (ZeroDivisionError)
    "conv1d_zero_stride": lambda d: torch.nn.functional.conv1d(
        torch.randn(1, 2, 5, device=d), torch.randn(3, 2, 2, device=d), stride=0
    ),
}


@pytest.mark.parametrize("name", list(_REFUSED_WHILE_BUILDING))
def test_refused_while_building_raises_the_cpus_exception(name: str) -> None:
    make = _REFUSED_WHILE_BUILDING[name]
    with pytest.raises(Exception) as cpu:
        make("cpu")
    with pytest.raises(type(cpu.value)) as tpu:
        make("tpu")
    assert str(tpu.value) == str(cpu.value)
    assert tpu.value.__cause__ is not None  # our own error stays attached for debugging


def test_a_dtype_the_cpus_kernel_refuses_is_its_answer() -> None:
    """The CPU's "<kernel>_cpu" not implemented for '<dtype>' is a refusal of the arguments
    (our build error is replaced by it); an op the CPU lacks entirely is not."""
    from torchtpu.eager import cpu_errors

    x = torch.randn(3, device="tpu")
    refusal = cpu_errors.cpu_error(torch.ops.aten.bitwise_and.Tensor, (x, x), {})
    assert isinstance(refusal, NotImplementedError) and "\"bitwise_and_cpu\" not implemented for 'Float'" in str(refusal)
    assert cpu_errors.cpu_error(torch.ops.aten.add.Tensor, (x, x), {}) is None


def test_large_arguments_keep_our_error() -> None:
    """Above cpu_errors.MAX_ELEMENTS the CPU is not asked (it would cost a full CPU run)."""
    from torchtpu.eager import cpu_errors

    old = cpu_errors.MAX_ELEMENTS
    cpu_errors.MAX_ELEMENTS = 10
    try:
        with pytest.raises(Exception) as tpu:
            torch.hstack([torch.randn(3, device="tpu"), torch.randn(1, 2, 3, 4, device="tpu")])
        assert "Tensors must have same number of dimensions" not in str(tpu.value)
    finally:
        cpu_errors.MAX_ELEMENTS = old


# -- found by the OpInfo error-input run (tests/test_opinfo_errors.py) -----------------------
ERROR_INPUT_FINDINGS: dict[str, Case] = {
    "complex_mixed_dtypes": lambda d: torch.complex(torch.ones(2, device=d), torch.ones(2, dtype=torch.float64, device=d)),
    "complex_integer_part": lambda d: torch.complex(torch.ones(2, device=d), torch.ones(2, dtype=torch.int32, device=d)),
    "masked_scatter_byte_mask": lambda d: torch.zeros(3, device=d).masked_scatter_(
        torch.tensor([1, 0, 1], dtype=torch.uint8, device=d), torch.ones(3, device=d)
    ),
    "cat_into_expanded_out": lambda d: torch.cat(
        [torch.ones(2, 3, device=d), torch.ones(2, 3, device=d)], out=torch.empty(1, 3, device=d).expand(4, 3)
    ),
    "masked_select_into_expanded_out": lambda d: torch.masked_select(
        torch.ones(3, device=d), torch.tensor([True, False, True], device=d), out=torch.empty(1, device=d).expand(2)
    ),
    "nonzero_into_its_input": lambda d: (lambda x: torch.nonzero(x, out=x))(torch.ones(2, 2, dtype=torch.long, device=d)),
    "cat_into_an_input": lambda d: (lambda x: torch.cat([x[:2], x[2:]], out=x))(torch.ones(4, 3, device=d)),
}


@pytest.mark.parametrize("name", ERROR_INPUT_FINDINGS)
def test_error_input_findings(name: str) -> None:
    same_as_cpu(ERROR_INPUT_FINDINGS[name])
