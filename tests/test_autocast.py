"""torch.autocast("tpu") follows PyTorch's CUDA autocast policy; torch.amp.GradScaler("tpu").

The oracle for the policy is PyTorch's own AutocastCUDA kernels, run on CPU-only machines
through fake CUDA tensors (FakeTensor with device "cuda"): for every sample the output
dtypes on tpu must equal CUDA's. Values are compared with the CPU: under CPU autocast where
it gives CUDA's dtype, and always against CUDA's policy applied by hand (inputs cast, op
run without autocast).
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils._pytree import tree_flatten
from utils import assert_close, assert_close_or_closer, to_cpu, to_float64, to_tpu

import torchtpu
from torchtpu.device import amp

f32, bf16, f16, f64 = torch.float32, torch.bfloat16, torch.float16, torch.float64
aten = torch.ops.aten


# -- inputs ---------------------------------------------------------------------------------------
class R:
    """A random float input: shape, dtype, positive values or not."""

    def __init__(self, *shape: int, dtype: torch.dtype = f32, positive: bool = False):
        self.shape, self.dtype, self.positive = shape, dtype, positive

    def make(self, g: torch.Generator) -> torch.Tensor:
        x = torch.randn(self.shape, generator=g)
        return (x.abs() + 0.5 if self.positive else x).to(self.dtype)


class Const:
    """A fixed tensor (indices, targets)."""

    def __init__(self, t: torch.Tensor):
        self.t = t

    def make(self, g: torch.Generator) -> torch.Tensor:
        return self.t.clone()


def make_inputs(specs: list[Any]) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [s.make(g) for s in specs]


# -- CUDA's policy, from PyTorch's own AutocastCUDA kernels ------------------------------------------
@contextlib.contextmanager
def cuda_autocast(dtype: torch.dtype) -> Iterator[None]:
    """torch.autocast("cuda") refuses to start without CUDA; set the same thread-local state."""
    prev = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")
    torch.set_autocast_enabled("cuda", True)
    torch.set_autocast_dtype("cuda", dtype)
    try:
        yield
    finally:
        torch.set_autocast_enabled("cuda", prev[0])
        torch.set_autocast_dtype("cuda", prev[1])


def cuda_result(fn: Callable[..., Any], inputs: list[torch.Tensor], dtype: torch.dtype) -> Any:
    """``fn`` on fake CUDA tensors under CUDA autocast: outputs with CUDA's dtypes."""
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    fakes = [FakeTensor(mode, torch.empty(t.shape, dtype=t.dtype, device="meta"), torch.device("cuda")) for t in inputs]
    with mode, cuda_autocast(dtype):
        return fn(*fakes)


def dtypes(x: Any) -> list[torch.dtype]:
    return [t.dtype for t in tree_flatten(x)[0] if isinstance(t, torch.Tensor)]


def eligible(t: torch.Tensor) -> bool:
    """A tensor autocast may cast (a float that is not float64)."""
    return t.is_floating_point() and t.dtype != f64


def by_hand(fn: Callable[..., Any], inputs: list[torch.Tensor], tag: str, dtype: torch.dtype) -> Any:
    """CUDA's policy applied by hand on the CPU: cast the inputs, run without autocast."""
    floats = [t for t in inputs if eligible(t)]
    if tag == "low":
        to = dtype
    elif tag == "fp32":
        to = f32
    elif tag == "promote":
        to = f32 if any(t.dtype == f32 for t in floats) else dtype
    else:
        return fn(*inputs)
    return fn(*[t.to(to) if eligible(t) else t for t in inputs])


# -- the samples: (id, function, inputs, CUDA policy tag) -----------------------------------------
def _cells() -> list[Any]:
    def lstm(x, h, c, wi, wh, bi, bh):  # noqa: ANN001, ANN202
        return torch.lstm_cell(x, (h, c), wi, wh, bi, bh)

    x, h = R(3, 5), R(3, 4)
    return [
        ("lstm_cell", lstm, [x, h, R(3, 4), R(16, 5), R(16, 4), R(16), R(16)], "low"),
        ("gru_cell", torch.gru_cell, [x, h, R(12, 5), R(12, 4), R(12), R(12)], "low"),
        ("rnn_tanh_cell", torch.rnn_tanh_cell, [x, h, R(4, 5), R(4, 4), R(4), R(4)], "low"),
        ("rnn_relu_cell", torch.rnn_relu_cell, [x, h, R(4, 5), R(4, 4), R(4), R(4)], "low"),
    ]


