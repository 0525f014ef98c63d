"""Object collectives and DDP gradient accumulation, on the device given on the command line
(``cpu``: gloo; ``tpu``: torchtpu's group): ``all_gather_object``, ``broadcast_object_list``,
``gather_object``, ``scatter_object_list`` (what evaluation loops and accelerate's
``gather_object`` use), and two micro-batches per step under ``DistributedDataParallel.no_sync``
(the gradient all-reduce skipped on the first, done on the second). Reports what each rank
received, the losses and the final weights."""

from __future__ import annotations

import sys
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from _common import report
from torch.nn.parallel import DistributedDataParallel as DDP

warnings.filterwarnings("ignore")


def objects(rank: int, world: int) -> dict:
    gathered: list = [None] * world
    dist.all_gather_object(gathered, {"rank": rank, "name": f"r{rank}", "values": list(range(rank + 2))})
    broadcast = [f"from {rank}", {"k": rank}] if rank == 0 else [None, None]
    dist.broadcast_object_list(broadcast, src=0)
    at_root: list | None = [None] * world if rank == 0 else None
    dist.gather_object(("tuple", rank), at_root, dst=0)
    scattered: list = [None]
    dist.scatter_object_list(scattered, [f"for {r}" for r in range(world)] if rank == 0 else None, src=0)
    return {"gathered": gathered, "broadcast": broadcast, "at_root": at_root, "scattered": scattered}


def accumulate(rank: int, device: torch.device) -> dict:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)).to(device)
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(2):
        x, y = torch.randn(16, 8, generator=g), torch.randn(16, 1, generator=g)
        mine_x, mine_y = x[rank::2].to(device), y[rank::2].to(device)
        opt.zero_grad()
        with ddp.no_sync():  # first micro-batch: local gradients only
            F.mse_loss(ddp(mine_x[:4]), mine_y[:4]).backward()
        loss = F.mse_loss(ddp(mine_x[4:]), mine_y[4:])
        loss.backward()  # second: the accumulated gradients are averaged over the ranks
        opt.step()
        losses.append(loss.item())
    return {"losses": losses, "weights": [p.detach().cpu().flatten().tolist() for p in model.parameters()]}


def main(device_type: str) -> None:
    dist.init_process_group("gloo" if device_type == "cpu" else "tpu")
    rank, world = dist.get_rank(), dist.get_world_size()
    report({"objects": objects(rank, world), "accumulate": accumulate(rank, torch.device(device_type))})
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
