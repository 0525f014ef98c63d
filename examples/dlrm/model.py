"""DLRM (Naumov et al., 2019): dense features through a bottom MLP, sparse categorical
features through one EmbeddingBag per table (multi-hot bags as a flat index tensor plus
offsets), pairwise dot-product interaction of all those vectors, a top MLP to one logit."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn

# The 26 categorical table sizes of Criteo Kaggle (Display Advertising Challenge), as the
# DLRM reference code counts them.
CRITEO_KAGGLE_ROWS = (
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
    27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
)  # fmt: skip
# Tables capped at 1M rows (the reference code's --max-ind-range): the uncapped tables
# hold 540M parameters (2.2 GB in float32, twice that again with Adagrad's state); capped,
# the model has 89M, which builds in seconds on a laptop.
MAX_ROWS = 1_000_000
Tensors = tuple[torch.Tensor, ...]


@dataclass
class DLRMConfig:
    table_rows: tuple[int, ...]
    dim: int  # embedding size = the bottom MLP's output size
    bottom: tuple[int, ...]  # dense features -> ... -> dim
    top: tuple[int, ...]  # hidden sizes of the top MLP, ending in 1 (the logit)
    max_bag: int  # each sample's bag holds 1..max_bag ids
    sparse: bool = False  # sparse gradients for the tables

    @property
    def modes(self) -> tuple[str, ...]:
        """Even tables sum their bag (weighted by per-sample weights), odd tables average it."""
        return tuple("sum" if i % 2 == 0 else "mean" for i in range(len(self.table_rows)))


# tiny: seconds on the cpu platform; small: a minute; base: the DLRM benchmark config for
# Criteo Kaggle (bottom 13-512-256-64-16, top 512-256-1, dim 16) with tables capped, and
# one id per bag, as Criteo's categorical features are one-hot.
SIZES = {
    "tiny": dict(table_rows=(100,) * 4, dim=8, bottom=(13, 16, 8), top=(16, 1), max_bag=3),
    "small": dict(table_rows=(10_000,) * 8, dim=16, bottom=(13, 128, 64, 16), top=(128, 64, 1), max_bag=4),
    "base": dict(
        table_rows=tuple(min(n, MAX_ROWS) for n in CRITEO_KAGGLE_ROWS),
        dim=16,
        bottom=(13, 512, 256, 64, 16),
        top=(512, 256, 1),
        max_bag=1,
    ),
}


def mlp(sizes: tuple[int, ...], last_relu: bool) -> nn.Sequential:
    """Linear layers with ReLU between them (and after the last when ``last_relu``),
    initialised as the DLRM reference does."""
    layers: list[nn.Module] = []
    for i, (m, n) in enumerate(zip(sizes[:-1], sizes[1:])):
        lin = nn.Linear(m, n)
        nn.init.normal_(lin.weight, 0.0, math.sqrt(2.0 / (m + n)))
        nn.init.normal_(lin.bias, 0.0, math.sqrt(1.0 / n))
        layers.append(lin)
        if i < len(sizes) - 2 or last_relu:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    def __init__(self, c: DLRMConfig) -> None:
        super().__init__()
        if c.bottom[-1] != c.dim:
            raise ValueError(f"the bottom MLP must end in the embedding size {c.dim}, not {c.bottom[-1]}")
        self.config = c
        self.bottom = mlp(c.bottom, last_relu=True)
        self.tables = nn.ModuleList(nn.EmbeddingBag(n, c.dim, mode=m, sparse=c.sparse) for n, m in zip(c.table_rows, c.modes))
        for t in self.tables:
            nn.init.uniform_(t.weight, -math.sqrt(1.0 / t.num_embeddings), math.sqrt(1.0 / t.num_embeddings))
        f = len(c.table_rows) + 1  # the bottom MLP's vector and one per table
        # the strictly lower triangle of the f x f dot-product matrix: each pair once
        self.register_buffer("pairs", torch.tril_indices(f, f, offset=-1), persistent=False)
        self.top = mlp((c.dim + f * (f - 1) // 2, *c.top), last_relu=False)

    def interact(self, dense: torch.Tensor, sparse: list[torch.Tensor]) -> torch.Tensor:
        """[dense, all pairwise dots] for each sample: (B, dim + f(f-1)/2)."""
        t = torch.stack([dense, *sparse], dim=1)  # (B, f, dim)
        z = torch.bmm(t, t.transpose(1, 2))  # (B, f, f)
        i, j = self.pairs
        return torch.cat([dense, z[:, i, j]], dim=1)

    def forward(self, dense: torch.Tensor, ids: Tensors, offsets: Tensors, weights: Tensors) -> torch.Tensor:
        """Logits (B,). ``ids[k]``/``offsets[k]``: table k's bags; ``weights``: one
        per-sample weight tensor per sum table, in table order."""
        x = self.bottom(dense)
        w = iter(weights)
        # per_sample_weights exist only for mode="sum"
        ly = [t(i, o, per_sample_weights=next(w) if t.mode == "sum" else None) for t, i, o in zip(self.tables, ids, offsets)]
        return self.top(self.interact(x, ly)).squeeze(1)
