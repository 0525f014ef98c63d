"""``flex_attention`` on tpu (torchtpu/integrations/flex_attention.py): its device check
refused tpu tensors, and compiled it left its graph running op by op. Forward and backward, eager and compiled, against
``scaled_dot_product_attention`` on the CPU with the same bias or mask written out as a
dense matrix (the CPU's flex_attention has no backward)."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

TPU = "tpu"
TOL = dict(rtol=1e-4, atol=1e-5)


def _relative_bias(score, b, h, q_idx, kv_idx):
    return score + (q_idx - kv_idx) * 0.1


def _qkv(heads_kv: int = 2) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(2, 4, 16, 8, generator=g), torch.randn(2, heads_kv, 16, 8, generator=g), torch.randn(2, heads_kv, 16, 8, generator=g)


def _grads(out: torch.Tensor, *inputs: torch.Tensor) -> list[torch.Tensor]:
    weights = torch.linspace(-1, 1, out.numel()).reshape(out.shape).to(out.device)
    return [g.cpu() for g in torch.autograd.grad((out * weights).sum(), inputs)]


def _compare(flex_fn, reference_fn, heads_kv: int = 4) -> None:
    q, k, v = _qkv(heads_kv)
    leaves_cpu = [t.clone().requires_grad_() for t in (q, k, v)]
    want = reference_fn(*leaves_cpu)
    leaves = [t.to(TPU).requires_grad_() for t in (q, k, v)]
    got = flex_fn(*leaves)
    torch.testing.assert_close(got.detach().cpu(), want.detach(), **TOL)
    for g, w in zip(_grads(got, *leaves), _grads(want, *leaves_cpu)):
        torch.testing.assert_close(g, w, **TOL)


def _bias_matrix(device: str = "cpu") -> torch.Tensor:
    i = torch.arange(16, device=device)
    return (i[:, None] - i[None, :]) * 0.1


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compile"])
def test_score_mod_forward_and_backward(compiled: bool) -> None:
    """Compiled, flex_attention becomes part of the graph's XLA programs (its dense form,
    torchtpu/compile/flex_attention.py): no graph falls back to running op by op."""
    fn = torch.compile(flex_attention, backend="tpu") if compiled else flex_attention
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _compare(
            lambda q, k, v: fn(q, k, v, score_mod=_relative_bias),
            lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=_bias_matrix()),
        )
    assert not [w for w in caught if "op by op" in str(w.message)]


def test_block_mask_of_packed_documents_with_grouped_query_attention() -> None:
    """Causal attention within each of two packed documents (tokens 0-6 and 7-15), two
    key/value heads for four query heads."""
    document = (torch.arange(16) >= 7).long()
    doc_tpu = document.to(TPU)

    def causal_in_document(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (doc_tpu[q_idx] == doc_tpu[kv_idx])

    block_mask = create_block_mask(causal_in_document, None, None, 16, 16, device=TPU, BLOCK_SIZE=8)
    allowed = (torch.arange(16)[:, None] >= torch.arange(16)[None, :]) & (document[:, None] == document[None, :])
    _compare(
        lambda q, k, v: flex_attention(q, k, v, block_mask=block_mask, enable_gqa=True),
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, enable_gqa=True),
        heads_kv=2,
    )


def test_other_devices_are_checked_as_before() -> None:
    """The CPU still refuses flex_attention's backward, with PyTorch's own error."""
    q = torch.randn(1, 1, 4, 8, requires_grad=True)
    with pytest.raises(NotImplementedError, match="does not support backward on CPU"):
        flex_attention(q, q, q)
