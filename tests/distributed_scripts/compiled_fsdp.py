"""FSDP2 (fully_shard) under torch.compile(backend="tpu"). One or more scenarios per run:

    RANK=r WORLD_SIZE=n MASTER_ADDR=127.0.0.1 MASTER_PORT=p python compiled_fsdp.py SCENARIO[,SCENARIO]

step   the example's whole step in one graph (InGraphFSDP: all-gathers and reduce-scatters
       inside), STEPS steps, then one eager FSDP2 step (its hooks must be back); the losses
       against the same training in one process, the programs and compiles of every step
bf16   the same compiled step with a bf16 MixedPrecisionPolicy (fp32 reduction)
uneven the compiled step of an MLP whose dims do not divide by the ranks (FSDP2 pads the
       shards; each rank's program pads and cuts its own)
hsdp   the compiled step with HSDP on a (2, WORLD // 2) mesh (4 ranks: 2 replicas of 2 shards),
       against the same training in one process and eager FSDP2 HSDP
fsdp_tp the compiled step with FSDP on dimension 0 of a (dp, tp) = (2, WORLD // 2) mesh over
       tensor parallelism on dimension 1 (tensor_parallel.py's plan), against one process
       and the same model's eager FSDP2 + TP steps
model  the stock recipe, torch.compile(model): FSDP2's hooks run eagerly between the
       blocks' programs; also what fullgraph=True says about them

Writes $TORCHTPU_TEST_OUT/rank<r>.json: {scenario: result}. The model, data and steps are
examples/distributed/fsdp2.py's (one launch: start-up is most of the time).
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

import torchtpu

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "distributed"))
from _common import rank_world, report  # noqa: E402
from common import LR, batches, make_model, reference_losses  # noqa: E402
from fsdp2 import compiled_step, eager_step  # noqa: E402

RANK, WORLD = rank_world()
STEPS = 4
Step = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
Batch = tuple[torch.Tensor, torch.Tensor]
mse_loss = torch.nn.functional.mse_loss


def sharded_model(mp: MixedPrecisionPolicy | None = None, mesh_shape: tuple[int, ...] = (WORLD,)) -> torch.nn.Module:
    names = ("replicate", "shard") if len(mesh_shape) == 2 else None
    mesh = init_device_mesh("tpu", mesh_shape, mesh_dim_names=names)
    model = make_model().to("tpu")
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=mp or MixedPrecisionPolicy())
    return fully_shard(model, mesh=mesh, mp_policy=mp or MixedPrecisionPolicy())


def run(
    steps: list[Step], data: list[Batch] | None = None, shard: tuple[int, int] = (WORLD, RANK)
) -> tuple[list[float], list[dict[str, int]]]:
    """One step function per batch (``shard``: the batch is cut in that many parts, this rank
    takes that one): each rank's loss averaged over the ranks, and the programs each step
    compiled and ran (the step alone, not the loss's all_reduce)."""
    losses, counts = [], []
    parts, index = shard
    for step, (x, y) in zip(steps, data or batches(len(steps))):
        xs, ys = x.chunk(parts)[index].to("tpu"), y.chunk(parts)[index].to("tpu")
        before = torchtpu.metrics.snapshot()
        loss = step(xs, ys)
        after = torchtpu.metrics.snapshot()
        counts.append({k: after[k] - before[k] for k in ("executions", "compiles")})
        loss = loss.detach().float().reshape(1)
        dist.all_reduce(loss, op=dist.ReduceOp.AVG)
        losses.append(loss.item())
    return losses, counts


def compared(losses: list[float], counts: list[dict[str, int]], ref: list[float] | None = None) -> dict:
    """The result: with the single-process losses (the example's, unless ``ref``)."""
    ref = ref or reference_losses(steps=len(losses))
    return {"losses": losses, "reference": ref, "max_diff": max(abs(a - b) for a, b in zip(losses, ref)), "counts": counts}


def step() -> dict:
    """STEPS compiled steps, then an eager FSDP2 step on the same model and shards."""
    model = sharded_model()
    losses, counts = run([compiled_step(model)] * STEPS + [eager_step(model)])
    return compared(losses, counts)


def bf16() -> dict:
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    compiled = run([compiled_step(sharded_model(mp))] * STEPS)
    eager = run([eager_step(sharded_model(mp))] * STEPS)[0]
    return {**compared(*compiled), "eager_fsdp2": eager}


def uneven() -> dict:
    def mlp() -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3)).to("tpu")

    g = torch.Generator().manual_seed(3)
    data = [(torch.randn(4, 6, generator=g), torch.randn(4, 3, generator=g)) for _ in range(STEPS)]
    ref_model = mlp()
    opt = torch.optim.SGD(ref_model.parameters(), lr=LR)
    ref = []
    for x, y in data:  # one process, the whole batch
        loss = mse_loss(ref_model(x.to("tpu")), y.to("tpu"))
        loss.backward()
        opt.step()
        opt.zero_grad()
        ref.append(loss.item())
    sharded = fully_shard(mlp(), mesh=init_device_mesh("tpu", (WORLD,)))
    shards = {n: list(p.to_local().shape) for n, p in sharded.named_parameters()}
    return {**compared(*run([compiled_step(sharded, mse_loss)] * STEPS, data), ref), "shards": shards}


