#!/usr/bin/env python
"""The reference system (torch-tpu, module ``torch_tpu``) on the benchmarks' workloads, run on the CPU.

torch-tpu is Google/Meta's PyTorch TPU backend. It normally needs a TPU; its set-up script
(``setup_torchtpu_peer.sh DIR``, shipped beside the project's benchmark notes) builds a venv
``DIR/venv`` with torch 2.13, torch-tpu 0.2.0, an XLA CPU PjRT plugin and a small C shim
``DIR/pjrt_shim/libpjrt_option_filter_shim.so`` that lets the plugin stand in for libtpu.
This script runs the same workloads as bench_eager.py and bench_modes.py under it:

  add:  y = x + x on a 2x2 float32 tensor + torch.accelerator.synchronize() (median of ADD_N)
  MLP:  3-layer MLP 1024-1024-1024-10, batch 64, cross-entropy, SGD lr 0.01, seed 0; one step =
        zero_grad + forward + backward + SGD + synchronize; first step, then the median of
        MLP_N steps after WARM warm-up steps, and the loss after 1 + WARM + MLP_N steps
        (1.7841 with the defaults, as for every torch-based system), in the reference system's
        two eager modes: DEFER_NEVER (its default: one launch per op) and DEFER_AND_FUSE.

Two sides:
  driver  ``peer_reference(python)`` (used by bench_modes.py and bench_eager.py) runs this file
          with ``python``, the interpreter of the reference system's venv, given by
          ``--peer-python`` or PEER_PYTHON, and returns the figures; without one it returns
          ``{"skipped": note}``, never an error.
  child   ``PEER_PYTHON peer_mlp.py --child --out result.json``: sets up the plugin and times.
By itself: ``python benchmarks/peer_mlp.py --peer-python DIR/venv/bin/python`` prints the JSON.

The plugin, chosen in the child before torch is imported (torch autoloads torch_tpu, which
aborts without TPU_LIBRARY_PATH): TPU_LIBRARY_PATH if set; else PEER_PLUGIN=shim (the
lammps-jax-pjrt-cpu plugin behind the shim at PEER_PJRT_SHIM, by default
``<venv>/../pjrt_shim/libpjrt_option_filter_shim.so``) or PEER_PLUGIN=xla-cpu-pjrt (the
xla-cpu-pjrt plugin, no shim needed: eager modes only); "auto" (default) takes the shim
when it is there. Compile caches start empty (a fresh TMPDIR and TORCHINDUCTOR_CACHE_DIR).

Env: PEER_PYTHON, PEER_PLUGIN, PEER_PJRT_SHIM, ADD_N, MLP_N, WARM.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from scratch_dirs import scratch_dir

B, D, H, C = 64, 1024, 1024, 10
LR = 0.01
MODES = ("DEFER_NEVER", "DEFER_AND_FUSE")
SETUP_NOTE = (
    "set PEER_PYTHON (or --peer-python) to the python of a venv with the reference system "
    "(torch-tpu 0.2.0 on a CPU PjRT plugin: its set-up script setup_torchtpu_peer.sh DIR builds DIR/venv)"
)


# -- driver side (runs under any python; imports nothing of torch) -----------------------------
def peer_python(option: str | None = None) -> str | None:
    """The reference system's interpreter: the option, else PEER_PYTHON, else none."""
    return option or os.environ.get("PEER_PYTHON") or None


