#!/usr/bin/env python
"""The MLP step in every execution mode, against JAX's jit and PyTorch CPU, in one run.

Workload: 3-layer MLP 1024-1024-1024-10, batch 64, cross-entropy, SGD lr 0.01, seed 0;
one step = zero_grad + forward + backward + SGD + synchronize. Steady-state median of MLP_N steps after WARM warm-up steps; the loss after
1 + WARM + MLP_N steps (1.7841 with the defaults) checks correctness.

Pipelined: the median per-step time of groups of 10 steps with one synchronize (JAX: one wait)
per group, as a loop that reads its loss every few steps runs: the host's recording or
dispatch of a step overlaps the device's run of the one before.

Rows:
  tpu eager            one cached program per op
  tpu DeferAndFuse     torchtpu.eager_mode("defer_and_fuse"), the stock training loop
  tpu compiled step    torch.compile(backend="tpu", fullgraph=True) of a functional step
  JAX jit              the same step under jax.jit (bench_jax.py, run by --jax-python, JAX_PYTHON,
                       or this python when it can import jax; see bench_compile.py)
  peer eager           the reference system (torch-tpu) in its default eager mode, DEFER_NEVER, and
  peer DeferAndFuse    in its DEFER_AND_FUSE mode, on an XLA CPU PjRT plugin: peer_mlp.py run by
                       --peer-python or PEER_PYTHON (skipped with a note when neither is given)
  CPU eager            PyTorch on the host
DeferAndFuse recording: the host time of one step before its synchronize (the ops are recorded,
nothing runs), per recorded op, and the part of it inside torchtpu's dispatch (the rest is
PyTorch's: module calls, the autograd engine, the optimizer), in a process of its own.
First step: the first step in a fresh process, cold (empty TORCHTPU_CACHE_DIR) and warm (the
same directory again: executables come from the disk cache), for DeferAndFuse and for
torch.compile(backend="tpu"): the one-program step and the compiled model (forward and
backward graphs, eager SGD). A compiled first step runs from the torch.compile call to the
synchronize after the step: AOTAutograd's import, Dynamo's tracing, AOTAutograd, our
lowering and XLA's compile or the disk cache load (docs/compile.md, "First-step time").
Dynamo's own import is shown apart (a script pays it when it builds its optimizer).

Env: MLP_N, WARM, JAX_PYTHON, JAX_BENCH, PEER_PYTHON, OUT=path.json
Options: --jax-python PATH, --peer-python PATH
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

os.environ.setdefault("TORCHTPU_CACHE_DIR", "")  # steady-state rows: no disk cache involved

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
import bench_compile as bc  # noqa: E402
import peer_mlp  # noqa: E402
from jax_python import jax_python  # noqa: E402
from scratch_dirs import scratch_dir  # noqa: E402

import torchtpu  # noqa: E402

FIRST_STEP_CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import torch, torch.nn.functional as F, torchtpu
sys.path.insert(0, sys.argv[1])
import bench_compile as bc
torchtpu.set_eager_mode("defer_and_fuse")
model = bc.make_mlp().to("tpu")
opt = torch.optim.SGD(model.parameters(), lr=bc.LR)
x, y = bc.mlp_data("tpu")
t1 = time.perf_counter()
opt.zero_grad(set_to_none=True)
loss = F.cross_entropy(model(x), y)
loss.backward()
opt.step()
torch.tpu.synchronize()
t2 = time.perf_counter()
m = torchtpu.metrics.snapshot()
print(json.dumps({"first_step_s": t2 - t1, "import_and_setup_s": t1 - t0, "compiles": m["compiles"], "disk_cache_hits": m["disk_cache_hits"]}))
"""


FIRST_COMPILED_CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import torch, torch.nn.functional as F, torchtpu
sys.path.insert(0, sys.argv[1])
import bench_compile as bc
kind = sys.argv[2]
model = bc.make_mlp().to("tpu")
x, y = bc.mlp_data("tpu")
torch.tpu.synchronize()
# Dynamo's import (~1 s, sympy included) is timed apart: a training script pays it before
# its first step anyway, when it builds its optimizer (torch.optim imports torch._dynamo)
t_dynamo = time.perf_counter()
import torch._dynamo
t_dynamo = time.perf_counter() - t_dynamo
opt = torch.optim.SGD(model.parameters(), lr=bc.LR) if kind == "model" else None
t1 = time.perf_counter()
if kind == "step":  # bench_compile.functional_step, built here so that its tracing is in the window
    params = {k: v.detach() for k, v in model.named_parameters()}
    def loss_fn(p, x, y):
        return F.cross_entropy(torch.func.functional_call(model, p, (x,)), y)
    def train_step(p, x, y):
        grads, loss = torch.func.grad_and_value(loss_fn)(p, x, y)
        for k in p:
            p[k].sub_(grads[k], alpha=bc.LR)
        return loss
    compiled = torch.compile(train_step, backend="tpu", fullgraph=True)
    loss = compiled(params, x, y)
