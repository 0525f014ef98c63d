"""Sharded data parallel training on tpu with FSDP2 (fully_shard), unchanged.

    torchrun --nproc-per-node=2 examples/distributed/fsdp2.py [--compare] [--bf16] [--compile MODE]

Every parameter is a DTensor sharded over the ranks; each block all-gathers its
parameters before use and reduce-scatters its gradients. --bf16 adds a mixed precision
policy (bf16 parameters and compute, fp32 gradient reduction). --compare also runs the
same training in one process (in fp32) and prints the largest loss difference.

--compile (with TORCHTPU_COLLECTIVES=xla, see docs/compile.md, "Collectives in compiled
programs"); the programs each step runs are printed with the losses:

  model  torch.compile(model, backend="tpu"), the stock recipe: PyTorch 2.13 runs FSDP2's
         hooks eagerly (they are wrapped in torch._dynamo.disable), so each block's forward
         and backward is a program and the all-gathers, reduce-scatters and their copies
         run between them (46 programs per step for this model).
  step   the whole step (forward, torch.autograd.grad, SGD in place) as ONE program, its
         communication inside: fully_shard's sharded parameters are all-gathered in the
         graph and their gradients reduce-scattered by autograd, in the policy's dtypes
         with --bf16 (torchtpu.distributed.compiled.InGraphFSDP); FSDP2's own hooks are
         off for the call.
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
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

import torchtpu
from torchtpu.distributed.compiled import InGraphFSDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import LR, batches, compare_and_report, loss_fn, make_model, reference_losses  # noqa: E402

Step = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def compiled_step(model: torch.nn.Module, loss_fn: Callable[..., torch.Tensor] = loss_fn, lr: float = LR) -> Step:
    """The whole SGD step as one graph: the parameters all-gathered inside it (their
    gradients reduce-scattered by autograd), autograd.grad traced by Dynamo
    (trace_autograd_ops), the update of the local shards in place."""
    torch._dynamo.config.trace_autograd_ops = True
    params = list(model.parameters())
    fsdp = InGraphFSDP(model)

    @torch.compile(backend="tpu", fullgraph=True)
    def graph(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = loss_fn(torch.func.functional_call(model, fsdp.unsharded_parameters(), (x,)), y)
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            for p, g in zip(params, grads):
                p.add_(g, alpha=-lr)
        return loss.detach()

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with fsdp.hooks_off():  # their eager collectives are in the graph instead
            return graph(x, y)

    return step


def eager_step(model: torch.nn.Module, compile_model: bool = False) -> Step:
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    forward = torch.compile(model, backend="tpu") if compile_model else model

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = loss_fn(forward(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.detach()

    return step


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--compare", action="store_true")
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--compile", choices=("model", "step"), help="see the module doc")
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
    step = compiled_step(model) if args.compile == "step" else eager_step(model, args.compile == "model")
    losses, programs = [], []
    for x, y in batches():
        xs, ys = x.chunk(world)[rank].to("tpu"), y.chunk(world)[rank].to("tpu")
        before = torchtpu.metrics.snapshot()["executions"]
        loss = step(xs, ys)
        programs.append(torchtpu.metrics.snapshot()["executions"] - before)
        step_loss = loss.float().reshape(1)
        dist.all_reduce(step_loss, op=dist.ReduceOp.AVG)
        losses.append(step_loss.item())
    name = "fsdp2_bf16" if args.bf16 else "fsdp2"
    if args.compile:
        name += f"_compiled_{args.compile}"
        if rank == 0:
            print(f"{name}: programs run per step {programs}")
    compare_and_report(name, losses, reference_losses if args.compare else None, rank, tol=3e-2 if args.bf16 else 1e-4)
    out = os.environ.get("TORCHTPU_TEST_OUT")
    if out and args.compile:  # for the tests: the programs each step ran
        with open(os.path.join(out, f"{name}_programs_rank{rank}.json"), "w") as f:
            json.dump(programs, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
