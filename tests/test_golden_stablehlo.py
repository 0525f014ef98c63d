"""Golden StableHLO tests: lower one op through the registry into the builder and compare
the emitted text (whole modules for the small ones, key lines for the rest). No device,
no compile: these pin what each rule family writes."""

from __future__ import annotations

import pkgutil
import re
import textwrap
from typing import Any

import pytest
import torch

import torchtpu.lowering.rules as rules_pkg
from torchtpu.lowering import registry
from torchtpu.lowering.context import ProgramContext, lower_call

aten = torch.ops.aten
F32 = torch.float32
I64 = torch.int64


class T:
    """A tensor parameter of the program."""

    def __init__(self, *shape: int, dtype: torch.dtype = F32):
        self.shape, self.dtype = shape, dtype


def lower(op: Any, *args: Any, random: bool = False, **kwargs: Any) -> str:
    """The module text of ``op(*args, **kwargs)`` with every T as a parameter."""
    registry._load_rules()
    ctx = ProgramContext()
    b = ctx.b

    def param(x: Any) -> Any:
        if isinstance(x, T):
            return b.param(x.shape, x.dtype)
        if isinstance(x, list) and x and all(isinstance(y, T) for y in x):
            return [b.param(y.shape, y.dtype) for y in x]
        return x

    vals = [param(a) for a in args]
    if random:
        ctx.new_rng_param()
    out = lower_call(ctx, op, vals, kwargs, None)
    outs = out if isinstance(out, (tuple, list)) else [out]
    return b.module([o for o in outs if o is not None])


def golden(text: str) -> str:
    return textwrap.dedent(text).strip() + "\n"


def ops_in(text: str) -> set[str]:
    return set(re.findall(r'"((?:stablehlo|chlo)\.\w+)"', text))


def signature(text: str) -> str:
    return re.search(r"func\.func public @main\((.*)\) -> \((.*)\) \{", text).group(0)


# -- whole-module goldens ------------------------------------------------------------------
def test_elementwise_mul_broadcasts_then_multiplies() -> None:
    assert lower(aten.mul.Tensor, T(2, 3), T(3)) == golden(
        """
        module @main {
          func.func public @main(%arg0: tensor<2x3xf32>, %arg1: tensor<3xf32>) -> (tensor<2x3xf32>) {
            %v1 = "stablehlo.broadcast_in_dim"(%arg1) {broadcast_dimensions = array<i64: 1>} : (tensor<3xf32>) -> tensor<2x3xf32>
            %v2 = "stablehlo.multiply"(%arg0, %v1) : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x3xf32>
            "func.return"(%v2) : (tensor<2x3xf32>) -> ()
          }
        }
        """
    )


def test_reduction_sum_dim() -> None:
    assert lower(aten.sum.dim_IntList, T(4, 5), [1]) == golden(
        """
        module @main {
          func.func public @main(%arg0: tensor<4x5xf32>) -> (tensor<4xf32>) {
            %v1 = "stablehlo.constant"() {value = dense<0x00000000> : tensor<f32>} : () -> tensor<f32>
            %v5 = "stablehlo.reduce"(%arg0, %v1) ({
             ^bb0(%v2: tensor<f32>, %v3: tensor<f32>):
              %v4 = "stablehlo.add"(%v2, %v3) : (tensor<f32>, tensor<f32>) -> tensor<f32>
              "stablehlo.return"(%v4) : (tensor<f32>) -> ()
            }) {dimensions = array<i64: 1>} : (tensor<4x5xf32>, tensor<f32>) -> tensor<4xf32>
            "func.return"(%v5) : (tensor<4xf32>) -> ()
          }
        }
        """
    )


def test_view_permute_is_one_transpose() -> None:
    assert lower(aten.permute.default, T(2, 3, 4), [2, 0, 1]) == golden(
        """
        module @main {
          func.func public @main(%arg0: tensor<2x3x4xf32>) -> (tensor<4x2x3xf32>) {
            %v1 = "stablehlo.transpose"(%arg0) {permutation = array<i64: 2, 0, 1>} : (tensor<2x3x4xf32>) -> tensor<4x2x3xf32>
            "func.return"(%v1) : (tensor<4x2x3xf32>) -> ()
          }
        }
        """
    )


