"""Data parallel training on tpu with PyTorch's DistributedDataParallel, unchanged.

    torchrun --nproc-per-node=2 examples/distributed/ddp.py [--compare]

Each process drives its own device (tpu:0) and trains on its slice of every global
batch; DDP averages the gradients through the "tpu" process group (in small buckets
here, to exercise bucketing) and accumulates two micro-batches under no_sync().
--compare also runs the same training in one process and prints the largest loss
difference.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import LR, batches, compare_and_report, loss_fn, make_model, reference_losses  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--compare", action="store_true")
    args = p.parse_args()
    dist.init_process_group("tpu")
    rank, world = dist.get_rank(), dist.get_world_size()

    model = DDP(make_model().to("tpu"), bucket_cap_mb=0.01)  # ~10 KB buckets: several per step
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for x, y in batches():
        xs, ys = x.chunk(world)[rank], y.chunk(world)[rank]
        # two micro-batches; gradients sync only on the second (no_sync on the first)
        (x1, x2), (y1, y2) = xs.chunk(2), ys.chunk(2)
        with model.no_sync():
            l1 = loss_fn(model(x1.to("tpu")), y1.to("tpu")) / 2
            l1.backward()
        l2 = loss_fn(model(x2.to("tpu")), y2.to("tpu")) / 2
        l2.backward()
        opt.step()
        opt.zero_grad()
        step_loss = (l1.detach() + l2.detach()).reshape(1)
        dist.all_reduce(step_loss, op=dist.ReduceOp.AVG)  # the global-batch loss
        losses.append(step_loss.item())
    compare_and_report("ddp", losses, (lambda: reference_losses(accumulate=2)) if args.compare else None, rank)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
