#!/usr/bin/env python
"""The JAX reference for bench_models.py: examples/mingpt's training step under jax.jit.

jax is not a torchtpu dependency, so this runs in an environment of its own:

    python3 -m venv venv_jax && venv_jax/bin/pip install jax==0.10.2 jaxlib==0.10.2
    JAX_PYTHON=venv_jax/bin/python python benchmarks/bench_models.py     # runs this script

or by itself: ``venv_jax/bin/python benchmarks/jax_models.py '<config json>'``.

The model is examples/mingpt/model.py written with jax.numpy: token and position
embeddings, pre-LayerNorm blocks with causal self-attention (masked softmax) and a GELU
(erf) MLP, a bias-free head; cross-entropy; AdamW (torch.optim.AdamW's update, weight
decay on every parameter as torch applies it). The whole step (value_and_grad + AdamW) is
one jax.jit with parameters and optimizer state donated. Weights are drawn by JAX (normal,
std 0.02, as the torch model's init), so the loss is near the torch runs', not equal.

Output: one JSON object on stdout: step_ms (median), step_ms_min, first_step_s, loss_last.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import jax
import jax.numpy as jnp


def init(key: jax.Array, c: dict) -> dict:
    d, v, t, n = c["n_embd"], c["vocab_size"], c["block_size"], c["n_layer"]
    keys = iter(jax.random.split(key, 4 + 4 * n))

    def normal(shape: tuple[int, ...]) -> jax.Array:
        return 0.02 * jax.random.normal(next(keys), shape, jnp.float32)

    def linear(i: int, o: int) -> dict:
        return {"w": normal((o, i)), "b": jnp.zeros((o,), jnp.float32)}

    def ln() -> dict:
        return {"w": jnp.ones((d,), jnp.float32), "b": jnp.zeros((d,), jnp.float32)}

    blocks = [
        {"ln1": ln(), "qkv": linear(d, 3 * d), "proj": linear(d, d), "ln2": ln(), "fc": linear(d, 4 * d), "out": linear(4 * d, d)}
        for _ in range(n)
    ]
    return {"tok": normal((v, d)), "pos": normal((t, d)), "blocks": blocks, "ln_f": ln(), "head": normal((v, d))}


def layer_norm(p: dict, x: jax.Array) -> jax.Array:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / jnp.sqrt(var + 1e-5) * p["w"] + p["b"]


def dense(p: dict, x: jax.Array) -> jax.Array:
    return x @ p["w"].T + p["b"]


def attention(p: dict, x: jax.Array, heads: int) -> jax.Array:
    b, t, d = x.shape
    q, k, v = jnp.split(dense(p["qkv"], x), 3, axis=-1)
    q, k, v = (z.reshape(b, t, heads, d // heads).transpose(0, 2, 1, 3) for z in (q, k, v))
    att = (q @ k.transpose(0, 1, 3, 2)) * (d // heads) ** -0.5
    mask = jnp.tril(jnp.ones((t, t), bool))
    att = jax.nn.softmax(jnp.where(mask, att, -jnp.inf), axis=-1)
    return dense(p["proj"], (att @ v).transpose(0, 2, 1, 3).reshape(b, t, d))


def forward(params: dict, idx: jax.Array, heads: int) -> jax.Array:
    x = params["tok"][idx] + params["pos"][: idx.shape[1]]
    for blk in params["blocks"]:
        x = x + attention(blk, layer_norm(blk["ln1"], x), heads)
        h = jax.nn.gelu(dense(blk["fc"], layer_norm(blk["ln2"], x)), approximate=False)
        x = x + dense(blk["out"], h)
    return layer_norm(params["ln_f"], x) @ params["head"].T


def loss_fn(params: dict, x: jax.Array, y: jax.Array, heads: int) -> jax.Array:
    logits = forward(params, x, heads)
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.take_along_axis(logp, y[..., None], axis=-1).mean()


def make_step(heads: int, lr: float = 3e-3, wd: float = 0.1, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8):
    def step(params: dict, m: dict, v: dict, count: jax.Array, x: jax.Array, y: jax.Array):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y, heads)
        count = count + 1
        m = jax.tree.map(lambda a, g: b1 * a + (1 - b1) * g, m, grads)
        v = jax.tree.map(lambda a, g: b2 * a + (1 - b2) * g * g, v, grads)
        c1, c2 = 1 - b1**count, 1 - b2**count

        def update(p: jax.Array, mi: jax.Array, vi: jax.Array) -> jax.Array:
            p = p * (1 - lr * wd)
            return p - lr * (mi / c1) / (jnp.sqrt(vi / c2) + eps)

        return jax.tree.map(update, params, m, v), m, v, count, loss

    return jax.jit(step, donate_argnums=(0, 1, 2, 3))


def main() -> None:
    c = json.loads(sys.argv[1])
    steps, warm = c.get("steps", 30), c.get("warm", 3)
    key = jax.random.PRNGKey(0)
    params = init(key, c)
    m = jax.tree.map(jnp.zeros_like, params)
    v = jax.tree.map(jnp.zeros_like, params)
    count = jnp.zeros((), jnp.float32)
    step = make_step(c["n_head"])
    data = jax.random.randint(jax.random.PRNGKey(1), (warm + steps + 1, c["batch"], c["block_size"] + 1), 0, c["vocab_size"])
    times = []
    loss = None
    for i in range(1 + warm + steps):
        x, y = data[i, :, :-1], data[i, :, 1:]
        t0 = time.perf_counter()
        params, m, v, count, loss = step(params, m, v, count, x, y)
        loss.block_until_ready()
        times.append(time.perf_counter() - t0)
    measured = times[1 + warm :]
    print(
        json.dumps(
            {
                "step_ms": 1e3 * statistics.median(measured),
                "step_ms_min": 1e3 * min(measured),
                "first_step_s": times[0],
                "loss_last": float(loss),
                "jax": jax.__version__,
            }
        )
    )


if __name__ == "__main__":
    main()
