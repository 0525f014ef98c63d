"""all_reduce on 2 processes: tpu tensors through the "tpu" process group against gloo on
CPU tensors, measured in the same run.

    python benchmarks/bench_allreduce.py [--iters 20] [--nproc 2]

Starts the worker processes itself (env:// rendezvous on a free local port). Prints, per
size, the median latency and bus bandwidth (2 (n-1)/n x bytes / time, the all_reduce
convention of nccl-tests) and the ratio to gloo on CPU; the tpu group is timed with its
cross-rank shape check on (the default) and off (TORCHTPU_DIST_CHECK=0).
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


def _measure(nbytes: int, iters: int, gloo: object) -> tuple[float, float, float]:
    """(gloo on CPU, tpu group with the check, tpu group without it), median seconds."""
    import torch
    import torch.distributed as dist

    cpu = torch.ones(nbytes // 4)
    tpu = torch.ones(nbytes // 4).to("tpu")

    def tpu_step() -> None:
        dist.all_reduce(tpu)
        torch.tpu.synchronize()

    def barrier() -> None:
        dist.barrier(group=gloo)

    t_gloo = _median_time(lambda: dist.all_reduce(cpu, group=gloo), iters, barrier)
    os.environ["TORCHTPU_DIST_CHECK"] = "1"
    t_tpu = _median_time(tpu_step, iters, barrier)
    os.environ["TORCHTPU_DIST_CHECK"] = "0"
    t_nocheck = _median_time(tpu_step, iters, barrier)
    return t_gloo, t_tpu, t_nocheck


def worker(iters: int) -> None:
    import torch.distributed as dist

    dist.init_process_group("tpu")
    rank, world = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    rows = [(label, nbytes, *_measure(nbytes, iters, gloo)) for label, nbytes in SIZES.items()]
    if rank == 0:
        factor = 2 * (world - 1) / world
        print(f"all_reduce float32, {world} processes, median of {iters} (loaded shared machine: compare ratios)")
        print(
            f"{'size':>6} | {'gloo CPU ms':>11} {'GB/s':>6} | {'tpu ms':>8} {'GB/s':>6} {'x gloo':>6} | {'tpu no-check ms':>15} {'x gloo':>6}"
        )
        for label, nbytes, tg, tt, tn in rows:
            bw_g, bw_t = factor * nbytes / tg / 1e9, factor * nbytes / tt / 1e9
            print(
                f"{label:>6} | {tg * 1e3:11.3f} {bw_g:6.2f} | {tt * 1e3:8.3f} {bw_t:6.2f} {tt / tg:6.2f} | {tn * 1e3:15.3f} {tn / tg:6.2f}"
            )
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--nproc", type=int, default=2)
    args = p.parse_args()
    if "RANK" in os.environ:
        worker(args.iters)
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
        procs.append(subprocess.Popen([sys.executable, __file__, "--iters", str(args.iters)], env=env))
    sys.exit(max(p.wait() for p in procs))


if __name__ == "__main__":
    main()