SAMPLES: list[tuple[str, Callable[..., Any], list[Any], str]] = [
    # lower precision
    ("mm", torch.mm, [R(8, 16), R(16, 4)], "low"),
    ("mm_mixed", torch.mm, [R(8, 16, dtype=bf16), R(16, 4)], "low"),
    ("matmul", torch.matmul, [R(2, 8, 16), R(16, 4)], "low"),
    ("linear", F.linear, [R(8, 16), R(4, 16), R(4)], "low"),
    ("conv1d", F.conv1d, [R(2, 3, 10), R(4, 3, 3), R(4)], "low"),
    ("conv2d", lambda x, w, b: F.conv2d(x, w, b, padding=1), [R(2, 3, 8, 8), R(4, 3, 3, 3), R(4)], "low"),
    ("conv2d_padding_same", lambda x, w: F.conv2d(x, w, padding="same"), [R(2, 3, 8, 8), R(4, 3, 3, 3)], "low"),
    ("conv3d", F.conv3d, [R(1, 2, 4, 4, 4), R(3, 2, 2, 2, 2)], "low"),
    ("conv_transpose1d", F.conv_transpose1d, [R(2, 3, 6), R(3, 4, 3)], "low"),
    ("conv_transpose2d", F.conv_transpose2d, [R(2, 3, 5, 5), R(3, 4, 3, 3), R(4)], "low"),
    ("bmm", torch.bmm, [R(2, 4, 8), R(2, 8, 3)], "low"),
    ("baddbmm", torch.baddbmm, [R(2, 4, 3), R(2, 4, 8), R(2, 8, 3)], "low"),
    ("addmm", torch.addmm, [R(4, 3), R(4, 8), R(8, 3)], "low"),
    ("addbmm", torch.addbmm, [R(4, 3), R(2, 4, 8), R(2, 8, 3)], "low"),
    ("addmv", torch.addmv, [R(4), R(4, 8), R(8)], "low"),
    ("addr", torch.addr, [R(4, 3), R(4), R(3)], "low"),
    ("mv", torch.mv, [R(4, 8), R(8)], "low"),
    ("einsum", lambda a, b: torch.einsum("ij,jk->ik", a, b), [R(4, 8), R(8, 3)], "low"),
    ("linalg_multi_dot", lambda a, b, c: torch.linalg.multi_dot([a, b, c]), [R(4, 8), R(8, 5), R(5, 3)], "low"),
    ("linalg_vecdot", torch.linalg.vecdot, [R(4, 8), R(4, 8)], "low"),
    ("prelu", F.prelu, [R(2, 3, 4), R(3)], "low"),
    ("sdpa", F.scaled_dot_product_attention, [R(2, 2, 8, 16), R(2, 2, 8, 16), R(2, 2, 8, 16)], "low"),
    *_cells(),
    # float32
    ("exp", torch.exp, [R(8, dtype=bf16)], "fp32"),
    ("log", torch.log, [R(8, dtype=bf16, positive=True)], "fp32"),
    ("rsqrt", torch.rsqrt, [R(8, dtype=bf16, positive=True)], "fp32"),
    ("pow_tensor_scalar", lambda x: torch.pow(x, 3), [R(8, dtype=bf16)], "fp32"),
    ("pow_tensor_tensor", torch.pow, [R(8, dtype=bf16, positive=True), R(8, dtype=bf16)], "fp32"),
    ("pow_scalar", lambda x: torch.pow(2.0, x), [R(8, dtype=bf16)], "fp32"),
    ("softplus", F.softplus, [R(8, dtype=bf16)], "fp32"),
    ("layer_norm", lambda x, w, b: F.layer_norm(x, (8,), w, b), [R(4, 8, dtype=bf16), R(8), R(8)], "fp32"),
    ("group_norm", lambda x, w, b: F.group_norm(x, 2, w, b), [R(2, 4, 3, dtype=bf16), R(4), R(4)], "fp32"),
    ("rms_norm", lambda x, w: F.rms_norm(x, (8,), w), [R(4, 8, dtype=bf16), R(8)], "fp32"),
    ("cosine_similarity", F.cosine_similarity, [R(4, 8, dtype=bf16), R(4, 8)], "fp32"),
    ("mse_loss", F.mse_loss, [R(4, 8, dtype=bf16), R(4, 8)], "fp32"),
    ("l1_loss", F.l1_loss, [R(4, 8, dtype=bf16), R(4, 8)], "fp32"),
    ("smooth_l1_loss", F.smooth_l1_loss, [R(4, 8, dtype=bf16), R(4, 8)], "fp32"),
    ("nll_loss", F.nll_loss, [R(4, 5, dtype=bf16), Const(torch.tensor([0, 4, 2, 1]))], "fp32"),
    # cross_entropy_loss passes log_softmax an explicit dtype (the input's), so on CUDA the
    # log-softmax runs in bfloat16 and only nll_loss in float32
    (
        "cross_entropy",
        F.cross_entropy,
        [R(4, 5, dtype=bf16), Const(torch.tensor([0, 4, 2, 1]))],
        lambda x, t: F.nll_loss(F.log_softmax(x, 1, dtype=x.dtype).float(), t),
    ),
    ("kl_div", lambda a, b: F.kl_div(a, b, reduction="batchmean"), [R(4, 5, dtype=bf16), R(4, 5, positive=True)], "fp32"),
    ("bce_with_logits", F.binary_cross_entropy_with_logits, [R(4, 5, dtype=bf16), R(4, 5, positive=True)], "fp32"),
    ("cdist", torch.cdist, [R(4, 3, dtype=bf16), R(5, 3, dtype=bf16)], "fp32"),
    ("logsumexp", lambda x: torch.logsumexp(x, 1), [R(4, 5, dtype=bf16)], "fp32"),
    ("interpolate_nearest", lambda x: F.interpolate(x, scale_factor=2), [R(1, 2, 3, 3, dtype=bf16)], "fp32"),
    ("interpolate_bilinear", lambda x: F.interpolate(x, size=(5, 5), mode="bilinear"), [R(1, 2, 3, 3, dtype=bf16)], "fp32"),
    ("softmax", lambda x: torch.softmax(x, 1), [R(4, 5, dtype=bf16)], "fp32"),
    ("log_softmax", lambda x: F.log_softmax(x, 1), [R(4, 5, dtype=bf16)], "fp32"),
    ("sum", torch.sum, [R(4, 5, dtype=bf16)], "fp32"),
    ("sum_dim", lambda x: x.sum(1), [R(4, 5, dtype=bf16)], "fp32"),
    ("prod", lambda x: x.prod(1), [R(4, 5, dtype=bf16)], "fp32"),
    ("cumsum", lambda x: x.cumsum(1), [R(4, 5, dtype=bf16)], "fp32"),
    ("cumprod", lambda x: x.cumprod(1), [R(4, 5, dtype=bf16)], "fp32"),
    ("vector_norm", torch.linalg.vector_norm, [R(4, 5, dtype=bf16)], "fp32"),
    ("matrix_norm", torch.linalg.matrix_norm, [R(4, 5, dtype=bf16)], "fp32"),
    ("norm_scalar", lambda x: aten.norm.Scalar(x, 3), [R(4, 5, dtype=bf16)], "fp32"),
    ("norm_dim", lambda x: aten.norm.ScalarOpt_dim(x, 2, [1], True), [R(4, 5, dtype=bf16)], "fp32"),
    # widest type
    ("addcmul", torch.addcmul, [R(8), R(8, dtype=bf16), R(8, dtype=bf16)], "promote"),
    ("addcmul_low", torch.addcmul, [R(8, dtype=bf16), R(8, dtype=bf16), R(8, dtype=bf16)], "promote"),
    ("addcdiv", torch.addcdiv, [R(8, dtype=bf16), R(8), R(8, positive=True)], "promote"),
    ("atan2", torch.atan2, [R(8, dtype=bf16), R(8)], "promote"),
    ("bilinear", F.bilinear, [R(4, 3, dtype=bf16), R(4, 5), R(2, 3, 5), R(2)], "promote"),
    ("cross", lambda a, b: torch.cross(a, b, dim=1), [R(4, 3, dtype=bf16), R(4, 3)], "promote"),
    ("dot", torch.dot, [R(8, dtype=bf16), R(8)], "promote"),
    ("vdot", torch.vdot, [R(8), R(8, dtype=bf16)], "promote"),
    ("grid_sample", lambda x, g: F.grid_sample(x, g, align_corners=False), [R(1, 2, 4, 4, dtype=bf16), R(1, 3, 3, 2)], "promote"),
    ("index_put", lambda x, i, v: x.index_put((i,), v), [R(6, dtype=bf16), Const(torch.tensor([0, 3, 5])), R(3)], "promote"),
    ("tensordot", lambda a, b: torch.tensordot(a, b, dims=1), [R(4, 3, dtype=bf16), R(3, 5)], "promote"),
    (
        "scatter_add",
        lambda x, i, s: torch.scatter_add(x, 0, i, s),
        [R(6, dtype=bf16), Const(torch.tensor([0, 2, 2, 5])), R(4)],
        "promote",
    ),
    # not on any list: run as written (cat/stack/index_copy promote natively)
    ("cat", lambda a, b: torch.cat([a, b]), [R(4, dtype=bf16), R(4)], "none"),
    ("stack", lambda a, b: torch.stack([a, b]), [R(4, dtype=bf16), R(4)], "none"),
    ("relu_add", lambda a, b: F.relu(a) + b, [R(8), R(8, dtype=bf16)], "none"),
    ("softmax_explicit_dtype", lambda x: torch.softmax(x, 0, dtype=bf16), [R(8)], "none"),
    ("sum_float64_input", torch.sum, [R(8, dtype=f64)], "none"),
    ("mm_float64_input", torch.mm, [R(4, 8, dtype=f64), R(8, 3, dtype=f64)], "none"),
]


