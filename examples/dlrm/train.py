#!/usr/bin/env python
"""Train DLRM on synthetic click logs (dense features, multi-hot categorical bags, clicks).

    python examples/dlrm/train.py --size tiny --compare                 # tpu vs CPU, eager
    python examples/dlrm/train.py --mode compile --optimizer adagrad
    python examples/dlrm/train.py --sparse                              # sparse table gradients

Plain PyTorch: the device string is the only change from a CUDA script (harness.py holds
the command line, the mode switch and --compare).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from model import DLRM, SIZES, DLRMConfig, Tensors  # noqa: E402

BATCH = {"tiny": 16, "small": 256, "base": 2048}
LR = {"sgd": 0.1, "adagrad": 0.05}

# dense features, ids, offsets, per-sample weights, click labels
Batch = tuple[torch.Tensor, Tensors, Tensors, Tensors, torch.Tensor]


def click_logs(step: int, c: DLRMConfig, batch_size: int) -> Batch:
    """One batch of synthetic click logs (seeded by ``step``): dense features, per table a
    flat id tensor with the offsets of its bags (1..max_bag ids each), per sum table the
    ids' weights, and click labels that depend on the dense features and on table 0."""
    g = torch.Generator().manual_seed(step)
    dense = torch.rand(batch_size, c.bottom[0], generator=g)
    ids, offsets, weights = [], [], []
    for rows, mode in zip(c.table_rows, c.modes):
        lengths = torch.randint(1, c.max_bag + 1, (batch_size,), generator=g)
        offsets.append(torch.cumsum(lengths, 0) - lengths)
        ids.append(torch.randint(0, rows, (int(lengths.sum()),), generator=g))
        if mode == "sum":
            weights.append(torch.rand(len(ids[-1]), generator=g))
    # a learnable rule: more dense signal and a first id in table 0's lower half click more
    first = ids[0][offsets[0]]
    logit = 3.0 * (dense[:, 0] + dense[:, 1] - 1.0) + torch.where(first < c.table_rows[0] // 2, 1.5, -1.5)
    labels = torch.bernoulli(torch.sigmoid(logit), generator=g)
    return dense, tuple(ids), tuple(offsets), tuple(weights), labels


def optimizer(name: str) -> Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]:
    def make(params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
        if name == "adagrad":
            return torch.optim.Adagrad(params, lr=LR[name])
        return torch.optim.SGD(params, lr=LR[name])

    return make


def task(size: str, opt: str = "sgd", sparse: bool = False) -> harness.Task:
    config = DLRMConfig(**SIZES[size], sparse=sparse)

    def loss(model: DLRM, batch: Batch) -> torch.Tensor:
        dense, ids, offsets, weights, labels = batch
        return F.binary_cross_entropy_with_logits(model(dense, ids, offsets, weights), labels)

    return harness.Task(
        name="dlrm",
        build=lambda: DLRM(config),
        optimizer=optimizer(opt),
        batch=lambda step: click_logs(step, config, BATCH[size]),
        loss=loss,
        unit="samples",
        items=lambda batch: batch[0].shape[0],
    )


def main(argv: list[str] | None = None) -> harness.Run:
    p = harness.parser(__doc__.splitlines()[1], steps=30)
    p.add_argument("--optimizer", choices=tuple(LR), default="sgd")
    p.add_argument("--sparse", action="store_true", help="EmbeddingBag(sparse=True): sparse gradients for the tables")
    args = p.parse_args(argv)
    run, _ = harness.main(task(args.size, args.optimizer, args.sparse), args)
    return run


if __name__ == "__main__":
    main()
