"""Convolution, pooling and upsampling on tpu vs CPU, forward and gradients."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from utils import TPU, assert_close, assert_close_or_closer, check, check_refereed, to_tpu

import torchtpu
from torchtpu.eager import dispatch
from torchtpu.lowering.rules import convolution as conv_rules


def r(*shape, dtype=torch.float32, grad=True):
    return torch.randn(*shape, dtype=dtype).requires_grad_(grad)


CONV_TOL = dict(atol=1e-4, rtol=1e-4)

CONV_CASES = {
    "2d": (lambda x, w, b: F.conv2d(x, w, b), (2, 3, 8, 8), (4, 3, 3, 3), 4),
    "2d_stride_pad_dil": (lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1, dilation=2), (2, 4, 9, 10), (6, 4, 3, 2), 6),
    "2d_groups": (lambda x, w, b: F.conv2d(x, w, b, stride=(2, 3), padding=(1, 2), groups=2), (2, 4, 9, 10), (6, 2, 3, 3), 6),
    # (10 + 0 - 3) % 4 = 3: the last input rows are never read
    "2d_uneven_stride": (lambda x, w, b: F.conv2d(x, w, b, stride=4), (1, 2, 10, 11), (3, 2, 3, 3), 3),
    "depthwise": (lambda x, w, b: F.conv2d(x, w, b, padding=1, groups=4), (2, 4, 6, 6), (8, 1, 3, 3), 8),
    "1d": (lambda x, w, b: F.conv1d(x, w, b, stride=3, padding=2), (2, 3, 11), (5, 3, 4), 5),
    "3d": (lambda x, w, b: F.conv3d(x, w, b, padding=1), (1, 2, 5, 6, 4), (3, 2, 3, 3, 3), 3),
    "2d_unbatched_same": (lambda x, w, b: F.conv2d(x, w, b, padding="same"), (3, 8, 8), (4, 3, 3, 3), 4),
    "t2d": (lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1), (2, 4, 5, 6), (4, 3, 3, 3), 3),
    "t2d_groups_dil": (
        lambda x, w, b: F.conv_transpose2d(x, w, b, stride=3, padding=1, output_padding=(2, 1), groups=2, dilation=2),
        (2, 4, 5, 6),
        (4, 3, 3, 3),
        6,
    ),
    "t1d_nobias": (lambda x, w, b: F.conv_transpose1d(x, w, b, stride=2), (2, 4, 7), (4, 2, 3), None),
    "t3d": (lambda x, w, b: F.conv_transpose3d(x, w, b, stride=2), (1, 2, 3, 4, 3), (2, 3, 2, 2, 2), 3),
}


@pytest.mark.parametrize("name", list(CONV_CASES))
def test_conv(name):
    fn, xs, ws, bs = CONV_CASES[name]
    check(fn, r(*xs), r(*ws), None if bs is None else r(bs), **CONV_TOL)


# Images with fewer positions than the kernel's window (ResNet's last stage: 3x3 kernels on
# 2x2 maps). XLA's CPU compiler would swap such a convolution's operands and run it ~25x
# slower, so on the cpu platform they lower to patches and one dot (rules/convolution.py);
# forward, input and weight gradients against the CPU.
SMALL_IMAGE_CASES = {
    "2x2_pad1": (lambda x, w, b: F.conv2d(x, w, b, padding=1), (2, 8, 2, 2), (6, 8, 3, 3), 6),
    "1x1_pad1": (lambda x, w, b: F.conv2d(x, w, b, padding=1), (3, 4, 1, 1), (5, 4, 3, 3), 5),
    "3x3_stride2_dil2": (lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=2, dilation=2), (2, 4, 3, 3), (5, 4, 3, 3), 5),
    # the second dim's high padding is -1 (the stride skips the last column)
    "negative_high_pad": (lambda x, w, b: F.conv2d(x, w, b, stride=3, padding=1), (2, 3, 2, 2), (4, 3, 3, 2), None),
    "1d": (lambda x, w, b: F.conv1d(x, w, b, padding=2), (2, 3, 3), (4, 3, 5), 4),
    "3d": (lambda x, w, b: F.conv3d(x, w, b, padding=1), (1, 2, 2, 2, 2), (3, 2, 3, 3, 3), 3),
    "t2d": (lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2, padding=1), (2, 4, 2, 2), (4, 3, 3, 3), 3),
    "groups_native": (lambda x, w, b: F.conv2d(x, w, b, padding=1, groups=2), (2, 4, 2, 2), (6, 2, 3, 3), 6),
}


@pytest.mark.parametrize("name", list(SMALL_IMAGE_CASES))
def test_conv_on_images_smaller_than_the_kernel(name):
    fn, xs, ws, bs = SMALL_IMAGE_CASES[name]
    check(fn, r(*xs), r(*ws), None if bs is None else r(bs), **CONV_TOL)


# Every case through each dot formulation the cpu platform may run a convolution as
# (rules/convolution.py's _cpu_plan picks one by size, so a model meets only some of them):
# forced here so each meets every stride, dilation, padding, transposition and layout of
# the cases, forward and both gradients. Grouped convolutions stay native.
_DOT_PLANS = {"patches": conv_rules._conv_as_patches, "overlap_add": conv_rules._conv_as_overlap_add}
_ALL_CONV_CASES = {**CONV_CASES, **{f"small_{name}": case for name, case in SMALL_IMAGE_CASES.items()}}


@pytest.mark.parametrize("plan", list(_DOT_PLANS))
@pytest.mark.parametrize("name", list(_ALL_CONV_CASES))
def test_conv_as_each_cpu_dot_formulation(name, plan, monkeypatch):
    def forced(lhs, rhs, window, lhs_layout, rhs_layout, out_shape):
        # the overlap-add is defined for an "io" kernel (gradients, transposed convolutions)
        return None if plan == "overlap_add" and rhs_layout != "io" else _DOT_PLANS[plan]

    monkeypatch.setattr(conv_rules, "_cpu_plan", forced)
    dispatch.clear_cache()  # eager's op programs were lowered with the real choice
    try:
        fn, xs, ws, bs = _ALL_CONV_CASES[name]
        check(fn, r(*xs), r(*ws), None if bs is None else r(bs), **CONV_TOL)
    finally:
        dispatch.clear_cache()


def test_conv_no_bias_input_without_grad():
    # convolution_backward with output_mask [False, True, False]
    check(lambda x, w: F.conv2d(x, w, padding=1), r(2, 3, 6, 6, grad=False), r(4, 3, 3, 3), **CONV_TOL)


def test_conv_bf16():
    bf = torch.bfloat16
    check_refereed(
        lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1), r(2, 3, 8, 8, dtype=bf), r(4, 3, 3, 3, dtype=bf), r(4, dtype=bf)
    )


def test_conv_module():
    torch.manual_seed(0)
    m = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Conv2d(8, 4, 3, bias=False)
    )
    mt = copy.deepcopy(m).to(TPU)
    x = torch.randn(2, 3, 10, 10)
    expected = m(x)
    expected.sum().backward()
    actual = mt(x.to(TPU))
    assert_close(actual, expected, **CONV_TOL)
    actual.sum().backward()
    for p, pt in zip(m.parameters(), mt.parameters(), strict=True):
        assert_close(pt.grad, p.grad, **CONV_TOL)


POOL_CASES = {
    "max2d": lambda x: F.max_pool2d(x, 2),
    "max2d_idx": lambda x: F.max_pool2d(x, 3, stride=2, padding=1, return_indices=True),
    "max2d_ceil_dil": lambda x: F.max_pool2d(
        x, (3, 2), stride=(2, 3), padding=(1, 0), dilation=(1, 2), ceil_mode=True, return_indices=True
    ),
    "max1d": lambda x: F.max_pool1d(x[:, :, 0], 3, stride=2, return_indices=True),
    "max3d": lambda x: F.max_pool3d(x[:, :, None, :, :].expand(-1, -1, 3, -1, -1), 2, stride=2, padding=1, return_indices=True),
    "max2d_unbatched": lambda x: F.max_pool2d(x[0], 2, return_indices=True),
    "avg2d": lambda x: F.avg_pool2d(x, 3, stride=2, padding=1),
    "avg2d_nopad_count_ceil": lambda x: F.avg_pool2d(x, 3, stride=2, padding=1, ceil_mode=True, count_include_pad=False),
    "avg2d_ceil": lambda x: F.avg_pool2d(x, (3, 2), stride=(2, 3), padding=(1, 1), ceil_mode=True),
    "avg2d_divisor": lambda x: F.avg_pool2d(x, 2, divisor_override=3),
    "avg1d": lambda x: F.avg_pool1d(x[:, :, 0], 3, stride=2, padding=1),
    "avg3d": lambda x: F.avg_pool3d(
        x[:, :, :4, :5, None].expand(-1, -1, -1, -1, 3), 2, stride=1, padding=1, count_include_pad=False
    ),
    "adaptive_avg2d": lambda x: F.adaptive_avg_pool2d(x, (3, 4)),
    "adaptive_avg2d_global": lambda x: F.adaptive_avg_pool2d(x, 1),
    "adaptive_avg1d": lambda x: F.adaptive_avg_pool1d(x[:, :, 0], 4),
    "adaptive_avg3d": lambda x: F.adaptive_avg_pool3d(x[:, :, :, :, None].expand(-1, -1, -1, -1, 3), (2, 3, 2)),
    "adaptive_max2d": lambda x: F.adaptive_max_pool2d(x, (3, 4), return_indices=True),
    "adaptive_max2d_even": lambda x: F.adaptive_max_pool2d(x, (5, 1), return_indices=True),
    "adaptive_max1d": lambda x: F.adaptive_max_pool1d(x[:, :, 0], 3, return_indices=True),
    "nearest2x": lambda x: F.interpolate(x, scale_factor=2, mode="nearest"),
    "nearest_size": lambda x: F.interpolate(x, size=(7, 13), mode="nearest"),
    "nearest_exact": lambda x: F.interpolate(x, size=(7, 13), mode="nearest-exact"),
    "bilinear": lambda x: F.interpolate(x, size=(7, 13), mode="bilinear"),
    "bilinear_scale": lambda x: F.interpolate(x, scale_factor=1.7, mode="bilinear"),
    "bilinear_align": lambda x: F.interpolate(x, scale_factor=1.7, mode="bilinear", align_corners=True),
    "linear1d": lambda x: F.interpolate(x[:, :, 0], scale_factor=2.5, mode="linear"),
    "trilinear": lambda x: F.interpolate(x[:, :, :3, :4, None].expand(-1, -1, -1, -1, 2), size=(4, 5, 3), mode="trilinear"),
}


@pytest.mark.parametrize("name", list(POOL_CASES))
def test_pool(name):
    check(POOL_CASES[name], r(2, 3, 10, 11), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mode", ["nearest", "nearest-exact"])
@pytest.mark.parametrize("shape", [(0, 2, 4), (0, 2, 4, 4), (0, 2, 2, 3, 2)])
def test_nearest_upsampling_of_an_empty_batch(shape, mode):
    """An empty batch (a detection head with no boxes) upsamples to an empty result on the
    CPU; PyTorch's meta function raised TypeError ("cond must be a bool") for it."""
    check(lambda t: F.interpolate(t, scale_factor=2.0, mode=mode), r(*shape))


