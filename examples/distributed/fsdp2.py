"""Sharded data parallel training on tpu with FSDP2 (fully_shard), unchanged.

    torchrun --nproc-per-node=2 examples/distributed/fsdp2.py [--compare] [--bf16]

Every parameter is a DTensor sharded over the ranks; each block all-gathers its
parameters before use and reduce-scatters its gradients. --bf16 adds a mixed precision
policy (bf16 parameters and compute, fp32 gradient reduction). --compare also runs the
same training in one process (in fp32) and prints the largest loss difference.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import LR, batches, compare_and_report, loss_fn, make_model, reference_losses  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--compare", action="store_true")
    p.add_argument("--bf16", action="store_true")
    args = p.parse_args()
    dist.init_process_group("tpu")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("tpu", (world,))

    model = make_model().to("tpu")
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if args.bf16 else MixedPrecisionPolicy()
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    if rank == 0:
        w = model.blocks[0].fc1.weight
        print(f"fc1.weight: {type(w).__name__} {w.placements}, local {tuple(w.to_local().shape)} of {tuple(w.shape)}")
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for x, y in batches():
        xs, ys = x.chunk(world)[rank].to("tpu"), y.chunk(world)[rank].to("tpu")
        loss = loss_fn(model(xs), ys)
        loss.backward()
        opt.step()
        opt.zero_grad()
        step_loss = loss.detach().float().reshape(1)
        dist.all_reduce(step_loss, op=dist.ReduceOp.AVG)
        losses.append(step_loss.item())
    name = "fsdp2_bf16" if args.bf16 else "fsdp2"
    compare_and_report(name, losses, reference_losses if args.compare else None, rank, tol=3e-2 if args.bf16 else 1e-4)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
