#!/usr/bin/env python
"""Train the diffusion UNet for a few steps, then draw images with DDPM's ancestral sampler.

    python examples/unet/sample.py --size tiny --compare            # tpu vs CPU samples
    python examples/unet/sample.py --steps 300 --sample-steps 50 --mode defer

The sampler's noise (x_T and each step's) is drawn on the CPU from a generator seeded by
--seed, so every device denoises the same noise; --compare samples on the CPU too, with the
weights trained on the device, and fails when the samples differ beyond float32 round-off.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from model import Diffusion  # noqa: E402
from train import task  # noqa: E402

SHADES = " .:-=+*#%@"


def sampler_noise(n: int, side: int, steps: int, seed: int) -> list[torch.Tensor]:
    """x_T and the noise of every step but the last, drawn on the CPU."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, 3, side, side, generator=g) for _ in range(steps)]


def sample(model: Diffusion, args: argparse.Namespace, device: str) -> torch.Tensor:
    """``args.images`` samples on ``device`` (in ``args.mode``), returned on the CPU."""
    model.eval()
    net = model.net
    if args.mode == "compile":
        net = torch.compile(net, backend="tpu" if device.startswith("tpu") else "inductor")
    noise = [z.to(device) for z in sampler_noise(args.images, model.net.config.image_size, args.sample_steps, args.seed)]
    with harness.mode_context(device, args.mode):
        return model.sample(noise, args.sample_steps, net).cpu()


def ascii_image(img: torch.Tensor) -> str:
    """An image in [-1, 1] as text: its brightness in 10 shades, two characters a pixel."""
    levels = ((img.mean(0) + 1) / 2 * (len(SHADES) - 1)).round().clamp(0, len(SHADES) - 1).long()
    return "\n".join("".join(SHADES[v] * 2 for v in row) for row in levels.tolist())


def main(argv: list[str] | None = None) -> torch.Tensor:
    p = harness.parser(__doc__.splitlines()[1], steps=6)
    p.add_argument("--sample-steps", type=int, default=10, help="ancestral sampling steps (timesteps respaced)")
    p.add_argument("--images", type=int, default=4)
    args = p.parse_args(argv)
    t = task(args.size)
    run = harness.train(t, args.device, args.mode, args.steps, args.bf16, args.seed)
    samples = sample(run.model, args, args.device)
    print(ascii_image(samples[0]))
    stats = " ".join(f"{s.mean():+.3f}/{s.std():.3f}" for s in samples)
    print(
        f"unet {args.device} {args.mode}: {args.images} samples after {args.steps} training steps, {args.sample_steps} sampling steps; mean/std {stats}"
    )
    if args.compare:
        # The CPU samples with the weights trained on the device: this checks the sampler.
        reference = t.build()
        reference.load_state_dict({k: v.cpu() for k, v in run.model.state_dict().items()})
        expected = sample(reference, argparse.Namespace(**{**vars(args), "mode": "eager"}), "cpu")
        harness.check_against_cpu(samples, expected, "sample")
    return samples


if __name__ == "__main__":
    main()
