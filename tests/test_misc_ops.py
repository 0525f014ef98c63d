"""cummax/cummin, mode, histc, index_reduce, hash_tensor, cubic and anti-aliased
upsampling, shrink and pdist backward, sgn's zero gradient, fake quantization (QAT):
tpu vs CPU (ties, NaN, empty inputs, several dims).

The large dtype x shape grids are marked slow (``make test-all``); in ``make test`` these
ops are still checked by the OpInfo subset (float32 forward and gradients) and by the
unparametrized cases here."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from utils import assert_close, to_tpu

NAN = float("nan")


def _ints(shape, dtype, lo=-2, hi=3):
    """Small integers: plenty of ties."""
    return torch.randint(lo, hi, shape).to(dtype)


# -- cummax / cummin ---------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("fn", [torch.cummax, torch.cummin])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.bool])
@pytest.mark.parametrize("shape,dim", [((7,), 0), ((4, 9), 1), ((4, 9), -2), ((3, 5, 2), 1), ((0, 3), 0), ((), 0)])
def test_cummax_cummin(fn, dtype, shape, dim):
    x = _ints(shape, dtype)
    if dtype.is_floating_point and x.numel() > 3:
        x.view(-1)[[1, 3]] = NAN  # NaN sticks; the later NaN takes over the index
    expected = fn(x, dim)
    actual = fn(to_tpu(x), dim)
    assert torch.equal(actual.indices.cpu(), expected.indices)  # ties: the LAST index, as the CPU
    assert_close(actual.values, expected.values)


def test_cummax_grad():
    x = _ints((3, 6), torch.float32).requires_grad_()
    xt = to_tpu(x.detach()).requires_grad_()
    (g,) = torch.autograd.grad(torch.cummax(x, 1).values.sum(), x)
    (gt,) = torch.autograd.grad(torch.cummax(xt, 1).values.sum(), xt)
    assert_close(gt, g)


# -- mode --------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.float16])
@pytest.mark.parametrize("shape,dim", [((7,), 0), ((4, 9), 1), ((4, 9), 0), ((3, 5, 2), 1), ((1, 3), 0), ((3, 0), 0), ((), 0), ((16,), 0)])
@pytest.mark.parametrize("keepdim", [False, True])
def test_mode(dtype, shape, dim, keepdim):
    x = _ints(shape, dtype)
    expected = torch.mode(x, dim, keepdim)
    actual = torch.mode(to_tpu(x), dim, keepdim)
    # equal counts: the smallest value; index: its last occurrence (the CPU's stable
    # insertion sort for up to 16 elements)
    assert torch.equal(actual.values.cpu(), expected.values)
    assert torch.equal(actual.indices.cpu(), expected.indices)


def test_mode_long_row_of_distinct_values():
    x = torch.randn(3000)
    expected, actual = torch.mode(x), torch.mode(to_tpu(x))
    assert torch.equal(actual.values.cpu(), expected.values)
    assert torch.equal(actual.indices.cpu(), expected.indices)


def test_mode_long_row_with_repeats_gives_an_occurrence_of_the_mode():
    # beyond 16 elements the CPU's std::sort is unstable: any occurrence is a right answer
    x = torch.randint(0, 5, (4, 200)).float()
    expected, actual = torch.mode(x, 1), torch.mode(to_tpu(x), 1)
    assert torch.equal(actual.values.cpu(), expected.values)
    idx = actual.indices.cpu()
    assert torch.equal(x.gather(1, idx[:, None])[:, 0], expected.values)


# -- histc -------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(), (5,), (5, 5), (1000,), (0,), (3, 0)])
@pytest.mark.parametrize("bins,lo,hi", [(100, 0, 0), (7, 0, 0), (3, -10, 10), (10, -3.3, 2.9), (1, 2, 2), (33, 0, 10)])
def test_histc(dtype, shape, bins, lo, hi):
    if dtype is torch.bfloat16 and shape == (1000,):
        # a bf16 bin count above 256 is not exact: the CPU's result then depends on how
        # its threads split the input (tpu counts in int64 and rounds once)
        pytest.skip("bf16 counts above 256 are rounded differently by the CPU's threads")
    x = (torch.randn(shape) * 5).to(dtype)
    assert torch.equal(torch.histc(to_tpu(x), bins, lo, hi).cpu(), torch.histc(x, bins, lo, hi))


def test_histc_edges_nan_and_constant_input():
    x = torch.linspace(-1, 1, 101)  # elements exactly on bin edges; x == max goes to the last bin
    for bins in (3, 7, 10, 33, 100):
        assert torch.equal(torch.histc(to_tpu(x), bins).cpu(), torch.histc(x, bins))
    x = torch.tensor([1.0, NAN, 2.0, 5.0])  # NaN and out-of-range values are not counted
    assert torch.equal(torch.histc(to_tpu(x), 4, 0, 3).cpu(), torch.histc(x, 4, 0, 3))
    x = torch.full((6,), 3.0)  # min == max in the data: the range widens to [2, 4]
    assert torch.equal(torch.histc(to_tpu(x), 4).cpu(), torch.histc(x, 4))


def test_histc_bad_range_raises():
    with pytest.raises(Exception, match="max must be larger than min"):
        torch.histc(to_tpu(torch.randn(5)), 4, 3, 1).cpu()


# -- index_reduce ------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("reduce", ["prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.float16])
@pytest.mark.parametrize("shape,dim,n", [((5,), 0, 4), ((4, 6), 1, 7), ((3, 4, 2), 0, 5), ((3, 4), 0, 0)])
def test_index_reduce(reduce, include_self, dtype, shape, dim, n):
    x = _ints(shape, dtype, -3, 4)
    src_shape = list(shape)
    src_shape[dim] = n
    src = _ints(src_shape, dtype, -3, 4)
    if dtype.is_floating_point and src.numel() > 2:
        src.view(-1)[1] = NAN
    index = torch.randint(0, shape[dim], (n,))  # repeated indices: several sources per row
    expected = x.index_reduce(dim, index, src, reduce, include_self=include_self)
    actual = to_tpu(x).index_reduce(dim, to_tpu(index), to_tpu(src), reduce, include_self=include_self)
    assert_close(actual, expected)


# -- hash_tensor -------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int32, torch.uint8, torch.bool, torch.int64])
@pytest.mark.parametrize("kwargs", [{}, {"dim": 1}, {"dim": [0], "keepdim": True}, {"dim": (0, 1)}])
def test_hash_tensor(dtype, kwargs):
    x = (torch.randn(4, 5) * 100).to(dtype)
    assert torch.equal(torch.hash_tensor(to_tpu(x), **kwargs).cpu(), torch.hash_tensor(x, **kwargs))


# -- cubic and anti-aliased upsampling (forward and backward) ----------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("mode,antialias", [("bicubic", False), ("bilinear", True), ("bicubic", True)])
@pytest.mark.parametrize("size,kwargs", [((7, 9), {}), ((3, 4), {}), ((13, 5), {}), (None, {"scale_factor": 1.7}), (None, {"scale_factor": 0.4})])
@pytest.mark.parametrize("align_corners", [False, True])
def test_upsample_cubic_and_antialiased(dtype, mode, antialias, size, kwargs, align_corners):
    x = torch.randn(2, 3, 6, 8, dtype=dtype, requires_grad=True)
    xt = to_tpu(x.detach()).requires_grad_()
    args = dict(size=size, mode=mode, align_corners=align_corners, antialias=antialias, **kwargs)
    expected, actual = F.interpolate(x, **args), F.interpolate(xt, **args)
    assert_close(actual, expected)
    g = torch.randn_like(expected)
    (ge,) = torch.autograd.grad(expected, x, g)
    (ga,) = torch.autograd.grad(actual, xt, to_tpu(g))
    assert_close(ga, ge)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_upsample_bicubic_16bit_matches_bit_for_bit(dtype):
    # the CPU stores the cubic weights in the input dtype: the matrices round them too
    x = torch.randn(1, 2, 5, 7).to(dtype)
    expected = F.interpolate(x, size=(9, 4), mode="bicubic")
    assert torch.equal(F.interpolate(to_tpu(x), size=(9, 4), mode="bicubic").cpu(), expected)


# -- backward ops ------------------------------------------------------------------------------
@pytest.mark.parametrize("fn", [F.softshrink, F.hardshrink])
def test_shrink_backward(fn):
    x = torch.tensor([-1.0, -0.5, -0.2, 0.0, 0.3, 0.5, 0.9, NAN], requires_grad=True)
    xt = to_tpu(x.detach()).requires_grad_()
    g = torch.randn(8)
    (ge,) = torch.autograd.grad(fn(x, 0.5), x, g)
    (ga,) = torch.autograd.grad(fn(xt, 0.5), xt, to_tpu(g))
    assert_close(ga, ge)


@pytest.mark.slow
@pytest.mark.parametrize("p", [0, 1, 1.5, 2, 3, float("inf")])
@pytest.mark.parametrize("n,m", [(5, 3), (2, 4), (6, 1)])
def test_pdist_backward(p, n, m):
    x = torch.randn(n, m, dtype=torch.float64)
    x[1] = x[0]  # a pair at distance 0: its gradient is 0, as the CPU's
    x.requires_grad_()
    xt = to_tpu(x.detach()).requires_grad_()
    expected, actual = F.pdist(x, p), F.pdist(xt, p)
    g = torch.randn_like(expected)
    (ge,) = torch.autograd.grad(expected, x, g)
    (ga,) = torch.autograd.grad(actual, xt, to_tpu(g))
    assert_close(ga, ge)


def test_sgn_backward_is_zero():
    # autograd builds the zero gradient with _efficientzerotensor
    xt = to_tpu(torch.randn(4, 5)).requires_grad_()
    torch.sgn(xt).sum().backward()
    assert xt.grad.device.type == "tpu"
    assert torch.equal(xt.grad.cpu(), torch.zeros(4, 5))


# -- fake quantization (quantization-aware training) --------------------------------------------
_FQ_EDGES = [float("inf"), float("-inf"), NAN, 1e30, -1e30, 0.25, 0.75, 1.25, 100.0, 1e10, 9.2e18, -3.3, 0.0, 63.75]


def _fq_check(fn, *args):
    """``fn`` on tpu vs the CPU: outputs (values and masks) and the gradient of every float
    input that requires one."""
    cpu_args = [a.clone().requires_grad_(a.requires_grad) for a in args]
    tpu_args = to_tpu(args)
    expected, actual = fn(*cpu_args), fn(*tpu_args)
    assert_close(actual, expected)
    out_e = expected[0] if isinstance(expected, tuple) else expected
    out_a = actual[0] if isinstance(actual, tuple) else actual
    if not out_e.requires_grad:
        return
    cot = torch.randn(out_e.shape, generator=torch.Generator().manual_seed(7)).to(out_e.dtype)
    wanted = [i for i, a in enumerate(cpu_args) if a.requires_grad]
    g_e = torch.autograd.grad(out_e, [cpu_args[i] for i in wanted], cot)
    g_a = torch.autograd.grad(out_a, [tpu_args[i] for i in wanted], cot.to(out_a.device))
    assert_close(g_a, g_e)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_fake_quantize_per_tensor_and_per_channel_match_cpu(dtype):
    """The ops had no tpu kernel (NotImplementedError). Ties round half to even after
    ``x * (1.0f / scale)``; NaN, infinities and huge values go where the CPU kernels put them
    (per tensor: clamped, NaN to quant_min; per channel: through int64, so to quant_min)."""
    aten = torch.ops.aten
    torch.manual_seed(0)
    edges = torch.tensor(_FQ_EDGES).to(dtype)
    _fq_check(lambda x: aten.fake_quantize_per_tensor_affine_cachemask(x, 0.5, 3, 0, 255), edges)
    rows = edges.reshape(2, 7)
    scales, int_zp, float_zp = torch.tensor([0.5, 0.3]), torch.tensor([3, -1], dtype=torch.int32), torch.tensor([3.5, -1.25])
    for zp in (int_zp, float_zp):
        _fq_check(lambda x, zp=zp: aten.fake_quantize_per_channel_affine_cachemask(x, scales.to(x.device), zp.to(x.device), 0, -128, 127), rows)
    x = (torch.randn(4, 3, 5, 5) * 3).to(dtype).requires_grad_()
    for scale in (0.1, 1 / 3, 0.07):
        _fq_check(lambda a, scale=scale: torch.fake_quantize_per_tensor_affine(a, scale, 5, -128, 127), x)
        s = torch.tensor([scale, scale * 2, scale / 3])
        zp = torch.tensor([0, 3, -7], dtype=torch.int32)
        _fq_check(lambda a, s=s, zp=zp: torch.fake_quantize_per_channel_affine(a, s.to(a.device), zp.to(a.device), 1, -128, 127), x)


def test_fake_quantize_tensor_qparams_and_fake_quant_module_match_cpu():
    """What ``torch.ao.quantization.FakeQuantize`` runs: the zero point read as an int32 (a
    float one truncated), pass-through with an all-True mask when fake quantization is off;
    the observer's running min/max and the qparams after several steps."""
    from torch.ao.quantization import FakeQuantize
    from torch.ao.quantization.observer import MovingAveragePerChannelMinMaxObserver

    aten = torch.ops.aten
    x = torch.tensor(_FQ_EDGES)
    for zp, on in ((torch.tensor([-2], dtype=torch.int32), 1), (torch.tensor([1.5]), 1), (torch.tensor([-2], dtype=torch.int32), 0)):
        enabled = torch.tensor([on])
        _fq_check(
            lambda a, zp=zp, enabled=enabled: aten._fake_quantize_per_tensor_affine_cachemask_tensor_qparams(
                a, torch.tensor([0.3]).to(a.device), zp.to(a.device), enabled.to(a.device), -128, 127
            ),
            x,
        )
    torch.manual_seed(0)
    per_tensor = FakeQuantize()
    per_channel = FakeQuantize(
        observer=MovingAveragePerChannelMinMaxObserver, quant_min=-128, quant_max=127, dtype=torch.qint8, qscheme=torch.per_channel_symmetric, ch_axis=0
    )
    for module in (per_tensor, per_channel):
        tpu_module = copy.deepcopy(module).to("tpu")
        x = (torch.randn(4, 6) * 3).requires_grad_()
        xt = x.detach().to("tpu").requires_grad_()
        outs = [module(x * (i + 1)) for i in range(3)]
        outs_t = [tpu_module(xt * (i + 1)) for i in range(3)]
        assert_close(outs_t, outs)
        assert_close(dict(tpu_module.state_dict()), dict(module.state_dict()))
        sum(o.sum() for o in outs).backward()
        sum(o.sum() for o in outs_t).backward()
        assert_close(xt.grad, x.grad)


