"""Pipeline parallel training on tpu with torch.distributed.pipelining, unchanged.

    torchrun --nproc-per-node=2 examples/distributed/pipeline.py [--schedule 1f1b|gpipe] [--compare]

The small transformer is cut in two stages -- embeddings and the first block on rank 0,
the second block and the head on rank 1 -- and each global batch runs as 4 micro-batches
through PyTorch's schedule, which sends activations forward and gradients back between
the ranks (1F1B sends and receives in both directions at once). --compare also runs the
same training in one process (the batch in 4 accumulated micro-batches) and prints the
largest loss difference.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import LR, TinyTransformer, batches, compare_and_report, loss_fn, make_model, reference_losses  # noqa: E402

MICROBATCHES = 4
SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


class First(nn.Module):
    """Rank 0's stage: token and position embeddings, then the first block."""

    def __init__(self, model: TinyTransformer) -> None:
        super().__init__()
        self.emb, self.pos, self.block = model.emb, model.pos, model.blocks[0]

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.block(self.emb(idx) + self.pos)


class Last(nn.Module):
    """Rank 1's stage: the second block, the final norm and the head."""

    def __init__(self, model: TinyTransformer) -> None:
        super().__init__()
        self.block, self.ln, self.head = model.blocks[1], model.ln, model.head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.ln(self.block(x)))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--schedule", choices=sorted(SCHEDULES), default="1f1b")
    p.add_argument("--compare", action="store_true")
    args = p.parse_args()
    dist.init_process_group("tpu")
    rank, world = dist.get_rank(), dist.get_world_size()
    if world != 2:
        raise SystemExit("this example cuts the model in 2 stages: run it with --nproc-per-node=2")
    device = torch.device("tpu")

    stage_module = (First, Last)[rank](make_model()).to(device)
    stage = PipelineStage(stage_module, rank, world, device)
    schedule = SCHEDULES[args.schedule](stage, n_microbatches=MICROBATCHES, loss_fn=loss_fn)
    opt = torch.optim.SGD(stage_module.parameters(), lr=LR)
    losses = []
    for x, y in batches():
        if rank == 0:
            schedule.step(x.to(device))
            step_loss = torch.zeros(1, device=device)
        else:
            micro: list[torch.Tensor] = []
            schedule.step(target=y.to(device), losses=micro)
            step_loss = torch.stack(micro).mean().reshape(1)  # the schedule averages the micro-batches' gradients
        opt.step()
        opt.zero_grad()
        dist.broadcast(step_loss, src=world - 1)  # the last stage computed it
        losses.append(step_loss.item())
    reference = (lambda: reference_losses(accumulate=MICROBATCHES)) if args.compare else None
    compare_and_report(f"pipeline-{args.schedule}", losses, reference, rank)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
