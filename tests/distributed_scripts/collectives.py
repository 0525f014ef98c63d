"""Every collective on tpu tensors against the same collective through gloo on CPU tensors.

Run: torchrun --nproc-per-node=2 tests/distributed_scripts/collectives.py
Writes {name: "ok" | error text} per rank (see _common.report).
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

sys.path.insert(0, os.path.dirname(__file__))
from _common import close, rank_world, report  # noqa: E402

from torchtpu.distributed.process_group import transport_kind  # noqa: E402

BACKEND = os.environ.get("TORCHTPU_TEST_BACKEND", "tpu")
results: dict[str, str] = {}


def both(name: str, fn: Callable[[str, Any], Any]) -> None:
    """Run ``fn(device, group)`` on tpu with the tpu group and on cpu with a gloo group;
    compare every returned tensor."""
    try:
        got = fn("tpu", TPU_GROUP)
        want = fn("cpu", GLOO)
        got = got if isinstance(got, list | tuple) else [got]
        want = want if isinstance(want, list | tuple) else [want]
        bad = [
            i
            for i, (a, b) in enumerate(zip(got, want))
            if a is not None and (a.device.type != b.device.type.replace("cpu", "tpu") and False or not close(a, b))
        ]
        if len(got) != len(want) or bad:
            results[name] = f"mismatch at outputs {bad}: {[g.cpu().tolist() for g in got]} vs {[w.tolist() for w in want]}"
        elif any(g is not None and g.device.type != "tpu" for g in got):
            results[name] = f"result not on tpu: {[g.device for g in got]}"
        else:
            results[name] = "ok"
    except Exception:  # noqa: BLE001 - reported to the test
        results[name] = traceback.format_exc()[-2000:]


def data(device: str, *shape: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 100 + RANK)
    if dtype.is_floating_point:
        t = torch.randn(*shape, generator=g).to(dtype)
    else:
        t = torch.randint(-50, 50, shape, generator=g).to(dtype)
    return t.to(device)


def exact(name: str, dtype: torch.dtype) -> None:
    """all_reduce of 16-bit floats on tpu against the float64 sum of every rank's values
    rounded to ``dtype`` (gloo rounds after every addition, so its own sum of 4 ranks can
    be further from the exact one than float16's tolerance)."""
    try:
        t = data("tpu", 5, dtype=dtype)
        dist.all_reduce(t, group=TPU_GROUP)
        g = [torch.Generator().manual_seed(r) for r in range(WORLD)]
        want = sum(torch.randn(5, generator=gr).to(dtype).double() for gr in g).to(dtype)
        results[name] = "ok" if close(t, want) else f"{t.cpu().tolist()} vs exact {want.tolist()}"
    except Exception:  # noqa: BLE001 - reported to the test
        results[name] = traceback.format_exc()[-2000:]


def run_all() -> None:
    W = WORLD
    for op in ["sum", "avg", "min", "max", "product"]:

        def f(d, g, op=op):
            t = data(d, 4, 3)
            dist.all_reduce(t, op=getattr(dist.ReduceOp, op.upper()), group=g)
            return t

        both(f"all_reduce_{op}", f)
    for dtype in [torch.bfloat16, torch.int32, torch.int64, torch.float16]:

        def f(d, g, dtype=dtype):
            t = data(d, 5, dtype=dtype)
            dist.all_reduce(t, group=g)
            return t

        if dtype.itemsize == 2 and transport_kind() == "host":  # summed in float32, rounded once
            exact(f"all_reduce_{str(dtype)[6:]}_vs_float64", dtype)
        else:  # XLA's all_reduce rounds after every addition in the dtype, as gloo (and NCCL) do
            both(f"all_reduce_{str(dtype)[6:]}", f)

    def view_allreduce(d, g):  # in-place on a non-contiguous view (gloo needs contiguous: reference via a copy)
        base = data(d, 4, 6)
        v = base[:, 1::2]
        if d == "cpu":
            c = v.contiguous()
            dist.all_reduce(c, group=g)
            v.copy_(c)
        else:
            dist.all_reduce(v, group=g)
        return base

    both("all_reduce_view", view_allreduce)

    def async_allreduce(d, g):
        t = data(d, 8)
        w = dist.all_reduce(t, group=g, async_op=True)
        w.wait()
        return t

    both("all_reduce_async", async_allreduce)

    def bcast(d, g):
        t = data(d, 3, 4)
        dist.broadcast(t, src=1 % W, group=g)
        return t

    both("broadcast", bcast)

    def ag(d, g):
        outs = [torch.zeros(2, 3, device=d) for _ in range(W)]
        dist.all_gather(outs, data(d, 2, 3), group=g)
        return outs

    both("all_gather", ag)

    def agt(d, g):
        out = torch.zeros(W * 2, 3, device=d)
        dist.all_gather_into_tensor(out, data(d, 2, 3), group=g)
        return out

    both("all_gather_into_tensor", agt)

    def ag_coal(d, g):
        outs = [torch.zeros(W * 2, device=d), torch.zeros(W * 3, 2, device=d)]
        ins = [data(d, 2), data(d, 3, 2, seed=1)]
        if d == "cpu":  # gloo cannot coalesce: the reference runs them one by one
            for o, i in zip(outs, ins):
                dist.all_gather_into_tensor(o, i, group=g)
            return outs
        with dist._coalescing_manager(group=g, device=torch.device(d)):
            for o, i in zip(outs, ins):
                dist.all_gather_into_tensor(o, i, group=g)
        with dist._coalescing_manager(group=g):  # the fast path: one all_gather_single_coalesced call
            for o, i in zip(outs, ins):
                dist.all_gather_into_tensor(o, i, group=g)
        return outs

    both("all_gather_into_tensor_coalesced", ag_coal)

    def ar_coal(d, g):
        ts = [data(d, 3), data(d, 2, 2, seed=1), data(d, 4, seed=2)]
        dist.all_reduce_coalesced(ts, group=g)
        return ts

    both("all_reduce_coalesced", ar_coal)

    def rs(d, g):
        out = torch.zeros(2, device=d)
        dist.reduce_scatter(out, [data(d, 2, seed=s) for s in range(W)], group=g)
        return out

    if BACKEND != "gloo":  # gloo has no list reduce_scatter: compare with the tensor variant

        def rs_ref(d, g):
            full = torch.cat([data(d, 2, seed=s) for s in range(W)])
            dist.all_reduce(full, group=g)
            return full.chunk(W)[RANK]

        try:
            a, b = rs("tpu", TPU_GROUP), rs_ref("cpu", GLOO)
            results["reduce_scatter"] = "ok" if close(a, b) else f"{a.cpu()} vs {b}"
        except Exception:  # noqa: BLE001
            results["reduce_scatter"] = traceback.format_exc()[-2000:]

    # gloo's reduce_scatter_tensor returns zeros in torch 2.13: the reference is all_reduce + chunk
    for op in ["sum", "avg", "max"]:

        def rst(d, g, op=op):
            red = getattr(dist.ReduceOp, op.upper())
            if d == "cpu":
                full = data(d, 3 * W, 2)
                dist.all_reduce(full, op=red, group=g)
                return full.chunk(W)[RANK]
            out = torch.zeros(3, 2, device=d)
            dist.reduce_scatter_tensor(out, data(d, 3 * W, 2), op=red, group=g)
            return out

        both(f"reduce_scatter_tensor_{op}", rst)

    def a2a_even(d, g):
        out = torch.zeros(2 * W, 3, device=d)
        dist.all_to_all_single(out, data(d, 2 * W, 3), group=g)
        return out

    both("all_to_all_single_even", a2a_even)

    def a2a_uneven(d, g):
        # rank r sends (r + p + 1) rows to peer p
        in_splits = [RANK + p + 1 for p in range(W)]
        out_splits = [p + RANK + 1 for p in range(W)]
        out = torch.zeros(sum(out_splits), 2, device=d)
        dist.all_to_all_single(out, data(d, sum(in_splits), 2), out_splits, in_splits, group=g)
        return out

    both("all_to_all_single_uneven", a2a_uneven)

    def a2a_list(d, g):
        outs = [torch.zeros(2, device=d) for _ in range(W)]
        dist.all_to_all(outs, [data(d, 2, seed=s) for s in range(W)], group=g)
        return outs

    if BACKEND != "gloo":  # gloo has no list all_to_all: compare with all_to_all_single
        try:
            a = a2a_list("tpu", TPU_GROUP)
            ref = torch.zeros(2 * W)
            dist.all_to_all_single(ref, torch.cat([data("cpu", 2, seed=s) for s in range(W)]), group=GLOO)
            results["all_to_all"] = "ok" if close(torch.cat([x.cpu() for x in a]), ref) else "mismatch"
        except Exception:  # noqa: BLE001
            results["all_to_all"] = traceback.format_exc()[-2000:]

    def gather(d, g):
        outs = [torch.zeros(3, device=d) for _ in range(W)] if RANK == 0 else None
        t = data(d, 3)
        dist.gather(t, outs, dst=0, group=g)
        return outs if RANK == 0 else t

    both("gather", gather)

    def scatter(d, g):
        out = torch.zeros(2, 2, device=d)
        ins = [data(d, 2, 2, seed=s) for s in range(W)] if RANK == 1 % W else None
        dist.scatter(out, ins, src=1 % W, group=g)
        return out

    both("scatter", scatter)

    def reduce(d, g):
        t = data(d, 4)
        dist.reduce(t, dst=0, op=dist.ReduceOp.MAX, group=g)
        return t if RANK == 0 else data(d, 1) * 0  # only the root's value is defined

    both("reduce", reduce)

    def p2p(d, g):
        if W < 2:
            return data(d, 1)
        t = data(d, 5)
        if RANK == 0:
            dist.send(t, dst=1, group=g)
        elif RANK == 1:
            dist.recv(t, src=0, group=g)
        return t

    both("send_recv", p2p)

    def barrier(d, g):
        dist.barrier(group=g)
        return data(d, 1)

    both("barrier", barrier)

    def functional(d, g):
        t = data(d, 4, 2)
        a = funcol.all_reduce(t, "sum", g)
        b = funcol.all_gather_tensor(t, 0, g)
        if d == "cpu":
            full = data(d, 2 * W, 2)
            dist.all_reduce(full, group=g)
            c = full.chunk(W)[RANK]
        else:
            c = funcol.reduce_scatter_tensor(data(d, 2 * W, 2), "sum", 0, g)
        return [funcol.wait_tensor(x) for x in (a, b)] + [funcol.wait_tensor(c) if d != "cpu" else c]

    both("functional_collectives", functional)

    def subgroup(d, g):
        sub = SUB_TPU if d == "tpu" else SUB_GLOO
        t = data(d, 3)
        if RANK in SUB_RANKS:
            dist.all_reduce(t, group=sub)
        return t

    both("new_group", subgroup)


if __name__ == "__main__":
    RANK, WORLD = rank_world()
    dist.init_process_group(BACKEND)
    TPU_GROUP = dist.group.WORLD
    GLOO = dist.new_group(backend="gloo")
    SUB_RANKS = [0, WORLD - 1]
    SUB_TPU = dist.new_group(SUB_RANKS, backend="tpu")
    SUB_GLOO = dist.new_group(SUB_RANKS, backend="gloo")
    run_all()
    report(results)
    dist.destroy_process_group()
