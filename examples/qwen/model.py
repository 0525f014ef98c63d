"""Qwen3: a Llama with RMSNorm on each head's queries and keys before RoPE (QK-norm), the
lm head tied to the embedding, RoPE base 1,000,000; and Qwen3-MoE, whose MLPs are
mixtures of experts: a router picks the top-k experts of each token, the tokens routed to
each expert are gathered, run through it and added back with ``index_add_`` weighted by
the normalized top-k router probabilities (as the Qwen3-MoE / Mixtral reference code does).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

# The shared blocks (RMSNorm, RoPE, attention with its static KV cache, SwiGLU, the decoder)
# come from examples/llama/model.py rather than a copy. It is imported as the package
# ``llama.model`` from examples/: putting examples/llama itself on sys.path would not do,
# as both files are named model.py.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from llama.model import Attention, Block, Llama, LlamaConfig, RMSNorm, SwiGLU  # noqa: E402


@dataclass
class QwenConfig(LlamaConfig):
    rope_theta: float = 1000000.0
    norm_eps: float = 1e-6
    tie_embeddings: bool = True
    n_experts: int = 0  # 0: dense SwiGLU MLPs (Qwen3); >0: Qwen3-MoE
    top_k: int = 2
    expert_ffn_dim: int = 0


_TINY = dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, max_seq_len=128)
_SMALL = dict(dim=256, n_layers=6, n_heads=8, n_kv_heads=4, head_dim=32, max_seq_len=256)
# tiny/small take the corpus' alphabet as vocabulary. base: Qwen3-0.6B (596,049,920
# parameters) and Qwen3-30B-A3B (30,532,122,624; untied head; build it on the meta device
# to count it, its float32 weights take 122 GB).
SIZES = {
    "tiny": dict(_TINY, ffn_dim=128),
    "small": dict(_SMALL, ffn_dim=768),
    "base": dict(
        vocab_size=151936,
        dim=1024,
        n_layers=28,
        n_heads=16,
        n_kv_heads=8,
        head_dim=128,
        ffn_dim=3072,
        max_seq_len=40960,
    ),
}
MOE_SIZES = {
    "tiny": dict(_TINY, ffn_dim=0, n_experts=4, top_k=2, expert_ffn_dim=64),
    "small": dict(_SMALL, ffn_dim=0, n_experts=8, top_k=2, expert_ffn_dim=256),
    "base": dict(
        vocab_size=151936,
        dim=2048,
        n_layers=48,
        n_heads=32,
        n_kv_heads=4,
        head_dim=128,
        ffn_dim=0,
        n_experts=128,
        top_k=8,
        expert_ffn_dim=768,
        max_seq_len=40960,
        tie_embeddings=False,
    ),
}
BLOCK = {"tiny": 32, "small": 128, "base": 512}  # training sequence length


class QwenAttention(Attention):
    def __init__(self, c: QwenConfig) -> None:
        super().__init__(c)
        self.q_norm = RMSNorm(c.head_dim, c.norm_eps)
        self.k_norm = RMSNorm(c.head_dim, c.norm_eps)

    def qk_norm(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.q_norm(q), self.k_norm(k)


class SparseMoE(nn.Module):
    """Top-k routing over ``n_experts`` SwiGLU experts."""

    def __init__(self, c: QwenConfig) -> None:
        super().__init__()
        self.n_experts, self.top_k = c.n_experts, c.top_k
        self.gate = nn.Linear(c.dim, c.n_experts, bias=False)  # the router
        self.experts = nn.ModuleList(SwiGLU(c.dim, c.expert_ffn_dim) for _ in range(c.n_experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        probs = F.softmax(self.gate(x), dim=-1, dtype=torch.float)
        weights, chosen = torch.topk(probs, self.top_k, dim=-1)
        weights = (weights / weights.sum(dim=-1, keepdim=True)).to(x.dtype)  # the top-k renormalized
        out = torch.zeros_like(x)
        # routed[e, slot, token]: token chose expert e as its slot-th choice
        routed = F.one_hot(chosen, self.n_experts).permute(2, 1, 0)
        for e, expert in enumerate(self.experts):
            slot, token = torch.where(routed[e])
            y = expert(x[token]) * weights[token, slot, None]
            out.index_add_(0, token, y.to(x.dtype))
        return out.view(shape)


class QwenBlock(Block):
    def __init__(self, c: QwenConfig) -> None:
        super().__init__(c, QwenAttention(c), SparseMoE(c) if c.n_experts else None)


class Qwen3(Llama):
    block = QwenBlock