# Samples whose policy is the same on the CPU (same list, or an equivalent cast): compared
# with CPU autocast too.
CPU_AGREES = {
    "mm", "mm_mixed", "matmul", "linear", "conv1d", "conv2d", "conv2d_padding_same", "conv3d",
    "conv_transpose1d", "conv_transpose2d", "bmm", "baddbmm", "addmm", "addbmm", "prelu", "sdpa",
    "linalg_vecdot", "mse_loss", "l1_loss", "smooth_l1_loss", "nll_loss", "kl_div",
    "bce_with_logits", "cdist", "prod", "cat", "stack", "relu_add",
    "softmax_explicit_dtype", "sum_float64_input", "mm_float64_input",
}  # fmt: skip
# CUDA's grid_sampler asks cuDNN whether it can run, which a CPU-only build cannot answer:
# no fake-CUDA oracle, the hand-written policy only.
NO_CUDA_ORACLE = {"grid_sample"}


# Results in (or computed through) a half type can differ from the CPU's by a rounding step
# of that type where the two round at different points. They are compared at PyTorch's
# default tolerances, or else must be no farther than the CPU's from a float64 reference
# (assert_close_or_closer).
def policy_reference(name: str, fn: Callable[..., Any], inputs: list[torch.Tensor], tag: Any, half: torch.dtype) -> Any:
    """``fn`` in float64 on the inputs the policy gives it: a lower-precision op sees them
    rounded to ``half`` (on the tpu and the CPU alike), the others exactly; an intermediate
    the policy computes in ``half`` is rounded once (ROUNDED_INTERMEDIATES)."""
    if name in ROUNDED_INTERMEDIATES:
        return ROUNDED_INTERMEDIATES[name](*to_float64(inputs), half=half)
    seen = [t.to(half) if tag == "low" and eligible(t) else t for t in inputs]
    return fn(*to_float64(seen))


