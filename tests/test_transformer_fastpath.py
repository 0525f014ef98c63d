"""``nn.MultiheadAttention`` and ``nn.TransformerEncoder`` in inference (eval mode, no
autograd) take PyTorch's fast path on tpu as on CUDA: the fused ``_native_multi_head_attention``
and ``_transformer_encoder_layer_fwd``, and with end padding a nested tensor per batch whose
padded output positions come back as zeros. All of it raised NotImplementedError before
(torchtpu/lowering/decomp_transformer.py, torchtpu/eager/nested.py). Compared with the CPU,
which takes the same path, including its NaN rows where a query has no key left."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
import torch.nn as nn
from utils import TPU

import torchtpu

MODES = ("eager", "defer_and_fuse")
B, T, D, H = 3, 7, 16, 4
# row 0 unpadded, row 1 two padded positions at the end, row 2 five
END_PADDING = torch.tensor([[False] * 7, [False] * 5 + [True] * 2, [False] * 2 + [True] * 5])
GAPPED_PADDING = torch.tensor([[False] * 7, [True] + [False] * 6, [False, True] * 3 + [False]])


def _mode(mode: str) -> contextlib.AbstractContextManager:
    return torchtpu.eager_mode("defer_and_fuse") if mode == "defer_and_fuse" else contextlib.nullcontext()


def _both(module: nn.Module, run, mode: str = "eager", compile: bool = False):
    """``run(module, device)`` on the CPU and on a tpu copy, without autograd."""
    torch.manual_seed(0)
    on_tpu = copy.deepcopy(module).to(TPU)
    if compile:
        on_tpu = torch.compile(on_tpu, backend="tpu")
    with torch.no_grad():
        want = run(module, "cpu")
        with _mode(mode):
            got = run(on_tpu, TPU)
    return got, want


def _assert_same(got, want) -> None:
    if want is None:
        assert got is None
        return
    torch.testing.assert_close(got.cpu(), want, equal_nan=True)


MHA_CALLS = {
    "plain": {},
    "key_padding": {"key_padding_mask": END_PADDING},
    "causal_bool": {"attn_mask": torch.ones(T, T, dtype=torch.bool).triu(1)},
    "both_masks": {"attn_mask": torch.ones(T, T, dtype=torch.bool).triu(1), "key_padding_mask": END_PADDING},
    "no_weights": {"need_weights": False},
    "per_head_weights": {"average_attn_weights": False},
    "a_fully_masked_row": {"key_padding_mask": torch.tensor([[True] * 7, [False] * 7, [False] * 7])},
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("call", MHA_CALLS)
def test_self_attention_fast_path(call: str, mode: str) -> None:
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(D, H, batch_first=True).eval()
    x = torch.randn(B, T, D)
    kwargs = MHA_CALLS[call]

    def run(m: nn.Module, device: str):
        xd = x.to(device)
        return m(xd, xd, xd, **{k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()})

    (out, weights), (want_out, want_weights) = _both(mha, run, mode)
    _assert_same(out, want_out)
    _assert_same(weights, want_weights)


def _encoder(norm_first: bool, activation: str = "relu") -> nn.Module:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(D, H, 32, dropout=0.0, activation=activation, batch_first=True, norm_first=norm_first)
    return nn.TransformerEncoder(layer, 2, enable_nested_tensor=not norm_first).eval()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("padding", ["none", "end", "gapped", "causal"])
def test_encoder_fast_path(padding: str, norm_first: bool, mode: str) -> None:
    x = torch.randn(B, T, D)

    def run(m: nn.Module, device: str) -> torch.Tensor:
        if padding == "causal":
            return m(x.to(device), mask=nn.Transformer.generate_square_subsequent_mask(T, device=device), is_causal=True)
        mask = {"none": None, "end": END_PADDING, "gapped": GAPPED_PADDING}[padding]
        return m(x.to(device), src_key_padding_mask=None if mask is None else mask.to(device))

    got, want = _both(_encoder(norm_first, "gelu" if norm_first else "relu"), run, mode)
    _assert_same(got, want)
    if padding == "end" and not norm_first:  # the nested path: padded positions are zeros
        assert (got.cpu()[END_PADDING] == 0).all() and (got.cpu()[~END_PADDING] != 0).any()


def test_compiled_encoder_matches_the_cpu() -> None:
    x = torch.randn(B, T, D)
    got, want = _both(_encoder(False), lambda m, d: m(x.to(d)), compile=True)
    _assert_same(got, want)


def test_full_transformer_inference() -> None:
    torch.manual_seed(0)
    model = nn.Transformer(D, H, 2, 2, 32, dropout=0.0, batch_first=True).eval()
    src, tgt = torch.randn(B, T, D), torch.randn(B, 5, D)

    def run(m: nn.Module, device: str) -> torch.Tensor:
        causal = nn.Transformer.generate_square_subsequent_mask(5, device=device)
        return m(src.to(device), tgt.to(device), src_key_padding_mask=END_PADDING.to(device), tgt_mask=causal)

    got, want = _both(model, run)
    _assert_same(got, want)


def test_a_gapped_mask_is_refused_when_checked_like_the_cpu() -> None:
    x = torch.randn(B, T, D)
    keep = ~GAPPED_PADDING
    with pytest.raises(RuntimeError, match="Mask must be left-aligned without gaps"):
        torch._nested_tensor_from_mask(x, keep)
    with pytest.raises(RuntimeError, match="Mask must be left-aligned without gaps"):
        torch._nested_tensor_from_mask(x.to(TPU), keep.to(TPU))
    assert torch._nested_tensor_from_mask_left_aligned(x.to(TPU), (~END_PADDING).to(TPU)) is True
    assert torch._nested_tensor_from_mask_left_aligned(x.to(TPU), keep.to(TPU)) is False
