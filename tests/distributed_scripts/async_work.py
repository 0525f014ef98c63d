"""Asynchronous collectives on the "tpu" group: ``async_op=True`` works, futures, ordering
against synchronous collectives, coalescing blocks and DDP comm hooks.

    torchrun --nproc-per-node=2 tests/distributed_scripts/async_work.py

Writes {check: "ok" | error} per rank (TORCHTPU_COLLECTIVES picks the transport).
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn as nn
from _common import close, rank_world, report
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from torchtpu import metrics
from torchtpu.distributed.process_group import transport_kind
from torchtpu.runtime import pjrt
from torchtpu.tensor.storage import cell_of

SIZES = [1, 7, 1024, 100_000, 3]


def _value(r: int, i: int, n: int) -> torch.Tensor:
    return torch.arange(n, dtype=torch.float32) * (r + 1) + i


def _expected(world: int, i: int, n: int) -> torch.Tensor:
    return sum(_value(r, i, n) for r in range(world))


def many_in_flight(rank: int, world: int) -> None:
    """Several all_reduces in flight at once, waited in reverse order."""
    ts = [_value(rank, i, n).to("tpu") for i, n in enumerate(SIZES)]
    works = [dist.all_reduce(t, async_op=True) for t in ts]
    for w in reversed(works):
        assert w.wait() is True
    for i, (t, n) in enumerate(zip(ts, SIZES)):
        assert close(t, _expected(world, i, n)), (i, t.cpu()[:4])
    assert all(w.is_completed() for w in works)


def futures(rank: int, world: int) -> None:
    """get_future() completes with the tensors; a chained callback sees the result."""
    t = _value(rank, 0, 1000).to("tpu")
    fut = dist.all_reduce(t, async_op=True).get_future()
    doubled = fut.then(lambda f: f.value()[0] * 2)
    (res,) = fut.wait()
    assert close(res, _expected(world, 0, 1000))
    assert close(doubled.wait(), _expected(world, 0, 1000) * 2)


def ordered_with_sync(rank: int, world: int) -> None:
    """An async all_reduce, then synchronous collectives on the same tensor's peers: the
    synchronous ones run after it, every rank pairs them the same way."""
    a = _value(rank, 1, 5000).to("tpu")
    work = dist.all_reduce(a, async_op=True)
    b = torch.full((3,), float(rank), device="tpu")
    dist.broadcast(b, src=world - 1)
    c = _value(rank, 2, 10).to("tpu")
    dist.all_reduce(c)
    work.wait()
    assert close(a, _expected(world, 1, 5000)) and close(c, _expected(world, 2, 10))
    assert close(b, torch.full((3,), float(world - 1)))


def views_and_cpu(rank: int, world: int) -> None:
    """A view of a larger storage and a CPU tensor: still correct (they may run at once)."""
    base = torch.zeros(4, 8, device="tpu") + rank
    row = base[1]
    work = dist.all_reduce(row, async_op=True)
    work.wait()
    expected = torch.zeros(4, 8) + rank
    expected[1] = sum(range(world))
    assert close(base, expected)


def in_place(rank: int, world: int) -> None:
    """A whole storage's all_reduce on the host transport (cpu platform) is reduced in the
    buffer itself: a program enqueued before it still reads the old value, a read before
    ``wait()`` waits and sees the sum, as do views of the storage, and the storage can be
    updated in place afterwards. A buffer another storage shares is copied, not claimed."""
    n = 300_000  # above the inline size: reduced on the group's worker thread
    big = _value(rank, 3, n).to("tpu")
    before = big * 1
    rows = big.view(600, 500)
    claimed = metrics.snapshot().get("collectives_in_place", 0)
    work = dist.all_reduce(big, async_op=True)
    early = big + 0
    work.wait()
    expected = _expected(world, 3, n)
    assert close(before, _value(rank, 3, n)) and close(early, expected) and close(rows.reshape(-1), expected)
    big.add_(1)
    assert close(big, expected + 1)
    small = _value(rank, 4, 7).to("tpu")
    dist.all_reduce(small)  # synchronous, on the caller's thread
    assert close(small, _expected(world, 4, 7))
    if transport_kind() == "host" and pjrt.get().platform == "cpu":
        assert metrics.snapshot().get("collectives_in_place", 0) - claimed == 2
    shared = _value(rank, 5, 64).to("tpu")
    held = cell_of(shared)._buf  # another holder of the buffer (as a pending graph's input would be)
    before_shared = metrics.snapshot().get("collectives_in_place", 0)
    dist.all_reduce(shared)
    assert close(shared, _expected(world, 5, 64))
    assert metrics.snapshot().get("collectives_in_place", 0) == before_shared
    assert held is not cell_of(shared)._buf  # the old buffer was left alone: a new one holds the sum


def sum_in_check(rank: int, world: int) -> None:
    """A small SUM/AVG all_reduce on the host transport rides in the cross-rank check's own
    exchange (one gloo round trip, not two): the sum as gloo gives it, 16-bit floats summed
    exactly and rounded once, integer averages floored as gloo's path does. Small all_gathers
    (into one tensor or a list) ride in it too."""
    before = metrics.snapshot().get("collectives_in_check", 0)
    x = _value(rank, 6, 100).to("tpu")
    dist.all_reduce(x)
    halves = (torch.arange(8, dtype=torch.float64) / 3 + rank).to(torch.bfloat16)
    t = halves.to("tpu")
    dist.all_reduce(t, op=dist.ReduceOp.AVG, async_op=True).wait()
    every = [(torch.arange(8, dtype=torch.float64) / 3 + r).to(torch.bfloat16).double() for r in range(world)]
    assert close(x, _expected(world, 6, 100)) and torch.equal(t.cpu(), (sum(every) / world).to(torch.bfloat16))
    ints = torch.full((5,), rank + 1, dtype=torch.int32, device="tpu")
    dist.all_reduce(ints, op=dist.ReduceOp.AVG)
    assert ints.cpu().tolist() == [sum(range(1, world + 1)) // world] * 5
    # rank 0 gives a view (not a whole storage: its values cannot ride in the check), the
    # others a whole tensor of the same shape: every rank falls back to gloo's all_reduce
    base = torch.zeros(2, 6, device="tpu") + rank
    mixed = base[1] if rank == 0 else torch.zeros(6, device="tpu") + rank
    dist.all_reduce(mixed)
    assert close(mixed, torch.full((6,), float(sum(range(world))))), mixed.cpu()
    # small all_gathers ride in the check too (its exchange is an all_gather)
    flat = torch.empty(3 * world, dtype=torch.int64, device="tpu")
    dist.all_gather_into_tensor(flat, torch.arange(3, device="tpu") + 10 * rank)
    parts = [torch.empty(2, 2, device="tpu") for _ in range(world)]
    dist.all_gather(parts, torch.full((2, 2), float(rank), device="tpu").to(torch.bfloat16).float())
    assert flat.cpu().tolist() == [i + 10 * r for r in range(world) for i in range(3)]
    assert all(torch.equal(p.cpu(), torch.full((2, 2), float(r))) for r, p in enumerate(parts))
    if transport_kind() == "host" and os.environ.get("TORCHTPU_DIST_CHECK", "1") != "0":
        assert metrics.snapshot().get("collectives_in_check", 0) - before == 5


def coalesced(rank: int, world: int) -> None:
    ts = [_value(rank, i, n).to("tpu") for i, n in enumerate(SIZES)]
    with dist._coalescing_manager(async_ops=True) as cm:
        for t in ts:
            dist.all_reduce(t)
    cm.wait()
    for i, (t, n) in enumerate(zip(ts, SIZES)):
        assert close(t, _expected(world, i, n)), i


def all_reduce_coalesced(rank: int, world: int) -> None:
    ts = [_value(rank, i, n).to("tpu") for i, n in enumerate(SIZES)]
    dist.all_reduce_coalesced(ts, async_op=True).wait()
    for i, (t, n) in enumerate(zip(ts, SIZES)):
        assert close(t, _expected(world, i, n)), i
    ints = [torch.arange(5, device="tpu") * (rank + 1), torch.full((2, 2), rank, device="tpu")]
    dist.all_reduce_coalesced(ints, op=dist.ReduceOp.MAX, async_op=True).wait()
    assert ints[0].cpu().tolist() == [v * world for v in range(5)] and ints[1].cpu().eq(world - 1).all()


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))


def ddp_hook(rank: int, world: int) -> None:
    """DDP with Python's allreduce comm hook (futures) and small buckets: the gradients
    equal the single-process full-batch gradients."""
    g = torch.Generator().manual_seed(5)
    x, y = torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)
    ref = _model()
    nn.functional.cross_entropy(ref(x), y).backward()
    model = DDP(_model().to("tpu"), bucket_cap_mb=0.001)
    model.register_comm_hook(None, default_hooks.allreduce_hook)
    xs, ys = x.chunk(world)[rank].to("tpu"), y.chunk(world)[rank].to("tpu")
    nn.functional.cross_entropy(model(xs), ys).backward()
    for (name, p), q in zip(model.module.named_parameters(), ref.parameters()):
        assert close(p.grad, q.grad), name


CHECKS: dict[str, Callable[[int, int], None]] = {
    f.__name__: f
    for f in (many_in_flight, futures, ordered_with_sync, views_and_cpu, in_place, sum_in_check, coalesced, all_reduce_coalesced, ddp_hook)
}


def main() -> None:
    dist.init_process_group("tpu")
    rank, world = rank_world()
    results = {}
    for name, fn in CHECKS.items():
        try:
            fn(rank, world)
            results[name] = "ok"
        except Exception:  # noqa: BLE001 - reported per check
            results[name] = traceback.format_exc()[-1500:]
    report(results)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