def test_linear_mm_is_one_dot_general() -> None:
    text = lower(aten.mm.default, T(2, 3), T(3, 4))
    assert ops_in(text) == {"stablehlo.dot_general"}
    assert (
        "lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]" in text
        and "(tensor<2x3xf32>, tensor<3x4xf32>) -> tensor<2x4xf32>" in text
    )
    assert "precision_config = [#stablehlo<precision DEFAULT>, #stablehlo<precision DEFAULT>]" in text


def test_linear_nd_contracts_the_last_dim_without_a_reshape() -> None:
    from torchtpu.lowering.rules.linear import CONTRACT_LEADING, LINEAR_ND

    text = lower(LINEAR_ND, T(2, 5, 3), T(4, 3), T(4))
    assert "stablehlo.reshape" not in text  # the (2, 5) leading dims stay apart
    assert "lhs_contracting_dimensions = [2], rhs_contracting_dimensions = [1]" in text
    assert "-> tensor<2x5x4xf32>" in text and "stablehlo.add" in text
    grad_w = lower(CONTRACT_LEADING, T(2, 5, 4), T(2, 5, 3))
    assert "lhs_contracting_dimensions = [0, 1], rhs_contracting_dimensions = [0, 1]" in grad_w
    assert "-> tensor<4x3xf32>" in grad_w and "stablehlo.reshape" not in grad_w


def test_convolution_nchw() -> None:
    text = lower(aten.convolution.default, T(1, 2, 5, 5), T(3, 2, 3, 3), None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1)
    assert ops_in(text) == {"stablehlo.convolution"}
    line = next(ln for ln in text.splitlines() if "stablehlo.convolution" in ln)
    for part in (
        "dimension_numbers = #stablehlo.conv<[b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1]>",
        "feature_group_count = 1 : i64",
        "padding = dense<[[0, 0], [0, 0]]> : tensor<2x2xi64>",
        "window_strides = array<i64: 1, 1>",
        "(tensor<1x2x5x5xf32>, tensor<3x2x3x3xf32>) -> tensor<1x3x3x3xf32>",
    ):
        assert part in line


def test_optimizer_foreach_mul_scalar() -> None:
    text = lower(aten._foreach_mul.Scalar, [T(3), T(2, 2)], 0.5)
    assert signature(text) == (
        "func.func public @main(%arg0: tensor<3xf32>, %arg1: tensor<2x2xf32>) -> (tensor<3xf32>, tensor<2x2xf32>) {"
    )
    assert text.count('"stablehlo.multiply"') == 2
    assert "dense<0x3F000000> : tensor<f32>" in text  # 0.5, bit-exact


# -- key-line goldens ---------------------------------------------------------------------
def test_gather_scatter_gather() -> None:
    text = lower(aten.gather.default, T(3, 4), 1, T(3, 2, dtype=I64))
    assert "stablehlo.gather" in ops_in(text)
    assert signature(text).endswith("-> (tensor<3x2xf32>) {")


def test_factory_arange_is_iota_affine() -> None:
    text = lower(aten.arange.start_step, 0, 8, 2, dtype=I64)
    assert {"stablehlo.iota", "stablehlo.multiply", "stablehlo.add"} <= ops_in(text)
    assert '"stablehlo.iota"() {iota_dimension = 0 : i64} : () -> tensor<4xi64>' in text


def test_loss_mse_mean() -> None:
    text = lower(aten.mse_loss.default, T(4, 3), T(4, 3), 1)
    assert {"stablehlo.subtract", "stablehlo.multiply", "stablehlo.reduce", "stablehlo.divide"} <= ops_in(text)
    assert signature(text).endswith("-> (tensor<f32>) {")


def test_normalization_layer_norm() -> None:
    text = lower(aten.native_layer_norm.default, T(2, 8), [8], T(8), T(8), 1e-5)
    assert {"stablehlo.reduce", "stablehlo.rsqrt"} <= ops_in(text)
    assert signature(text).endswith("-> (tensor<2x8xf32>, tensor<2x1xf32>, tensor<2x1xf32>) {")


