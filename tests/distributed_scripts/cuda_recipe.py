"""PyTorch's DDP tutorial recipe, with "cuda" replaced by the device given on the command
line (``cpu`` runs it on gloo, ``tpu`` on torchtpu's group): each rank selects device
``LOCAL_RANK`` with ``set_device``, builds the model on ``<device>:LOCAL_RANK`` and wraps it
in ``DistributedDataParallel(model, device_ids=[local_rank], output_device=local_rank)``.
On tpu, tpu:LOCAL_RANK names the process's one device (it raised "device index 1 is not
available" on rank 1). Reports the losses and final weights of three SGD steps, each rank
on half the batch."""

from __future__ import annotations

import os
import sys
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from _common import report
from torch.nn.parallel import DistributedDataParallel as DDP

warnings.filterwarnings("ignore")


def main(device_type: str) -> None:
    local_rank = int(os.environ["LOCAL_RANK"])
    rank = int(os.environ["RANK"])
    if device_type == "cpu":
        dist.init_process_group("gloo")
        device, ddp_kwargs = torch.device("cpu"), {}
    else:
        torch.tpu.set_device(local_rank)
        dist.init_process_group("tpu")
        device = torch.device(device_type, local_rank)
        ddp_kwargs = {"device_ids": [local_rank], "output_device": local_rank}
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)).to(device)
    ddp = DDP(model, **ddp_kwargs)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(16, 8, generator=g), torch.randn(16, 1, generator=g)
    losses = []
    for _ in range(3):
        opt.zero_grad()
        loss = F.mse_loss(ddp(x[rank::2]), y[rank::2].to(device))  # the CPU batch moves to device_ids[0]
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append(mean.item() / 2)
    report(
        {
            "losses": losses,
            "weights": [p.detach().cpu().flatten().tolist() for p in model.parameters()],
            "device": str(next(model.parameters()).device),
            "generator": str(torch.Generator(device=device).device),
        }
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
