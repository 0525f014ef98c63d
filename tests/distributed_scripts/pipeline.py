"""Point-to-point traffic in both directions at once, as pipeline parallelism makes it: two
ranks, each sending to the other and receiving from it in one ``batch_isend_irecv``, and
``torch.distributed.pipelining``'s GPipe and 1F1B schedules training a 2-stage MLP.

Before, a send on the tpu group returned only once its peer had received it, so two ranks
that both posted their send first waited for each other forever (1F1B hung on both
transports; GPipe, which never sends both ways at once, ran). Each rank reports the values
it received (and the source rank of a recv from any rank) and, per schedule, its stage's largest parameter difference from the same
model trained in one process on the CPU (the loss of each microbatch averaged, as the
schedules scale gradients) and the last step's microbatch losses against that reference's.

    python pipeline.py <cpu|tpu>   (under the tests' launcher; RANK/WORLD_SIZE set)
"""

from __future__ import annotations

import copy
import os
import sys
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from _common import rank_world, report
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

warnings.filterwarnings("ignore")
MICROBATCHES, STEPS, LR = 4, 3, 0.1


def exchange(device: torch.device, rank: int) -> dict:
    """Both ranks send first and receive second, in one batch; then a blocking send and a
    recv from any rank (with the source where the xla transport needs one)."""
    peer = 1 - rank
    mine = torch.full((3,), float(rank + 1), device=device)
    theirs = torch.zeros(3, device=device)
    works = dist.batch_isend_irecv([dist.P2POp(dist.isend, mine, peer), dist.P2POp(dist.irecv, theirs, peer)])
    for w in works:
        w.wait()
    got, source = torch.zeros(2, device=device), None
    if rank == 0:
        dist.send(torch.tensor([7.0, 8.0], device=device), 1)
    else:
        source = dist.recv(got, 0 if os.environ.get("TORCHTPU_COLLECTIVES") == "xla" else None)
    return {"received": theirs.cpu().tolist(), "sent_once": got.cpu().tolist(), "source": source}


def model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4))


def train(schedule_cls: type, device: torch.device, rank: int, world: int) -> dict:
    full = model()
    reference = copy.deepcopy(full)
    stage_module = (full[:4], full[4:])[rank].to(device)
    loss_fn = F.mse_loss
    schedule = schedule_cls(PipelineStage(stage_module, rank, world, device), n_microbatches=MICROBATCHES, loss_fn=loss_fn)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
    opt = torch.optim.SGD(stage_module.parameters(), lr=LR)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=LR)
    losses: list[torch.Tensor] = []
    ref_losses: list[float] = []
    for _ in range(STEPS):
        opt.zero_grad()
        losses = []
        if rank == 0:
            schedule.step(x.to(device))
        else:
            schedule.step(target=y.to(device), losses=losses)
        opt.step()
        ref_opt.zero_grad()
        per_microbatch = [loss_fn(reference(xm), ym) for xm, ym in zip(x.chunk(MICROBATCHES), y.chunk(MICROBATCHES))]
        (sum(per_microbatch) / MICROBATCHES).backward()
        ref_opt.step()
        ref_losses = [v.item() for v in per_microbatch]
    ref_stage = (reference[:4], reference[4:])[rank]
    diff = max((p.detach().cpu() - q.detach()).abs().max().item() for p, q in zip(stage_module.parameters(), ref_stage.parameters()))
    return {"param_diff": diff, "losses": [v.item() for v in losses], "ref_losses": ref_losses}


def main(device_type: str) -> None:
    rank, world = rank_world()
    dist.init_process_group("gloo" if device_type == "cpu" else "tpu")
    device = torch.device(device_type)
    result = exchange(device, rank)
    for name, cls in (("gpipe", ScheduleGPipe), ("1f1b", Schedule1F1B)):
        result[name] = train(cls, device, rank, world)
    report(result)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