def test_nearest_upsampling_errors_like_the_cpu():
    for shape, message in (((2, 0, 4, 4), "Non-empty 4D data tensor"), ((2, 3, 0, 4), "greater than 0")):
        for device in ("cpu", TPU):
            with pytest.raises(RuntimeError, match=message):
                F.interpolate(torch.randn(shape, device=device), scale_factor=2.0)


def test_max_pool_ties_and_inf():
    x = torch.tensor([[[[1.0, 1.0, 3.0, 3.0], [1.0, 1.0, 3.0, float("-inf")], [float("-inf")] * 4, [2.0, 5.0, 5.0, 2.0]]]])
    check(lambda t: F.max_pool2d(t, 2, stride=1, return_indices=True), x.requires_grad_())


def test_pool_bf16():
    x = r(2, 3, 8, 9, dtype=torch.bfloat16)
    check_refereed(lambda t: F.max_pool2d(t, 3, stride=2, padding=1, return_indices=True), x)
    check_refereed(lambda t: F.avg_pool2d(t, 3, stride=2, padding=1), x)
    check_refereed(lambda t: F.adaptive_avg_pool2d(t, (3, 4)), x)
    check_refereed(lambda t: F.interpolate(t, scale_factor=2, mode="bilinear"), x)


@pytest.mark.parametrize(
    "mode, padding",
    [("bilinear", "zeros"), ("nearest", "border"), pytest.param("bicubic", "reflection", marks=pytest.mark.slow)],
)
def test_grid_sample_backward_matches_cpu(mode, padding):
    x = torch.randn(2, 3, 5, 6, requires_grad=True)
    grid = (torch.rand(2, 4, 7, 2) * 2.4 - 1.2).requires_grad_()
    xt, gt = x.detach().to(TPU).requires_grad_(), grid.detach().to(TPU).requires_grad_()
    g = torch.randn(2, 3, 4, 7)
    F.grid_sample(x, grid, mode=mode, padding_mode=padding, align_corners=False).backward(g)
    F.grid_sample(xt, gt, mode=mode, padding_mode=padding, align_corners=False).backward(g.to(TPU))
    assert_close(xt.grad, x.grad, atol=1e-5, rtol=1e-5)
    assert_close(gt.grad, grid.grad, atol=1e-4, rtol=1e-4)


