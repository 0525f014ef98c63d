"""Functional collectives inside torch.compile(backend="tpu") programs. One scenario per run:

    RANK=r WORLD_SIZE=n MASTER_ADDR=127.0.0.1 MASTER_PORT=p python compiled_collectives.py SCENARIO[,SCENARIO]

collectives  a compiled function with every functional collective, against gloo on CPU tensors;
             with 4 ranks also a 2x2 DeviceMesh (collectives on both dimensions in one program)
tp           a compiled tensor-parallel MLP training step (forward, backward, SGD) against the
             same training in one process; the programs and compiles of every step
kill         rank 1 is SIGKILLed after warm-up; rank 0 runs the compiled step again
mismatch     compiled functions whose collectives depend on the rank (reduce op, shape): an
             error on every rank, not mixed values or a gloo abort; a rank's own constant is fine
lonely       rank 1 compiles a graph with a collective that rank 0 never compiles

Writes $TORCHTPU_TEST_OUT/rank<r>.json: {scenario: result}, where collectives' result is
{name: "ok" | error} and tp's the losses and per-step counts; kill writes {"error": ...,
"seconds": ...}. Several scenarios in one run share the processes' start-up (~15 s).
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

import torchtpu

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "distributed"))
from _common import attempt, rank_world, report  # noqa: E402
from tensor_parallel import compiled_step  # noqa: E402

RANK, WORLD = rank_world()
STEPS, LR = 4, 0.1


def data(*shape: int, seed: int = 0, rank: int | None = None) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 100 + (RANK if rank is None else rank))
    return torch.randn(*shape, generator=g)


def counted(fn: Callable[[], object]) -> tuple[object, dict[str, int]]:
    """``fn()`` and the programs it compiled and ran."""
    before = torchtpu.metrics.snapshot()
    out = fn()
    after = torchtpu.metrics.snapshot()
    return out, {k: after[k] - before[k] for k in ("executions", "compiles")}


# -- every functional collective against gloo ------------------------------------------------------
def all_collectives(group: dist.ProcessGroup) -> Callable[..., tuple[torch.Tensor, ...]]:
    @torch.compile(backend="tpu", fullgraph=True)
    def f(x: torch.Tensor, i: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            funcol.all_reduce(x * 2, "sum", group),
            funcol.all_reduce(x, "avg", group),
            funcol.all_reduce(x, "max", group),
            funcol.all_reduce(i, "bor", group),
            funcol.all_gather_tensor(x, 0, group),
            funcol.reduce_scatter_tensor(x, "sum", 0, group),
            funcol.all_to_all_single(x, None, None, group),
            funcol.broadcast(x + 1, WORLD - 1, group),
            *funcol.all_reduce_coalesced([x, i.float()], "sum", group),
            *funcol.all_gather_into_tensor_coalesced([x, x * 3], group),
            *funcol.reduce_scatter_tensor_coalesced([x, x * 3], "sum", [0, 0], group),
        )

    return f


def gloo_reference(x: torch.Tensor, i: torch.Tensor, gloo: dist.ProcessGroup) -> list[torch.Tensor]:
    def reduced(t: torch.Tensor, op: dist.ReduceOp) -> torch.Tensor:
        t = t.clone()
        dist.all_reduce(t, op=op, group=gloo)
        return t

    gathered = torch.empty(WORLD * x.shape[0], *x.shape[1:])
    dist.all_gather_into_tensor(gathered, x, group=gloo)
    scattered = torch.empty(x.shape[0] // WORLD, *x.shape[1:])
    dist.reduce_scatter_tensor(scattered, x.clone(), group=gloo)
    exchanged = torch.empty_like(x)
    dist.all_to_all_single(exchanged, x.clone(), group=gloo)
    root = x + 1
    dist.broadcast(root, WORLD - 1, group=gloo)
    ibor = torch.tensor([int(v) for v in i])
    for r in range(WORLD):  # gloo has no BOR: the reference from every rank's data
        ibor |= int_data(r)
    return [
        reduced(x * 2, dist.ReduceOp.SUM),
        reduced(x, dist.ReduceOp.SUM) / WORLD,
        reduced(x, dist.ReduceOp.MAX),
        ibor,
        gathered,
        scattered,
        exchanged,
        root,
        reduced(x, dist.ReduceOp.SUM),
        reduced(i.float(), dist.ReduceOp.SUM),
        gathered,
        gathered * 3,
        scattered,
        scattered * 3,
    ]


def int_data(rank: int) -> torch.Tensor:
    return torch.tensor([1 << rank, 3, rank + 8, -rank], dtype=torch.int32)


def check_collectives(results: dict[str, str]) -> None:
    gloo = dist.new_group(backend="gloo")
    x, i = data(4 * WORLD, 3, seed=1), int_data(RANK)
    f = all_collectives(dist.group.WORLD)
    f(x.to("tpu"), i.to("tpu"))  # warm-up: compiles
    got, counts = counted(lambda: [t.cpu() for t in f(x.to("tpu"), i.to("tpu"))])
    names = ["all_reduce_sum", "all_reduce_avg", "all_reduce_max", "all_reduce_bor", "all_gather_into_tensor"]
    names += ["reduce_scatter_tensor", "all_to_all_single", "broadcast", "all_reduce_coalesced_0", "all_reduce_coalesced_1"]
    names += ["all_gather_coalesced_0", "all_gather_coalesced_1", "reduce_scatter_coalesced_0", "reduce_scatter_coalesced_1"]
    for name, g, want in zip(names, got, gloo_reference(x, i, gloo)):
        results[name] = "ok" if torch.allclose(g, want.to(g.dtype)) and g.shape == want.shape else f"got {g} want {want}"
    # the two tensors moved in + one program with every collective inside, no compile
    results["one_program"] = "ok" if counts == {"executions": 1, "compiles": 0} else str(counts)


def check_2d_mesh(results: dict[str, str]) -> None:
    """A 2x2 mesh: one program with collectives on both dimensions (the partition of the
    ranks into each dimension's groups is learnt at compile time)."""
    mesh = init_device_mesh("tpu", (2, WORLD // 2), mesh_dim_names=("dp", "tp"))
    dp, tp = mesh.get_group("dp"), mesh.get_group("tp")

    @torch.compile(backend="tpu", fullgraph=True)
    def f(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return funcol.all_reduce(funcol.all_reduce(x, "sum", tp), "max", dp), funcol.all_gather_tensor(x, 0, dp)

    x = data(2, 3, seed=2)
    got, counts = counted(lambda: [t.cpu() for t in f(x.to("tpu"))])
    coord = mesh.get_coordinate()
    everyone = [data(2, 3, seed=2, rank=r) for r in range(WORLD)]
    ranks = mesh.mesh.tolist()  # [dp][tp] -> global rank
    sums = [sum(everyone[r] for r in row) for row in ranks]  # per dp index, over tp
    want0 = torch.maximum(sums[0], sums[1])
    want1 = torch.cat([everyone[ranks[d][coord[1]]] for d in range(2)])
    ok = torch.allclose(got[0], want0) and torch.equal(got[1], want1)
    results["mesh_2d"] = "ok" if ok else f"got {got} want {want0}, {want1}"
    results["mesh_2d_one_program"] = "ok" if counts["executions"] == 1 else str(counts)


def check_redistribute(results: dict[str, str]) -> None:
    """DTensor Shard(a) -> Shard(b) in a compiled function (_dtensor.shard_dim_alltoall),
    dims that do not divide by the ranks included (DTensor pads them), with its backward
    (the reverse all_to_all, in the backward graph's program)."""
    mesh = init_device_mesh("tpu", (WORLD,))
    for shape, src, dst in (((4, 6), 0, 1), ((5, 3, 4), 2, 0), ((3, 5, 2), 0, 1)):
        name = f"redistribute_{'x'.join(map(str, shape))}_{src}to{dst}"
        full = data(*shape, seed=3, rank=0)  # the same global tensor on every rank
        leaf = full.to("tpu").requires_grad_()
        d = distribute_tensor(leaf, mesh, [Shard(src)])
        torch._dynamo.reset()  # a new dst would otherwise make Dynamo treat it as a dynamic int

        @torch.compile(backend="tpu", fullgraph=True)
        def f(d: torch.Tensor) -> torch.Tensor:
            return d.redistribute(mesh, [Shard(dst)]).to_local() * 2  # noqa: B023 - compiled and run in this iteration

        out, counts = counted(functools.partial(f, d))
        chunks = (full * 2).chunk(WORLD, dim=dst)  # DTensor's Shard: torch.chunk's sizes, then empty ones
        want = chunks[RANK] if RANK < len(chunks) else (full * 2).narrow(dst, 0, 0)
        (out * out).sum().backward()
        grad = d.grad.full_tensor().cpu() if d.grad is not None else leaf.grad.cpu()
        ok = torch.equal(out.detach().cpu(), want) and torch.allclose(grad, 8 * full)
        results[name] = "ok" if ok else f"got {out} want {want}; grad {grad} want {8 * full}"
        results[name + "_one_program"] = "ok" if counts["executions"] == 1 else str(counts)


def sent_rows(src: int, dst: int) -> int:
    """Rows rank ``src`` sends rank ``dst`` in the uneven all_to_all: 0 to 2, differing per
    pair and per direction (every rank both sends and receives uneven splits, some empty)."""
    return (2 * src + dst) % 3


def check_uneven_all_to_all(results: dict[str, str]) -> None:
    """all_to_all_single with uneven splits (Python ints, each rank its own) in a compiled
    function, forward and backward (the reverse exchange): gloo's values on CPU tensors,
    one program per call after the first."""
    gloo = dist.new_group(backend="gloo")
    ins = [sent_rows(RANK, p) for p in range(WORLD)]
    outs = [sent_rows(p, RANK) for p in range(WORLD)]

    @torch.compile(backend="tpu", fullgraph=True)
    def f(x: torch.Tensor) -> torch.Tensor:
        return funcol.all_to_all_single(x * 2, outs, ins, dist.group.WORLD) + 1

    x = data(sum(ins), 3, seed=4)
    leaf = x.to("tpu").requires_grad_()
    f(x.to("tpu"))  # warm-up: compiles
    got, counts = counted(lambda: f(x.to("tpu")).cpu())
    want = torch.empty(sum(outs), 3)
    dist.all_to_all_single(want, x * 2, outs, ins, group=gloo)
    results["all_to_all_uneven"] = "ok" if torch.equal(got, want + 1) else f"got {got} want {want + 1}"
    results["all_to_all_uneven_one_program"] = "ok" if counts == {"executions": 1, "compiles": 0} else str(counts)
    weights = data(sum(outs), 3, seed=5)  # d(sum(y * w))/dx: the weights sent back, doubled
    (f(leaf) * weights.to("tpu")).sum().backward()
    back = torch.empty(sum(ins), 3)
    dist.all_to_all_single(back, weights, ins, outs, group=gloo)
    grad = leaf.grad.cpu()
    results["all_to_all_uneven_backward"] = "ok" if torch.allclose(grad, back * 2) else f"got {grad} want {back * 2}"


def collectives() -> dict[str, str]:
    results: dict[str, str] = {}
    checks = (("collectives", check_collectives), ("mesh", check_2d_mesh), ("redistribute", check_redistribute))
    for name, fn in (*checks, ("uneven", check_uneven_all_to_all)):
        if name == "mesh" and WORLD != 4:
            continue
        try:
            fn(results)
        except Exception:  # noqa: BLE001 - reported to the test
            results[name] = traceback.format_exc()[-3000:]
    return results


# -- a tensor-parallel training step ----------------------------------------------------------------
def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)).to("tpu")


def batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(7)
    return [(torch.randn(8, 16, generator=g), torch.randn(8, 8, generator=g)) for _ in range(STEPS)]


def training_step(model: nn.Module) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """Forward, backward and the SGD update as one graph: the example's step (docs/compile.md)."""
    return compiled_step(model, nn.functional.mse_loss, LR)


def reference_losses() -> list[float]:
    """The same training in one process (eager, on tpu, no parallelism)."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for x, y in batches():
        loss = nn.functional.mse_loss(model(x.to("tpu")), y.to("tpu"))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def tp_model() -> nn.Module:
    model = mlp()
    mesh = init_device_mesh("tpu", (WORLD,))
    return parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})


def tp() -> dict:
    step = training_step(tp_model())
    losses, counts = [], []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for x, y in batches():
            x, y = x.to("tpu"), y.to("tpu")
            loss, c = counted(lambda x=x, y=y: step(x, y))
            losses.append(loss.item())
            counts.append(c)
    ref = reference_losses()
    return {
        "losses": losses,
        "reference": ref,
        "max_diff": max(abs(a - b) for a, b in zip(losses, ref)),
        "counts": counts,
        "warnings": [str(w.message) for w in caught if "torchtpu" in str(w.message)],
    }


def _error_of(fn: Callable[[], object]) -> str | None:
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the test inspects it
        return f"{type(e).__name__}: {e}"
    return None


def mismatch() -> dict:
    group = dist.group.WORLD

    @torch.compile(backend="tpu", fullgraph=True)
    def reduce_op(x: torch.Tensor) -> torch.Tensor:
        return funcol.all_reduce(x, "sum" if RANK == 0 else "max", group)

    @torch.compile(backend="tpu", fullgraph=True)
    def scaled(x: torch.Tensor) -> torch.Tensor:  # a rank's own constant: the same collectives
        return funcol.all_reduce(x * (RANK + 1), "sum", group)

    x = torch.ones(4, device="tpu")
    return {
        "reduce_op": _error_of(lambda: reduce_op(x).cpu()),
        "shape": _error_of(lambda: scaled(torch.ones(4 if RANK == 0 else 6, device="tpu")).cpu()),
        "constant": scaled(x).cpu().tolist(),
    }


def lonely() -> dict:
    @torch.compile(backend="tpu", fullgraph=True)
    def f(x: torch.Tensor) -> torch.Tensor:
        return funcol.all_reduce(x, "sum", dist.group.WORLD)

    t0 = time.perf_counter()
    error = _error_of(lambda: f(torch.ones(4, device="tpu")).cpu()) if RANK == 1 else None
    seconds = time.perf_counter() - t0
    # rank 0 stays until rank 1 has given up waiting for it (a barrier would time out first)
    store = dist.distributed_c10d._get_default_store()
    if RANK == 1:
        store.set("lonely_done", "1")
    else:
        store.wait(["lonely_done"], timedelta(seconds=100))
    return {"error": error, "seconds": seconds}


def kill() -> None:
    step = training_step(tp_model())
    batch = [t.to("tpu") for t in batches()[0]]
    step(*batch).item()  # warm-up: compiled, ran once on both ranks
    dist.barrier()
    if RANK == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.5)
    attempt(lambda: [step(*batch).item() for _ in range(3)])


if __name__ == "__main__":
    scenarios = sys.argv[1].split(",")
    timeout = timedelta(seconds=float(os.environ.get("TORCHTPU_TEST_TIMEOUT", "60")))
    dist.init_process_group("tpu", timeout=timeout)
    if scenarios == ["kill"]:
        kill()
    else:
        report({s: {"collectives": collectives, "tp": tp, "mismatch": mismatch, "lonely": lonely}[s]() for s in scenarios})
        dist.destroy_process_group()