def test_pooling_max_pool2d_is_reduce_window() -> None:
    text = lower(aten.max_pool2d.default, T(1, 1, 4, 4), [2, 2], [2, 2])
    assert "stablehlo.reduce_window" in ops_in(text)
    assert "window_dimensions = array<i64: 1, 1, 2, 2>" in text and "window_strides = array<i64: 1, 1, 2, 2>" in text
    assert signature(text).endswith("-> (tensor<1x1x2x2xf32>) {")


def test_rng_rand_uses_rng_bit_generator() -> None:
    text = lower(aten.rand.default, [2, 3], random=True, dtype=F32)
    assert "stablehlo.rng_bit_generator" in ops_in(text)
    assert "rng_algorithm = #stablehlo<rng_algorithm PHILOX>" in text
    assert "tensor<2xui64>" in signature(text)  # the RNG state is an operand and a result


def test_sorting_sort() -> None:
    text = lower(aten.sort.default, T(5), -1, False)
    assert "stablehlo.sort" in ops_in(text)
    assert signature(text).endswith("-> (tensor<5xf32>, tensor<5xi64>) {")


def test_attention_safe_softmax() -> None:
    text = lower(aten._safe_softmax.default, T(2, 4), -1)
    assert {"stablehlo.exponential", "stablehlo.reduce", "stablehlo.select"} <= ops_in(text)


def test_complex_view_as_real() -> None:
    text = lower(aten.view_as_real.default, T(3, dtype=torch.complex64))
    assert {"stablehlo.real", "stablehlo.imag"} <= ops_in(text)
    assert signature(text).endswith("-> (tensor<3x2xf32>) {")


def test_embedding_bag_gathers_rows() -> None:
    text = lower(aten._embedding_bag_forward_only.default, T(10, 3), T(4, dtype=I64), T(2, dtype=I64))
    assert "stablehlo.gather" in ops_in(text)


def test_fft_rfft_is_one_fft_op() -> None:
    text = lower(aten._fft_r2c.default, T(8), [0], 0, True)
    assert ops_in(text) == {"stablehlo.fft"}
    assert "fft_type = #stablehlo<fft_type RFFT>, fft_length = array<i64: 8>" in text
    assert "(tensor<8xf32>) -> tensor<5xcomplex<f32>>" in text


def test_linalg_cholesky() -> None:
    text = lower(aten.linalg_cholesky_ex.default, T(3, 3))
    assert "stablehlo.cholesky" in ops_in(text)


def test_linalg_cholesky_solve_is_two_triangular_solves() -> None:
    text = lower(aten._cholesky_solve_helper.default, T(2, 4, 3), T(2, 4, 4), False)
    assert ops_in(text) == {"stablehlo.triangular_solve"}
    assert text.count('"stablehlo.triangular_solve"') == 2 and "transpose_a = #stablehlo<transpose ADJOINT>" in text


def test_linalg_matrix_exp_selects_a_degree_then_squares_in_a_loop() -> None:
    text = lower(aten.linalg_matrix_exp.default, T(2, 3, 3))
    assert {"stablehlo.while", "stablehlo.dot_general", "stablehlo.select"} <= ops_in(text)
    assert "stablehlo.custom_call" not in ops_in(text)  # no LAPACK: runs on any platform
    assert signature(text).endswith("-> (tensor<2x3x3xf32>) {")


def test_linalg_lstsq_gels_is_geqrf_ormqr_and_a_triangular_solve() -> None:
    text = lower(aten.linalg_lstsq.default, T(4, 3), T(4, 2), driver="gels")
    assert '"lapack_sgeqrf_ffi"' in text and '"lapack_sormqr_ffi"' in text
    assert "stablehlo.triangular_solve" in ops_in(text) and "lapack_sgesdd_ffi" not in text
    # solution, residuals (m > n), rank and singular values (empty for gels)
    assert signature(text).endswith("-> (tensor<3x2xf32>, tensor<2xf32>, tensor<0xi64>, tensor<0xf32>) {")