# DeferAndFuse runs the same lowering: its four cases (10 s) run in the long suite only
@pytest.mark.parametrize("mode", ["eager", pytest.param("defer_and_fuse", marks=pytest.mark.slow)])
@pytest.mark.parametrize("padding", ["border", "reflection"])
@pytest.mark.parametrize("align_corners", [False, True])
def test_grid_sample_gives_no_gradient_to_grid_points_on_the_border(align_corners, padding, mode):
    """The CPU and CUDA kernels count a source position exactly on the border as outside
    when they clip it (``clip_coordinates_set_grad``): such a grid point gets no gradient.
    The backward through PyTorch's decomposition took the interpolation's slope there (its
    clamp passes the gradient at the bounds): the grid gradient differed by up to ~100 at
    the edge pixels of an identity ``affine_grid`` (a spatial transformer at its init).
    Positions on the border are exact in every formula here: +-1 with align_corners, and
    +-(1 - 1/8) for 8 pixels without; the rest are random, some outside."""
    torch.manual_seed(0)
    edge = 1.0 if align_corners else 1 - 1 / 8
    grid = torch.rand(2, 5, 6, 2) * 2.6 - 1.3
    grid[:, 0, :, 0], grid[:, 1, :, 0], grid[:, 2, :, 1], grid[:, 3, :, 1] = edge, -edge, edge, -edge
    x = torch.randn(2, 3, 8, 8)
    g = torch.randn(2, 3, 5, 6)
    want = grid.clone().requires_grad_()
    F.grid_sample(x, want, padding_mode=padding, align_corners=align_corners).backward(g)
    got = grid.to(TPU).requires_grad_()
    with torchtpu.eager_mode(mode):
        F.grid_sample(x.to(TPU), got, padding_mode=padding, align_corners=align_corners).backward(g.to(TPU))
    assert want.grad[:, :4].eq(0).any()  # the border points' own coordinate got none on the CPU
    assert_close(got.grad, want.grad, atol=1e-4, rtol=1e-4)


