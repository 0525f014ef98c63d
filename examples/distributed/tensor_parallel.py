"""Tensor parallel training on tpu with DTensor and parallelize_module, unchanged.

    torchrun --nproc-per-node=2 examples/distributed/tensor_parallel.py [--compare] [--compile]

The attention projections q/k/v and the first MLP layer are split by output columns
(ColwiseParallel), the attention output and second MLP layer by input rows
(RowwiseParallel), so each rank holds HEADS / N heads and a slice of the MLP; every rank
sees the whole batch. Also shows the DTensor basics: distribute_tensor, redistribute and
full_tensor. --compare also runs the same training in one process and prints the
largest loss difference.

--compile runs each training step (forward, backward and the SGD update) as one
torch.compile(backend="tpu") graph. With TORCHTPU_COLLECTIVES=xla its collectives (the
all_reduce of every RowwiseParallel output and of the activations' gradients) are lowered
into the step's XLA program: one program per step, printed with the loss. With the host
transport (the cpu default) the graph runs op by op, its collectives through the group.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

import torchtpu

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


def compiled_step(
    model: torch.nn.Module, loss_fn: Callable[..., torch.Tensor] = loss_fn, lr: float = LR
) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The whole SGD step as one graph: autograd.grad traced by Dynamo (trace_autograd_ops),
    the update in place (AOTAutograd writes it back into the parameters)."""
    torch._dynamo.config.trace_autograd_ops = True
    params = list(model.parameters())

    @torch.compile(backend="tpu", fullgraph=True)
    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = loss_fn(model(x), y)
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            for p, g in zip(params, grads):
                p.add_(g, alpha=-lr)
        return loss.detach()

    return step


def eager_step(model: torch.nn.Module) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    # foreach=False: the un-parallelized parameters are plain tensors, the others DTensors
    opt = torch.optim.SGD(model.parameters(), lr=LR, foreach=False)

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    return step


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--compare", action="store_true")
    p.add_argument("--compile", action="store_true", help="one torch.compile graph per step (see the module doc)")
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
    step = compiled_step(model) if args.compile else eager_step(model)
    losses, programs = [], []
    for x, y in batches():
        x, y = x.to("tpu"), y.to("tpu")
        before = torchtpu.metrics.snapshot()["executions"]
        losses.append(step(x, y).item())
        programs.append(torchtpu.metrics.snapshot()["executions"] - before)
    if rank == 0:
        print(f"tensor_parallel: programs run per step {programs}")
    if not basics_ok:
        losses = [float("nan")] * len(losses)
    name = "tensor_parallel_compiled" if args.compile else "tensor_parallel"
    compare_and_report(name, losses, reference_losses if args.compare else None, rank)
    out = os.environ.get("TORCHTPU_TEST_OUT")
    if out:  # for the tests: the programs each step ran
        with open(os.path.join(out, f"{name}_programs_rank{rank}.json"), "w") as f:
            json.dump(programs, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
