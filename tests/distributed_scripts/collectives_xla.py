"""What the xla transport adds to collectives.py's checks (run with TORCHTPU_COLLECTIVES=xla).

    TORCHTPU_COLLECTIVES=xla torchrun --nproc-per-node=2 tests/distributed_scripts/collectives_xla.py [--no-base]

Also runs collectives.py's checks (every collective against gloo on CPU tensors) first,
unless --no-base. The reference for every result is computed on the CPU from all ranks' inputs (gathered
through a gloo group), in float64 where it rounds. Writes {name: "ok" | error text}.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

sys.path.insert(0, os.path.dirname(__file__))
from _common import rank_world, report  # noqa: E402

results: dict[str, str] = {}
RO = dist.ReduceOp


def case(name: str, fn: Callable[[], str | None]) -> None:
    try:
        results[name] = fn() or "ok"
    except Exception:  # noqa: BLE001 - reported to the test
        results[name] = traceback.format_exc()[-2000:]


def data(*shape: int, dtype: torch.dtype = torch.float32, rank: int | None = None, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 100 + (RANK if rank is None else rank))
    if dtype is torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_complex:
        return torch.randn(*shape, generator=g, dtype=dtype)
    if dtype.is_floating_point:
        return torch.randn(*shape, generator=g).to(dtype)
    lo = 0 if dtype is torch.uint8 else -50
    return torch.randint(lo, 50, shape, generator=g).to(dtype)


def everyone(*shape: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> list[torch.Tensor]:
    """Every rank's ``data(...)``: computed locally (the data depends only on the rank)."""
    return [data(*shape, dtype=dtype, rank=r, seed=seed) for r in range(WORLD)]


def same(got: torch.Tensor, want: torch.Tensor, exact: bool = False) -> str | None:
    got = got.cpu()
    if got.dtype != want.dtype or got.shape != want.shape:
        return f"got {got.dtype}{list(got.shape)}, want {want.dtype}{list(want.shape)}"
    if exact:
        ok = torch.equal(got.view(torch.uint8), want.view(torch.uint8)) if got.dtype.itemsize == 1 else _bits_equal(got, want)
    else:
        try:
            torch.testing.assert_close(got, want)
            ok = True
        except AssertionError:
            ok = False
    return None if ok else f"got {got.tolist()} want {want.tolist()}"


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype.is_complex:
        a, b = torch.view_as_real(a), torch.view_as_real(b)
    view = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.dtype.itemsize]
    return torch.equal(a.contiguous().view(view), b.contiguous().view(view))


def reference(op: str, xs: list[torch.Tensor]) -> torch.Tensor:
    dtype = xs[0].dtype
    wide = torch.float64 if dtype.is_floating_point else (torch.complex128 if dtype.is_complex else torch.int64)
    s = torch.stack([x.to(wide) for x in xs])
    if dtype is torch.bool:
        s = s.bool()
        out = {"sum": s.any(0), "max": s.any(0), "bor": s.any(0), "product": s.all(0), "min": s.all(0), "band": s.all(0)}.get(op)
        return out if out is not None else (s.sum(0) % 2).bool()
    if op in ("band", "bor", "bxor"):
        acc = s[0]
        for x in s[1:]:
            acc = {"band": acc & x, "bor": acc | x, "bxor": acc ^ x}[op]
        return acc.to(dtype)
    out = {
        "sum": s.sum(0),
        "product": s.prod(0),
        "min": s.amin(0) if op == "min" else None,
        "max": s.amax(0) if op == "max" else None,
    }
    if op == "avg":
        total = s.sum(0)
        return (
            (total / WORLD).to(dtype)
            if (dtype.is_floating_point or dtype.is_complex)
            else torch.div(total, WORLD, rounding_mode="floor").to(dtype)
        )
    return out[op].to(dtype)


