"""Fault tolerance with torchrun and torch.distributed.checkpoint (DCP), unchanged PyTorch.

    torchrun --nproc-per-node=2 --max-restarts=1 examples/distributed/restart.py \\
        --ckpt build/restart_ckpt [--steps 12] [--every 4] [--kill-at 7]

A DDP MLP trains on "tpu" with AdamW and saves a DCP checkpoint (model and optimizer)
every ``--every`` steps; at start it resumes from the newest complete checkpoint in
``--ckpt``. With ``--kill-at K``, rank 1 kills itself with SIGKILL at the start of step
K -- once: a marker file in ``--ckpt`` keeps the restarted attempt from doing it again.
torchrun then stops the other rank and restarts both (``--max-restarts=1``); they resume
from the last checkpoint, so only the steps since it are computed twice, and the losses
equal an uninterrupted run's.

Every step's batch depends only on the step number, so a resumed run sees the same data.
Rank 0 prints each step's loss and, with TORCHTPU_TEST_OUT set, writes them to
``restart_rank0.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel as DDP

BATCH, DIM, CLASSES, LR = 16, 32, 4, 1e-2
MARKER = "killed_once"


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(DIM, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, CLASSES))


def batch(step: int, rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's share of global batch ``step`` (a function of the step number only)."""
    g = torch.Generator().manual_seed(step)
    x, y = torch.randn(BATCH, DIM, generator=g), torch.randint(0, CLASSES, (BATCH,), generator=g)
    return x.chunk(world)[rank].to("tpu"), y.chunk(world)[rank].to("tpu")


def latest_checkpoint(root: Path) -> tuple[int, Path] | None:
    """The newest complete checkpoint: DCP writes ``.metadata`` last, after every rank's data."""
    done = [(int(p.name.removeprefix("step_")), p) for p in root.glob("step_*") if (p / ".metadata").exists()]
    return max(done) if done else None


def save(model: nn.Module, opt: torch.optim.Optimizer, path: Path) -> None:
    msd, osd = get_state_dict(model, opt)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(path))


def load(model: nn.Module, opt: torch.optim.Optimizer, path: Path) -> None:
    """Load in place into the model's and optimizer's own tpu tensors."""
    msd, osd = get_state_dict(model, opt)
    state = {"model": msd, "optim": osd}
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])


def maybe_die(step: int, kill_at: int, rank: int, root: Path) -> None:
    """Rank 1 dies at step ``kill_at`` in the first attempt only (the marker remembers)."""
    marker = root / MARKER
    if step != kill_at or rank != 1 or marker.exists():
        return
    marker.write_text(f"rank 1 killed itself at step {step}\n")
    os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ckpt", required=True, help="checkpoint directory (created if missing)")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--every", type=int, default=4, help="checkpoint every this many steps")
    p.add_argument("--kill-at", type=int, default=0, help="rank 1 dies at the start of this step, once")
    args = p.parse_args()
    root = Path(args.ckpt)
    root.mkdir(parents=True, exist_ok=True)

    dist.init_process_group("tpu")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = DDP(make_model().to("tpu"))
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    start, found = 1, latest_checkpoint(root)
    if found is not None:
        load(model, opt, found[1])
        start = found[0] + 1
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if rank == 0:
        print(f"attempt {attempt}: starting at step {start}" + (f" (resumed from {found[1].name})" if found else ""), flush=True)

    losses = {}
    for step in range(start, args.steps + 1):
        maybe_die(step, args.kill_at, rank, root)
        x, y = batch(step, rank, world)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        global_loss = loss.detach().reshape(1)
        dist.all_reduce(global_loss, op=dist.ReduceOp.AVG)
        losses[step] = global_loss.item()
        if rank == 0:
            print(f"step {step}: loss {losses[step]:.6f}", flush=True)
        if step % args.every == 0:
            save(model, opt, root / f"step_{step}")

    out = os.environ.get("TORCHTPU_TEST_OUT")
    if out and rank == 0:
        result = {"attempt": attempt, "start": start, "losses": losses}
        Path(out, "restart_rank0.json").write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
