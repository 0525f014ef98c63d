#!/usr/bin/env python
"""Eager-mode benchmark: tpu (XLA via PjRT) against PyTorch CPU, measured in the same run.

Workloads (the same in bench_compile.py, bench_modes.py and bench_jax.py):
  add:  y = x + x on a 2x2 float32 tensor, then wait for it (median of ADD_N)
  mlp:  3-layer MLP 1024-1024-1024-10, batch 64, cross-entropy, SGD lr 0.01,
        torch.manual_seed(0) init; one step = forward + backward + SGD + sync.
        Steady-state median of MLP_N steps after WARM warm-up steps.
Prints medians and tpu/CPU ratios; writes JSON to OUT if set. With --peer-python (or
PEER_PYTHON) naming the python of the reference system's venv, the same two workloads also run
under it (torch-tpu in its default eager mode, DEFER_NEVER: peer_mlp.py) as a "peer" column;
without one the column is skipped with a note.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import torchtpu

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_mlp  # noqa: E402

ADD_N = int(os.environ.get("ADD_N", 500))
MLP_N = int(os.environ.get("MLP_N", 50))
WARM = int(os.environ.get("WARM", 5))
B, D, H, C = 64, 1024, 1024, 10


def sync(device: str) -> None:
    if device == "tpu":
        torch.tpu.synchronize()


def bench_add(device: str) -> float:
    x = torch.ones(2, 2, device=device)
    for _ in range(50):
        y = x + x
    sync(device)
    ts = []
    for _ in range(ADD_N):
        t0 = time.perf_counter()
        y = x + x
        sync(device)
        ts.append(time.perf_counter() - t0)
    del y
    return statistics.median(ts)


def make_mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(D, H), nn.ReLU(), nn.Linear(H, H), nn.ReLU(), nn.Linear(H, C))


def bench_mlp(device: str, steps: int = MLP_N) -> dict:
    model = make_mlp().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(B, D, generator=g).to(device)
    y = torch.randint(0, C, (B,), generator=g).to(device)

    def step() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        sync(device)
        return loss

    t0 = time.perf_counter()
    step()
    first = time.perf_counter() - t0
    for _ in range(WARM):
        step()
    ts = []
    for _ in range(steps):
        t0 = time.perf_counter()
        loss = step()
        ts.append(time.perf_counter() - t0)
    return {"first_step_s": first, "step_s": statistics.median(ts), "loss": loss.item()}


def peer_column(python: str | None) -> dict:
    """add + sync and the MLP step under the reference system's default eager mode."""
    peer = peer_mlp.peer_reference(python, add_n=ADD_N, mlp_n=MLP_N, warm=WARM)
    return peer if "skipped" in peer else peer["DEFER_NEVER"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--peer-python", help="python of the reference system's venv (default: $PEER_PYTHON)")
    args = p.parse_args()
    res: dict = {"torch": torch.__version__, "threads": torch.get_num_threads(), "platform": torchtpu.platform()}
    res["peer"] = peer_column(peer_mlp.peer_python(args.peer_python))
    res["add_tpu_s"] = bench_add("tpu")
    res["add_cpu_s"] = bench_add("cpu")
    torchtpu.metrics.reset()
    res["mlp_tpu"] = bench_mlp("tpu")
    res["mlp_tpu_metrics"] = torchtpu.metrics.snapshot()
    res["mlp_cpu"] = bench_mlp("cpu")
    # the correctness check of the workload: loss after 56 steps (1 + WARM + MLP_N with defaults)
    us = 1e6
    print(f"platform: {res['platform']}  torch {res['torch']}  threads {res['threads']}")
    print(f"{'workload':<28}{'tpu':>14}{'cpu':>14}{'tpu/cpu':>10}")
    print(
        f"{'add + sync (median)':<28}{res['add_tpu_s'] * us:>11.1f} us{res['add_cpu_s'] * us:>11.1f} us{res['add_tpu_s'] / res['add_cpu_s']:>10.1f}"
    )
    mt, mc = res["mlp_tpu"], res["mlp_cpu"]
    print(
        f"{'MLP eager step (median)':<28}{mt['step_s'] * 1e3:>11.2f} ms{mc['step_s'] * 1e3:>11.2f} ms{mt['step_s'] / mc['step_s']:>10.2f}"
    )
    print(f"{'MLP first step':<28}{mt['first_step_s']:>12.3f} s{mc['first_step_s']:>12.3f} s")
    print(f"{f'MLP loss after {1 + WARM + MLP_N} steps':<28}{mt['loss']:>14.4f}{mc['loss']:>14.4f}")
    report_peer(res)
    m = res["mlp_tpu_metrics"]
    print(f"tpu metrics over the MLP run: compiles={m['compiles']} cache_hits={m['cache_hits']} executions={m['executions']}")
    if os.environ.get("OUT"):
        with open(os.environ["OUT"], "w") as f:
            json.dump(res, f, indent=1)


def report_peer(res: dict) -> None:
    peer = res["peer"]
    if "skipped" in peer:
        print(f"reference system (torch-tpu): skipped: {peer['skipped']}")
        return
    print(f"{'reference system (torch-tpu, DEFER_NEVER)':<42}{'peer':>11}{'tpu/peer':>10}")
    if "add_sync_s" in peer:
        print(f"{'  add + sync (median)':<42}{peer['add_sync_s'] * 1e6:>8.1f} us{res['add_tpu_s'] / peer['add_sync_s']:>10.2f}")
    if "step_s" in peer:
        mt = res["mlp_tpu"]
        print(f"{'  MLP eager step (median)':<42}{peer['step_s'] * 1e3:>8.2f} ms{mt['step_s'] / peer['step_s']:>10.2f}")
        print(f"{'  MLP first step / loss':<42}{peer['first_step_s']:>9.3f} s{peer['loss']:>10.4f}")


if __name__ == "__main__":
    main()