def run_all() -> None:
    W = WORLD
    case("transport_is_xla", lambda: None if dist.group.WORLD.transport.name == "xla" else dist.group.WORLD.transport.name)

    # every reduce op and dtype the host transport supports, against a float64 / int64 reference
    combos = [
        (op, dt)
        for op in ("sum", "avg", "product", "min", "max")
        for dt in (torch.float32, torch.float64, torch.bfloat16, torch.int32, torch.int64)
    ]
    combos += [(op, dt) for op in ("band", "bor", "bxor") for dt in (torch.int32, torch.int64, torch.uint8, torch.bool)]
    combos += [
        ("sum", torch.int8),
        ("sum", torch.uint8),
        ("max", torch.float16),
        ("sum", torch.complex64),
        ("avg", torch.complex64),
    ]
    combos += [("sum", torch.bool), ("product", torch.bool)]
    for op, dt in combos:

        def f(op=op, dt=dt) -> str | None:
            t = data(3, 5, dtype=dt, seed=1).to("tpu")
            dist.all_reduce(t, op=getattr(RO, op.upper()))
            want = reference(op, everyone(3, 5, dtype=dt, seed=1))
            return same(t, want, exact=not (dt.is_floating_point or dt.is_complex) or W == 2)

        case(f"all_reduce_{op}_{str(dt)[6:]}", f)

    def broadcast_bits() -> str | None:
        bad = []
        for dt in (torch.float32, torch.bfloat16, torch.float64, torch.int64, torch.bool, torch.complex64, torch.uint8):
            src = W - 1
            special = torch.tensor([-0.0, float("nan"), float("-inf"), 1e-40]) if dt.is_floating_point else None
            x = data(6, dtype=dt, seed=2)
            if special is not None:
                x[:4] = special.to(dt)
            want = data(6, dtype=dt, seed=2, rank=src)
            if special is not None:
                want[:4] = special.to(dt)
            t = x.to("tpu")
            dist.broadcast(t, src=src)
            err = same(t, want, exact=True)
            if err:
                bad.append(f"{dt}: {err}")
        return "; ".join(bad) or None

    case("broadcast_exact_bits", broadcast_bits)

    def reduce_scatter_ops() -> str | None:
        bad = []
        for op, dt in (
            ("min", torch.float32),
            ("product", torch.float64),
            ("band", torch.int32),
            ("avg", torch.int64),
            ("sum", torch.bfloat16),
        ):
            out = torch.zeros(2, 3, dtype=dt, device="tpu")
            dist.reduce_scatter_tensor(out, data(2 * W, 3, dtype=dt, seed=3).to("tpu"), op=getattr(RO, op.upper()))
            want = reference(op, everyone(2 * W, 3, dtype=dt, seed=3)).chunk(W)[RANK]
            err = same(out, want)
            if err:
                bad.append(f"{op} {dt}: {err}")
        return "; ".join(bad) or None

    case("reduce_scatter_tensor_ops", reduce_scatter_ops)

    def reduce_scatter_list() -> str | None:
        out = torch.zeros(4, device="tpu")
        dist.reduce_scatter(out, [data(4, seed=10 + p).to("tpu") for p in range(W)], op=RO.MAX)
        return same(out, reference("max", [data(4, seed=10 + RANK, rank=r) for r in range(W)]))

    case("reduce_scatter_list_max", reduce_scatter_list)

    def a2a_uneven_rows() -> str | None:
        # rank r sends (r * p) % 3 rows of width 2x2 to peer p: some splits are empty
        ins = [(RANK * p) % 3 for p in range(W)]
        outs = [(p * RANK) % 3 for p in range(W)]
        x = torch.arange(sum(ins) * 4, dtype=torch.float32).reshape(-1, 2, 2) + 100 * RANK
        out = torch.full((sum(outs), 2, 2), -1.0, device="tpu")
        dist.all_to_all_single(out, x.to("tpu"), outs, ins)
        pieces = []
        for p in range(W):
            p_ins = [(p * q) % 3 for q in range(W)]
            px = torch.arange(sum(p_ins) * 4, dtype=torch.float32).reshape(-1, 2, 2) + 100 * p
            start = sum(p_ins[:RANK])
            pieces.append(px[start : start + p_ins[RANK]])
        return same(out, torch.cat(pieces))

    case("all_to_all_single_uneven_rows", a2a_uneven_rows)

    def gather_views() -> str | None:
        base = torch.zeros(W, 3, 2, device="tpu")
        outs = [base[i, :, 1] for i in range(W)]  # strided views: copied into
        dist.all_gather(outs, data(3, seed=4).to("tpu"))
        want = torch.zeros(W, 3, 2)
        want[:, :, 1] = torch.stack(everyone(3, seed=4))
        return same(base, want)

    case("all_gather_into_views", gather_views)

    def gather_bool_bf16() -> str | None:
        bad = []
        for dt in (torch.bool, torch.bfloat16, torch.int8):
            out = torch.zeros(W * 4, dtype=dt, device="tpu")
            dist.all_gather_into_tensor(out, data(4, dtype=dt, seed=5).to("tpu"))
            err = same(out, torch.cat(everyone(4, dtype=dt, seed=5)), exact=True)
            if err:
                bad.append(f"{dt}: {err}")
        return "; ".join(bad) or None

    case("all_gather_dtypes", gather_bool_bf16)

    def p2p_ring() -> str | None:
        # each rank sends to the next and receives from the previous, twice (cached programs)
        bad = []
        for step in range(2):
            send = (data(5, seed=6 + step) + 0).to("tpu")
            recv = torch.zeros(5, device="tpu")
            nxt, prv = (RANK + 1) % W, (RANK - 1) % W
            if RANK % 2 == 0:
                dist.send(send, nxt)
                dist.recv(recv, prv)
            else:
                dist.recv(recv, prv)
                dist.send(send, nxt)
            err = same(recv, data(5, seed=6 + step, rank=prv))
            if err:
                bad.append(f"step {step}: {err}")
        return "; ".join(bad) or None

    if W % 2 == 0:
        case("send_recv_ring", p2p_ring)

    def cached() -> str | None:
        import torchtpu.metrics as m

        t = torch.ones(7, device="tpu")
        dist.all_reduce(t)
        t.cpu()  # DeferAndFuse records the all_reduce: its program compiles when it runs
        before = m.snapshot()["compiles"]
        for _ in range(3):
            dist.all_reduce(t)
        after = m.snapshot()["compiles"]
        err = same(t, torch.full((7,), float(W**4)))
        return err or (None if after == before else f"{after - before} compiles for repeated all_reduce")

    case("programs_cached", cached)

    def mesh_dims() -> str | None:
        if W % 2:
            return None
        mesh = init_device_mesh("tpu", (2, W // 2), mesh_dim_names=("dp", "tp"))
        bad = []
        for dim in ("dp", "tp"):
            g = mesh.get_group(dim)
            members = dist.get_process_group_ranks(g)
            t = torch.tensor([float(RANK + 1)], device="tpu")
            dist.all_reduce(t, group=g)
            want = torch.tensor([float(sum(r + 1 for r in members))])
            if g.transport.name != "xla":
                bad.append(f"{dim}: transport {g.transport.name}")
            err = same(t, want)
            if err:
                bad.append(f"{dim} {members}: {err}")
            out = torch.zeros(len(members), device="tpu")
            dist.all_gather_into_tensor(out, torch.tensor([float(RANK)], device="tpu"), group=g)
            err = same(out, torch.tensor([float(r) for r in members]))
            if err:
                bad.append(f"{dim} all_gather {members}: {err}")
        return "; ".join(bad) or None

    case("device_mesh_dims", mesh_dims)

    def subgroup_bcast() -> str | None:
        members = list(range(1, W)) if W > 2 else [0, 1]
        g = dist.new_group(members, backend="tpu")
        if RANK not in members:
            return None
        t = data(3, seed=7).to("tpu")
        dist.broadcast(t, src=members[-1], group=g)
        return same(t, data(3, seed=7, rank=members[-1]), exact=True)

    case("subgroup_broadcast", subgroup_bcast)


def run_base() -> None:
    """collectives.py's checks (every collective against gloo) in the same processes, so a
    test pays for one start-up and one XLA runtime."""
    import collectives as base

    base.RANK, base.WORLD = RANK, WORLD
    base.TPU_GROUP = dist.group.WORLD
    base.GLOO = dist.new_group(backend="gloo")
    base.SUB_RANKS = [0, WORLD - 1]
    base.SUB_TPU = dist.new_group(base.SUB_RANKS, backend="tpu")
    base.SUB_GLOO = dist.new_group(base.SUB_RANKS, backend="gloo")
    base.run_all()
    results.update({f"base/{k}": v for k, v in base.results.items()})


if __name__ == "__main__":
    RANK, WORLD = rank_world()
    dist.init_process_group("tpu")
    if "--no-base" not in sys.argv:
        run_base()
    run_all()
    report(results)
    dist.destroy_process_group()