def test_linalg_eig_calls_geev_with_complex_results() -> None:
    text = lower(aten.linalg_eig.default, T(3, 3))
    assert '"lapack_sgeev_ffi"' in text and "compute_right = 86 : ui8" in text
    assert signature(text).endswith("-> (tensor<3xcomplex<f32>>, tensor<3x3xcomplex<f32>>) {")


def test_padding_replication_backward() -> None:
    text = lower(aten.replication_pad1d_backward.default, T(1, 2, 7), T(1, 2, 4), [2, 1])
    assert signature(text).endswith("-> (tensor<1x2x4xf32>) {")


def test_special_bessel_j0_selects_between_its_ranges() -> None:
    # a port of the CPU's Cephes code: both ranges' formulas, combined with select; no CHLO op
    text = lower(aten.special_bessel_j0.default, T(3))
    assert {"stablehlo.select", "stablehlo.cosine", "stablehlo.sine", "stablehlo.sqrt"} <= ops_in(text)
    assert not any(op.startswith("chlo.") for op in ops_in(text))
    assert signature(text).endswith("-> (tensor<3xf32>) {")
    # erfcx looks its per-interval polynomial up in a [100, 7] table
    assert "stablehlo.gather" in ops_in(lower(aten.special_erfcx.default, T(2, 2, dtype=torch.float64)))


# Which golden test covers which rule family; every module in lowering/rules/ needs one.
FAMILIES = {
    "elementwise": test_elementwise_mul_broadcasts_then_multiplies,
    "reduction": test_reduction_sum_dim,
    "view": test_view_permute_is_one_transpose,
    "linear": test_linear_mm_is_one_dot_general,
    "convolution": test_convolution_nchw,
    "optimizer": test_optimizer_foreach_mul_scalar,
    "gather_scatter": test_gather_scatter_gather,
    "factory": test_factory_arange_is_iota_affine,
    "loss": test_loss_mse_mean,
    "normalization": test_normalization_layer_norm,
    "pooling": test_pooling_max_pool2d_is_reduce_window,
    "rng": test_rng_rand_uses_rng_bit_generator,
    "sorting": test_sorting_sort,
    "attention": test_attention_safe_softmax,
    "complex": test_complex_view_as_real,
    "embedding": test_embedding_bag_gathers_rows,
    "fft": test_fft_rfft_is_one_fft_op,
    "linalg": test_linalg_cholesky,
    "padding": test_padding_replication_backward,
    "special": test_special_bessel_j0_selects_between_its_ranges,
}


def test_polynomials_chebyshev_t_is_one_while_loop() -> None:
    text = lower(aten.special_chebyshev_polynomial_t.default, T(4), T(4))
    assert text.count('"stablehlo.while"') == 1
    assert {"stablehlo.reduce", "chlo.acos", "stablehlo.cosine"} <= ops_in(text)  # any-active test, trig form
    # n is truncated to int64 as the CPU's static_cast does; the loop counter is int64 too
    assert "(tensor<4xf32>) -> tensor<4xi64>" in text
    assert signature(text).endswith("-> (tensor<4xf32>) {")


def test_gamma_igamma_has_a_loop_per_algorithm() -> None:
    text = lower(aten.igamma.default, T(3), T(3))
    # power series of P, series and continued fraction of Q, asymptotic expansion
    assert text.count('"stablehlo.while"') == 4
    assert {"chlo.lgamma", "chlo.erfc", "stablehlo.dynamic_slice"} <= ops_in(text)
    assert "tensor<25x25xf32>" in text  # the asymptotic expansion's coefficient table
    assert signature(text).endswith("-> (tensor<3xf32>) {")


def test_rng_samplers_gamma_is_one_accept_loop_carrying_the_rng_state() -> None:
    text = lower(aten._standard_gamma.default, T(5), random=True)
    # one draw before the loop (the boost for alpha < 1), three per trip (Box-Muller's two
    # uniforms and the acceptance uniform) from the Philox state the loop carries
    assert text.count('"stablehlo.while"') == 1
    assert text.count('"stablehlo.rng_bit_generator"') == 4
    assert "tensor<3xui64>" in text.split('"stablehlo.while"')[1]  # the state is loop state
    assert signature(text).endswith("-> (tensor<5xf32>) {")


