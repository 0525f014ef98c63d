#!/usr/bin/env python
"""The JAX reference for bench_compile.py and bench_modes.py: the same workloads under jax.jit.

torchtpu never imports jax; this script runs in a process of its own, under the project's
venv when it has the ``[jax]`` extra (``pip install -e '.[jax]'``, which ``make test`` does:
jax==0.10.2), or under any python with jax==0.10.2 given to bench_compile.py / bench_modes.py
by ``--jax-python`` or JAX_PYTHON:

    python benchmarks/bench_modes.py                              # finds jax in this venv
    python benchmarks/bench_modes.py --jax-python venv_jax/bin/python

or by itself: ``venv_jax/bin/python benchmarks/bench_jax.py`` (env ADD_N, MLP_N, WARM,
MLP_H, OUT). jaxlib 0.10.2 is the XLA that torchtpu runs on, so its jit is the level
``torch.compile(backend="tpu")`` should reach.

Workloads (the same as in bench_eager.py, bench_compile.py and bench_modes.py):
  add:  y = x + x on a 2x2 float32 array, waiting for the result (median of ADD_N),
        and the same with a copy back to a NumPy array (for reference only).
  MLP:  3-layer MLP 1024-1024-1024-10 (hidden width MLP_H), batch 64, softmax
        cross-entropy, plain SGD lr 0.01; the whole step (value_and_grad + update) is
        one jax.jit with the parameters donated. The first call (trace, compile, run) is
        timed alone, then the median of MLP_N steps after WARM warm-up steps, and the
        median per-step time of groups of 10 steps with one wait each; also the
        time to trace and lower, and to compile, on a fresh jit of the same step.
        JAX draws its own initial weights (torch.nn.Linear's uniform bounds, not its
        random stream), so its loss after 1 + WARM + MLP_N steps is 1.7848 with the
        defaults, near the torch runs' 1.7841 but not equal to it.

Output: one JSON object, printed and written to OUT (default jax.json). The MLP figures
sit under "mlp_jit": step_ms, step_ms_min, step_ms_pipelined, first_step_s, trace_lower_s, xla_compile_s,
loss_first, loss_last; the add figures are add_ms and add_readback_ms.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

ADD_N = int(os.environ.get("ADD_N", 200))
MLP_N = int(os.environ.get("MLP_N", 50))
WARM = int(os.environ.get("WARM", 5))
OUT = os.environ.get("OUT", "jax.json")
BATCH, WIDTH, CLASSES = 64, int(os.environ.get("MLP_H", 1024)), 10
LR = 0.01
PIPELINE = 10  # steps per wait in the pipelined timing (as bench_compile.py's)

Params = list[tuple[jax.Array, jax.Array]]


def median_ms(seconds: list[float]) -> float:
    return round(statistics.median(seconds) * 1e3, 4)


def timings(fn: Callable[[], object], n: int) -> list[float]:
    """Wall time of ``n`` calls of ``fn`` (each call waits for its own result)."""
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def init_params(key: jax.Array) -> Params:
    """Weights and biases drawn from U(-1/sqrt(fan_in), 1/sqrt(fan_in)), as nn.Linear does."""
    params = []
    for fan_in, fan_out in [(WIDTH, WIDTH), (WIDTH, WIDTH), (WIDTH, CLASSES)]:
        key, kw, kb = jax.random.split(key, 3)
        bound = 1.0 / np.sqrt(fan_in)
        w = jax.random.uniform(kw, (fan_in, fan_out), jnp.float32, -bound, bound)
        b = jax.random.uniform(kb, (fan_out,), jnp.float32, -bound, bound)
        params.append((w, b))
    return params


def logits(params: Params, x: jax.Array) -> jax.Array:
    *hidden, (w_out, b_out) = params
    for w, b in hidden:
        x = jax.nn.relu(x @ w + b)
    return x @ w_out + b_out


def cross_entropy(params: Params, x: jax.Array, y: jax.Array) -> jax.Array:
    logp = jax.nn.log_softmax(logits(params, x))
    return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))


def sgd_step(params: Params, x: jax.Array, y: jax.Array) -> tuple[Params, jax.Array]:
    loss, grads = jax.value_and_grad(cross_entropy)(params, x, y)
    return jax.tree.map(lambda p, g: p - LR * g, params, grads), loss


def bench_add() -> dict:
    x = jnp.ones((2, 2), jnp.float32)
    for _ in range(20):  # warm the op cache
        (x + x).block_until_ready()
    waited = timings(lambda: (x + x).block_until_ready(), ADD_N)
    read_back = timings(lambda: np.asarray(x + x), ADD_N)
    return {"add_ms": median_ms(waited), "add_readback_ms": median_ms(read_back)}


def bench_mlp() -> dict:
    params = init_params(jax.random.PRNGKey(0))
    kx, ky = jax.random.split(jax.random.PRNGKey(1))
    x = jax.random.normal(kx, (BATCH, WIDTH), jnp.float32)
    y = jax.random.randint(ky, (BATCH,), 0, CLASSES)
    step = jax.jit(sgd_step, donate_argnums=(0,))

    t0 = time.perf_counter()
    params, first_loss = jax.block_until_ready(step(params, x, y))
    first_step = time.perf_counter() - t0

    # compile cost alone: a new function object, so no jit cache of this process answers
    fresh = jax.jit(lambda p, a, b: sgd_step(p, a, b))
    c0 = time.perf_counter()
    lowered = fresh.lower(params, x, y)
    c1 = time.perf_counter()
    lowered.compile()
    c2 = time.perf_counter()

    loss = first_loss
    for _ in range(WARM):
        params, loss = step(params, x, y)
    jax.block_until_ready(params)
    steps = []
    for _ in range(MLP_N):
        t0 = time.perf_counter()
        params, loss = jax.block_until_ready(step(params, x, y))
        steps.append(time.perf_counter() - t0)
    loss_last = loss
    # pipelined: groups of PIPELINE steps, one wait per group (dispatch overlaps the device)
    pipelined = []
    for g in range(max(1, MLP_N // PIPELINE) + 1):
        t0 = time.perf_counter()
        for _ in range(PIPELINE):
            params, loss = step(params, x, y)
        jax.block_until_ready((params, loss))
        if g:
            pipelined.append((time.perf_counter() - t0) / PIPELINE)
    return {
        "first_step_s": round(first_step, 3),
        "trace_lower_s": round(c1 - c0, 3),
        "xla_compile_s": round(c2 - c1, 3),
        "step_ms": median_ms(steps),
        "step_ms_min": round(min(steps) * 1e3, 4),
        "step_ms_pipelined": median_ms(pipelined),
        "loss_first": float(first_loss),
        "loss_last": float(loss_last),
    }


def main() -> None:
    res = {"peer": "jax", "jax": jax.__version__, "backend": jax.default_backend(), "devices": str(jax.devices())}
    res.update(bench_add())
    res["mlp_jit"] = bench_mlp()
    if os.path.dirname(OUT):
        os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
