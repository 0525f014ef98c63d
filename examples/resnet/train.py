#!/usr/bin/env python
"""Train an image classifier (torchvision's ResNet-18 or ResNet-50) with SGD on random images.

    python examples/resnet/train.py --size tiny --compare                   # tpu vs CPU, eager
    python examples/resnet/train.py --arch resnet50 --channels-last --mode compile
    python examples/resnet/train.py --mode defer --bf16 --steps 50

Plain PyTorch: the device string is the only change from a CUDA script (harness.py holds
the command line, the mode switch and --compare). The network is the real ResNet at full
width at every size; the sizes differ in the images, classes and batch:
tiny = 2 images 3x64x64, 10 classes (the four stages run at 16, 8, 4 and 2 pixels);
small = 8 images 3x128x128, 100 classes; base = 32 images 3x224x224, 1000 classes (ImageNet).
Not smaller than tiny: BatchNorm's batch statistics need enough values per channel at the
last stage (2 images at 32x32 leave 2, and the CPU's own float32 logits are then 1e-2 off
the float64 ones).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

try:
    from torchvision.models import resnet18, resnet50
except (ImportError, RuntimeError):  # no torchvision, or one built for another torch
    from resnet import resnet18, resnet50  # noqa: E402

ARCHS = {"resnet18": resnet18, "resnet50": resnet50}
# batch, image side, classes
SIZES = {"tiny": (2, 64, 10), "small": (8, 128, 100), "base": (32, 224, 1000)}
# torchvision's ImageNet recipe: SGD, momentum 0.9, weight decay 1e-4, lr 0.1 per 256 images.
LR_PER_IMAGE = 0.1 / 256


def images(step: int, size: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The step's random images (normalised, so N(0, 1) pixels) and random labels."""
    batch, side, classes = SIZES[size]
    g = torch.Generator().manual_seed(step)
    return torch.randn(batch, 3, side, side, generator=g), torch.randint(0, classes, (batch,), generator=g)


def build(arch: str, size: str, channels_last: bool) -> nn.Module:
    # Zero-gamma init (Goyal et al. 2017; timm's default): every residual branch starts at
    # zero, so each block starts as the identity. It also keeps the first steps' updates
    # small: with the usual init a ReLU input within float32 round-off of 0 (one element in
    # a million) switches a gradient on or off, moves a conv's gradient by up to 30%, and
    # the CPU alone, from weights differing by 1e-7, ends 6 steps up to 1e-2 apart (resnet50: 0.4).
    model = ARCHS[arch](num_classes=SIZES[size][2], zero_init_residual=True)
    return model.to(memory_format=torch.channels_last) if channels_last else model


def task(arch: str, size: str, channels_last: bool = False) -> harness.Task:
    memory_format = torch.channels_last if channels_last else torch.contiguous_format

    def loss(model: nn.Module, batch: Any) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(model(x.contiguous(memory_format=memory_format)), y)

    return harness.Task(
        name=arch,
        build=lambda: build(arch, size, channels_last),
        optimizer=lambda params: torch.optim.SGD(params, lr=LR_PER_IMAGE * SIZES[size][0], momentum=0.9, weight_decay=1e-4),
        batch=lambda step: images(step, size),
        loss=loss,
        unit="images",
        items=lambda batch: batch[0].shape[0],
    )


def parser(description: str, steps: int) -> argparse.ArgumentParser:
    p = harness.parser(description, steps=steps)
    p.add_argument("--arch", choices=sorted(ARCHS), default="resnet18")
    p.add_argument("--channels-last", action="store_true", help="model and images in torch.channels_last")
    return p


def main(argv: list[str] | None = None) -> harness.Run:
    args = parser(__doc__.splitlines()[1], steps=20).parse_args(argv)
    run, _ = harness.main(task(args.arch, args.size, args.channels_last), args)
    return run


if __name__ == "__main__":
    main()
