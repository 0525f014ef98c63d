"""DeferAndFuse with the xla transport: all_reduce is recorded into the pending graph.

    TORCHTPU_COLLECTIVES=xla TORCHTPU_DEFER_AND_FUSE=1 torchrun --nproc-per-node=2 \
        tests/distributed_scripts/defer_collectives.py

Every value is checked against a CPU reference computed from all ranks' inputs (each
rank's input depends only on its rank). Writes {check: "ok" | error text} per rank; the
program counts come from torchtpu.metrics.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(__file__))
from _common import close, rank_world, report  # noqa: E402

import torchtpu  # noqa: E402
from torchtpu import metrics  # noqa: E402

RANK, WORLD = rank_world()
CHECKED = os.environ.get("TORCHTPU_DIST_CHECK", "1") != "0"
results: dict[str, str] = {}


def case(name: str, fn: Callable[[], None]) -> None:
    try:
        fn()
        results[name] = "ok"
    except Exception:  # noqa: BLE001 - reported to the test
        results[name] = traceback.format_exc()[-2000:]


def data(rank: int, n: int = 6) -> torch.Tensor:
    return torch.arange(n, dtype=torch.float32) * (rank + 1) - rank


def dev(t: torch.Tensor) -> torch.Tensor:
    """``t`` on the device in a storage of its own size: a 1-d upload whose length varies
    gets a bucketed twin, and ops on it give bucketed results (``bucketed_inputs``)."""
    return t.reshape(1, -1).to("tpu").reshape(t.shape)


def counted(fn: Callable[[], None]) -> dict[str, int]:
    """What ``fn`` ran: flushes in all, flushes a collective forced, programs executed."""
    before = metrics.snapshot()
    fn()
    after = metrics.snapshot()
    n = {k: after[k] - before[k] for k in ("flushes", "executions")}
    n["flushes_collective"] = after["flushes_by_reason"].get("collective", 0) - before["flushes_by_reason"].get("collective", 0)
    return n


def fused() -> None:
    """Compute, all_reduce, compute: without the cross-rank check (a host exchange, which
    runs the graph first) it is one program; with it, the all_reduce starts the graph of
    what follows it. The value is the CPU's either way."""
    x = dev(data(RANK))
    torch.tpu.synchronize()
    out: list[torch.Tensor] = []

    def step() -> None:
        y = x * 2 + 1
        dist.all_reduce(y)
        out.append((y.sin() * 3).cpu())

    n = counted(step)
    want = sum(data(r) * 2 + 1 for r in range(WORLD)).sin() * 3
    assert close(out[0], want), (out[0], want)
    assert n["executions"] == (2 if CHECKED else 1), n
    if not CHECKED:
        assert n["flushes_collective"] == 0, n


def dropped_result() -> None:
    """An all_reduce whose tensor one rank drops before its graph runs still runs there (XLA
    deletes a collective whose result is unused: the peers would pair their next one with it)."""
    x = dev(data(RANK))
    tmp = x + 1
    dist.all_reduce(tmp)
    if RANK == 0:
        del tmp
    y = x * 3
    dist.all_reduce(y)
    assert close(y, sum(data(r) * 3 for r in range(WORLD)))


def rank_dependent_boundaries() -> None:
    """Rank 0 reads a value mid-step (its graph ends there), the others do not: the ranks'
    programs differ, their collectives meet in order."""
    x = dev(data(RANK))
    for step in range(3):
        y = x * (step + 1)
        if RANK == 0:
            y.sum().item()
        dist.all_reduce(y)
        z = y + step
        assert close(z, sum(data(r) * (step + 1) for r in range(WORLD)) + step), step


def async_work() -> None:
    """async_op=True: the work is complete at once (what reads the tensor runs after the
    all_reduce, in the same program); its future holds the tensor."""
    y = dev(data(RANK)) * 5
    work = dist.all_reduce(y, async_op=True)
    fut = work.get_future()
    assert work.wait() is True and work.is_completed()
    (res,) = fut.wait()
    assert res is y
    assert close(y, sum(data(r) * 5 for r in range(WORLD)))