FAMILIES["polynomials"] = test_polynomials_chebyshev_t_is_one_while_loop
FAMILIES["rng_samplers"] = test_rng_samplers_gamma_is_one_accept_loop_carrying_the_rng_state
FAMILIES["gamma"] = test_gamma_igamma_has_a_loop_per_algorithm


def test_reduction_cummax_is_a_log_step_scan_of_pairs() -> None:
    text = lower(aten.cummax.default, T(3, 8), 1)
    # ceil(log2(8)) = 3 shifted combines of (value, index), no loop and no sort
    assert text.count('"stablehlo.pad"') == 6
    assert "stablehlo.while" not in ops_in(text) and "stablehlo.sort" not in ops_in(text)
    assert signature(text).endswith("-> (tensor<3x8xf32>, tensor<3x8xi64>) {")


def test_reduction_histc_data_range_is_a_device_reduction() -> None:
    text = lower(aten.histc.default, T(4, 5), 7, 0, 0)
    # min == max: the range comes from the data on the device (no host sync), then one scatter-add
    assert {"stablehlo.reduce", "stablehlo.scatter"} <= ops_in(text)
    assert signature(text).endswith("-> (tensor<7xf32>) {")


def test_sorting_mode_sorts_once() -> None:
    text = lower(aten.mode.default, T(4, 6), 1)
    assert text.count('"stablehlo.sort"') == 1
    assert signature(text).endswith("-> (tensor<4xf32>, tensor<4xi64>) {")


def test_gather_scatter_index_reduce_amax() -> None:
    text = lower(aten.index_reduce.default, T(5, 3), 0, T(4, dtype=I64), T(4, 3), "amax", include_self=False)
    assert {"stablehlo.scatter", "stablehlo.maximum", "stablehlo.select"} <= ops_in(text)
    assert signature(text).endswith("-> (tensor<5x3xf32>) {")


def test_pooling_bicubic_upsampling_is_two_matrix_products() -> None:
    text = lower(aten.upsample_bicubic2d.default, T(1, 2, 4, 6), [8, 9], False)
    assert text.count('"stablehlo.dot_general"') == 2
    assert signature(text).endswith("-> (tensor<1x2x8x9xf32>) {")


@pytest.mark.parametrize("module", sorted(m.name for m in pkgutil.iter_modules(rules_pkg.__path__)))
def test_every_rule_family_has_a_golden_test(module: str) -> None:
    assert module in FAMILIES, f"add a golden StableHLO test for torchtpu/lowering/rules/{module}.py"


def test_ctc_loss_is_one_while_loop_over_time() -> None:
    # log_probs (T=6, N=2, C=5), padded targets (2, 3): the alpha recursion is one loop,
    # vectorised over the batch and the 2*3+1 label positions
    text = lower(aten._ctc_loss.Tensor, T(6, 2, 5), T(2, 3, dtype=I64), T(2, dtype=I64), T(2, dtype=I64), 0, False)
    assert text.count('"stablehlo.while"') == 1
    assert signature(text).endswith("-> (tensor<2xf32>, tensor<2x6x7xf32>) {")


def test_recurrent_fused_lstm_cell_is_elementwise() -> None:
    # gates (3, 4*4) from input and hidden projections plus biases: sigmoid/tanh, no matmul
    text = lower(aten._thnn_fused_lstm_cell.default, T(3, 16), T(3, 16), T(3, 4), T(16), T(16))
    assert {"stablehlo.logistic", "stablehlo.tanh"} <= ops_in(text)
    assert "stablehlo.dot_general" not in ops_in(text) and "stablehlo.while" not in ops_in(text)
    assert signature(text).endswith("-> (tensor<3x4xf32>, tensor<3x4xf32>, tensor<3x16xf32>) {")


