"""Pipeline schedules over 4 ranks: GPipe and 1F1B with one stage per rank, and
interleaved 1F1B with two stages per rank (stage i on rank i mod 4), whose activations go
round the ranks twice -- rank 3 sends to rank 0 -- so that every rank waits on a transfer
while its neighbours wait on theirs. Each rank reports its stages' largest parameter
difference from the 8-layer model trained in one process on the CPU (microbatch losses
averaged, as the schedules scale gradients).

    python pipeline_ring.py <cpu|tpu>   (under the tests' launcher, 4 ranks)
"""

from __future__ import annotations

import copy
import sys
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from _common import rank_world, report
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

warnings.filterwarnings("ignore")
MICROBATCHES, STEPS, LR = 4, 2, 0.1


def train(name: str, device: torch.device, rank: int, world: int) -> float:
    torch.manual_seed(0)
    full = nn.Sequential(*[nn.Sequential(nn.Linear(16, 16), nn.Tanh()) for _ in range(2 * world)])
    reference = copy.deepcopy(full)
    if name == "interleaved":
        layers = [rank, rank + world]
        modules = [full[i].to(device) for i in layers]
        stages = [PipelineStage(m, i, 2 * world, device) for m, i in zip(modules, layers)]
        schedule = ScheduleInterleaved1F1B(stages, n_microbatches=MICROBATCHES, loss_fn=F.mse_loss)
        first, last = 0 in layers, 2 * world - 1 in layers
    else:
        layers = [2 * rank, 2 * rank + 1]
        modules = [nn.Sequential(*[full[i] for i in layers]).to(device)]
        cls = ScheduleGPipe if name == "gpipe" else Schedule1F1B
        schedule = cls(PipelineStage(modules[0], rank, world, device), n_microbatches=MICROBATCHES, loss_fn=F.mse_loss)
        first, last = rank == 0, rank == world - 1
    params = [p for m in modules for p in m.parameters()]
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 16, generator=g), torch.randn(8, 16, generator=g)
    opt, ref_opt = torch.optim.SGD(params, lr=LR), torch.optim.SGD(reference.parameters(), lr=LR)
    for _ in range(STEPS):
        opt.zero_grad()
        args = (x.to(device),) if first else ()
        schedule.step(*args, **({"target": y.to(device)} if last else {}))
        opt.step()
        ref_opt.zero_grad()
        (sum(F.mse_loss(reference(a), b) for a, b in zip(x.chunk(MICROBATCHES), y.chunk(MICROBATCHES))) / MICROBATCHES).backward()
        ref_opt.step()
    ref_params = [p for i in layers for p in reference[i].parameters()]
    return max((p.detach().cpu() - q.detach()).abs().max().item() for p, q in zip(params, ref_params))


def main(device_type: str) -> None:
    rank, world = rank_world()
    dist.init_process_group("gloo" if device_type == "cpu" else "tpu")
    device = torch.device(device_type)
    report({name: train(name, device, rank, world) for name in ("gpipe", "1f1b", "interleaved")})
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
