#!/usr/bin/env python
"""Hugging Face ``generate()`` (greedy) tokens/s on tpu in every mode, next to the CPU, in one run.

Workload: a small random Llama (hidden 128, 2 layers, 4 heads, vocab 512; no download),
batch 1, an 8-token prompt, GEN_N new tokens (default 32). Each row: one first call (its
time and the programs it compiled), then the median of REPEATS timed calls; tokens/s =
GEN_N / median. Every row's tokens are checked against CPU eager.

Rows:
  CPU eager                 PyTorch on the host, dynamic cache (generate's default)
  CPU eager, static cache   cache_implementation="static"
  CPU inductor              forward torch.compile'd (inductor), static cache
  tpu eager                 one cached program per op, dynamic cache
  tpu eager, static cache   the same with the static cache
  tpu DeferAndFuse, static  torchtpu.eager_mode("defer_and_fuse"), static cache
  tpu compiled, static      forward torch.compile(backend="tpu"), static cache
  tpu compiled + DeferAndFuse   the same, generate()'s own loop under DeferAndFuse (its
                            bookkeeping ops fuse into a graph per step instead of a
                            program per op)
  tpu static, transformers compile   cache_implementation="static" alone: transformers
                            compiles the decode step (backend "tpu"), prefill runs eagerly
"compiles" counts torchtpu programs: in the first call (every tpu row starts cold: the
in-memory executable cache is emptied and the disk cache is off), then per steady-state call.

PyTorch CPU runs with CPU_THREADS intra-op threads (default 1): on a small, shared machine
its OpenMP threads spin-wait for each other and a 2-thread run was measured 50-100x slower
than a 1-thread one, which would flatter every tpu row.

Env: GEN_N, REPEATS, CPU_THREADS, INDUCTOR (0 skips the inductor row: its C++ build takes
minutes), TORCHTPU_CACHE_DIR (default: empty).
"""

from __future__ import annotations

import contextlib
import copy
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("TORCHTPU_CACHE_DIR", "")  # first-call rows: no disk cache hits

import torch  # noqa: E402
import transformers  # noqa: E402

import torchtpu  # noqa: E402
from torchtpu.runtime import cache  # noqa: E402

GEN_N = int(os.environ.get("GEN_N", "32"))
REPEATS = int(os.environ.get("REPEATS", "5"))
CPU_THREADS = int(os.environ.get("CPU_THREADS", "1"))
INDUCTOR = os.environ.get("INDUCTOR", "1") != "0"
PROMPT = 8


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, initializer_range=0.2,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config).eval()


def generate_kwargs(static: bool) -> dict[str, Any]:
    kw: dict[str, Any] = dict(max_new_tokens=GEN_N, min_new_tokens=GEN_N, do_sample=False)
    if static:  # run eagerly: on device "tpu" transformers would torch.compile(backend="tpu") the decode step itself
        kw.update(cache_implementation="static", disable_compile=True)
    return kw


def compiles() -> int:
    return torchtpu.metrics.snapshot()["compiles"]


def measure(
    model: torch.nn.Module, device: str, static: bool, mode: Callable[[], Any], auto_compile: bool = False
) -> dict[str, Any]:
    ids = torch.randint(3, 512, (1, PROMPT), generator=torch.Generator().manual_seed(1)).to(device)
    kw = generate_kwargs(static)
    if auto_compile:  # transformers compiles the decode step itself (backend "tpu" on device "tpu")
        kw.pop("disable_compile")

    def once() -> tuple[float, torch.Tensor]:
        with mode():
            t0 = time.perf_counter()
            out = model.generate(ids, **kw)
            out = out.cpu()  # waits for the device
            return time.perf_counter() - t0, out

    c0 = compiles()
    first_s, tokens = once()
    first_compiles = compiles() - c0
    times = []
    c1 = compiles()
    for _ in range(REPEATS):
        t, out = once()
        times.append(t)
        assert torch.equal(out, tokens), "a repeated generate() gave other tokens"
    med = statistics.median(times)
    return dict(
        first_s=first_s, first_compiles=first_compiles, compiles_per_call=(compiles() - c1) / REPEATS, median_s=med, tokens=tokens
    )


def rows() -> list[tuple[str, Callable[[], dict[str, Any]]]]:
    cpu = make_model()
    null = contextlib.nullcontext

    def tpu(
        static: bool, mode: Callable[[], Any] = null, compiled: bool = False, auto: bool = False
    ) -> Callable[[], dict[str, Any]]:
        def run() -> dict[str, Any]:
            torch._dynamo.reset()
            cache.clear_memory()  # a cold start: every program this row needs is compiled and counted
            model = copy.deepcopy(cpu).to("tpu")
            if compiled:
                model.forward = torch.compile(model.forward, backend="tpu")
            return measure(model, "tpu", static, mode, auto)

        return run

    def inductor() -> dict[str, Any]:
        torch._dynamo.reset()
        model = copy.deepcopy(cpu)
        model.forward = torch.compile(model.forward)
        return measure(model, "cpu", True, null)

    dnf = lambda: torchtpu.eager_mode("defer_and_fuse")  # noqa: E731
    return [
        ("CPU eager", lambda: measure(cpu, "cpu", False, null)),
        ("CPU eager, static cache", lambda: measure(cpu, "cpu", True, null)),
        *([("CPU inductor, static cache", inductor)] if INDUCTOR else []),
        ("tpu eager", tpu(False)),
        ("tpu eager, static cache", tpu(True)),
        ("tpu DeferAndFuse, static cache", tpu(True, dnf)),
        ("tpu compiled, static cache", tpu(True, compiled=True)),
        ("tpu compiled + DeferAndFuse", tpu(True, dnf, compiled=True)),
        ("tpu static, transformers compile", tpu(True, auto=True)),
    ]


def main() -> None:
    torch.set_num_threads(CPU_THREADS)
    print(
        f"generate(): small Llama, batch 1, prompt {PROMPT}, {GEN_N} new tokens, median of {REPEATS}; "
        f"{torch.tpu.get_device_name()}; PyTorch CPU threads: {CPU_THREADS}"
    )
    results: dict[str, dict[str, Any]] = {}
    for name, run in rows():
        try:
            results[name] = run()
        except Exception as e:  # a row that cannot run (e.g. no C++ compiler for inductor) is reported, not fatal
            print(f"{name}: failed ({type(e).__name__}: {str(e).splitlines()[0][:160]})")
    ref = results["CPU eager"]
    header = f"{'mode':<32}{'tokens/s':>10}{'vs CPU eager':>14}{'ms/token':>10}{'first call s':>14}{'compiles 1st':>14}{'compiles/call':>15}  tokens"
    print(header)
    print("-" * len(header))
    for name, r in results.items():
        tps = GEN_N / r["median_s"]
        same = "= CPU" if torch.equal(r["tokens"], ref["tokens"]) else "DIFFER"
        print(
            f"{name:<32}{tps:>10.1f}{tps / (GEN_N / ref['median_s']):>14.2f}{1e3 * r['median_s'] / GEN_N:>10.2f}"
            f"{r['first_s']:>14.2f}{r['first_compiles']:>14}{r['compiles_per_call']:>15.1f}  {same}"
        )


if __name__ == "__main__":
    main()
