#!/usr/bin/env python
"""The training step of four examples in every mode, against PyTorch on the CPU and JAX's
jit, in one run.

    python benchmarks/bench_models.py [--size tiny] [--steps 20] [--warm 3] [--only mingpt,llama]
    python benchmarks/bench_models.py --jax-python venv_jax/bin/python   # adds the JAX row
                                      # (or JAX_PYTHON=...; default: this python if it has jax)

Workloads: the examples' own tasks (examples/<name>/train.py) at one fixed size: minGPT,
Llama, ResNet-18, DLRM (SGD). One step = forward + backward + optimizer step +
synchronize, the step examples/harness.py runs. Rows, each measured in the workload's own
process (one process per workload: the examples' module names overlap):

  tpu eager         one cached program per op
  tpu defer         torchtpu DeferAndFuse: the step's ops recorded and run as fused programs
  tpu compile       torch.compile(backend="tpu") of the whole step
  cpu eager         PyTorch on the host
  cpu inductor      torch.compile (inductor) of the whole step on the host
  jax jit           minGPT only: benchmarks/jax_models.py under --jax-python / JAX_PYTHON (a
                    venv with jax==0.10.2, the XLA torchtpu runs on), skipped with a note
                    without it

Printed: the median step (ms) after --warm warm-up steps, the first step (s, compiles
included), ratios against CPU inductor and JAX, and a bar chart written to --png
(matplotlib; skipped with a message when it is not installed). Targets (issue 13):
compiled step <= 1.0x CPU inductor and <= 1.0x JAX jit, DeferAndFuse <= 1.3x JAX jit.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

from jax_python import NO_JAX, jax_python
from scratch_dirs import scratch_dir

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "examples")
# name -> (the example's training script, keyword arguments of its task())
WORKLOADS: dict[str, tuple[str, dict[str, Any]]] = {
    "mingpt": ("mingpt/train.py", {}),
    "llama": ("llama/train.py", {}),
    "resnet18": ("resnet/train.py", {"arch": "resnet18"}),
    "dlrm": ("dlrm/train.py", {"opt": "sgd"}),
}
ROWS = (("tpu", "eager"), ("tpu", "defer"), ("tpu", "compile"), ("cpu", "eager"), ("cpu", "inductor"))


def load_task(name: str, size: str) -> Any:
    """The example's harness.Task (its train.py's ``task(size, **kwargs)``)."""
    script, kwargs = WORKLOADS[name]
    path = os.path.join(EXAMPLES, script)
    sys.path[:0] = [os.path.dirname(path), EXAMPLES]
    spec = importlib.util.spec_from_file_location(f"example_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # torch.compile looks the step's globals up by module name
    spec.loader.exec_module(module)
    task = module.task(size=size, **kwargs)
    return task[0] if isinstance(task, tuple) else task


def time_row(task: Any, device: str, mode: str, steps: int, warm: int) -> dict[str, float]:
    """Median step time of ``task`` on ``device`` in ``mode`` (inductor: torch.compile's
    default backend on the CPU)."""
    import harness
    import torch

    torch.manual_seed(0)
    model = task.build().to(device)
    opt = task.optimizer(model.parameters())
    step = harness.make_step(task, model, opt, device, bf16=False)
    if mode in ("compile", "inductor"):
        step = torch.compile(step, backend="tpu" if device == "tpu" else "inductor")
    sync = torch.tpu.synchronize if device == "tpu" else (lambda: None)
    times, loss = [], None
    # Every row starts from the same collector state: the objects earlier rows (and model
    # building) left behind are frozen out of the cyclic collector's scans, which otherwise
    # made a later row's collections slower (measured: the same compiled minGPT step at
    # 1.8 ms first and 2.3 ms after the other rows, ~0.9 ms of it in gc).
    gc.collect()
    gc.freeze()
    with harness.mode_context(device, mode):
        for i in range(1 + warm + steps):
            batch = harness.to_device(task.batch(i), device)
            t0 = time.perf_counter()
            loss = step(batch)
            sync()
            times.append(time.perf_counter() - t0)
    gc.unfreeze()
    measured = times[1 + warm :]
    return {
        "step_ms": 1e3 * statistics.median(measured),
        "step_ms_min": 1e3 * min(measured),
        "first_step_s": times[0],
        "loss_last": float(loss),
    }


def worker(name: str, size: str, steps: int, warm: int) -> dict[str, Any]:
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", scratch_dir("bench_models_inductor_"))
    task = load_task(name, size)
    return {f"{device} {mode}": time_row(task, device, mode, steps, warm) for device, mode in ROWS}


def jax_row(python: str | None, size: str, steps: int, warm: int) -> dict[str, Any]:
    """minGPT under jax.jit (benchmarks/jax_models.py) with the example's configuration, run
    by ``python``; ``{"skipped": why}`` without one or when the run fails."""
    if not python:
        return {"skipped": NO_JAX}
    sys.path[:0] = [os.path.join(EXAMPLES, "mingpt"), EXAMPLES]
    import harness
    from model import SIZES

    config = dict(SIZES[size], vocab_size=harness.CharCorpus.load().vocab_size, steps=steps, warm=warm)
    config["batch"] = load_task("mingpt", size).batch(0)[0].shape[0]
    script = os.path.join(ROOT, "benchmarks", "jax_models.py")
    try:
        out = subprocess.run([python, script, json.dumps(config)], capture_output=True, text=True, check=True)
        return json.loads(out.stdout.strip().splitlines()[-1])
    except subprocess.CalledProcessError as e:
        return {"skipped": f"jax_models.py failed under {python}: {e.stderr[-1500:]}"}
    except (OSError, IndexError, ValueError) as e:
        return {"skipped": f"JAX run failed ({python}): {type(e).__name__}: {str(e)[:300]}"}


def run_worker(name: str, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--worker", name, "--size", args.size, "--steps", str(args.steps), "--warm", str(args.warm)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, PYTHONWARNINGS="ignore"))
    if out.returncode != 0:
        print(f"{name} failed:\n{out.stderr[-3000:]}", file=sys.stderr)
        return {}
    return json.loads(out.stdout.strip().splitlines()[-1])


def table(results: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| workload | row | step ms (median) | first step s | vs CPU inductor | vs JAX jit |",
        "|---|---|---|---|---|---|",
    ]
    for name, rows in results.items():
        inductor = rows.get("cpu inductor", {}).get("step_ms")
        jax = rows.get("jax jit", {}).get("step_ms")
        for row, r in rows.items():
            vs_inductor = f"{r['step_ms'] / inductor:.2f}x" if inductor else "-"
            vs_jax = f"{r['step_ms'] / jax:.2f}x" if jax else "-"
            lines.append(f"| {name} | {row} | {r['step_ms']:.2f} | {r['first_step_s']:.2f} | {vs_inductor} | {vs_jax} |")
    return "\n".join(lines)


def chart(results: dict[str, dict[str, Any]], path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib is not installed: no chart ({path}); pip install matplotlib")
        return
    rows = list(dict.fromkeys(row for r in results.values() for row in r))
    fig, axes = plt.subplots(1, len(results), figsize=(4 * len(results), 3.5), squeeze=False)
    for ax, (name, r) in zip(axes[0], results.items()):
        names = [row for row in rows if row in r]
        ax.bar(range(len(names)), [r[n]["step_ms"] for n in names], color=["C0" if n.startswith("tpu") else "C7" for n in names])
        ax.set_xticks(range(len(names)), names, rotation=45, ha="right", fontsize=8)
        ax.set_title(name)
        ax.set_ylabel("step ms (median)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"chart: {path}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    p.add_argument("--size", default="tiny")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warm", type=int, default=3)
    p.add_argument("--only", default=",".join(WORKLOADS))
    p.add_argument("--png", default="bench_models.png")
    p.add_argument("--json", default="")
    p.add_argument("--jax-python", help="python with jax==0.10.2 for the JAX row (default: $JAX_PYTHON, else this one)")
    p.add_argument("--worker", default="", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.size, args.steps, args.warm)))
        return
    results = {}
    for name in args.only.split(","):
        results[name] = run_worker(name, args)
        if name == "mingpt":
            jax = jax_row(jax_python(args.jax_python), args.size, args.steps, args.warm)
            if "skipped" in jax:
                print(f"jax jit row skipped: {jax['skipped']}", file=sys.stderr)
            else:
                results[name]["jax jit"] = jax
        print(f"{name}: " + ", ".join(f"{row} {r['step_ms']:.2f} ms" for row, r in results[name].items()), flush=True)
    print(table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    chart(results, args.png)


if __name__ == "__main__":
    main()