@pytest.mark.parametrize("zero_point", [2.5, 3.5, -0.5, 1.7, 300.0])
@pytest.mark.parametrize("grad_factor", [1.0, 0.25])
def test_learnable_fake_quantize_forward_and_gradients_match_cpu(zero_point, grad_factor):
    """LSQ (``_LearnableFakeQuantize``): the forward rounds the zero point half to even, the
    per-tensor backward adds 0.5 and truncates; the gradients of x (straight through), scale
    and zero point as the CPU kernels compute them."""
    torch.manual_seed(0)
    x = (torch.randn(4, 3, 5) * 3).requires_grad_()
    scale = torch.tensor([0.07], requires_grad=True)
    zp = torch.tensor([zero_point], requires_grad=True)
    _fq_check(lambda a, s, z: torch._fake_quantize_learnable_per_tensor_affine(a, s, z, 0, 255, grad_factor), x, scale, zp)
    scales = torch.tensor([0.07, 0.1, 0.033], requires_grad=True)
    zps = torch.tensor([zero_point, zero_point - 1, 0.5], requires_grad=True)
    _fq_check(lambda a, s, z: torch._fake_quantize_learnable_per_channel_affine(a, s, z, 1, -128, 127, grad_factor), x, scales, zps)


@pytest.mark.parametrize(
    "call",
    [
        lambda d: torch.ops.aten.fake_quantize_per_tensor_affine_cachemask(torch.randn(3, device=d), 0.1, 0, 10, 5),
        lambda d: torch.ops.aten.fake_quantize_per_tensor_affine_cachemask(torch.randn(3, device=d), 0.1, 300, 0, 255),
        lambda d: torch.ops.aten.fake_quantize_per_channel_affine_cachemask(
            torch.randn(4, 3, device=d), torch.tensor([0.1, 0.2, 0.3], device=d), torch.zeros(3, dtype=torch.int32, device=d), -1, 0, 255
        ),
        lambda d: torch.ops.aten.fake_quantize_per_channel_affine_cachemask(
            torch.randn(4, 3, device=d), torch.tensor([0.1, 0.2, 0.3], device=d), torch.zeros(3, dtype=torch.int64, device=d), 1, 0, 255
        ),
        lambda d: torch.ops.aten.fake_quantize_per_channel_affine_cachemask(
            torch.randn(4, 3, device=d), torch.tensor([[0.1, 0.2, 0.3]], device=d), torch.zeros(3, dtype=torch.int32, device=d), 1, 0, 255
        ),
        lambda d: torch.ops.aten._fake_quantize_learnable_per_tensor_affine(
            torch.randn(3, device=d), torch.tensor(0.1, device=d), torch.tensor(0.0, device=d), 0, 255, 1.0
        ),
    ],
    ids=["quant_min>quant_max", "zero_point_out_of_range", "negative_axis", "int64_zero_point", "2d_scale", "0d_scale"],
)
def test_fake_quantize_refuses_what_the_cpu_refuses(call):
    with pytest.raises(Exception) as cpu_error:
        call("cpu")
    with pytest.raises(type(cpu_error.value)):
        call("tpu")


