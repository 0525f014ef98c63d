"""``torch.compile(DistributedDataParallel(model))``, PyTorch's recommended order, on the
device given on the command line (``tpu``: compiled with backend "tpu"; ``cpu``: the same DDP
model uncompiled on gloo, the reference). With 1 MiB buckets the model's 2 MiB of
parameters fill several, so Dynamo's DDPOptimizer splits the forward graph at the bucket
boundaries and each bucket's all-reduce starts while the backward goes on. Reports four
AdamW steps' losses and the final weights, each rank on half the batch."""

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


def main(device: str) -> None:
    dist.init_process_group("gloo" if device == "cpu" else "tpu")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 512), nn.GELU(), nn.Linear(512, 512), nn.GELU(), nn.Linear(512, 512), nn.GELU(), nn.Linear(512, 1))
    ddp = DDP(model.to(device), bucket_cap_mb=1)
    step_model = torch.compile(ddp, backend="tpu") if device == "tpu" else ddp
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(4):
        x, y = torch.randn(16, 16, generator=g), torch.randn(16, 1, generator=g)
        opt.zero_grad()
        loss = F.mse_loss(step_model(x[rank::2].to(device)), y[rank::2].to(device))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    report({"losses": losses, "weights": [p.detach().cpu().flatten()[:64].tolist() for p in model.parameters()]})
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