def ops_and_dtypes() -> None:
    """Reductions and dtypes recorded alike; a view of a larger storage runs as its own program."""
    reference = {
        dist.ReduceOp.MAX: lambda s: s.amax(0),
        dist.ReduceOp.AVG: lambda s: s.mean(0),
        dist.ReduceOp.PRODUCT: lambda s: s.prod(0),
    }
    for op, dtype in (
        (dist.ReduceOp.MAX, torch.int32),
        (dist.ReduceOp.AVG, torch.float32),
        (dist.ReduceOp.PRODUCT, torch.float64),
    ):
        t = dev(data(RANK).to(dtype)) + 1
        dist.all_reduce(t, op=op)
        want = reference[op](torch.stack([data(r).to(dtype) + 1 for r in range(WORLD)]))
        assert close(t, want), (op, t.cpu(), want)
    base = torch.zeros(3, 4, device="tpu") + RANK
    dist.all_reduce(base[1])
    want = torch.zeros(3, 4) + RANK
    want[1] = sum(range(WORLD))
    assert close(base, want)


def gather_and_scatter() -> None:
    """all_gather_into_tensor and reduce_scatter_tensor (FSDP2's pair) recorded in one graph
    with the compute around them."""
    x = dev(data(RANK, 4))
    full = dev(data(RANK, 3 * WORLD))
    gathered = torch.empty(4 * WORLD, device="tpu")
    mine = torch.empty(3, device="tpu")

    def step() -> None:
        dist.all_gather_into_tensor(gathered, x * 2)
        dist.reduce_scatter_tensor(mine, full + 1, op=dist.ReduceOp.AVG)
        assert close(gathered + 1, torch.cat([data(r, 4) * 2 + 1 for r in range(WORLD)])), gathered.cpu()
        want = (sum(data(r, 3 * WORLD) + 1 for r in range(WORLD)) / WORLD)[3 * RANK : 3 * RANK + 3]
        assert close(mine * 1, want), (mine.cpu(), want)

    n = counted(step)
    assert n["flushes_collective"] == (2 if CHECKED else 0), n  # the check runs the graph before each


def broadcast_and_all_to_all() -> None:
    """broadcast and an even all_to_all_single, recorded like the others."""
    x = dev(data(RANK, 2 * WORLD))

    def step() -> None:
        b = x * 3
        dist.broadcast(b, src=WORLD - 1)
        out = torch.empty(2 * WORLD, device="tpu")
        dist.all_to_all_single(out, x + 1)
        assert close(b, data(WORLD - 1, 2 * WORLD) * 3), b.cpu()
        want = torch.cat([(data(r, 2 * WORLD) + 1)[2 * RANK : 2 * RANK + 2] for r in range(WORLD)])
        assert close(out, want), (out.cpu(), want)

    n = counted(step)
    assert n["flushes_collective"] == (2 if CHECKED else 0), n


def lists_to_and_from_root() -> None:
    """all_gather and gather into lists of tensors, and scatter from a list, recorded: each
    output is the CPU's (gather's and scatter's roots are different ranks)."""
    x = dev(data(RANK, 3))
    root = WORLD - 1

    def step() -> None:
        everyone = [torch.empty(3, device="tpu") for _ in range(WORLD)]
        dist.all_gather(everyone, x * 2)
        at_root = [torch.empty(3, device="tpu") for _ in range(WORLD)] if RANK == root else None
        dist.gather(x + 1, at_root, dst=root)
        mine = torch.empty(3, device="tpu")
        parts = [dev(data(r, 3)) * 10 for r in range(WORLD)] if RANK == 0 else None
        dist.scatter(mine, parts, src=0)
        for r, t in enumerate(everyone):
            assert close(t, data(r, 3) * 2), (r, t.cpu())
        if at_root is not None:
            for r, t in enumerate(at_root):
                assert close(t, data(r, 3) + 1), (r, t.cpu())
        assert close(mine, data(RANK, 3) * 10), mine.cpu()

    n = counted(step)
    assert n["flushes_collective"] == (3 if CHECKED else 0), n


