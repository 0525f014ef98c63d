"""Tensor parallel training on tpu with DTensor and parallelize_module, unchanged.

    torchrun --nproc-per-node=2 examples/distributed/tensor_parallel.py [--compare]

The attention projections q/k/v and the first MLP layer are split by output columns
(ColwiseParallel), the attention output and second MLP layer by input rows
(RowwiseParallel), so each rank holds HEADS / N heads and a slice of the MLP; every rank
sees the whole batch. Also shows the DTensor basics: distribute_tensor, redistribute and
full_tensor. --compare also runs the same training in one process and prints the
largest loss difference.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import LR, batches, compare_and_report, loss_fn, make_model, reference_losses  # noqa: E402


def dtensor_basics(mesh: object, rank: int) -> bool:
    full = torch.arange(24.0).reshape(6, 4)
    d = distribute_tensor(full.to("tpu"), mesh, [Shard(0)])
    ok = torch.equal(d.full_tensor().cpu(), full)
    ok &= torch.equal(d.redistribute(mesh, [Replicate()]).to_local().cpu(), full)
    ok &= torch.equal(d.redistribute(mesh, [Shard(1)]).full_tensor().cpu(), full)
    ok &= torch.allclose((d * 2).sum(0).full_tensor().cpu(), (full * 2).sum(0))
    if rank == 0:
        print(
            f"DTensor: local shard {tuple(d.to_local().shape)} on {d.to_local().device}; full_tensor/redistribute {'OK' if ok else 'WRONG'}"
        )
    return bool(ok)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--compare", action="store_true")
    args = p.parse_args()
    dist.init_process_group("tpu")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("tpu", (world,))
    basics_ok = dtensor_basics(mesh, rank)

    model = make_model().to("tpu")
    plan = {
        "attn.q": ColwiseParallel(),
        "attn.k": ColwiseParallel(),
        "attn.v": ColwiseParallel(),
        "attn.o": RowwiseParallel(),
        "fc1": ColwiseParallel(),
        "fc2": RowwiseParallel(),
    }
    for block in model.blocks:
        parallelize_module(block, mesh, plan)
    # foreach=False: the un-parallelized parameters are plain tensors, the others DTensors
    opt = torch.optim.SGD(model.parameters(), lr=LR, foreach=False)
    losses = []
    for x, y in batches():
        loss = loss_fn(model(x.to("tpu")), y.to("tpu"))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    if not basics_ok:
        losses = [float("nan")] * len(losses)
    compare_and_report("tensor_parallel", losses, reference_losses if args.compare else None, rank)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