# Without its rounded intermediate the float64 reference of a float32 result is a coin flip:
# the CPU's bfloat16 log-softmax (not correctly rounded: errors up to 0.0094 where half an ulp
# is 0.0078) beat ours (correctly rounded) on the four elements the loss picks.
ROUNDED_INTERMEDIATES = {
    "cross_entropy": lambda x, t, half: F.nll_loss(F.log_softmax(x, 1).to(half).double(), t),
}


def _run_tpu(fn: Callable[..., Any], inputs: list[torch.Tensor], dtype: torch.dtype | None) -> Any:
    with torch.autocast("tpu", dtype=dtype):
        return to_cpu(fn(*to_tpu(inputs)))


def _check_sample(name: str, fn: Callable[..., Any], inputs: list[torch.Tensor], tag: Any, half: torch.dtype) -> None:
    actual = _run_tpu(fn, inputs, None if half == bf16 else half)  # bfloat16 is the default
    expected = tag(*inputs) if callable(tag) else by_hand(fn, inputs, tag, half)
    if name not in NO_CUDA_ORACLE:
        assert dtypes(actual) == dtypes(cuda_result(fn, inputs, half)), "dtypes differ from CUDA autocast"
    assert dtypes(actual) == dtypes(expected)
    reference = policy_reference(name, fn, inputs, tag, half)
    assert_close_or_closer(actual, expected, reference)
    if name in CPU_AGREES:
        with torch.autocast("cpu", dtype=half):
            cpu_autocast = fn(*inputs)
        assert dtypes(cpu_autocast) == dtypes(actual)
        assert_close_or_closer(actual, cpu_autocast, reference)