def reduce_to_root() -> None:
    """reduce, recorded on every rank: the root gets the sum (and its max), the other
    ranks keep their tensors; without the check nothing is flushed for it."""
    x = dev(data(RANK))

    def step() -> None:
        y, z = x * 2, x - 1
        dist.reduce(y, dst=0)
        dist.reduce(z, dst=WORLD - 1, op=dist.ReduceOp.MAX)
        want_y = sum(data(r) * 2 for r in range(WORLD)) if RANK == 0 else data(RANK) * 2
        want_z = torch.stack([data(r) - 1 for r in range(WORLD)]).amax(0) if RANK == WORLD - 1 else data(RANK) - 1
        assert close(y, want_y), (y.cpu(), want_y)
        assert close(z, want_z), (z.cpu(), want_z)

    n = counted(step)
    assert n["flushes_collective"] == (2 if CHECKED else 0), n


def bucketed_inputs() -> None:
    """Tensors in bucketed storages (eager/buckets.py: here results of ops on ids uploaded
    at varying lengths) are exchanged without their spare rows, eager and deferred."""
    for mode in ("eager", "defer_and_fuse"):
        with torchtpu.eager_mode(mode):
            for n in (5, 7, 6):
                y = data(RANK, n).to("tpu") * 2
                gathered = torch.empty(n * WORLD, device="tpu")
                dist.all_gather_into_tensor(gathered, y)
                assert close(gathered, torch.cat([data(r, n) * 2 for r in range(WORLD)])), (mode, n, gathered.cpu())
                dist.all_reduce(y)
                assert close(y, sum(data(r, n) * 2 for r in range(WORLD))), (mode, n, y.cpu())
                ids = data(RANK, n * WORLD).to("tpu") + 0
                mine = torch.empty(n, device="tpu")
                dist.reduce_scatter_tensor(mine, ids)
                want = sum(data(r, n * WORLD) for r in range(WORLD))[n * RANK : n * (RANK + 1)]
                assert close(mine, want), (mode, n, mine.cpu(), want)


def ddp_training() -> None:
    """DDP's bucketed gradient all_reduces under DeferAndFuse: every rank's model equals a
    CPU model trained on the whole batch (the mean of the ranks' gradients)."""
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    model = DDP(nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4)).to("tpu"), bucket_cap_mb=0.0005)
    model.module.load_state_dict(ref.state_dict())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    for _ in range(4):
        xs = [torch.randn(4, 8, generator=g) for _ in range(WORLD)]
        ys = [torch.randn(4, 4, generator=g) for _ in range(WORLD)]
        opt.zero_grad()
        nn.functional.mse_loss(model(xs[RANK].to("tpu")), ys[RANK].to("tpu")).backward()
        opt.step()
        ref_opt.zero_grad()
        nn.functional.mse_loss(ref(torch.cat(xs)), torch.cat(ys)).backward()
        ref_opt.step()
    for (name, p), q in zip(model.module.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), msg=lambda m, name=name: f"{name}: {m}")


def main() -> None:
    dist.init_process_group("tpu", timeout=timedelta(seconds=60))
    assert torchtpu.get_eager_mode() == "defer_and_fuse"
    for name, fn in [
        ("fused", fused),
        ("dropped_result", dropped_result),
        ("rank_dependent_boundaries", rank_dependent_boundaries),
        ("async_work", async_work),
        ("ops_and_dtypes", ops_and_dtypes),
        ("gather_and_scatter", gather_and_scatter),
        ("broadcast_and_all_to_all", broadcast_and_all_to_all),
        ("reduce_to_root", reduce_to_root),
        ("lists_to_and_from_root", lists_to_and_from_root),
        ("bucketed_inputs", bucketed_inputs),
        ("ddp_training", ddp_training),
    ]:
        case(name, fn)
    report(results)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
