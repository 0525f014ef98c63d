#!/usr/bin/env python
"""torch.compile(backend="tpu") against JAX's jit and PyTorch CPU (eager, inductor), in one run.

Workloads:
  MLP step: 3-layer MLP 1024-1024-1024-10, batch 64, cross-entropy, SGD lr 0.01, seed 0;
            steady-state median of MLP_N steps after WARM warm-up steps, first step timed
            separately (tracing + compilation, torchtpu's disk cache disabled).
            The loss after 1 + WARM + MLP_N steps (1.7841 with defaults) checks correctness.
  GPT step: a small GPT (2 layers, d=128, 4 heads, context 64, vocab 256, batch 8) with AdamW:
            tpu compiled model vs PyTorch CPU inductor.

Columns for the MLP:
  tpu compiled model   torch.compile(model, backend="tpu"); backward by AOTAutograd; SGD eager
  tpu compiled step    the whole step as ONE program: torch.func.grad_and_value + in-place SGD
                       update of the parameters (donated), torch.compile(fullgraph=True)
  tpu stock step       torch.compile(step) around zero_grad/backward/opt.step (several programs)
  JAX jit              the same MLP step under jax.jit: bench_jax.py beside this file, run by
                       JAX_PYTHON=path/to/python of a venv with jax==0.10.2 (skipped with a
                       note if unset; JAX_BENCH=path picks another script). Same XLA as jaxlib 0.10.2.
  CPU eager / inductor PyTorch on the host.

Env: MLP_N, WARM, GPT_N, JAX_PYTHON, JAX_BENCH, SKIP_INDUCTOR=1, OUT=path.json
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TORCHTPU_CACHE_DIR", "")  # cold compiles: no disk cache
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="bench_compile_inductor_"))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import torchtpu  # noqa: E402

MLP_N = int(os.environ.get("MLP_N", 50))
WARM = int(os.environ.get("WARM", 5))
GPT_N = int(os.environ.get("GPT_N", 20))
B, D, H, C = 64, 1024, 1024, 10
LR = 0.01
JAX_SCRIPT = os.environ.get("JAX_BENCH", os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench_jax.py"))


def sync(device: str) -> None:
    if device == "tpu":
        torch.tpu.synchronize()


def make_mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(D, H), nn.ReLU(), nn.Linear(H, H), nn.ReLU(), nn.Linear(H, C))


def mlp_data(device: str) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(B, D, generator=g).to(device), torch.randint(0, C, (B,), generator=g).to(device)


def timed(step, device: str, steps: int = MLP_N, warm: int = WARM) -> dict:
    """First step (incl. compilation), then the median of ``steps`` after ``warm``."""
    t0 = time.perf_counter()
    loss = step()
    sync(device)
    first = time.perf_counter() - t0
    for _ in range(warm):
        loss = step()
    sync(device)
    ts = []
    for _ in range(steps):
        t0 = time.perf_counter()
        loss = step()
        sync(device)
        ts.append(time.perf_counter() - t0)
    return {"first_step_s": first, "step_s": statistics.median(ts), "loss": float(loss.item())}


# -- MLP variants --------------------------------------------------------------------------------
def mlp_module_step(device: str, compile_backend: str | None) -> dict:
    torch._dynamo.reset()
    model = make_mlp().to(device)
    fwd = torch.compile(model, backend=compile_backend) if compile_backend else model
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    x, y = mlp_data(device)

    def step() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(fwd(x), y)
        loss.backward()
        opt.step()
        return loss

    return timed(step, device)


def mlp_whole_step_functional() -> dict:
    """One program per step: forward, backward and the SGD update (in place, donated)."""
    torch._dynamo.reset()
    model = make_mlp().to("tpu")
    params = {k: v.detach() for k, v in model.named_parameters()}
    x, y = mlp_data("tpu")

    def loss_fn(p: dict, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(torch.func.functional_call(model, p, (x,)), y)

    @torch.compile(backend="tpu", fullgraph=True)
    def train_step(p: dict, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        grads, loss = torch.func.grad_and_value(loss_fn)(p, x, y)
        for k in p:
            p[k].sub_(grads[k], alpha=LR)
        return loss

    return timed(lambda: train_step(params, x, y), "tpu")


def mlp_whole_step_stock() -> dict:
    """torch.compile around the stock step: Dynamo splits it into several programs."""
    torch._dynamo.reset()
    model = make_mlp().to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    x, y = mlp_data("tpu")

    @torch.compile(backend="tpu")
    def train_step() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    return timed(train_step, "tpu")


def jax_reference() -> dict:
    python = os.environ.get("JAX_PYTHON")
    if not python:
        return {"skipped": "set JAX_PYTHON to a python with jax==0.10.2 (python3 -m venv v && v/bin/pip install jax==0.10.2)"}
    out = tempfile.mktemp(suffix=".json", prefix="bench_compile_jax_")
    env = dict(os.environ, OUT=out, MLP_N=str(MLP_N), WARM=str(WARM), ADD_N="20")
    try:
        subprocess.run([python, JAX_SCRIPT], env=env, check=True, capture_output=True, timeout=600)
        with open(out) as f:
            return json.load(f)["mlp_jit"]
    except (OSError, subprocess.SubprocessError, KeyError, ValueError) as e:
        return {"skipped": f"JAX run failed: {type(e).__name__}: {str(e)[:300]}"}


# -- GPT -----------------------------------------------------------------------------------------
def gpt_step(device: str, backend: str) -> dict:
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
    from tests.test_compile_models import GPT

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = GPT(vocab=256, d=128, heads=4, layers=2, ctx=64).to(device)
    fwd = torch.compile(model, backend=backend)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, 256, (8, 65), generator=g)
    x, y = idx[:, :-1].contiguous().to(device), idx[:, 1:].contiguous().to(device)

    def step() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(fwd(x).flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()
        return loss

    return timed(step, device, steps=GPT_N, warm=3)


def main() -> None:
    res: dict = {"torch": torch.__version__, "threads": torch.get_num_threads(), "platform": torchtpu.platform()}
    torchtpu.metrics.reset()
    res["tpu_compiled_model"] = mlp_module_step("tpu", "tpu")
    res["tpu_compiled_step"] = mlp_whole_step_functional()
    m0 = torchtpu.metrics.snapshot()
    res["tpu_stock_step"] = mlp_whole_step_stock()
    res["tpu_metrics"] = m0
    res["jax_jit"] = jax_reference()
    res["cpu_eager"] = mlp_module_step("cpu", None)
    if os.environ.get("SKIP_INDUCTOR") != "1":
        res["cpu_inductor"] = mlp_module_step("cpu", "inductor")
        res["gpt_tpu_compiled"] = gpt_step("tpu", "tpu")
        res["gpt_cpu_inductor"] = gpt_step("cpu", "inductor")
    report(res)
    if os.environ.get("OUT"):
        with open(os.environ["OUT"], "w") as f:
            json.dump(res, f, indent=1)


def report(res: dict) -> None:
    print(f"platform: {res['platform']}  torch {res['torch']}  threads {res['threads']}  (one run, medians)")
    jax = res["jax_jit"]
    jax_ms = jax.get("step_ms")
    rows = [
        ("tpu compiled model", res["tpu_compiled_model"]),
        ("tpu compiled step (1 prog)", res["tpu_compiled_step"]),
        ("tpu stock step compiled", res["tpu_stock_step"]),
        ("CPU eager", res["cpu_eager"]),
        ("CPU inductor", res.get("cpu_inductor")),
    ]
    print(f"{'MLP step':<28}{'median':>11}{'vs JAX jit':>12}{'first step':>13}{'loss@56':>10}")
    if jax_ms is not None:
        print(f"{'JAX jit':<28}{jax_ms:>8.2f} ms{1.0:>12.2f}{jax['first_step_s']:>11.3f} s{jax['loss_last']:>10.4f}")
    else:
        print(f"{'JAX jit':<28}  skipped: {jax.get('skipped')}")
    for name, r in rows:
        if r is None:
            continue
        ms = r["step_s"] * 1e3
        ratio = f"{ms / jax_ms:>12.2f}" if jax_ms else f"{'-':>12}"
        print(f"{name:<28}{ms:>8.2f} ms{ratio}{r['first_step_s']:>11.3f} s{r['loss']:>10.4f}")
    if "gpt_tpu_compiled" in res:
        gt, gc = res["gpt_tpu_compiled"], res["gpt_cpu_inductor"]
        print(f"{'GPT step (AdamW)':<28}{'tpu':>11}{'CPU inductor':>14}{'tpu/CPU':>9}")
        print(f"{'  median':<28}{gt['step_s'] * 1e3:>8.2f} ms{gc['step_s'] * 1e3:>11.2f} ms{gt['step_s'] / gc['step_s']:>9.2f}")
        print(f"{'  first step':<28}{gt['first_step_s']:>9.3f} s{gc['first_step_s']:>12.3f} s")
    m = res["tpu_metrics"]
    print(f"tpu metrics (compiled model + compiled step runs): compiles={m['compiles']} executions={m['executions']}")


if __name__ == "__main__":
    main()
