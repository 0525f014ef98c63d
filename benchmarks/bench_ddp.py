"""DDP training step of the MLP workload on 2 processes against the 1-process full-batch step,
measured in the same run.

    python benchmarks/bench_ddp.py [--steps 20] [--transports host,xla] [--defer]
    python benchmarks/bench_ddp.py --profile [--transports host]     # the overlap timeline

The workload is bench_compile.py's MLP (1024-1024-1024-10, batch 64, cross-entropy, SGD);
each DDP rank trains on half of the batch. Rows, medians of ``--steps`` steps after two
warm-up steps, each step ending with ``torch.tpu.synchronize()``:

- ``1 process, batch 64``: the reference;
- ``DDP <transport>``: 2 processes, batch 32 each, DDP's default buckets, asynchronous
  all_reduce (the communication of a bucket overlaps the rest of the backward);
- ``DDP <transport>, no overlap``: the same with a comm hook that all-reduces each bucket
  synchronously (what DDP did when every collective completed before returning);
- ``PyTorch CPU: ...``: the same step on CPU tensors, one process and DDP over gloo, as a
  reference for what two processes gain on this machine at all (on two cores, one process
  already keeps both busy, and each DDP rank gets one).

The 2-process rows run with ``OMP_NUM_THREADS=1``, as torchrun starts its workers.

``--defer`` adds the same under DeferAndFuse (``TORCHTPU_DEFER_AND_FUSE=1``), against a
1-process DeferAndFuse step: DDP on the xla transport, whose bucket all_reduces are recorded
into the backward's graphs, with the cross-rank check (a graph per bucket) and without it
(``TORCHTPU_DIST_CHECK=0``: the backward and its all_reduces in one program).

``--profile`` runs one DDP forward and backward under ``torch.profiler`` (all threads,
``torchtpu.profiler.device_timing``) on each rank and prints rank 0's timeline: the
backward nodes, each bucket's communication span (``torchtpu::collective``), and how long
they overlap.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
from typing import Any, NamedTuple

B, D, H, C, LR = 64, 1024, 1024, 10, 0.01


def _model() -> Any:
    import torch
    import torch.nn as nn

    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(D, H), nn.ReLU(), nn.Linear(H, H), nn.ReLU(), nn.Linear(H, C))


def _batch(rank: int, world: int, device: str) -> tuple[Any, Any]:
    import torch

    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(B, D, generator=g), torch.randint(0, C, (B,), generator=g)
    return x.chunk(world)[rank].to(device), y.chunk(world)[rank].to(device)


def _sync_hook(state, bucket):  # noqa: ANN001, ANN202 - DDP rejects a hook annotated other than GradBucket
    """A comm hook that all-reduces the bucket before returning: no overlap."""
    import torch
    import torch.distributed as dist

    buf = bucket.buffer()
    buf.div_(dist.get_world_size())
    dist.all_reduce(buf)
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(buf)
    return fut


def _step_fn(model: Any, rank: int, world: int, device: str = "tpu") -> Any:
    import torch
    import torch.nn.functional as F

    opt = torch.optim.SGD(model.parameters(), lr=LR)
    x, y = _batch(rank, world, device)
    synchronize = torch.tpu.synchronize if device == "tpu" else (lambda: None)  # CPU ops are done on return

    def step() -> float:
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        synchronize()
        return loss

    return step


def _median_ms(step: Any, steps: int, barrier: Any = None) -> float:
    times = []
    for i in range(steps + 2):
        if barrier is not None:
            barrier()
        t0 = time.perf_counter()
        step()
        if i >= 2:
            times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def single(steps: int, device: str) -> None:
    import torch  # noqa: F401 - loads the tpu device

    print(f"RESULT single {_median_ms(_step_fn(_model().to(device), 0, 1, device), steps):.3f}", flush=True)


def ddp(steps: int, transport: str, overlap: bool, device: str) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    os.environ["TORCHTPU_COLLECTIVES"] = transport
    dist.init_process_group("tpu" if device == "tpu" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    model = DDP(_model().to(device))
    if not overlap:
        model.register_comm_hook(None, _sync_hook)
    ms = _median_ms(_step_fn(model, rank, world, device), steps, lambda: dist.barrier(group=gloo))
    if rank == 0:
        print(f"RESULT ddp {ms:.3f}", flush=True)
    dist.destroy_process_group()


def _launch(nproc: int, args: list[str], env: dict[str, str]) -> list[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for r in range(nproc):
        e = dict(os.environ, **env, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(nproc))
        if nproc > 1:
            e.setdefault("OMP_NUM_THREADS", "1")  # as torchrun sets it
        e.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen([sys.executable, __file__, *args], env=e, stdout=subprocess.PIPE, text=True))
    outs = [p.communicate()[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit(f"a worker failed: {[p.returncode for p in procs]}")
    return outs


def _result(outs: list[str]) -> float:
    for out in outs:
        for line in out.splitlines():
            if line.startswith("RESULT "):
                return float(line.split()[2])
    raise SystemExit("no result line")


class Row(NamedTuple):
    name: str
    ms: float
    reference: str  # the name of the row it is compared with


def _ddp_row(steps: int, transport: str, overlap: bool, env: dict[str, str], device: str = "tpu") -> float:
    args = ["--worker", "ddp", "--steps", str(steps), "--transports", transport, "--device", device]
    return _result(_launch(2, args + ([] if overlap else ["--no-overlap"]), env))


def table(steps: int, transports: list[str], defer: bool) -> None:
    single_args = ["--worker", "single", "--steps", str(steps)]
    eager_ref = "1 process, batch 64"
    rows = [Row(eager_ref, _result(_launch(1, single_args, {})), eager_ref)]
    cpu_ref = "PyTorch CPU: 1 process, batch 64"
    rows.append(Row(cpu_ref, _result(_launch(1, [*single_args, "--device", "cpu"], {})), cpu_ref))
    rows.append(Row("PyTorch CPU: DDP gloo, 2 x batch 32", _ddp_row(steps, "host", True, {}, "cpu"), cpu_ref))
    for tr in transports:
        for overlap in (True, False):
            name = f"DDP {tr}" + ("" if overlap else ", no overlap") + ", 2 x batch 32"
            rows.append(Row(name, _ddp_row(steps, tr, overlap, {}), eager_ref))
    if defer:
        on = {"TORCHTPU_DEFER_AND_FUSE": "1"}
        defer_ref = "DeferAndFuse: 1 process, batch 64"
        rows.append(Row(defer_ref, _result(_launch(1, single_args, on)), defer_ref))
        rows.append(Row("DeferAndFuse: DDP xla, 2 x batch 32", _ddp_row(steps, "xla", True, on), defer_ref))
        no_check = dict(on, TORCHTPU_DIST_CHECK="0")
        rows.append(Row("DeferAndFuse: DDP xla, no check", _ddp_row(steps, "xla", True, no_check), defer_ref))
    ms_of = {r.name: r.ms for r in rows}
    print(f"MLP {D}-{H}-{H}-{C} SGD step, median of {steps} (a shared machine: compare ratios)")
    print(f"{'configuration':<38} | {'step ms':>8} | {'x 1 process':>11}")
    for r in rows:
        print(f"{r.name:<38} | {r.ms:8.2f} | {r.ms / ms_of[r.reference]:11.2f}")


# -- the overlap timeline ------------------------------------------------------------------------
def profile(transport: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import torchtpu.profiler

    os.environ["TORCHTPU_COLLECTIVES"] = transport
    dist.init_process_group("tpu")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = DDP(_model().to("tpu"))
    step = _step_fn(model, rank, world)
    x, y = _batch(rank, world, "tpu")
    for _ in range(3):
        step()
    # device_timing: each backward program's span lasts until the device finished it, so
    # the spans show when the device computed, not only when Python enqueued
    torchtpu.profiler.device_timing(True)
    config = torch._C._profiler._ExperimentalConfig(profile_all_threads=True)  # the worker threads too
    with torch.profiler.profile(experimental_config=config) as prof:
        torch.nn.functional.cross_entropy(model(x), y).backward()
        torch.tpu.synchronize()
    torchtpu.profiler.device_timing(False)
    if rank == 0:
        _print_timeline(prof.events())
    dist.destroy_process_group()


_NODE = "autograd::engine::evaluate_function: "


def _print_timeline(events: Any) -> None:
    """Rank 0's backward nodes and communication spans (ms from the first backward node),
    and how long each bucket's communication overlapped backward computation."""
    spans = [(e.time_range.start / 1e3, e.time_range.end / 1e3, e.name, e.thread) for e in events]
    nodes = sorted((s, e, n.removeprefix(_NODE), th) for s, e, n, th in spans if n.startswith(_NODE))
    comm = sorted((s, e, n, th) for s, e, n, th in spans if n.startswith("torchtpu::collective"))
    if not nodes or not comm:
        print("no backward or communication spans recorded")
        return
    t0 = nodes[0][0]
    rows = [(s, e, th, n) for s, e, n, th in nodes if e - s > 0.05] + [(s, e, th, n) for s, e, n, th in comm]
    print("rank 0 timeline: backward nodes (device-timed) and bucket all_reduces, ms from the first node")
    for s, e, th, n in sorted(rows):
        print(f"  {s - t0:8.3f} - {e - t0:8.3f}  thread {th:<6} {n}")
    total = 0.0
    for i, (s, e, _, _) in enumerate(comm):
        ov = sum(max(0.0, min(e, b) - max(s, a)) for a, b, _, _ in nodes)
        total += ov
        print(f"  bucket {i}: {e - s:.3f} ms on the wire, {ov:.3f} ms of it while backward nodes ran")
    print(f"  communication overlapping the backward: {total:.3f} ms")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--transports", default="host,xla", help="comma-separated: host, xla")
    p.add_argument("--profile", action="store_true", help="print rank 0's overlap timeline of one step")
    p.add_argument("--defer", action="store_true", help="add DeferAndFuse rows (DDP on the xla transport)")
    p.add_argument("--worker", choices=["single", "ddp", "profile"], help=argparse.SUPPRESS)
    p.add_argument("--no-overlap", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--device", default="tpu", choices=["tpu", "cpu"], help=argparse.SUPPRESS)
    args = p.parse_args()
    transports = [t.strip() for t in args.transports.split(",") if t.strip()]
    if args.worker == "single":
        return single(args.steps, args.device)
    if args.worker == "ddp":
        return ddp(args.steps, transports[0], not args.no_overlap, args.device)
    if args.worker == "profile":
        return profile(transports[0])
    if args.profile:
        for tr in transports:
            print(f"== {tr} transport")
            print("".join(_launch(2, ["--worker", "profile", "--transports", tr], {})), end="")
        return
    table(args.steps, transports, args.defer)


if __name__ == "__main__":
    main()