@pytest.mark.parametrize("name,fn,specs,tag", SAMPLES, ids=[s[0] for s in SAMPLES])
def test_op_policy_matches_cuda(name: str, fn: Callable[..., Any], specs: list[Any], tag: Any) -> None:
    _check_sample(name, fn, make_inputs(specs), tag, bf16)


FP16_SAMPLES = [s for s in SAMPLES if s[0] in ("linear", "conv2d", "sdpa", "addcmul", "softmax", "layer_norm")]


@pytest.mark.parametrize("name,fn,specs,tag", FP16_SAMPLES, ids=[s[0] for s in FP16_SAMPLES])
def test_op_policy_float16(name: str, fn: Callable[..., Any], specs: list[Any], tag: Any) -> None:
    inputs = [t.to(f16) if t.dtype == bf16 else t for t in make_inputs(specs)]
    _check_sample(name, fn, inputs, tag, f16)


# -- the registration -----------------------------------------------------------------------------
def _overloads_with_kernel(key: str) -> set[str]:
    names = (q for q in torch._C._dispatch_get_all_op_names() if torch._C._dispatch_has_kernel_for_dispatch_key(q, key))
    return {q.removeprefix("aten::") for q in names}


def test_registered_ops_are_cudas() -> None:
    """Every overload CUDA autocasts, and no other, has a tpu autocast kernel; our lists
    name each of them once."""
    ours = _overloads_with_kernel("AutocastPrivateUse1")
    assert ours == _overloads_with_kernel("AutocastCUDA")
    listed = [*amp.LOWER_PRECISION_FP, *amp.FP32, *amp.FP32_SET_OPT_DTYPE, *amp.FP32_APPEND_DTYPE, *amp.PROMOTE, *amp.BANNED]
    assert sorted(listed) == sorted(ours)
    assert amp.policy_of("aten::mm.default") == "lower_precision_fp"
    assert amp.policy_of("softmax.int") == "fp32_set_opt_dtype"
    assert amp.policy_of("relu") is None


def test_mixed_half_types_raise_like_cuda() -> None:
    a, b = torch.randn(4, dtype=f16), torch.randn(4, dtype=bf16)
    with pytest.raises(RuntimeError, match="Unexpected floating ScalarType"):
        cuda_result(torch.addcmul, [b, a, b], bf16)
    with pytest.raises(RuntimeError, match="Unexpected floating ScalarType"), torch.autocast("tpu"):
        torch.addcmul(*to_tpu([b, a, b]))


def test_binary_cross_entropy_is_banned() -> None:
    x, t = torch.rand(4, device="tpu"), torch.rand(4, device="tpu")
    with pytest.raises(RuntimeError, match="unsafe to autocast"), torch.autocast("tpu"):
        F.binary_cross_entropy(x, t)
    assert F.binary_cross_entropy(x, t).dtype == f32  # outside autocast it runs


# -- the autocast API -----------------------------------------------------------------------------
def test_api_state_nesting_and_disable() -> None:
    a = torch.randn(4, 4, device="tpu")
    assert torch.amp.is_autocast_available("tpu")
    assert torch.get_autocast_dtype("tpu") == bf16
    assert torch.tpu.get_amp_supported_dtype() == [bf16, f16]
    assert not torch.is_autocast_enabled("tpu")
    assert torch.mm(a, a).dtype == f32
    with torch.autocast("tpu"):
        assert torch.is_autocast_enabled("tpu") and not torch.is_autocast_enabled("cpu")
        assert torch.mm(a, a).dtype == bf16
        with torch.autocast("tpu", dtype=f16):
            assert torch.get_autocast_dtype("tpu") == f16
            assert torch.mm(a, a).dtype == f16
            with torch.autocast("tpu", enabled=False):
                assert not torch.is_autocast_enabled("tpu")
                assert torch.mm(a, a).dtype == f32
            assert torch.mm(a, a).dtype == f16
        assert torch.mm(a, a).dtype == bf16
    assert not torch.is_autocast_enabled("tpu") and torch.get_autocast_dtype("tpu") == bf16
    # CPU autocast leaves tpu tensors alone, and tpu autocast CPU tensors
    with torch.autocast("cpu", dtype=bf16):
        assert torch.mm(a, a).dtype == f32
    with torch.autocast("tpu"):
        assert torch.mm(a.cpu(), a.cpu()).dtype == f32

    @torch.autocast("tpu")
    def decorated(x: torch.Tensor) -> torch.Tensor:
        return x @ x

    assert decorated(a).dtype == bf16


