"""Shared by the distributed examples: a small transformer, its data, and the
single-process reference run the examples compare their losses with."""

from __future__ import annotations

import json
import os
from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, DIM, HEADS, LAYERS, SEQ, BATCH, STEPS, LR = 64, 32, 4, 2, 8, 8, 10, 1e-2


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v = nn.Linear(DIM, DIM), nn.Linear(DIM, DIM), nn.Linear(DIM, DIM)
        self.o = nn.Linear(DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        hd = DIM // HEADS
        # -1 heads: under tensor parallelism each rank holds HEADS / world of them
        q, k, v = (p(x).view(b, t, -1, hd).transpose(1, 2) for p in (self.q, self.k, self.v))
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        att = (q @ k.transpose(-2, -1)) / hd**0.5
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        return self.o((att @ v).transpose(1, 2).reshape(b, t, -1))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.attn = Attention()
        self.fc1, self.fc2 = nn.Linear(DIM, 4 * DIM), nn.Linear(4 * DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class TinyTransformer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.pos = nn.Parameter(torch.randn(SEQ, DIM) * 0.02)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.emb(idx) + self.pos
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


def make_model(seed: int = 0) -> TinyTransformer:
    torch.manual_seed(seed)
    return TinyTransformer()


def batches(steps: int = STEPS) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The global batches (CPU): next-token prediction on a fixed random sequence set."""
    g = torch.Generator().manual_seed(1234)
    data = torch.randint(0, VOCAB, (steps, BATCH, SEQ + 1), generator=g)
    return [(d[:, :-1], d[:, 1:]) for d in data]


def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, VOCAB), target.reshape(-1))


def reference_losses(device: str = "tpu", steps: int = STEPS, accumulate: int = 1) -> list[float]:
    """The same training in one process on the global batch: what every distributed
    run must reproduce. ``accumulate`` splits each batch into that many micro-batches."""
    model = make_model().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for x, y in batches(steps):
        total = 0.0
        for xs, ys in zip(x.chunk(accumulate), y.chunk(accumulate)):
            loss = loss_fn(model(xs.to(device)), ys.to(device)) / accumulate
            loss.backward()
            total += loss.item()
        opt.step()
        opt.zero_grad()
        losses.append(total)
    return losses


def compare_and_report(
    name: str, losses: list[float], reference: Callable[[], list[float]] | None, rank: int, tol: float = 1e-4
) -> None:
    """Print the losses; with a reference, the largest difference; with TORCHTPU_TEST_OUT,
    write them as JSON for the tests."""
    ref = reference() if reference is not None else None
    diff = max(abs(a - b) for a, b in zip(losses, ref)) if ref else None
    if rank == 0:
        print(f"{name}: losses {[round(v, 5) for v in losses]}")
        if ref is not None:
            print(
                f"{name}: single-process {[round(v, 5) for v in ref]}; max |diff| {diff:.2e} ({'OK' if diff <= tol else 'DIFFERENT'})"
            )
    out = os.environ.get("TORCHTPU_TEST_OUT")
    if out:
        with open(os.path.join(out, f"{name}_rank{rank}.json"), "w") as f:
            json.dump({"losses": losses, "reference": ref, "max_diff": diff}, f)
