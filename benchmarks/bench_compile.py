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
  tpu stock step       torch.compile(step) around zero_grad/backward/opt.step (several programs),
                       and the same under torchtpu.eager_mode("defer_and_fuse"), where the graphs
                       Dynamo splits the step into are recorded and run as one program
  JAX jit              the same MLP step under jax.jit: bench_jax.py beside this file, run by the
                       python given by --jax-python or JAX_PYTHON, else by this interpreter when it
                       can import jax (the project's ``[jax]`` extra installs jax==0.10.2), else
                       skipped with a note. JAX_BENCH=path picks another script. Same XLA as jaxlib 0.10.2.
  CPU eager / inductor PyTorch on the host.

Per-call overhead (a second table): for the one-program step and for the forward call of the
compiled model (MLP and GPT), the host time of one call split into Dynamo's guard evaluation,
the rest of Dynamo's and AOTAutograd's wrappers, and our runner (CompiledGraph.__call__, of
which the PjRT execute call). Each call follows a synchronize, as in a training loop, so the
caches are as cold as a real step leaves them (see docs/compile.md, "Per-call overhead").

Env: MLP_N, WARM, GPT_N, OVERHEAD_N, JAX_PYTHON, JAX_BENCH, SKIP_INDUCTOR=1, OUT=path.json
Options: --jax-python PATH (overrides JAX_PYTHON)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from jax_python import NO_JAX, jax_python
from scratch_dirs import scratch_dir

os.environ.setdefault("TORCHTPU_CACHE_DIR", "")  # cold compiles: no disk cache
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", scratch_dir("bench_compile_inductor_"))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import torchtpu  # noqa: E402

MLP_N = int(os.environ.get("MLP_N", 50))
WARM = int(os.environ.get("WARM", 5))
GPT_N = int(os.environ.get("GPT_N", 20))
OVERHEAD_N = int(os.environ.get("OVERHEAD_N", 50))
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


PIPELINE = 10  # steps per synchronize in the pipelined timing


def timed(step, device: str, steps: int = MLP_N, warm: int = WARM, pipelined: bool = False) -> dict:
    """First step (incl. compilation), then the median of ``steps`` after ``warm``, each
    waited for. ``pipelined``: also the median per-step time of groups of PIPELINE steps
    with one synchronize per group (a loop that reads its loss every few steps), whose
    host work overlaps the device's; measured after the loss is read."""
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
    out = {"first_step_s": first, "step_s": statistics.median(ts), "loss": float(loss.item())}
    if pipelined:
        out["pipelined_step_s"] = pipelined_step(step, device, max(1, steps // PIPELINE))
    return out


def pipelined_step(step: Callable[[], Any], device: str, groups: int) -> float:
    """Median per-step time of ``groups`` groups of PIPELINE steps, one synchronize each
    (after one untimed group: a step that follows an unsynchronized one may differ)."""
    per_step = []
    for g in range(groups + 1):
        t0 = time.perf_counter()
        for _ in range(PIPELINE):
            step()
        sync(device)
        if g:
            per_step.append((time.perf_counter() - t0) / PIPELINE)
    return statistics.median(per_step)


# -- MLP variants --------------------------------------------------------------------------------
def mlp_module_step(device: str, compile_backend: str | None, pipelined: bool = False) -> dict:
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

    return timed(step, device, pipelined=pipelined)


def functional_step(options: dict | None = None) -> tuple[Callable[[], torch.Tensor], Callable, dict]:
    """The one-program step (forward, backward and the SGD update, in place and donated):
    the call, the compiled function and its arguments by name (for the guard check)."""
    torch._dynamo.reset()
    model = make_mlp().to("tpu")
    params = {k: v.detach() for k, v in model.named_parameters()}
    x, y = mlp_data("tpu")

    def loss_fn(p: dict, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(torch.func.functional_call(model, p, (x,)), y)

    def train_step(p: dict, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        grads, loss = torch.func.grad_and_value(loss_fn)(p, x, y)
        for k in p:
            p[k].sub_(grads[k], alpha=LR)
        return loss

    compiled = torch.compile(train_step, backend="tpu", fullgraph=True, options=options)
    return (lambda: compiled(params, x, y)), train_step, {"p": params, "x": x, "y": y}


def mlp_whole_step_functional(pipelined: bool = False) -> dict:
    """One program per step: forward, backward and the SGD update (in place, donated)."""
    return timed(functional_step()[0], "tpu", pipelined=pipelined)


def mlp_whole_step_stock(eager_mode: str = "eager") -> dict:
    """torch.compile around the stock step: Dynamo splits it into several programs, which
    run one by one in eager mode and are recorded into one program under DeferAndFuse."""
    with torchtpu.eager_mode(eager_mode):
        return _stock_step()


def _stock_step() -> dict:
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


def jax_reference(python: str | None) -> dict:
    """bench_jax.py's MLP figures, run by ``python``; ``{"skipped": why}`` without one."""
    if not python:
        return {"skipped": NO_JAX}
    out = os.path.join(scratch_dir("bench_compile_jax_"), "mlp.json")
    env = dict(os.environ, OUT=out, MLP_N=str(MLP_N), WARM=str(WARM), ADD_N="20")
    try:
        subprocess.run([python, JAX_SCRIPT], env=env, check=True, capture_output=True, timeout=600)
        with open(out) as f:
            return json.load(f)["mlp_jit"]
    except (OSError, subprocess.SubprocessError, KeyError, ValueError) as e:
        return {"skipped": f"JAX run failed ({python}): {type(e).__name__}: {str(e)[:300]}"}


# -- GPT -----------------------------------------------------------------------------------------
def gpt_setup(device: str, backend: str) -> tuple[nn.Module, Callable, torch.optim.Optimizer, torch.Tensor, torch.Tensor]:
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
    from tests.test_compile_models import GPT

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = GPT(vocab=256, d=128, heads=4, layers=2, ctx=64).to(device)
    fwd = torch.compile(model, backend=backend)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, 256, (8, 65), generator=g)
    return model, fwd, opt, idx[:, :-1].contiguous().to(device), idx[:, 1:].contiguous().to(device)


def gpt_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), y.flatten())


def gpt_step(device: str, backend: str) -> dict:
    _, fwd, opt, x, y = gpt_setup(device, backend)

    def step() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        loss = gpt_loss(fwd(x), y)
        loss.backward()
        opt.step()
        return loss

    return timed(step, device, steps=GPT_N, warm=3)


# -- per-call overhead: Dynamo's guards and AOTAutograd's wrappers against our runner ------------
class RunnerClock:
    """Host seconds spent inside torchtpu's CompiledGraph.__call__ and, within it, in the
    runtime's execute, while the ``with`` block lasts (both wrapped; restored on exit)."""

    def __init__(self) -> None:
        self.runner = self.execute = 0.0
        self.last = (0.0, 0.0, 0.0)  # the measured call: total, runner, execute

    def reset(self) -> None:
        self.runner = self.execute = 0.0

    def __enter__(self) -> RunnerClock:
        from torchtpu.compile.fx_lowering import CompiledGraph
        from torchtpu.runtime import pjrt

        self._cls, self._call = CompiledGraph, CompiledGraph.__call__
        self._rt = pjrt.get()
        self._exec = self._rt.execute
        CompiledGraph.__call__ = self._timed(self._call, "runner")  # type: ignore[method-assign]
        self._rt.execute = self._timed(self._exec, "execute")
        return self

    def _timed(self, fn: Callable, field: str) -> Callable:
        def wrapper(*args: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args)
            finally:
                setattr(self, field, getattr(self, field) + time.perf_counter() - t0)

        return wrapper

    def __exit__(self, *exc: object) -> None:
        self._cls.__call__ = self._call  # type: ignore[method-assign]
        del self._rt.execute  # the instance attribute hid the method


def guard_check(fn: Callable, args: dict) -> Callable[[], bool] | None:
    """Dynamo's guard evaluation for the cache entry of ``fn``'s code that accepts a frame of
    ``args`` (and ``fn``'s closure); a private debugging API: None if it is gone."""
    code = fn.__code__
    cells = dict(zip(code.co_freevars, (c.cell_contents for c in fn.__closure__ or ())))
    f_locals = {**args, **cells}
    try:
        from torch._dynamo.eval_frame import _debug_get_cache_entry_list

        for entry in _debug_get_cache_entry_list(code):
            if entry.guard_manager.check(f_locals):
                return lambda: entry.guard_manager.check(f_locals)
    except Exception:  # noqa: BLE001 (a private API: absent means "not measured")
        return None
    return None


def call_overhead(timed_call: Callable[[RunnerClock], float], guards: Callable[[], bool] | None) -> dict:
    """Medians over OVERHEAD_N calls, each after a synchronize that ends a full step (the
    caches as a training loop leaves them); the guards are timed alone after another step."""
    rows, guard_s = [], []
    with RunnerClock() as clock:
        for _ in range(OVERHEAD_N):
            timed_call(clock)
            if guards is not None:
                t0 = time.perf_counter()
                guards()
                guard_s.append(time.perf_counter() - t0)
            timed_call(clock)  # this step's caches are cold again: measure it
            rows.append(clock.last)
    med = statistics.median
    out = {
        "call_s": med(r[0] for r in rows),
        "outside_s": med(r[0] - r[1] for r in rows),
        "runner_s": med(r[1] for r in rows),
        "execute_s": med(r[2] for r in rows),
    }
    if guard_s:
        out["guards_s"] = med(guard_s)
    return out


def _measured(clock: RunnerClock, call: Callable[[], Any]) -> Any:
    clock.reset()
    t0 = time.perf_counter()
    result = call()
    clock.last = (time.perf_counter() - t0, clock.runner, clock.execute)
    return result


def overhead_functional_step(options: dict | None = None) -> dict:
    call, fn, args = functional_step(options)
    for _ in range(WARM):
        call()
    sync("tpu")

    def timed_call(clock: RunnerClock) -> None:
        _measured(clock, call)
        sync("tpu")

    return call_overhead(timed_call, guard_check(fn, args))


def overhead_forward(
    model: nn.Module, fwd: Callable, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor, loss: Callable
) -> dict:
    """The compiled model's forward call inside a full training step (eager loss and optimizer)."""

    def timed_call(clock: RunnerClock) -> None:
        opt.zero_grad(set_to_none=True)
        out = _measured(clock, lambda: fwd(x))
        loss(out, y).backward()
        opt.step()
        sync("tpu")

    for _ in range(WARM):
        timed_call(RunnerClock())
    forward = type(model).forward
    names = forward.__code__.co_varnames[: forward.__code__.co_argcount]
    return call_overhead(timed_call, guard_check(forward, dict(zip(names, (model, x)))))


def overheads() -> dict:
    torch._dynamo.reset()
    model = make_mlp().to("tpu")
    mlp = (model, torch.compile(model, backend="tpu"), torch.optim.SGD(model.parameters(), lr=LR), *mlp_data("tpu"))
    res = {
        "mlp_compiled_step": overhead_functional_step(),
        "mlp_compiled_step_tensor_guards": overhead_functional_step(
            {"guard_filter_fn": torch.compiler.keep_tensor_guards_unsafe}
        ),
        "mlp_compiled_model_forward": overhead_forward(*mlp, F.cross_entropy),
    }
    if os.environ.get("SKIP_INDUCTOR") != "1":
        res["gpt_compiled_model_forward"] = overhead_forward(*gpt_setup("tpu", "tpu"), gpt_loss)
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--jax-python", help="python with jax==0.10.2 for the JAX column (default: $JAX_PYTHON, else this one)")
    args = p.parse_args()
    res: dict = {"torch": torch.__version__, "threads": torch.get_num_threads(), "platform": torchtpu.platform()}
    torchtpu.metrics.reset()
    res["tpu_compiled_model"] = mlp_module_step("tpu", "tpu")
    res["tpu_compiled_step"] = mlp_whole_step_functional()
    m0 = torchtpu.metrics.snapshot()
    res["tpu_stock_step"] = mlp_whole_step_stock()
    res["tpu_stock_step_defer"] = mlp_whole_step_stock("defer_and_fuse")
    res["tpu_metrics"] = m0
    res["jax_jit"] = jax_reference(jax_python(args.jax_python))
    res["cpu_eager"] = mlp_module_step("cpu", None)
    if os.environ.get("SKIP_INDUCTOR") != "1":
        res["cpu_inductor"] = mlp_module_step("cpu", "inductor")
        res["gpt_tpu_compiled"] = gpt_step("tpu", "tpu")
        res["gpt_cpu_inductor"] = gpt_step("cpu", "inductor")
    res["overhead"] = overheads()
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
        ("  same, under DeferAndFuse", res.get("tpu_stock_step_defer")),
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
    report_overhead(res["overhead"])


OVERHEAD_ROWS = (
    ("mlp_compiled_step", "MLP compiled step (1 prog)"),
    ("mlp_compiled_step_tensor_guards", "  same, tensor guards only"),
    ("mlp_compiled_model_forward", "MLP compiled model, fwd"),
    ("gpt_compiled_model_forward", "GPT compiled model, fwd"),
)


def report_overhead(res: dict) -> None:
    """One line per workload: where the host time of one compiled call goes (medians, us)."""
    print(f"per-call host time after a sync, medians of {OVERHEAD_N} (us): outside = Dynamo guards + Dynamo/AOT wrappers")
    print(f"{'call':<28}{'total':>8}{'outside':>9}{'guards':>8}{'runner':>8}{'execute':>9}{'outside/runner':>16}")
    for key, name in OVERHEAD_ROWS:
        r = res.get(key)
        if r is None:
            continue
        guards = f"{r['guards_s'] * 1e6:>8.0f}" if "guards_s" in r else f"{'-':>8}"
        print(
            f"{name:<28}{r['call_s'] * 1e6:>8.0f}{r['outside_s'] * 1e6:>9.0f}{guards}{r['runner_s'] * 1e6:>8.0f}"
            f"{r['execute_s'] * 1e6:>9.0f}{r['outside_s'] / r['runner_s']:>16.2f}"
        )
    print("(the tensor-guards row passes options={'guard_filter_fn': torch.compiler.keep_tensor_guards_unsafe})")


if __name__ == "__main__":
    main()