else:
    fwd = torch.compile(model, backend="tpu")
    opt.zero_grad(set_to_none=True)
    loss = F.cross_entropy(fwd(x), y)
    loss.backward()
    opt.step()
torch.tpu.synchronize()
t2 = time.perf_counter()
m = torchtpu.metrics.snapshot()
print(json.dumps({"first_step_s": t2 - t1, "import_and_setup_s": t1 - t0, "dynamo_import_s": t_dynamo, "compiles": m["compiles"],
                  "disk_cache_hits": m["disk_cache_hits"], "loss": float(loss.item())}))
"""
# The host side of one DeferAndFuse step, in a process of its own: torchtpu's dispatch entry is
# timed from the first op on (its kernels bind it when they are registered, at the first tpu op)
RECORDING_CHILD = r"""
import json, statistics, sys, time
import torch, torch.nn.functional as F, torchtpu
from torchtpu.eager import dispatch
sys.path.insert(0, sys.argv[1])
import bench_compile as bc
run, inside = dispatch.run, [0.0, 0]
def timed(op, args, kwargs):
    t0 = time.perf_counter()
    try:
        return run(op, args, kwargs)
    finally:
        inside[0] += time.perf_counter() - t0
        inside[1] += 1
dispatch.run = timed
model = bc.make_mlp().to("tpu")
opt = torch.optim.SGD(model.parameters(), lr=bc.LR)
x, y = bc.mlp_data("tpu")
torchtpu.set_eager_mode("defer_and_fuse")
host, ours, ops = [], [], 0
for i in range(bc.WARM + bc.MLP_N):
    inside[:] = [0.0, 0]
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    F.cross_entropy(model(x), y).backward()
    opt.step()
    t1 = time.perf_counter()
    ops = inside[1]
    torch.tpu.synchronize()  # outside the window: the recorded graph runs here
    if i >= bc.WARM:
        host.append(t1 - t0)
        ours.append(inside[0] / ops)
