#!/usr/bin/env python
"""Train a small MLP classifier on device "tpu" and on the CPU; print both final losses.

    make demo                     # or: .venv/bin/python examples/train_mlp.py

The only change from a CPU/CUDA script is the device string: `import torch` loads the
backend by itself.
"""

from __future__ import annotations

import time

import torch
import torch.nn as nn
import torch.nn.functional as F

try:
    from tqdm import tqdm
except ImportError:  # the progress bar is optional
    def tqdm(it, **kwargs):  # type: ignore[no-redef]
        return it

STEPS = 60
BATCH = 64


def make_data(n: int = 2048, d: int = 32, classes: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    centers = torch.randn(classes, d, generator=g) * 0.3
    y = torch.randint(0, classes, (n,), generator=g)
    x = centers[y] + torch.randn(n, d, generator=g)
    return x, y


def train(device: str) -> tuple[float, float]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.LayerNorm(128), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 4))
    model = model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    x_all, y_all = make_data()
    start = time.perf_counter()
    bar = tqdm(range(STEPS), desc=f"{device:>3}", ncols=80)
    for step in bar:
        i = (step * BATCH) % len(x_all)
        x, y = x_all[i : i + BATCH].to(device), y_all[i : i + BATCH].to(device)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if step % 10 == 0 and hasattr(bar, "set_postfix"):
            bar.set_postfix(loss=f"{loss.item():.4f}")
    final = loss.item()
    return final, time.perf_counter() - start


def main() -> None:
    import torchtpu

    print(f"torchtpu {torchtpu.__version__} on {torch.tpu.get_device_name()}")
    tpu_loss, tpu_s = train("tpu")
    cpu_loss, cpu_s = train("cpu")
    print(f"final loss after {STEPS} steps:  tpu {tpu_loss:.6f} ({tpu_s:.2f} s)   cpu {cpu_loss:.6f} ({cpu_s:.2f} s)")
    print(f"difference: {abs(tpu_loss - cpu_loss):.2e}")
    m = torchtpu.metrics.snapshot()
    print(f"programs compiled: {m['compiles']}, cache hits: {m['cache_hits']}, executions: {m['executions']}")


if __name__ == "__main__":
    main()
