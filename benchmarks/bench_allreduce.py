"""all_reduce on 2 processes: tpu tensors through the "tpu" process group against gloo on
CPU tensors, measured in the same run.

    python benchmarks/bench_allreduce.py [--iters 20] [--nproc 2] [--transports host,xla]

Starts the worker processes itself (env:// rendezvous on a free local port). Prints, per
size, the median latency and bus bandwidth (2 (n-1)/n x bytes / time, the all_reduce
convention of nccl-tests) and the ratio to gloo on CPU. Each transport of the "tpu" group
is timed with its cross-rank shape check on (the default) and off (TORCHTPU_DIST_CHECK=0):
``host`` (gloo on host views) and ``xla`` (collectives as XLA programs; the default group
is created with TORCHTPU_COLLECTIVES=xla so that the processes join one XLA runtime, and
the host transport is a second "tpu" group).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

SIZES = {"4 KB": 4 << 10, "1 MB": 1 << 20, "64 MB": 64 << 20}


def _median_time(fn: Callable[[], None], iters: int, barrier: Callable[[], None]) -> float:
    times = []
    for i in range(iters + 2):
        barrier()
        t0 = time.perf_counter()
        fn()
        if i >= 2:  # two warm-up rounds (compiles, first-touch pages)
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _measure(nbytes: int, iters: int, gloo: object, groups: dict[str, object]) -> list[float]:
    """Median seconds: gloo on CPU, then per transport (check on, check off)."""
    import torch
    import torch.distributed as dist

    cpu = torch.ones(nbytes // 4)
    tpu = torch.ones(nbytes // 4).to("tpu")

    def barrier() -> None:
        dist.barrier(group=gloo)

    times = [_median_time(lambda: dist.all_reduce(cpu, group=gloo), iters, barrier)]
    for group in groups.values():

        def tpu_step(group: object = group) -> None:
            dist.all_reduce(tpu, group=group)
            torch.tpu.synchronize()

        for check in ("1", "0"):
            os.environ["TORCHTPU_DIST_CHECK"] = check
            times.append(_median_time(tpu_step, iters, barrier))
    return times


def _groups(transports: list[str]) -> dict[str, object]:
    """One "tpu" group per transport. With xla the default group must be created with it
    (it starts the XLA distributed runtime); the host transport is then a second group."""
    import torch.distributed as dist

    os.environ["TORCHTPU_COLLECTIVES"] = "xla" if "xla" in transports else "host"
    dist.init_process_group("tpu")
    groups = {os.environ["TORCHTPU_COLLECTIVES"]: dist.group.WORLD}
    for name in transports:
        if name not in groups:
            os.environ["TORCHTPU_COLLECTIVES"] = name
            groups[name] = dist.new_group(backend="tpu")
    return {name: groups[name] for name in transports}


def worker(iters: int, transports: list[str]) -> None:
    import torch.distributed as dist

    groups = _groups(transports)
    rank, world = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    rows = [(label, nbytes, _measure(nbytes, iters, gloo, groups)) for label, nbytes in SIZES.items()]
    if rank == 0:
        factor = 2 * (world - 1) / world
        print(f"all_reduce float32, {world} processes, median of {iters} (loaded shared machine: compare ratios)")
        head = f"{'size':>6} | {'gloo CPU ms':>11} {'GB/s':>6}"
        for name in groups:
            head += f" | {name + ' ms':>9} {'GB/s':>6} {'x gloo':>6} | {name + ' no-check':>14} {'x gloo':>6}"
        print(head)
        for label, nbytes, (tg, *ts) in rows:
            line = f"{label:>6} | {tg * 1e3:11.3f} {factor * nbytes / tg / 1e9:6.2f}"
            for tt, tn in zip(ts[::2], ts[1::2]):
                bw = factor * nbytes / tt / 1e9
                line += f" | {tt * 1e3:9.3f} {bw:6.2f} {tt / tg:6.2f} | {tn * 1e3:14.3f} {tn / tg:6.2f}"
            print(line)
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--transports", default="host,xla", help="comma-separated: host, xla")
    args = p.parse_args()
    transports = [t.strip() for t in args.transports.split(",") if t.strip()]
    if "RANK" in os.environ:
        worker(args.iters, transports)
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for r in range(args.nproc):
        env = dict(
            os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(args.nproc), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
        )
        env.setdefault("OMP_NUM_THREADS", "1")
        cmd = [sys.executable, __file__, "--iters", str(args.iters), "--transports", args.transports]
        procs.append(subprocess.Popen(cmd, env=env))
    sys.exit(max(p.wait() for p in procs))


if __name__ == "__main__":
    main()