def _grid_sample_3d_cases():
    """DeferAndFuse runs the same lowering (only the program boundaries differ): its six
    cases (32 s of CPU, XLA compiling the 3-D sampler's gradient) run in the long suite
    only, and so do four of the eager ones (17 s: the default suite was at its budget);
    bilinear with reflection (the most involved index arithmetic) and nearest with zeros
    (the out-of-range mask) stay."""
    for eager_mode in ("eager", "defer_and_fuse"):
        for mode in ("bilinear", "nearest"):
            for padding in ("zeros", "border", "reflection"):
                fast = eager_mode == "eager" and (mode, padding) in {("bilinear", "reflection"), ("nearest", "zeros")}
                yield pytest.param(mode, padding, eager_mode, marks=[] if fast else [pytest.mark.slow])


@pytest.mark.parametrize("mode,padding,eager_mode", list(_grid_sample_3d_cases()))
def test_grid_sample_3d_matches_cpu(mode, padding, eager_mode):
    """5-D grid_sample (volumes: VoxelMorph-style registration, video) was not lowered."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, 4, 5, 6)
    grid = torch.rand(2, 3, 4, 2, 3) * 2.4 - 1.2
    grid[0, 0, 0, 0] = torch.tensor([1.0, -1.0, 1.0])
    g = torch.randn(2, 3, 3, 4, 2)
    for align_corners in (False, True):
        want_x, want_g = x.clone().requires_grad_(), grid.clone().requires_grad_()
        want = F.grid_sample(want_x, want_g, mode=mode, padding_mode=padding, align_corners=align_corners)
        want.backward(g)
        got_x, got_g = x.to(TPU).requires_grad_(), grid.to(TPU).requires_grad_()
        with torchtpu.eager_mode(eager_mode):
            got = F.grid_sample(got_x, got_g, mode=mode, padding_mode=padding, align_corners=align_corners)
            got.backward(g.to(TPU))
        assert_close(got, want, atol=1e-5, rtol=1e-5)
        assert_close(got_x.grad, want_x.grad, atol=1e-5, rtol=1e-5)
        assert_close(got_g.grad, want_g.grad, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("size", [(4, 1, 28, 28), (2, 3, 7, 13), (2, 1, 3, 5, 6)])
@pytest.mark.parametrize("align_corners", [False, True])
def test_an_identity_affine_grid_is_the_cpus_to_the_bit(size, align_corners):
    """PyTorch's decomposition builds the base grid as linspace(-a, a), an ulp off the CPU's
    linspace(-1, 1) * (n - 1) / n; grid_sample's gradient jumps at integer positions, so at
    an identity theta that ulp chose the other side at many pixels."""
    identity = torch.eye(len(size) - 1)[:-1].expand(size[0], -1, -1).contiguous()
    grid = F.affine_grid(identity.to(TPU), size, align_corners=align_corners).cpu()
    assert torch.equal(grid, F.affine_grid(identity, size, align_corners=align_corners))
    # any other theta: the matmul's rounding is the implementation's own
    theta = identity + 0.1 * torch.randn(identity.shape, generator=torch.Generator().manual_seed(0))
    want = F.affine_grid(theta, size, align_corners=align_corners)
    assert_close(F.affine_grid(theta.to(TPU), size, align_corners=align_corners), want, atol=1e-6, rtol=1e-6)


def test_a_spatial_transformer_at_its_identity_init_has_the_cpus_gradient():
    """A spatial transformer network (localization net whose last layer starts at the
    identity transform, affine_grid, grid_sample, a classifier): every sampling position is
    an integer, where bilinear interpolation has a kink. The theta gradient was off by up to
    0.9 (1.40 on the CPU, 0.54 on tpu) from the ulp-different affine grid."""
    torch.manual_seed(0)
    loc = torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(4), torch.nn.Flatten(), torch.nn.Linear(128, 6))
    torch.nn.init.zeros_(loc[-1].weight)
    with torch.no_grad():
        loc[-1].bias.copy_(torch.tensor([1.0, 0, 0, 0, 1, 0]))
    head = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(28 * 28, 10))
    x, y = torch.randn(4, 1, 28, 28), torch.randint(0, 10, (4,))
    grads = []
    for device in ("cpu", TPU):
        l, h = copy.deepcopy(loc).to(device), copy.deepcopy(head).to(device)
        xd = x.to(device)
        grid = F.affine_grid(l(xd).view(-1, 2, 3), xd.size(), align_corners=False)
        F.cross_entropy(h(F.grid_sample(xd, grid, padding_mode="border", align_corners=False)), y.to(device)).backward()
        grads.append(l[-1].bias.grad.cpu())
    assert_close(grads[1], grads[0], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("mode", ["reflect", "replicate", "circular"])
def test_pad_backward_matches_cpu(mode):
    # reflection_pad{1,2,3}d_backward has its own rule (float32 sums for 16-bit grads); replicate too
    x = torch.randn(2, 3, 6, 7, requires_grad=True)
    xt = x.detach().to(TPU).requires_grad_()
    g = torch.randn(2, 3, 10, 11)
    F.pad(x, (2, 2, 2, 2), mode=mode).backward(g)
    F.pad(xt, (2, 2, 2, 2), mode=mode).backward(g.to(TPU))
    assert_close(xt.grad, x.grad)


@pytest.mark.parametrize(
    "shape, fmt, conv",
    [((2, 3, 8, 8), torch.channels_last, torch.nn.Conv2d), ((2, 3, 6, 6, 6), torch.channels_last_3d, torch.nn.Conv3d)],
    ids=["2d", "3d"],
)
@pytest.mark.parametrize("which", ["input", "weight"])
def test_convolution_output_keeps_the_channels_last_layout(shape, fmt, conv, which):
    """A channels-last input or weight gives a channels-last output, as on the CPU and CUDA
    (the meta kernel answered contiguous): a channels-last model stays channels-last."""
    torch.manual_seed(0)
    module = conv(3, 4, 3)
    x = torch.randn(*shape)
    if which == "input":
        x = x.contiguous(memory_format=fmt)
    else:
        module = module.to(memory_format=fmt)
    expected = module(x)
    got = copy.deepcopy(module).to(TPU)(x.to(TPU))
    assert expected.is_contiguous(memory_format=fmt)
    assert got.stride() == expected.stride()
    assert_close(got.cpu(), expected, **CONV_TOL)


def _samples(*shape, dtype=torch.float32):
    return torch.rand(*shape, generator=torch.Generator().manual_seed(5)).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize(
    "case",
    [
        ("2d", (2, 3, 9, 11), [3, 2], [4, 6]),
        ("2d", (3, 9, 11), [2, 2], [5, 7]),  # unbatched
        ("2d", (2, 3, 9, 11), [3, 2], [7, 10]),  # every start used
        ("2d", (2, 3, 9, 11), [3, 2], [1, 1]),
        ("3d", (2, 2, 7, 8, 9), [2, 3, 2], [4, 3, 5]),
        ("3d", (2, 7, 8, 9), [2, 2, 2], [3, 4, 5]),
    ],
)
def test_fractional_max_pool_matches_cpu(case, dtype):
    """fractional_max_pool2d/3d had no tpu kernel. Given the random samples (the RNG streams
    differ), the windows start where the CPU's generate_intervals puts them (arithmetic in the
    samples' dtype), the first of equal maxima wins, and the gradient goes to each max."""
    kind, shape, kernel, out = case
    op = torch.ops.aten.fractional_max_pool2d if kind == "2d" else torch.ops.aten.fractional_max_pool3d
    planes = shape[0] * shape[1] if len(shape) == len(kernel) + 2 else shape[0]
    samples = _samples(1, planes, len(kernel), dtype=dtype).reshape(-1, shape[-len(kernel) - 1], len(kernel))
    x = torch.randint(0, 4, shape).to(dtype).requires_grad_()  # ties in most windows
    sixteen_bit = dtype == torch.bfloat16  # overlapping windows add gradients in bf16: refereed below
    check(lambda a, s: op(a, kernel, out, s), x, samples, grad=not sixteen_bit)
    check(lambda a, s: op(a, kernel, out, s), r(*shape, dtype=dtype), samples, grad=not sixteen_bit)
    if sixteen_bit:
        backward = torch.ops.aten.fractional_max_pool2d_backward if kind == "2d" else torch.ops.aten.fractional_max_pool3d_backward
        values, indices = op(x.detach(), kernel, out, samples)
        grad = torch.randn(values.shape).to(dtype)
        expected = backward(grad, x.detach(), kernel, out, indices)
        actual = backward(*to_tpu((grad, x.detach())), kernel, out, indices.to(TPU))
        planes = x.numel() // x[(0,) * (x.dim() - len(kernel))].numel()
        exact = torch.zeros(planes, x.numel() // planes, dtype=torch.float64)  # the gradient added up exactly
        exact = exact.scatter_add(1, indices.reshape(planes, -1), grad.double().reshape(planes, -1)).reshape(x.shape)
        assert_close_or_closer(actual, expected, exact)


def test_fractional_max_pool_nan_and_inf_windows_match_cpu():
    """The CPU keeps the last NaN of a window (``val > max || isnan(val)``) and, for a window
    of -inf, its first position; F.fractional_max_pool2d with an output ratio."""
    x = torch.randn(1, 2, 8, 8)
    x[0, 0, 1, 1] = x[0, 0, 1, 2] = float("nan")
    x[0, 1, :4, :4] = float("-inf")
    x[0, 1, 5, 5] = float("inf")
    check(lambda a, s: torch.ops.aten.fractional_max_pool2d(a, [3, 3], [3, 3], s), x.requires_grad_(), _samples(1, 2, 2))
    samples = _samples(2, 3, 2)
    check(lambda a, s: F.fractional_max_pool2d(a, 3, output_ratio=(0.5, 0.5), _random_samples=s, return_indices=True), r(2, 3, 16, 16), samples)


@pytest.mark.parametrize("kind", ["2d", "3d"])
def test_fractional_max_pool_reads_the_first_rows_of_extra_samples(kind):
    """The CPU kernel takes ``_random_samples`` with more rows than the batch (an unbatched
    input given a batch's samples, as ModuleInfo's nn.FractionalMaxPool3d sample does) and
    reads the first. The decomposition reshaped all of them: "shape '[1, 4, 3]' is invalid"."""
    k = 2 if kind == "2d" else 3
    pool = F.fractional_max_pool2d if kind == "2d" else F.fractional_max_pool3d
    x = r(4, *([7] * k))  # unbatched: 4 planes
    samples = _samples(2, 4, k)  # two batches' worth
    check(lambda a, s: pool(a, 2, output_ratio=(0.5,) * k, _random_samples=s, return_indices=True), x, samples)
