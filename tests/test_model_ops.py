"""Ops that models hit beyond the core set, on tpu vs CPU, forward and gradients:
attention, norms, convolution, pooling, upsampling, scatter/index family, sorting and
searching, embedding_bag, padding modes, special functions, clamp, norms, device RNG,
and the data-dependent-shape ops (unique & co., which sync with the host)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from utils import TPU, assert_close, check, check_refereed

import torchtpu.metrics as metrics


def r(*shape, dtype=torch.float32, grad=True):
    return torch.randn(*shape, dtype=dtype).requires_grad_(grad)


TOL = dict(atol=1e-4, rtol=1e-4)


# --------------------------------------------------------------------------------------
# scaled_dot_product_attention: one fused program forward, one backward
# --------------------------------------------------------------------------------------
def _bool_mask(L, S):
    m = torch.rand(L, S) > 0.3
    m[:, 0] = True  # no fully masked row (the math backend gives NaN-free zeros there too, but keep it simple)
    return m


SDPA_CASES = {
    "plain": (dict(), (2, 3, 5, 8), (2, 3, 7, 8)),
    "causal": (dict(is_causal=True), (2, 2, 6, 4), (2, 2, 6, 4)),
    "causal_rect": (dict(is_causal=True), (1, 2, 3, 4), (1, 2, 5, 4)),
    "scale": (dict(scale=0.3), (2, 2, 4, 8), (2, 2, 6, 8)),
    "bool_mask": (dict(mask="bool"), (2, 2, 5, 4), (2, 2, 7, 4)),
    "float_mask": (dict(mask="float"), (2, 2, 5, 4), (2, 2, 7, 4)),
    "3d": (dict(), (4, 5, 8), (4, 6, 8)),
    "gqa": (dict(enable_gqa=True), (2, 4, 5, 8), (2, 2, 6, 8)),
    # broadcasting, as the math backend's matmuls do (gradients summed over the broadcast)
    "mqa": (dict(), (2, 4, 5, 8), (2, 1, 6, 8)),  # Falcon: one key/value head
    "mqa_causal_gqa": (dict(is_causal=True, enable_gqa=True), (2, 4, 5, 8), (2, 1, 5, 8)),
    "mqa_key_only": (dict(v_shape=(2, 4, 6, 6)), (2, 4, 5, 8), (2, 1, 6, 8)),
    "gqa_mixed_kv_heads": (dict(enable_gqa=True, v_shape=(2, 1, 6, 6)), (2, 4, 5, 8), (2, 2, 6, 8)),
    "kv_batch_1": (dict(), (3, 2, 5, 8), (1, 2, 6, 8)),
    "q_batch_1": (dict(), (1, 2, 5, 8), (3, 2, 6, 8)),
    "q_one_head": (dict(), (2, 1, 5, 8), (2, 3, 6, 8)),
    "kv_3d_q_4d": (dict(), (2, 3, 5, 8), (3, 6, 8)),
    "q_2d_kv_4d": (dict(), (5, 8), (2, 3, 6, 8)),
    "5d_mqa": (dict(), (2, 2, 3, 5, 8), (2, 2, 1, 6, 8)),
    "2d": (dict(), (5, 8), (6, 8)),
    "mask_LS": (dict(mask="float", mask_shape=(5, 7)), (2, 3, 5, 8), (2, 3, 7, 8)),
    "mask_B1LS_mqa": (dict(mask="float", mask_shape=(2, 1, 5, 7)), (2, 3, 5, 8), (2, 1, 7, 8)),
    "mask_11LS": (dict(mask="float", mask_shape=(1, 1, 5, 7)), (2, 3, 5, 8), (2, 3, 7, 8)),
    "mask_B11S": (dict(mask="float", mask_shape=(2, 1, 1, 7)), (2, 3, 5, 8), (2, 3, 7, 8)),
    "mask_HLS": (dict(mask="float", mask_shape=(3, 5, 7)), (2, 3, 5, 8), (2, 3, 7, 8)),
    "bool_mask_B1LS_gqa": (dict(mask="bool", mask_shape=(2, 1, 5, 7), enable_gqa=True), (2, 4, 5, 8), (2, 2, 7, 8)),
}


def _check_sdpa(name: str, dtype: torch.dtype, tol: dict) -> None:
    kw, qs, ks = SDPA_CASES[name]
    kw = dict(kw)
    mask = kw.pop("mask", None)
    mask_shape = kw.pop("mask_shape", None)
    q, k, v = r(*qs, dtype=dtype), r(*ks, dtype=dtype), r(*kw.pop("v_shape", (*ks[:-1], 6)), dtype=dtype)
    L, S = qs[-2], ks[-2]
    if mask == "bool":
        kw["attn_mask"] = _bool_mask(L, S) if mask_shape is None else torch.rand(mask_shape) > 0.3
        kw["attn_mask"][..., 0] = True
    elif mask == "float":  # broadcast over heads; gets a gradient too
        kw["attn_mask"] = r(*(mask_shape or (qs[0], 1, L, S)), dtype=dtype)
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        if "attn_mask" in kw:
            m = kw.pop("attn_mask")
            check(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m, **kw), q, k, v, m, **tol)
        else:
            check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **kw), q, k, v, **tol)


@pytest.mark.parametrize("name", list(SDPA_CASES))
def test_sdpa(name):
    _check_sdpa(name, torch.float32, TOL)


@pytest.mark.parametrize("name", ["plain", "scale", "float_mask", "gqa", "mask_B1LS_mqa"])
def test_sdpa_float64_computes_in_float64(name):
    """The math backend computes float64 attention in float64; a float32 step anywhere
    (the scale, the scores, the probabilities) leaves errors near 1e-8, far above float64's
    rounding of these sums (about 1e-15)."""
    _check_sdpa(name, torch.float64, dict(atol=1e-12, rtol=1e-12))


def test_sdpa_fully_masked_row_gives_zeros():
    q, k, v = r(1, 2, 4, 8), r(1, 2, 5, 8), r(1, 2, 5, 8)
    m = torch.rand(4, 5) > 0.4
    m[:, 0] = True
    m[2] = False  # this query attends to nothing: the math backend returns zeros, no NaN
    check(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m), q, k, v, m, **TOL)


def test_sdpa_errors():
    q = torch.randn(1, 4, 3, 8, device=TPU)
    k = torch.randn(1, 2, 3, 8, device=TPU)
    with pytest.raises(RuntimeError, match="enable_gqa"):
        F.scaled_dot_product_attention(q, k, k)
    with pytest.raises(RuntimeError, match="dtype"):
        F.scaled_dot_product_attention(q, q.double(), q)
    with pytest.raises(RuntimeError, match="must divide"):  # 4 query heads, 3 key/value heads
        F.scaled_dot_product_attention(
            q, torch.randn(1, 3, 3, 8, device=TPU), torch.randn(1, 3, 3, 8, device=TPU), enable_gqa=True
        )
    with pytest.raises(RuntimeError, match="attn_mask"):  # the CPU's in-place add cannot grow the scores
        F.scaled_dot_product_attention(q, q, q, attn_mask=torch.zeros(1, 1, 4, 3, 3, device=TPU))
    with pytest.raises(RuntimeError, match="broadcast"):
        F.scaled_dot_product_attention(q, torch.randn(3, 4, 3, 8, device=TPU), torch.randn(2, 4, 3, 8, device=TPU))


def test_sdpa_bf16():
    q, k, v = (r(2, 2, 6, 8, dtype=torch.bfloat16) for _ in range(3))
    check_refereed(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), q, k, v)


def test_sdpa_is_one_fused_program():
    """Forward is one program (the fused rule), backward one more; a repeat compiles nothing."""
    q, k, v = (torch.randn(2, 2, 5, 8, device=TPU, requires_grad=True) for _ in range(3))
    F.scaled_dot_product_attention(q, k, v, is_causal=True)  # warm the cache (also the softmax-free bits)
    metrics.reset()
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert metrics.snapshot()["executions"] == 1
    assert metrics.snapshot()["compiles"] == 0
    g = torch.ones_like(out)
    metrics.reset()
    torch.autograd.grad(out, (q, k, v), g)
    # the fused backward is one program; autograd may add a few trivial ones (e.g. zeros)
    assert metrics.snapshot()["executions"] <= 2


def test_sdpa_reaches_fused_rules(monkeypatch):
    from torchtpu.eager import dispatch
    from torchtpu.lowering import registry
    from torchtpu.lowering.rules.attention import SDPA_BACKWARD, SDPA_FORWARD

    seen = []
    for op in (SDPA_FORWARD, SDPA_BACKWARD):
        rule = registry.RULES[op]
        monkeypatch.setitem(registry.RULES, op, lambda L, *a, _r=rule, _op=op, **k: seen.append(_op) or _r(L, *a, **k))
    monkeypatch.setattr(dispatch, "_CACHE", {})
    q = torch.randn(1, 2, 3, 4, device=TPU, requires_grad=True)
    F.scaled_dot_product_attention(q, q, q, scale=0.7).sum().backward()
    assert seen == [SDPA_FORWARD, SDPA_BACKWARD]


# Dropout inside sdpa is random, so it is tested by what holds for every mask. q = 0 makes the
# attention weights uniform (exactly 1/S for S a power of two); k = v = I (E = S) makes the
# output the dropped weights themselves, mask / (S (1 - p)), so the mask is read back from it.
# Each test runs on the CPU too: the assertions hold for PyTorch's own kernel.
DROP_P, DROP_S, DROP_ROWS = 0.5, 256, (1, 4, 256)  # 1024 query rows over 256 keys
DEVICES = ["cpu", "tpu"]


def _dropout_inputs(device: str, grad: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    b, h, L = DROP_ROWS
    eye = torch.eye(DROP_S, device=device).expand(b, h, DROP_S, DROP_S)
    q = torch.zeros(b, h, L, DROP_S, device=device)
    return q.requires_grad_(grad), eye.clone().requires_grad_(grad), eye.clone().requires_grad_(grad)


def _dropped_weights(device: str) -> torch.Tensor:
    return F.scaled_dot_product_attention(*_dropout_inputs(device), dropout_p=DROP_P, scale=1.0).cpu()


@pytest.mark.parametrize("device", DEVICES)
def test_sdpa_dropout_scales_kept_weights(device):
    """Each kept weight is 1/S scaled by 1/(1-p); the dropped fraction is p.

    The mask holds M = 1024 * 256 independent Bernoulli(p) draws, so the dropped fraction has
    standard deviation sqrt(p (1-p) / M) = 1/1024 at p = 0.5; the bound is 6 of those
    (a false failure has probability ~2e-9)."""
    w = _dropped_weights(device)
    kept = w != 0
    torch.testing.assert_close(w[kept], torch.full_like(w[kept], 1 / (DROP_S * (1 - DROP_P))), rtol=0, atol=0)
    sigma = math.sqrt(DROP_P * (1 - DROP_P) / w.numel())
    assert abs((~kept).float().mean().item() - DROP_P) <= 6 * sigma


@pytest.mark.parametrize("device", DEVICES)
def test_sdpa_dropout_keeps_the_mean(device):
    """With v = 1, a row's output is K / (S (1-p)) with K ~ Binomial(S, 1-p) kept weights: mean 1,
    variance p / (S (1-p)). The mean over N = 1024 independent rows has standard deviation
    sqrt(p / (S (1-p) N)) = 1/512 at p = 0.5, S = 256; the bound is 6 of those. A missing
    1/(1-p) scale gives 0.5."""
    q, k, _ = _dropout_inputs(device)
    v = torch.ones(*DROP_ROWS[:2], DROP_S, 8, device=device)
    out = F.scaled_dot_product_attention(q, k, v, dropout_p=DROP_P, scale=1.0).cpu()
    rows = out[..., 0]
    assert torch.equal(out, rows.unsqueeze(-1).expand_as(out))  # one mask per row, shared by the columns
    sigma = math.sqrt(DROP_P / (DROP_S * (1 - DROP_P) * rows.numel()))
    assert abs(rows.mean().item() - 1) <= 6 * sigma


@pytest.mark.parametrize("device", DEVICES)
def test_sdpa_dropout_masks_follow_the_seed(device):
    """Two calls draw different masks; reseeding with torch.manual_seed repeats a mask."""
    torch.manual_seed(7)
    first, second = _dropped_weights(device), _dropped_weights(device)
    torch.manual_seed(7)
    again = _dropped_weights(device)
    assert not torch.equal(first, second)
    assert torch.equal(first, again)


def test_sdpa_dropout_zero_is_no_dropout():
    q, k, v = (torch.randn(2, 2, 5, 8) for _ in range(3))
    ref = F.scaled_dot_product_attention(q, k, v)
    out = F.scaled_dot_product_attention(q.to(TPU), k.to(TPU), v.to(TPU), dropout_p=0.0)
    assert torch.equal(out.cpu(), F.scaled_dot_product_attention(q.to(TPU), k.to(TPU), v.to(TPU)).cpu())
    assert_close(out, ref)


@pytest.mark.parametrize("device", DEVICES)
def test_sdpa_dropout_backward_uses_the_forward_mask(device):
    """Backward goes through the mask the forward drew, scaled by 1/(1-p).

    With q = 0, k = v = I and scale 1: out = D (the dropped weights), so grad_v = D^T g; the
    weights' gradient is mask * g / (1-p), and through the uniform softmax (1/S) and k = I,
    grad_q = (G - mean over keys of G) / S with G = mask * g / (1-p); grad_k = 0 since q = 0.
    g holds small integers, so every value is exact in float32."""
    q, k, v = _dropout_inputs(device, grad=True)
    out = F.scaled_dot_product_attention(q, k, v, dropout_p=DROP_P, scale=1.0)
    g = torch.randint(-3, 4, out.shape).float()
    gq, gk, gv = torch.autograd.grad(out, (q, k, v), g.to(device))
    d, g64 = out.detach().cpu().double(), g.double()
    G = (d != 0) * g64 / (1 - DROP_P)
    torch.testing.assert_close(gq.cpu(), ((G - G.mean(-1, keepdim=True)) / DROP_S).float())
    torch.testing.assert_close(gv.cpu(), (d.mT @ g64).float())
    assert not gk.cpu().any()


def test_sdpa_inference_mode():
    q, k, v = (torch.randn(2, 2, 4, 8) for _ in range(3))
    with torch.inference_mode():
        out = F.scaled_dot_product_attention(q.to(TPU), k.to(TPU), v.to(TPU), is_causal=True)
    assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True), **TOL)


# --------------------------------------------------------------------------------------
# norms, convolution, pooling, upsampling
# --------------------------------------------------------------------------------------
def test_layer_group_batch_norm():
    x = r(4, 6, 5, 5)
    check(lambda x, w, b: F.layer_norm(x, (5, 5), w, b), x, r(5, 5), r(5, 5), **TOL)
    check(lambda x, w, b: F.group_norm(x, 3, w, b), x, r(6), r(6), **TOL)
    check(lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True), x, r(6), r(6), **TOL)
    stats = (torch.randn(6), torch.rand(6) + 0.5)
    check(lambda x, w, b, rm, rv: F.batch_norm(x, rm, rv, w, b, training=False), x, r(6), r(6), *stats, **TOL)


@pytest.mark.parametrize(
    "fn,xs,ws",
    [
        (lambda x, w: F.conv1d(x, w, stride=2, padding=1, dilation=2, groups=2), (2, 4, 12), (6, 2, 3)),
        (lambda x, w: F.conv2d(x, w, padding=1, groups=2), (2, 4, 7, 6), (6, 2, 3, 3)),
        (lambda x, w: F.conv3d(x, w, stride=2), (1, 2, 5, 5, 5), (3, 2, 2, 2, 2)),
        (lambda x, w: F.conv_transpose2d(x, w, stride=2, padding=1, output_padding=1), (2, 3, 4, 5), (3, 2, 3, 3)),
    ],
)
def test_convolution(fn, xs, ws):
    check(fn, r(*xs), r(*ws), **TOL)


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: F.max_pool2d(x, 3, stride=2, padding=1),
        lambda x: F.avg_pool2d(x, 2, ceil_mode=True, count_include_pad=False),
        lambda x: F.adaptive_avg_pool2d(x, (3, 2)),
        lambda x: F.adaptive_max_pool2d(x, 3),
        lambda x: F.max_pool1d(x.flatten(2), 4),
        lambda x: F.avg_pool3d(x.unsqueeze(2).expand(-1, -1, 2, -1, -1), (1, 2, 2)),
    ],
)
def test_pooling(fn):
    check(fn, r(2, 3, 7, 7), **TOL)


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: F.interpolate(x, scale_factor=2, mode="nearest"),
        lambda x: F.interpolate(x, size=(5, 9), mode="nearest"),
        lambda x: F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False),
        lambda x: F.interpolate(x, size=(7, 3), mode="bilinear", align_corners=True),
        lambda x: F.interpolate(x.flatten(2), scale_factor=3, mode="nearest"),
    ],
)
def test_upsample(fn):
    check(fn, r(2, 3, 4, 5), **TOL)


# --------------------------------------------------------------------------------------
# index_put / scatter / index_add
# --------------------------------------------------------------------------------------
def test_scatter_family():
    x, src = r(4, 5), r(4, 5)
    idx = torch.randint(0, 4, (4, 5))
    check(lambda x, i, s: x.scatter_add(0, i, s), x, idx, src)
    for red in ("sum", "prod", "mean", "amax", "amin"):
        check(
            lambda x, i, s, red=red: x.scatter_reduce(0, i, s, red, include_self=False), x, idx, src, grad=red in ("sum", "mean")
        )
    i1 = torch.tensor([0, 2, 2, 3])
    check(lambda x, i, s: x.index_add(0, i, s, alpha=2.0), x, i1, r(4, 5))
    i2 = torch.tensor([1, 1, 4, 0])
    check(lambda x, i, j, v: x.index_put((i, j), v, accumulate=True), x, i1, i2, r(4))


# --------------------------------------------------------------------------------------
# sort / topk / argsort / cumulative ops
# --------------------------------------------------------------------------------------
def _with_ties_and_nans(*shape, dtype=torch.float32):
    x = torch.randint(-3, 4, shape).to(dtype)
    flat = x.view(-1)
    flat[::5] = float("nan") if dtype.is_floating_point else flat[::5]
    return x


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.int32])
@pytest.mark.parametrize("descending", [False, True])
def test_sort_stable(dtype, descending):
    x = _with_ties_and_nans(4, 11, dtype=dtype)
    check(lambda x: torch.sort(x, dim=1, descending=descending, stable=True), x, grad=False)
    check(lambda x: torch.sort(x, dim=0, descending=descending, stable=True), x, grad=False)
    check(lambda x: torch.argsort(x, dim=-1, descending=descending, stable=True), x, grad=False)


def test_sort_special_floats_and_bool():
    x = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1.0, -float("nan"), 2.0])
    check(lambda x: torch.sort(x, stable=True), x, grad=False)
    check(lambda x: torch.sort(x, descending=True, stable=True), x, grad=False)
    b = torch.tensor([True, False, True, False, False])
    check(lambda x: torch.sort(x, stable=True), b, grad=False)


def test_sort_grad_and_values():
    x = r(3, 7)  # distinct values: gradient flows through the permutation
    check(lambda x: torch.sort(x, dim=-1, descending=True)[0], x)
    check(lambda x: torch.sort(x, dim=0).values, x)
    check(lambda x: x.msort(), x)
    check(lambda x: torch.sort(x.sum()).values, x)  # 0-d


@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("dim", [-1, 0])
def test_topk(largest, dim):
    x = r(6, 9)
    check(lambda x: torch.topk(x, 3, dim=dim, largest=largest), x)
    xi = torch.randint(0, 50, (6, 9))  # ties: which index PyTorch returns is unspecified, compare values
    check(lambda x: torch.topk(x, 4, dim=dim, largest=largest, sorted=True).values, xi, grad=False)
    check(lambda x: torch.topk(x, 1, largest=largest).values, torch.tensor([1.0, float("nan"), 3.0]), grad=False)


def test_kthvalue_median_via_sort():
    x = r(5, 8)
    check(lambda x: torch.kthvalue(x, 3, dim=1), x)
    check(lambda x: torch.kthvalue(x, 2, dim=0, keepdim=True), x)
    check(lambda x: torch.median(x, dim=1), x)
    check(lambda x: torch.median(x), x)
    xn = torch.tensor([[1.0, float("nan"), 3.0, 0.5, float("nan")], [4.0, 2.0, 3.0, 1.0, 0.0], [float("nan")] * 5])
    check(lambda x: torch.median(x, dim=1), xn, grad=False)
    check(lambda x: torch.nanmedian(x, dim=1), xn, grad=False)
    check(lambda x: torch.nanmedian(x), xn, grad=False)
    check(lambda x: torch.median(x, dim=0), torch.randint(0, 9, (7, 3)).unique(dim=0).float(), grad=False)


@pytest.mark.parametrize("op", ["cumsum", "cumprod", "logcumsumexp"])
def test_cumulative(op):
    x = r(4, 6) * 0.5
    check(lambda x: getattr(torch, op)(x, dim=1), x, **TOL)
    check(lambda x: getattr(torch, op)(x, dim=0), x, **TOL)
    if op != "logcumsumexp":
        check(lambda x: getattr(torch, op)(x, 0), torch.randint(-3, 4, (9,)), grad=False)


# --------------------------------------------------------------------------------------
# searchsorted / bucketize
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("right", [False, True])
def test_searchsorted(right):
    seq = torch.sort(torch.randint(0, 10, (3, 8)).float(), dim=-1).values
    vals = torch.randint(-1, 11, (3, 5)).float()
    check(lambda s, v: torch.searchsorted(s, v, right=right), seq, vals, grad=False)
    check(lambda s, v: torch.searchsorted(s, v, side="right" if right else "left", out_int32=True), seq, vals, grad=False)
    check(lambda s: torch.searchsorted(s, 4.0, right=right), seq[0], grad=False)
    check(lambda s, v: torch.searchsorted(s, v, right=right), seq[0], vals, grad=False)  # 1-d boundaries
    unsorted = torch.randint(0, 10, (3, 8)).float()
    sorter = torch.argsort(unsorted, dim=-1, stable=True)
    check(lambda s, v, o: torch.searchsorted(s, v, right=right, sorter=o), unsorted, vals, sorter, grad=False)


@pytest.mark.parametrize("right", [False, True])
def test_searchsorted_steps_as_the_cpu_past_nan_boundaries(right):
    """NaN boundaries sort last, and the CPU's binary search mostly never reaches them:
    0.5 in [1, 2, 3, nan] is at 0, where counting the boundaries below it said 1 (a NaN
    compares false, so it counted); in [1, nan, nan, nan] the search walks into the NaNs
    and says 4, which only stepping the same search gives."""
    seqs = torch.tensor([[1.0, 2.0, 3.0, float("nan")], [1.0, float("nan"), float("nan"), float("nan")], [-2.0, 0.0, 0.0, 5.0]])
    vals = torch.tensor([[0.5, 2.0, 10.0, float("nan")], [0.5, 1.0, 5.0, -1.0], [0.0, float("nan"), 5.0, -3.0]])
    check(lambda s, v: torch.searchsorted(s, v, right=right), seqs, vals, grad=False)
    for row in range(3):
        check(lambda s, v: torch.searchsorted(s, v, right=right), seqs[row], vals, grad=False)
        check(lambda v, s: torch.bucketize(v, s, right=right), vals, seqs[row], grad=False)
    order = torch.tensor([[3, 0, 2, 1], [2, 3, 0, 1], [1, 3, 0, 2]])
    shuffled, sorter = seqs.gather(1, order), order.argsort(dim=1)
    check(lambda s, v, o: torch.searchsorted(s, v, right=right, sorter=o), shuffled, vals, sorter, grad=False)


def test_bucketize():
    bounds = torch.tensor([-1.0, 0.0, 0.5, 2.0])
    x = torch.randn(4, 5)
    check(lambda x, b: torch.bucketize(x, b), x, bounds, grad=False)
    check(lambda x, b: torch.bucketize(x, b, right=True, out_int32=True), x, bounds, grad=False)
    check(lambda b: torch.bucketize(0.5, b), bounds, grad=False)


# --------------------------------------------------------------------------------------
# embedding_bag, one_hot, tril/triu
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag_offsets(mode):
    w = r(10, 4)
    idx = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9, 0])
    offsets = torch.tensor([0, 3, 3, 7])  # an empty bag
    check(lambda w, i, o: F.embedding_bag(i, w, o, mode=mode), w, idx, offsets, **TOL)
    last = torch.tensor([0, 3, 3, 7, 9])  # include_last_offset: the last offset is len(indices)
    check(lambda w, i, o: F.embedding_bag(i, w, o, mode=mode, include_last_offset=True), w, idx, last, **TOL)
    # A last offset short of len(indices): CUDA's kernel and the CPU's float64 kernel run the
    # last bag to the end of the indices, ignoring that offset's value; the CPU's float32
    # fast path (fbgemm) stops at it instead. We give CUDA's numbers, judged by float64.
    wt = w.detach().to(TPU).requires_grad_()
    got = F.embedding_bag(idx.to(TPU), wt, offsets.to(TPU), mode=mode, include_last_offset=True)
    w64 = w.detach().double().requires_grad_()
    want = F.embedding_bag(idx, w64, offsets, mode=mode, include_last_offset=True)
    assert_close(got.cpu(), want.float(), **TOL)
    cot = torch.randn(want.shape, dtype=torch.float64)
    got.backward(cot.float().to(TPU))
    want.backward(cot)
    assert_close(wt.grad.cpu(), w64.grad.float(), **TOL)
    check(lambda w, i, o: F.embedding_bag(i, w, o, mode=mode, padding_idx=4), w, idx, offsets, **TOL)


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag_2d_and_padding_idx(mode):
    w = r(10, 3)
    idx = torch.tensor([[1, 2, 0], [4, 0, 0], [9, 9, 3], [0, 0, 0]])
    check(lambda w, i: F.embedding_bag(i, w, mode=mode), w, idx, **TOL)
    check(lambda w, i: F.embedding_bag(i, w, mode=mode, padding_idx=0), w, idx, **TOL)  # an all-padding bag
    if mode == "sum":
        # PyTorch's CPU embedding_bag scales by the wrong counts here; the documented
        # meaning (1 / frequency in the batch) is what F.embedding computes
        wt = w.detach().to(TPU).requires_grad_()
        F.embedding_bag(idx.to(TPU), wt, mode="sum", scale_grad_by_freq=True).sum().backward()
        wc = w.detach().clone().requires_grad_()
        F.embedding(idx, wc, scale_grad_by_freq=True).sum().backward()
        assert_close(wt.grad, wc.grad, **TOL)


def test_embedding_bag_per_sample_weights():
    w, psw = r(10, 3), r(9)
    idx = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9, 0])
    offsets = torch.tensor([0, 2, 5])
    check(lambda w, p, i, o: F.embedding_bag(i, w, o, mode="sum", per_sample_weights=p), w, psw, idx, offsets, **TOL)
    check(
        lambda w, p, i, o: F.embedding_bag(i, w, o, mode="sum", per_sample_weights=p, padding_idx=2), w, psw, idx, offsets, **TOL
    )


def test_embedding_bag_module():
    torch.manual_seed(0)
    m = torch.nn.EmbeddingBag(12, 5, mode="mean")
    mt = torch.nn.EmbeddingBag(12, 5, mode="mean").to(TPU)
    mt.load_state_dict(m.state_dict())
    idx, off = torch.tensor([3, 1, 7, 7, 11]), torch.tensor([0, 2])
    out = m(idx, off)
    out_t = mt(idx.to(TPU), off.to(TPU))
    assert_close(out_t, out, **TOL)
    out.sum().backward()
    out_t.sum().backward()
    assert_close(mt.weight.grad, m.weight.grad, **TOL)


def test_one_hot_tril_triu():
    x = torch.tensor([[0, 3], [2, 1]])
    check(lambda x: F.one_hot(x, 5), x, grad=False)
    check(lambda x: F.one_hot(x, -1), torch.tensor([0, 4, 1]), grad=False)  # num_classes from the data
    y = r(3, 5, 4)
    for k in (-1, 0, 2):
        check(lambda y, k=k: torch.tril(y, k), y)
        check(lambda y, k=k: torch.triu(y, k), y)


# --------------------------------------------------------------------------------------
# padding modes
# --------------------------------------------------------------------------------------
PADS = {
    1: [(1, 2), (0, 3)],
    2: [(1, 2, 0, 1), (2, 2, 2, 2)],
    3: [(1, 0, 1, 1, 0, 2)],
}


@pytest.mark.parametrize("mode", ["constant", "reflect", "replicate", "circular"])
@pytest.mark.parametrize("nd", [1, 2, 3])
def test_pad_modes(mode, nd):
    shape = {1: (2, 3, 5), 2: (2, 3, 4, 5), 3: (1, 2, 3, 4, 5)}[nd]
    for pad in PADS[nd]:
        kw = dict(value=1.5) if mode == "constant" else {}
        check(lambda x, pad=pad, kw=kw: F.pad(x, pad, mode=mode, **kw), r(*shape), **TOL)
    if mode != "constant":  # no-batch input
        check(lambda x: F.pad(x, PADS[nd][0], mode=mode), r(*shape[1:]), **TOL)


def test_pad_constant_negative_and_int():
    check(lambda x: F.pad(x, (-1, 2, 1, -2)), r(3, 4, 5))
    check(lambda x: F.pad(x, (1, 1), value=7), torch.arange(6).view(2, 3), grad=False)


# --------------------------------------------------------------------------------------
# roll/flip, special functions, clamp, logsumexp, norms
# --------------------------------------------------------------------------------------
def test_roll_flip():
    x = r(3, 4, 5)
    check(lambda x: torch.roll(x, 2, 1), x)
    check(lambda x: torch.roll(x, (-1, 7), (0, 2)), x)
    check(lambda x: torch.roll(x, 3), x)
    check(lambda x: torch.flip(x, (0, 2)), x)


@pytest.mark.parametrize(
    "fn,make",
    [
        (torch.erf, lambda: r(20)),
        (torch.erfc, lambda: r(20)),
        (torch.erfinv, lambda: (torch.rand(20) * 1.8 - 0.9).requires_grad_()),
        (torch.lgamma, lambda: (torch.rand(20) * 6 + 0.1).requires_grad_()),
        (torch.digamma, lambda: (torch.rand(20) * 6 + 0.1).requires_grad_()),
    ],
)
def test_special(fn, make):
    check(fn, make(), atol=1e-4, rtol=1e-4)


def test_special_negative_lgamma_digamma():
    x = torch.tensor([-2.5, -1.3, -0.5, 0.3, 1.0, 2.0, 10.0])
    check(torch.lgamma, x, grad=False, atol=1e-4, rtol=1e-4)
    check(torch.digamma, x, grad=False, atol=1e-4, rtol=1e-4)


def test_clamp_variants():
    x = r(4, 5)
    lo, hi = r(4, 5) - 1, r(5) + 1
    check(lambda x: x.clamp(-0.5, 0.5), x)
    check(lambda x: x.clamp(min=0.1), x)
    check(lambda x: x.clamp(max=-0.1), x)
    check(lambda x, lo, hi: torch.clamp(x, lo, hi), x, lo, hi)
    check(lambda x, lo: torch.clamp_min(x, lo), x, lo)
    check(lambda x, hi: torch.clamp_max(x, hi), x, hi)
    check(lambda x: x.clip(-1, 1), x)
    check(lambda x: x.clamp(-2, 2), torch.randint(-5, 5, (6,)), grad=False)


def test_logsumexp_and_norms():
    x = r(3, 4, 5)
    check(lambda x: torch.logsumexp(x, dim=1), x, **TOL)
    check(lambda x: torch.logsumexp(x, dim=(0, 2), keepdim=True), x, **TOL)
    check(lambda x: torch.logsumexp(x * float("-inf"), dim=1), x.detach(), grad=False)
    for p in (1, 2, 3.5, math.inf, -math.inf, 0):
        check(lambda x, p=p: torch.linalg.vector_norm(x, p, dim=-1), x, grad=p != 0, **TOL)
    check(lambda x: x.norm(), x, **TOL)
    check(lambda x: torch.norm(x, p="fro", dim=(1, 2)), x, **TOL)
    check(lambda x: torch.linalg.norm(x, dim=0), x, **TOL)
    check(lambda x: F.normalize(x, dim=1), x, **TOL)


# --------------------------------------------------------------------------------------
# device RNG: shapes, ranges, moments, reproducibility (not bit-equal to CPU)
# --------------------------------------------------------------------------------------
def test_rng_family():
    torch.manual_seed(0)
    n = 20000
    p = torch.full((n,), 0.3, device=TPU)
    b = torch.bernoulli(p).cpu()
    assert set(b.unique().tolist()) <= {0.0, 1.0} and abs(b.mean().item() - 0.3) < 0.02
    u = torch.empty(n, device=TPU).uniform_(2, 5).cpu()
    assert u.min() >= 2 and u.max() < 5 and abs(u.mean().item() - 3.5) < 0.05
    g = torch.empty(n, device=TPU).normal_(1.0, 2.0).cpu()
    assert abs(g.mean().item() - 1.0) < 0.08 and abs(g.std().item() - 2.0) < 0.08
    e = torch.empty(n, device=TPU).exponential_(2.0).cpu()
    assert e.min() >= 0 and abs(e.mean().item() - 0.5) < 0.03
    probs = torch.tensor([[0.1, 0.0, 0.6, 0.3], [0.25, 0.25, 0.25, 0.25]], device=TPU)
    m = torch.multinomial(probs, 2000, replacement=True).cpu()
    assert (m[0] != 1).all() and abs((m[0] == 2).float().mean().item() - 0.6) < 0.05
    m2 = torch.multinomial(probs, 3, replacement=False).cpu()
    assert all(len(set(row.tolist())) == 3 for row in m2) and (m2[0] != 1).all()
    torch.manual_seed(5)
    a = torch.randn(8, device=TPU).cpu()
    torch.manual_seed(5)
    assert torch.equal(a, torch.randn(8, device=TPU).cpu())


# --------------------------------------------------------------------------------------
# data-dependent shapes: unique & co. (host sync), nonzero, masked_select, bool indexing
# --------------------------------------------------------------------------------------
UNIQUE_INPUTS = {
    "float": lambda: torch.tensor([3.0, 1.0, 2.0, 3.0, 1.0, -0.0, 0.0, 7.5]),
    "int2d": lambda: torch.randint(0, 5, (4, 6)),
    "bool": lambda: torch.tensor([True, False, True]),
    "empty": lambda: torch.zeros(0),
}


@pytest.mark.parametrize("name", list(UNIQUE_INPUTS))
@pytest.mark.parametrize("inverse", [False, True])
@pytest.mark.parametrize("counts", [False, True])
def test_unique(name, inverse, counts):
    x = UNIQUE_INPUTS[name]()
    check(lambda x: torch.unique(x, sorted=True, return_inverse=inverse, return_counts=counts), x, grad=False)
    check(lambda x: torch.unique_consecutive(x, return_inverse=inverse, return_counts=counts), x, grad=False)


def test_unique_dim():
    x = torch.tensor([[1, 2, 1, 2], [3, 4, 3, 0], [1, 2, 1, 2]])
    for dim in (0, 1, -1):
        check(lambda x, dim=dim: torch.unique(x, dim=dim, return_inverse=True, return_counts=True), x, grad=False)
        check(lambda x, dim=dim: torch.unique_consecutive(x, dim=dim, return_inverse=True, return_counts=True), x, grad=False)
    check(lambda x: torch.unique(x, dim=0, sorted=True), x.float(), grad=False)


def test_unique_unsorted_is_a_permutation_of_sorted():
    x = torch.randint(0, 6, (30,))
    out = torch.unique(x.to(TPU), sorted=False).cpu()
    assert torch.equal(torch.sort(out).values, torch.unique(x))


def test_data_dependent_ops():
    x = r(4, 5, grad=False)
    check(torch.nonzero, x > 0, grad=False)
    check(lambda x: torch.masked_select(x, x > 0), x, grad=False)
    check(lambda x: x[x > 0.5], x, grad=False)
    check(lambda x: torch.nonzero(x > 0, as_tuple=True), x, grad=False)
    xg = r(4, 5)
    check(lambda x: x[x.detach() > 0].sum() * 2, xg)