def hsdp() -> dict:
    mesh_shape = (2, WORLD // 2)
    compiled = run([compiled_step(sharded_model(mesh_shape=mesh_shape))] * STEPS)
    eager = run([eager_step(sharded_model(mesh_shape=mesh_shape))] * STEPS)[0]
    model = sharded_model(mesh_shape=mesh_shape)
    placements = sorted({str(tuple(p.placements)) for p in model.parameters()})
    return {**compared(*compiled), "eager_fsdp2": eager, "placements": placements}


def tp_sharded_model() -> tuple[torch.nn.Module, int]:
    """tensor_parallel.py's plan on mesh["tp"], then fully_shard on mesh["dp"]; and this
    rank's data-parallel index (the tp ranks of one dp index share a batch)."""
    mesh = init_device_mesh("tpu", (2, WORLD // 2), mesh_dim_names=("dp", "tp"))
    model = make_model().to("tpu")
    col, row = ColwiseParallel, RowwiseParallel
    plan = {"attn.q": col(), "attn.k": col(), "attn.v": col(), "attn.o": row(), "fc1": col(), "fc2": row()}
    for block in model.blocks:
        parallelize_module(block, mesh["tp"], plan)
    for block in model.blocks:
        fully_shard(block, mesh=mesh["dp"])
    return fully_shard(model, mesh=mesh["dp"]), mesh["dp"].get_local_rank()


def fsdp_tp() -> dict:
    model, dp = tp_sharded_model()
    compiled = run([compiled_step(model)] * STEPS, shard=(2, dp))
    model, dp = tp_sharded_model()
    eager = run([eager_step(model)] * STEPS, shard=(2, dp))[0]
    placements = sorted({str(tuple(p.placements)) for p in model.parameters()})
    return {**compared(*compiled), "eager_fsdp2": eager, "placements": placements}


def model() -> dict:
    result = compared(*run([eager_step(sharded_model(), compile_model=True)] * STEPS))
    # Dynamo marked the frames it gave up on above as skipped: a fullgraph compile would
    # then run them eagerly without a word
    torch._dynamo.reset()
    try:  # FSDP2's hooks are torch._dynamo.disable'd: a full graph is refused
        x = batches(1)[0][0].chunk(WORLD)[RANK].to("tpu")
        torch.compile(sharded_model(), backend="tpu", fullgraph=True)(x)
        result["fullgraph_error"] = None
    except Exception as e:  # noqa: BLE001 - reported to the test
        result["fullgraph_error"] = f"{type(e).__name__}: {e}"[:600]
    return result


if __name__ == "__main__":
    dist.init_process_group("tpu")
    results = {}
    for name in sys.argv[1].split(","):
        try:
            results[name] = {"step": step, "bf16": bf16, "uneven": uneven, "hsdp": hsdp, "fsdp_tp": fsdp_tp, "model": model}[
                name
            ]()
        except Exception:  # noqa: BLE001 - reported to the test
            results[name] = {"error": traceback.format_exc()[-4000:]}
    report(results)
    dist.destroy_process_group()