def peer_reference(python: str | None, add_n: int = 200, mlp_n: int = 50, warm: int = 5, timeout: float = 900) -> dict:
    """Run the child under ``python``; its JSON, or ``{"skipped": why}`` when it cannot run."""
    if not python:
        return {"skipped": SETUP_NOTE}
    if not shutil.which(python) and not os.access(python, os.X_OK):
        return {"skipped": f"PEER_PYTHON={python} is not an executable; {SETUP_NOTE}"}
    work = scratch_dir("peer_mlp_")
    out = os.path.join(work, "peer.json")
    # cold compile caches: torch-tpu keeps its executables in inductor's cache directory
    env = dict(os.environ, ADD_N=str(add_n), MLP_N=str(mlp_n), WARM=str(warm), TMPDIR=work)
    env["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(work, "inductor")
    try:
        run = subprocess.run(
            [python, os.path.abspath(__file__), "--child", "--out", out],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if run.returncode != 0 or not os.path.exists(out):
            tail = (run.stderr or run.stdout).strip().splitlines()[-3:]
            return {"skipped": f"the reference system's run failed (exit {run.returncode}): {' | '.join(tail)[:400]}"}
        with open(out) as f:
            return json.load(f)
    except (OSError, subprocess.SubprocessError, ValueError) as e:
        return {"skipped": f"the reference system's run failed: {type(e).__name__}: {str(e)[:300]}"}
    finally:
        shutil.rmtree(work, ignore_errors=True)


# -- child side (runs under the reference system's python) -------------------------------------
def _plugin_env() -> str | None:
    """Point TPU_LIBRARY_PATH at a CPU PjRT plugin; None when done, else why it cannot be."""
    if os.environ.get("TPU_LIBRARY_PATH"):
        return None
    choice = os.environ.get("PEER_PLUGIN", "auto")
    shim = os.environ.get("PEER_PJRT_SHIM") or os.path.join(
        os.path.dirname(sys.prefix), "pjrt_shim", "libpjrt_option_filter_shim.so"
    )
    real = importlib.util.find_spec("lammps_jax_pjrt_cpu")
    if choice == "shim" or (choice == "auto" and real is not None and os.path.exists(shim)):
        if real is None or not os.path.exists(shim):
            return f"PEER_PLUGIN=shim needs lammps-jax-pjrt-cpu and the shim {shim}"
        os.environ.setdefault("PJRT_SHIM_REAL_PLUGIN", os.path.join(os.path.dirname(real.origin), "pjrt_c_api_cpu_plugin.so"))
        os.environ["TPU_LIBRARY_PATH"] = shim
        os.environ["PEER_PLUGIN_USED"] = "shim"
        return None
    cpu = importlib.util.find_spec("xla_plugins.xla_cpu_pjrt") if importlib.util.find_spec("xla_plugins") else None
    if cpu is None:
        return "no CPU PjRT plugin for the reference system (install xla-cpu-pjrt, or build the shim)"
    os.environ["TPU_LIBRARY_PATH"] = os.path.join(os.path.dirname(cpu.origin), "xla_cpu_pjrt.so")
    os.environ["PEER_PLUGIN_USED"] = "xla-cpu-pjrt"
    return None


def _quiet() -> None:
    """The reference system warns about tcmalloc and API stages on import: not our business."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("PYTHONWARNINGS", "ignore:<TorchTpu/Performance/TcMalloc/,ignore:<TorchTpu/ApiStage")
    import warnings

    warnings.filterwarnings("ignore", message="<TorchTpu/")


def _median_of(fn: Callable[[], Any], n: int) -> float:
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def _add_sync(torch: Any, n: int) -> dict:
    x = torch.ones(2, 2, device="tpu")

    def op() -> None:
        y = x + x  # noqa: F841 (the add is the workload)
        torch.accelerator.synchronize()

    for _ in range(20):
        op()
    return {"add_sync_s": _median_of(op, n)}


def _mlp(torch: Any, n: int, warm: int) -> dict:
    """The stock training step of bench_compile.py, timed as bench_compile.timed does."""
    nn, F = torch.nn, torch.nn.functional
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(D, H), nn.ReLU(), nn.Linear(H, H), nn.ReLU(), nn.Linear(H, C)).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(B, D, generator=g).to("tpu"), torch.randint(0, C, (B,), generator=g).to("tpu")
    torch.accelerator.synchronize()

    def step() -> Any:
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        torch.accelerator.synchronize()
        return loss

    t0 = time.perf_counter()
    loss = step()
    first = time.perf_counter() - t0
    for _ in range(warm):
        step()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        loss = step()
        ts.append(time.perf_counter() - t0)
    return {"first_step_s": first, "step_s": statistics.median(ts), "loss": float(loss.detach().cpu())}


def _guarded(fn: Callable[..., dict], *args: Any) -> dict:
    try:
        return fn(*args)
    except Exception as e:  # one failing mode must not hide the others
        return {"skipped": f"{type(e).__name__}: {str(e)[:300]}"}


def child() -> dict:
    if importlib.util.find_spec("torch_tpu") is None:
        return {"skipped": f"{sys.executable} has no torch_tpu; {SETUP_NOTE}"}
    why = _plugin_env()
    if why:
        return {"skipped": why}
    _quiet()
    import torch
    from torch_tpu import _loader

    t0 = time.perf_counter()
    _loader._init_device("tpu")  # its autoloader registers "tpu" only when it sees a TPU
    torch.ones(1, device="tpu").cpu()
    res: dict = {
        "peer": "torch_tpu",
        "torch_tpu": importlib.metadata.version("torch_tpu"),
        "torch": torch.__version__,
        "plugin": os.environ.get("PEER_PLUGIN_USED", "TPU_LIBRARY_PATH"),
        "device_init_s": time.perf_counter() - t0,
    }
    add_n, mlp_n, warm = (int(os.environ.get(k, d)) for k, d in (("ADD_N", 200), ("MLP_N", 50), ("WARM", 5)))
    modes = torch.tpu.EagerMode
    default = torch.tpu.eager_mode
    for name in MODES:
        torch.tpu.eager_mode = getattr(modes, name)
        res[name] = {**_guarded(_add_sync, torch, add_n), **_guarded(_mlp, torch, mlp_n, warm)}
    torch.tpu.eager_mode = default
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--peer-python", help="python of the reference system's venv (default: $PEER_PYTHON)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help="write the JSON here")
    a = p.parse_args()
    if a.child:
        res = child()
    else:
        res = peer_reference(
            peer_python(a.peer_python), *(int(os.environ.get(k, d)) for k, d in (("ADD_N", 200), ("MLP_N", 50), ("WARM", 5)))
        )
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
    if not a.child:
        print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