print(json.dumps({"ops": ops, "host_step_s": statistics.median(host), "torchtpu_per_op_s": statistics.median(ours)}))
"""

FIRST_STEP_ROWS = (
    ("DeferAndFuse", [FIRST_STEP_CHILD]),
    ("compiled one-program step", [FIRST_COMPILED_CHILD, "step"]),
    ("compiled model, eager SGD", [FIRST_COMPILED_CHILD, "model"]),
)


def stock_step(mode: str) -> dict:
    """The stock training loop (bench_compile's, uncompiled) under an eager mode."""
    torchtpu.metrics.reset()
    with torchtpu.eager_mode(mode):
        res = bc.mlp_module_step("tpu", None, pipelined=True)
    m = torchtpu.metrics.snapshot()
    res["compiles"], res["executions"], res["flushes_by_reason"] = m["compiles"], m["executions"], m["flushes_by_reason"]
    return res


def run_child(script: str, args: list[str], env: dict[str, str] | None = None) -> dict:
    """Run ``script`` in a fresh python with this directory and ``args`` as its arguments:
    the JSON object it prints last, or {"error": its stderr's tail}."""
    run = subprocess.run(
        [sys.executable, "-c", script, os.path.dirname(__file__), *args], env=env, capture_output=True, text=True, timeout=600
    )
    return json.loads(run.stdout.strip().splitlines()[-1]) if run.returncode == 0 else {"error": run.stderr[-500:]}


def recording_cost() -> dict:
    """The host time of a DeferAndFuse MLP step (recording only), and the part of it spent
    inside torchtpu per recorded op; the rest is PyTorch's own (modules, autograd, optimizer)."""
    return run_child(RECORDING_CHILD, [])


def first_steps() -> dict:
    """Per row, the first step in a fresh process with an empty disk cache, then warm."""
    out = {}
    for name, (script, *args) in FIRST_STEP_ROWS:
        cache = scratch_dir("bench_modes_cache_")
        env = dict(os.environ, TORCHTPU_CACHE_DIR=cache)
        for label in ("cold", "warm"):
            out[f"{name}, {label}"] = run_child(script, args, env)
    return out


def peer_rows(python: str | None) -> dict:
    """The reference system's two eager modes, in this table's units (or why they are absent)."""
    peer = peer_mlp.peer_reference(python, add_n=20, mlp_n=bc.MLP_N, warm=bc.WARM)
    if "skipped" in peer:
        return {"peer_eager": peer, "peer_defer_and_fuse": {"skipped": "see above"}}
    return {"peer_eager": peer["DEFER_NEVER"], "peer_defer_and_fuse": peer["DEFER_AND_FUSE"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--jax-python", help="python with jax==0.10.2 (default: $JAX_PYTHON, else this one if it has jax)")
    p.add_argument("--peer-python", help="python of the reference system's venv (default: $PEER_PYTHON)")
    args = p.parse_args()
    res = {"torch": torch.__version__, "platform": torchtpu.platform(), "threads": torch.get_num_threads()}
    jax = bc.jax_reference(jax_python(args.jax_python))
    if "step_ms" in jax:  # bench_jax.py's units
        jax = {**jax, "step_s": jax["step_ms"] / 1e3, "loss": jax.get("loss_last", float("nan"))}
        if "step_ms_pipelined" in jax:
            jax["pipelined_step_s"] = jax["step_ms_pipelined"] / 1e3
    res["jax_jit"] = jax
    res.update(peer_rows(peer_mlp.peer_python(args.peer_python)))
    res["eager"] = stock_step("eager")
    res["defer_and_fuse"] = stock_step("defer_and_fuse")
    res["compiled_step"] = bc.mlp_whole_step_functional(pipelined=True)
    res["cpu_eager"] = bc.mlp_module_step("cpu", None)
    res["recording"] = recording_cost()
    res["first_step"] = first_steps()
    report(res)
    if os.environ.get("OUT"):
        with open(os.environ["OUT"], "w") as f:
            json.dump(res, f, indent=1)


def report(res: dict) -> None:
    jax = res["jax_jit"]
    ref = jax.get("step_s")
    print(f"platform {res['platform']}  torch {res['torch']}  threads {res['threads']}  MLP_N={bc.MLP_N} WARM={bc.WARM}")
    print(
        f"{'MLP step':<22}{'median':>11}{'vs JAX jit':>12}{'vs CPU eager':>14}{'first step':>12}{'loss':>9}"
        f"{'pipelined':>12}{'vs JAX':>8}"
    )
    ref_pipelined = jax.get("pipelined_step_s")
    cpu = res["cpu_eager"]["step_s"]
    rows = [
        ("JAX jit", jax),
        ("tpu eager", res["eager"]),
        ("tpu DeferAndFuse", res["defer_and_fuse"]),
        ("tpu compiled step", res["compiled_step"]),
        ("peer eager", res["peer_eager"]),
        ("peer DeferAndFuse", res["peer_defer_and_fuse"]),
        ("CPU eager", res["cpu_eager"]),
    ]
    for name, r in rows:
        if "step_s" not in r:
            print(f"{name:<22}  skipped: {r.get('skipped', r)}")
            continue
        vs_jax = f"{r['step_s'] / ref:.2f}" if ref else "-"
        pipelined = r.get("pipelined_step_s")
        piped = f"{pipelined * 1e3:>9.2f} ms" if pipelined else f"{'-':>12}"
        piped += f"{pipelined / ref_pipelined:>8.2f}" if pipelined and ref_pipelined else f"{'-':>8}"
        print(
            f"{name:<22}{r['step_s'] * 1e3:>8.2f} ms{vs_jax:>12}{r['step_s'] / cpu:>14.2f}{r['first_step_s']:>10.2f} s{r['loss']:>9.4f}"
            f"{piped}"
        )
    for ours, theirs in (("eager", "peer_eager"), ("defer_and_fuse", "peer_defer_and_fuse")):
        if "step_s" in res[theirs]:
            print(f"tpu {ours} / reference system's {ours}: {res[ours]['step_s'] / res[theirs]['step_s']:.2f}")
    d = res["defer_and_fuse"]
    print(f"DeferAndFuse over the run: compiles={d['compiles']} executions={d['executions']} flushes={d['flushes_by_reason']}")
    rec = res["recording"]
    if "error" in rec:
        print(f"DeferAndFuse recording: error {rec['error']}")
    else:
        print(
            f"DeferAndFuse recording (host, before the synchronize): {rec['host_step_s'] * 1e3:.2f} ms per step for "
            f"{rec['ops']} ops = {rec['host_step_s'] / rec['ops'] * 1e6:.1f} us per op, of which inside torchtpu "
            f"{rec['torchtpu_per_op_s'] * 1e6:.1f} us per op (the rest: PyTorch's modules, autograd engine, optimizer)"
        )
    for label, r in res["first_step"].items():
        if "error" in r:
            print(f"first step, {label} disk cache: error {r['error']}")
        else:
            dynamo = f", import torch._dynamo before it {r['dynamo_import_s']:.2f} s" if "dynamo_import_s" in r else ""
            print(
                f"first step, {label} disk cache: {r['first_step_s']:.3f} s  (compiles={r['compiles']}, "
                f"disk hits={r['disk_cache_hits']}{dynamo})"
            )


if __name__ == "__main__":
    main()