def _fused_fake_quant_steps(module, x):
    outs = [module(x), module(x * 2 + 1)]
    module.disable_observer()
    outs.append(module(x * 5))
    module.enable_observer()
    module.disable_fake_quant()
    outs.append(module(x - 3))
    module.enable_fake_quant()
    outs.append(module(x.abs()))
    return outs


@pytest.mark.parametrize("qscheme", ["per_tensor_affine", "per_tensor_symmetric", "per_channel_symmetric", "per_channel_affine"])
def test_fused_moving_avg_obs_fake_quant_matches_cpu(qscheme):
    """The default QAT qconfig's FusedMovingAvgObsFakeQuantize (``_fused_moving_avg_obs_fq_helper``,
    which had no tpu kernel): observer on/off, fake quantization on/off, the running min/max,
    scale and zero point (per channel: buffers empty until the first call) and the
    straight-through gradient."""
    from torch.ao.quantization import FusedMovingAvgObsFakeQuantize
    from torch.ao.quantization.observer import MovingAveragePerChannelMinMaxObserver

    per_channel = qscheme.startswith("per_channel")
    signed = qscheme.endswith("symmetric")
    module = FusedMovingAvgObsFakeQuantize(
        **({"observer": MovingAveragePerChannelMinMaxObserver, "ch_axis": 0} if per_channel else {}),
        quant_min=-128 if signed else 0,
        quant_max=127 if signed else 255,
        dtype=torch.qint8 if signed else torch.quint8,
        qscheme=getattr(torch, qscheme),
    )
    tpu_module = copy.deepcopy(module).to("tpu")
    torch.manual_seed(0)
    x = (torch.randn(4, 6, 3) * 3).requires_grad_()
    xt = x.detach().to("tpu").requires_grad_()
    outs, outs_t = _fused_fake_quant_steps(module, x), _fused_fake_quant_steps(tpu_module, xt)
    assert_close(outs_t, outs)
    assert_close(dict(tpu_module.state_dict()), dict(module.state_dict()))
    cot = [torch.randn(o.shape) for o in outs]
    torch.autograd.backward(outs, cot)
    torch.autograd.backward(outs_t, [c.to("tpu") for c in cot])
    assert_close(xt.grad, x.grad)


def test_qat_model_trains_like_cpu():
    """prepare_qat with the default x86 qconfig (fused observers + fake quantization of the
    activations per tensor and of the weights per channel), four SGD steps."""

    def train(device):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(64, 5)).train()
        model.qconfig = torch.ao.quantization.get_default_qat_qconfig("x86")
        torch.ao.quantization.prepare_qat(model, inplace=True)
        model.to(device)
        x = torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(1)).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        losses = []
        for i in range(4):
            opt.zero_grad()
            loss = model(x * (1 + i * 0.1)).pow(2).mean()
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        return losses, dict(model.state_dict())

    assert_close(train("tpu"), train("cpu"))