def test_unsupported_dtype_warns_and_disables() -> None:
    a = torch.randn(4, 4, device="tpu")
    with pytest.warns(UserWarning, match="tpu Autocast only supports"), torch.autocast("tpu", dtype=f64):
        assert torch.mm(a, a).dtype == f32


def test_weight_cast_cache() -> None:
    """fp32 leaf weights are cast once per autocast region (cache_enabled, the default)."""
    w = torch.randn(3, 4, device="tpu", requires_grad=True)
    x = torch.randn(2, 4, device="tpu")
    with torch.autocast("tpu"):
        F.linear(x, w)
        F.linear(x, w)
        assert len(amp._cast_cache) == 1
        with torch.autocast("tpu"):  # an inner region does not clear it
            pass
        assert len(amp._cast_cache) == 1
    assert len(amp._cast_cache) == 0
    with torch.autocast("tpu", cache_enabled=False):
        y = F.linear(x, w)
        assert len(amp._cast_cache) == 0
    y.sum().backward()
    assert w.grad.dtype == f32


# -- models ---------------------------------------------------------------------------------------
# LOSS_OUTSIDE: the models' losses are computed outside the autocast region. Inside it the two
# policies differ: the CPU's runs cross_entropy in float32, CUDA's (ours) its log-softmax in
# bfloat16, which put the logits' gradient 1.8x farther from float64 than the CPU's (0.0040 vs
# 0.0022 summed) by policy, not by accuracy (the "cross_entropy" sample above checks CUDA's).
class Net(torch.nn.Module):
    """conv -> linear -> self-attention -> linear head: ops on which the CPU and CUDA policies
    agree. tanh, not relu: a relu whose bfloat16 input rounds to the other side of 0 on one
    device would switch a whole gradient term on or off."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.proj = torch.nn.Linear(4 * 16, 32)
        self.qkv = torch.nn.Linear(8, 24)
        self.head = torch.nn.Linear(32, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.conv(x)).flatten(1)
        h = torch.tanh(self.proj(h))
        q, k, v = self.qkv(h.view(h.shape[0], 4, 8)).unsqueeze(1).chunk(3, dim=-1)
        a = F.scaled_dot_product_attention(q, k, v).reshape(h.shape[0], 32)
        return self.head(a + h)


def _model_step(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, device_type: str) -> tuple[Any, ...]:
    with torch.autocast(device_type, dtype=bf16):
        out = model(x)
    loss = F.cross_entropy(out.float(), y)  # outside: see LOSS_OUTSIDE
    loss.backward()
    return out, loss, [p.grad for p in model.parameters()]


def _make_net() -> tuple[torch.nn.Module, torch.nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    cpu = Net()
    tpu = Net()
    tpu.load_state_dict(cpu.state_dict())
    return cpu, tpu.to("tpu"), torch.randn(6, 3, 4, 4), torch.randint(0, 5, (6,))


def test_model_forward_backward_matches_cpu_autocast() -> None:
    cpu, tpu, x, y = _make_net()
    # float64 copy: autocast leaves float64 alone, so this is the step without any rounding
    reference = _model_step(copy.deepcopy(cpu).double(), x.double(), y, "cpu")
    expected = _model_step(cpu, x, y, "cpu")
    actual = _model_step(tpu, x.to("tpu"), y.to("tpu"), "tpu")
    assert actual[0].dtype == bf16 and actual[1].dtype == f32
    assert [g.dtype for g in actual[2]] == [f32] * len(expected[2])
    # the float32 loss and gradients are computed through bfloat16 logits and activations
    assert_close_or_closer(actual, expected, reference)


# -- the three execution modes --------------------------------------------------------------------
def _mixed(x: torch.Tensor, w: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, ...]:
    h = F.linear(x, w)  # bfloat16
    n = F.layer_norm(h, (h.shape[-1],), g)  # float32
    s = torch.softmax(n, -1)  # float32
    return h, n, s, torch.cat([h, s]), (h @ s.t()).sum()  # ..., float32 (cat promotes), float32 (sum)


MIXED_DTYPES = [bf16, f32, f32, f32, f32]


def _mixed_inputs() -> list[torch.Tensor]:
    return make_inputs([R(4, 8), R(6, 8), R(6)])


def test_defer_and_fuse_mode_matches_eager() -> None:
    inputs = to_tpu(_mixed_inputs())
    with torch.autocast("tpu"):
        eager = to_cpu(_mixed(*inputs))
    with torchtpu.eager_mode("defer_and_fuse"), torch.autocast("tpu"):
        deferred = to_cpu(_mixed(*inputs))
    assert dtypes(deferred) == dtypes(eager) == MIXED_DTYPES
    reference = _mixed(*to_float64(_mixed_inputs()))
    assert_close_or_closer(deferred, eager, reference)
    with torch.autocast("cpu", dtype=bf16):  # on the CPU, by hand: layer_norm and softmax are not on its list
        x, w, g = _mixed_inputs()
        h = F.linear(x, w)
        n = F.layer_norm(h.float(), (6,), g)
        s = torch.softmax(n, -1)
        expected = [h, n, s, torch.cat([h, s]), (h @ s.t()).sum(dtype=f32)]
    assert_close_or_closer(eager, expected, reference)


def test_compile_forward_and_backward_match_eager() -> None:
    """Dynamo traces autocast regions itself; inside or around the compiled function, the
    compiled program has eager autocast's dtypes and values, gradients included."""

    def step(x: torch.Tensor, w: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, ...]:
        outs = _mixed(x, w, g)
        return (*outs, *torch.autograd.grad(outs[-1], [w, g]))

    def inside(x: torch.Tensor, w: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, ...]:
        with torch.autocast("tpu"):
            return step(x, w, g)

    def leaves(to: Callable[[Any], Any] = to_tpu) -> list[torch.Tensor]:
        x, w, g = to(_mixed_inputs())
        return [x, w.requires_grad_(), g.requires_grad_()]

    reference = step(*leaves(to_float64))

    with torch.autocast("tpu"):
        eager = to_cpu(step(*leaves()))
    assert dtypes(eager) == [*MIXED_DTYPES, f32, f32]
    torch._dynamo.reset()
    compiled_inside = to_cpu(torch.compile(inside, backend="tpu")(*leaves()))
    with torch.autocast("tpu"):
        compiled_around = to_cpu(torch.compile(step, backend="tpu")(*leaves()))
        # tracing ran the cast kernels on fake tensors: none of them may stay in the weight cache
        assert not amp._cast_cache
    for result in (compiled_inside, compiled_around):
        assert dtypes(result) == dtypes(eager)
        assert_close_or_closer(result, eager, reference)


