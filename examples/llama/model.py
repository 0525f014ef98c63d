"""A Llama (Llama 3 style) decoder: RMSNorm, rotary position embeddings, grouped-query
attention through ``F.scaled_dot_product_attention``, SwiGLU MLP, an untied lm head, and a
static KV cache for generation (see :class:`KVCache`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class LlamaConfig:
    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn_dim: int
    head_dim: int | None = None  # dim // n_heads unless given (Qwen3 sets it apart)
    max_seq_len: int = 256  # rows of the RoPE tables: the longest training block or KV cache
    rope_theta: float = 500000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = False

    def __post_init__(self) -> None:
        if self.head_dim is None:
            self.head_dim = self.dim // self.n_heads


# tiny: seconds on the cpu platform; small: a minute; base: Llama-3.2-1B (its 128,256-token
# vocabulary and tied embeddings, so the parameter count is the published 1,235,814,400;
# tiny and small take the corpus' alphabet as vocabulary and keep the head untied).
SIZES = {
    "tiny": dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128, max_seq_len=128),
    "small": dict(dim=256, n_layers=6, n_heads=8, n_kv_heads=4, ffn_dim=768, max_seq_len=256),
    "base": dict(
        vocab_size=128256,
        dim=2048,
        n_layers=16,
        n_heads=32,
        n_kv_heads=8,
        ffn_dim=8192,
        max_seq_len=8192,
        tie_embeddings=True,
    ),
}
BLOCK = {"tiny": 32, "small": 128, "base": 512}  # training sequence length


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # normalize in float32 (as the reference does) so bfloat16 activations keep their scale
        y = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * y.type_as(x)


class Rotary(nn.Module):
    """cos/sin tables for every position up to ``max_seq_len``; ``forward(positions)``
    picks rows by a position *tensor*, so a decode step at position ``pos`` is the same
    program for every ``pos``."""

    def __init__(self, head_dim: int, max_seq_len: int, theta: float) -> None:
        super().__init__()
        inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float32), inv_freq)
        angles = torch.cat([angles, angles], dim=-1)  # (max_seq_len, head_dim), halves repeated
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cos.index_select(0, positions), self.sin.index_select(0, positions)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (batch, heads, seq, head_dim) by the (seq, head_dim) tables."""
    return (x * cos + rotate_half(x) * sin).type_as(x)


class KVCache(nn.Module):
    """A static cache for one layer: (batch, kv_heads, max_len, head_dim) keys and values,
    allocated once. Writes go to positions given as a tensor, so its shape never changes."""

    def __init__(self, batch: int, kv_heads: int, max_len: int, head_dim: int, dtype: torch.dtype, device: str) -> None:
        super().__init__()
        shape = (batch, kv_heads, max_len, head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)

    def update(self, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.k.index_copy_(2, positions, k)
        self.v.index_copy_(2, positions, v)
        return self.k, self.v


class Attention(nn.Module):
    def __init__(self, c: LlamaConfig) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = c.n_heads, c.n_kv_heads, c.head_dim
        self.wq = nn.Linear(c.dim, c.n_heads * c.head_dim, bias=False)
        self.wk = nn.Linear(c.dim, c.n_kv_heads * c.head_dim, bias=False)
        self.wv = nn.Linear(c.dim, c.n_kv_heads * c.head_dim, bias=False)
        self.wo = nn.Linear(c.n_heads * c.head_dim, c.dim, bias=False)

    def qk_norm(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Nothing in Llama; Qwen3 normalizes each head here, before RoPE."""
        return q, k

    def forward(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], cache: KVCache | None, positions: torch.Tensor
    ) -> torch.Tensor:
        """Training and prefill: causal attention over ``x``'s own tokens (prefill also
        writes them to the cache). Decode (one token at ``positions`` = [pos]): attention
        over the whole cache, masked to the positions written so far."""
        b, t, _ = x.shape
        q = self.wq(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = self.qk_norm(q, k)
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        if cache is None or t > 1:
            if cache is not None:
                cache.update(positions, k, v)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            keys, values = cache.update(positions, k, v)
            mask = (torch.arange(keys.size(2), device=x.device) <= positions).view(1, 1, 1, -1)
            y = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True)
        return self.wo(y.transpose(1, 2).reshape(b, t, -1))


class SwiGLU(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)  # gate
        self.w3 = nn.Linear(dim, hidden, bias=False)  # up
        self.w2 = nn.Linear(hidden, dim, bias=False)  # down

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, c: LlamaConfig, attn: Attention | None = None, mlp: nn.Module | None = None) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(c.dim, c.norm_eps)
        self.attn = attn or Attention(c)
        self.mlp_norm = RMSNorm(c.dim, c.norm_eps)
        self.mlp = mlp or SwiGLU(c.dim, c.ffn_dim)

    def forward(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], cache: KVCache | None, positions: torch.Tensor
    ) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), rope, cache, positions)
        return x + self.mlp(self.mlp_norm(x))


class Llama(nn.Module):
    block: type[Block] = Block  # Qwen3 swaps in its own

    def __init__(self, c: LlamaConfig) -> None:
        super().__init__()
        self.config = c
        self.embed = nn.Embedding(c.vocab_size, c.dim)
        self.rotary = Rotary(c.head_dim, c.max_seq_len, c.rope_theta)
        self.layers = nn.ModuleList(self.block(c) for _ in range(c.n_layers))
        self.norm = RMSNorm(c.dim, c.norm_eps)
        self.head = nn.Linear(c.dim, c.vocab_size, bias=False)
        self.apply(self._init)
        if c.tie_embeddings:
            self.head.weight = self.embed.weight

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)

    def forward(
        self, idx: torch.Tensor, caches: list[KVCache] | None = None, positions: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Logits for ``idx`` (batch, seq). Training: no cache, positions 0..seq-1.
        Generation: ``caches`` (one per layer) and the ``positions`` of ``idx``'s tokens."""
        if positions is None:
            positions = torch.arange(idx.size(1), device=idx.device)
        rope = self.rotary(positions)
        x = self.embed(idx)
        for i, layer in enumerate(self.layers):
            x = layer(x, rope, None if caches is None else caches[i], positions)
        return self.head(self.norm(x))

    def new_caches(self, batch: int, max_len: int, device: str, dtype: torch.dtype = torch.float32) -> list[KVCache]:
        c = self.config
        return [KVCache(batch, c.n_kv_heads, max_len, c.head_dim, dtype, device) for _ in range(c.n_layers)]