FAMILIES["ctc"] = test_ctc_loss_is_one_while_loop_over_time
FAMILIES["recurrent"] = test_recurrent_fused_lstm_cell_is_elementwise


def test_weight_norm_backward_is_one_reduction() -> None:
    # grad_g needs one sum over the non-`dim` dims; grad_v is elementwise from there
    text = lower(aten._weight_norm_interface_backward.default, T(6, 4, 3), T(6, 4, 3), T(6, 1, 1), T(6, 1, 1), 0)
    assert text.count('"stablehlo.reduce"') == 1 and "stablehlo.dot_general" not in ops_in(text)
    assert signature(text).endswith("-> (tensor<6x4x3xf32>, tensor<6x1x1xf32>) {")


FAMILIES["weight_norm"] = test_weight_norm_backward_is_one_reduction


def test_collectives_all_reduce_over_a_2x2_mesh_dimension() -> None:
    # functional collectives need their program's replica layout: test_compile_collectives'
    # graph-level helper sets it; a 4-replica program whose group splits it into two pairs
    from test_compile_collectives import _lower

    from torchtpu.lowering.collectives import ReplicaLayout

    f = torch.ops._c10d_functional

    def fn(x):
        return f.wait_tensor.default(f.all_reduce.default(x, "sum", "tp"))

    text = _lower(fn, ReplicaLayout((0, 1, 2, 3), {"tp": ((0, 1), (2, 3))}), (4,), (4,))
    assert text.count('"stablehlo.all_reduce"') == 1 and '"stablehlo.add"' in text
    assert "replica_groups = dense<[[0, 1], [2, 3]]> : tensor<2x2xi64>" in text
    assert signature(text).endswith("-> (tensor<4xf32>) {")


FAMILIES["collectives"] = test_collectives_all_reduce_over_a_2x2_mesh_dimension


def test_small_image_convolution_is_patches_and_a_dot_on_cpu_only() -> None:
    """A 3x3 kernel over a 2x2 image: XLA's CPU compiler would swap the operands (slow), so
    the cpu platform gets slices + one dot_general; other platforms keep the convolution."""
    from types import SimpleNamespace

    args = (T(2, 8, 2, 2), T(6, 8, 3, 3), None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    cpu = lower(aten.convolution.default, *args)
    # one slice per output position (4), fewer than the kernel's 9 positions
    assert "stablehlo.convolution" not in cpu and cpu.count("stablehlo.slice") == 4 and "stablehlo.dot_general" in cpu
    # a larger image keeps the convolution on the cpu too
    big = lower(aten.convolution.default, T(2, 8, 4, 4), *args[1:])
    assert "stablehlo.convolution" in big and "stablehlo.dot_general" not in big
    registry._load_rules()
    ctx = ProgramContext()
    ctx.set_platform(SimpleNamespace(platform="tpu", supports_f64=False, has_lapack=False))
    vals = [ctx.b.param(a.shape, a.dtype) if isinstance(a, T) else a for a in args]
    tpu = ctx.b.module([lower_call(ctx, aten.convolution.default, vals, {}, None)])
    assert "stablehlo.convolution" in tpu and "stablehlo.dot_general" not in tpu


def test_attention_products_have_one_batch_dim() -> None:
    """SDPA's products run with the batch and head dims folded into one: XLA's CPU backend
    keeps a dot with several batch dims that contracts the left operand's rows (the
    backward's P^T @ dO) out of its library fusions, at twice the program's time."""
    from torchtpu.lowering.rules.attention import SDPA_BACKWARD, SDPA_FORWARD

    q, kv = T(8, 4, 32, 16), T(8, 2, 32, 16)
    forward = lower(SDPA_FORWARD, q, kv, kv, None, True, None)
    backward = lower(SDPA_BACKWARD, q, q, kv, kv, None, q, T(8, 4, 32), True, None, False)
    for text in (forward, backward):
        batching = re.findall(r"lhs_batching_dimensions = \[([\d, ]*)\]", text)
        assert batching and all(dims == "0" for dims in batching), batching
    assert len(re.findall(r"stablehlo\.dot_general", backward)) == 5  # dV, dP, dQ, dK and the scores