# -- GradScaler -----------------------------------------------------------------------------------
def _scaler_run(
    device: str, make_opt: Callable[[Any], torch.optim.Optimizer], bad_steps: dict[int, float], dtype: torch.dtype = f32
) -> tuple[list[float], list[torch.Tensor]]:
    """A bfloat16-autocast training loop under GradScaler; at ``bad_steps`` one gradient
    element is overwritten with inf or NaN (the step must be skipped, the scale backed off)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3)).to(device, dtype)
    opt = make_opt(model.parameters())
    scaler = torch.amp.GradScaler(device, init_scale=2.0**10, growth_interval=2)
    g = torch.Generator().manual_seed(1)
    scales = []
    for step in range(max(bad_steps) + 2):
        x, y = torch.randn(4, 8, generator=g).to(device, dtype), torch.randint(0, 3, (4,), generator=g).to(device)
        with torch.autocast(device, dtype=bf16):
            logits = model(x)
        loss = F.cross_entropy(logits.float(), y)  # outside: see LOSS_OUTSIDE
        scaler.scale(loss).backward()
        if step in bad_steps:
            model[2 * (step % 2)].weight.grad[0, 1] = bad_steps[step]
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        scales.append(scaler.get_scale())
    return scales, [p.detach().cpu() for p in model.parameters()]


OPTIMIZERS = {
    "sgd_momentum": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
    "adam_fused": lambda ps: torch.optim.Adam(ps, lr=0.01, fused=True),  # takes grad_scale/found_inf itself
}


@pytest.mark.parametrize("opt", list(OPTIMIZERS))
def test_grad_scaler_matches_cpu(opt: str) -> None:
    bad = {3: math.inf, 5: math.nan}
    e_scales, e_params = _scaler_run("cpu", OPTIMIZERS[opt], bad)
    a_scales, a_params = _scaler_run("tpu", OPTIMIZERS[opt], bad)
    # grows every 2 good steps, halves at each bad one
    assert e_scales == [1024.0, 2048.0, 2048.0, 1024.0, 1024.0, 512.0, 512.0]
    assert a_scales == e_scales
    # trained through bfloat16 matmuls; the float64 run (which autocast leaves alone) has none
    assert_close_or_closer(a_params, e_params, _scaler_run("cpu", OPTIMIZERS[opt], bad, f64)[1])


def test_grad_scaler_defer_and_fuse() -> None:
    bad = {1: math.inf, 2: -math.inf}
    e_scales, e_params = _scaler_run("cpu", OPTIMIZERS["sgd_momentum"], bad)
    with torchtpu.eager_mode("defer_and_fuse"):
        a_scales, a_params = _scaler_run("tpu", OPTIMIZERS["sgd_momentum"], bad)
    assert e_scales == [1024.0, 512.0, 256.0, 256.0]
    assert a_scales == e_scales
    # XLA's default --xla_allow_excess_precision may drop float32 -> bfloat16 -> float32 round
    # trips inside a fused program that eager mode performs; the result must still be no
    # farther from float64 than the CPU's
    assert_close_or_closer(a_params, e_params, _scaler_run("cpu", OPTIMIZERS["sgd_momentum"], bad, f64)[1])


def test_amp_kernels_match_cpu() -> None:
    def unscale(device: str) -> Any:
        grads = [
            torch.tensor([1.0, -2.0], device=device),
            torch.tensor([3.0, 0.5], device=device).to(bf16),
            torch.tensor([4.0], device=device).to(f16),
        ]
        found, inv = torch.zeros((), device=device), torch.tensor(0.3, device=device)
        torch._amp_foreach_non_finite_check_and_unscale_(grads, found, inv)
        first = found.clone()
        grads[1][1] = math.inf
        torch._amp_foreach_non_finite_check_and_unscale_(grads, found, inv)
        return grads, first, found

    def update(device: str) -> list[tuple[float, int]]:
        scale, tracker = torch.tensor(3.0e38, device=device), torch.tensor(0, dtype=torch.int32, device=device)
        out = []
        for f in (0.0, 0.0, 0.0, 1.0, math.nan, 0.0):  # grows, clamps at the float32 limit, backs off
            torch._amp_update_scale_(scale, tracker, torch.tensor(f, device=device), 1.1, 0.3, 2)
            out.append((scale.item(), tracker.item()))
        return out

    assert_close(unscale("tpu"), unscale("cpu"), rtol=0, atol=0)
    assert update("tpu") == update("cpu")
    with pytest.raises(RuntimeError, match="found_inf must be a 1-element tensor"):
        torch._amp_foreach_non_finite_check_and_unscale_(
            [torch.ones(2, device="tpu")], torch.zeros(2, device="tpu"), torch.ones((), device="tpu")
        )


# -- CUDA's policy on the CPU (the model zoo's autocast reference) ---------------------------------


@pytest.mark.parametrize("name,fn,specs,tag", [s for s in SAMPLES if s[0] not in NO_CUDA_ORACLE], ids=[s[0] for s in SAMPLES if s[0] not in NO_CUDA_ORACLE])
def test_cuda_policy_on_the_cpu(name: str, fn: Callable[..., Any], specs: list[Any], tag: Any) -> None:
    """tests/models/cuda_policy.py gives CPU autocast CUDA's dtypes, and its own back after."""
    from models.cuda_policy import cuda_policy_on_the_cpu

    inputs = make_inputs(specs)
    with torch.autocast("tpu", dtype=bf16):  # first: tpu's run registers what the fake CUDA run of a fused cell needs
        expected = dtypes(fn(*to_tpu(inputs)))
    assert expected == dtypes(cuda_result(fn, inputs, bf16))
    with cuda_policy_on_the_cpu(), torch.autocast("cpu", dtype=bf16):
        assert dtypes(fn(*inputs)) == expected
    with torch.autocast("cpu", dtype=bf16):  # the CPU's policy again
        assert torch.mm(*make_inputs([R(2, 3), R(3, 2)])).dtype == bf16
        assert torch.softmax(torch.ones(2, dtype=bf16), 0).dtype == bf16  # CUDA's: float32
