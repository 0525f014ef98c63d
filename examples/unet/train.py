#!/usr/bin/env python
"""Train a diffusion UNet (DDPM) to denoise synthetic images of discs and squares.

    python examples/unet/train.py --size tiny --compare            # tpu vs CPU, eager
    python examples/unet/train.py --mode compile --bf16
    python examples/unet/train.py --mode defer --steps 200

Plain PyTorch: the device string is the only change from a CUDA script (harness.py holds
the command line, the mode switch and --compare). Sizes: tiny = 16x16 images, 16 base
channels, 8 images a step; small = 32x32, 32 channels; base = DDPM's CIFAR-10 UNet (35.7M
parameters, 32x32). Every step's images, timesteps and noise are drawn on the CPU.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from model import SIZES, Diffusion, UNetConfig, build  # noqa: E402

BATCH = {"tiny": 8, "small": 32, "base": 128}
LR = {"tiny": 1e-3, "small": 5e-4, "base": 2e-4}  # DDPM: Adam, 2e-4 at batch 128


def shapes(n: int, side: int, g: torch.Generator) -> torch.Tensor:
    """``n`` images in [-1, 1]: a disc or a square of one random colour on another."""
    grid = torch.arange(side, dtype=torch.float32) + 0.5
    center = torch.rand(n, 2, 1, 1, generator=g) * side
    radius = ((0.15 + 0.25 * torch.rand(n, generator=g)) * side)[:, None, None]
    dy, dx = (grid[:, None] - center[:, 0]).abs(), (grid[None, :] - center[:, 1]).abs()
    square = (torch.rand(n, generator=g) < 0.5)[:, None, None]
    inside = torch.where(square, torch.maximum(dx, dy) < radius, dx**2 + dy**2 < radius**2)
    fg, bg = (torch.rand(n, 3, 1, 1, generator=g) * 2 - 1 for _ in range(2))
    return torch.where(inside[:, None], fg, bg)


def batch(step: int, size: str, timesteps: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The step's clean images, timesteps and noise (all drawn here, so every device sees
    the same)."""
    g = torch.Generator().manual_seed(step)
    x0 = shapes(BATCH[size], SIZES[size]["image_size"], g)
    t = torch.randint(0, timesteps, (x0.shape[0],), generator=g)
    return x0, t, torch.randn(x0.shape, generator=g)


def task(size: str) -> harness.Task:
    def loss(model: Diffusion, b: Any) -> torch.Tensor:
        return model.loss(*b)

    timesteps = UNetConfig(**SIZES[size]).timesteps
    return harness.Task(
        name="unet",
        build=lambda: build(size),
        optimizer=lambda params: torch.optim.Adam(params, lr=LR[size]),
        batch=lambda step: batch(step, size, timesteps),
        loss=loss,
        unit="images",
        items=lambda b: b[0].shape[0],
    )


def main(argv: list[str] | None = None) -> harness.Run:
    args = harness.parser(__doc__.splitlines()[1], steps=20).parse_args(argv)
    run, _ = harness.main(task(args.size), args)
    return run


if __name__ == "__main__":
    main()
