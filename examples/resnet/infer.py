#!/usr/bin/env python
"""Train a ResNet for a few steps, then classify a batch in eval mode and print the top 5.

    python examples/resnet/infer.py --size tiny --compare            # tpu vs CPU logits
    python examples/resnet/infer.py --arch resnet50 --channels-last --mode compile

Eval mode: BatchNorm normalises with the running statistics the training steps gathered.
--compare loads the trained weights into a CPU model, classifies the same batch there and
fails when the logits differ beyond float32 round-off.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from train import build, images, parser, task  # noqa: E402


def classify(model: nn.Module, x: torch.Tensor, args: argparse.Namespace, device: str, mode: str) -> torch.Tensor:
    """The eval-mode logits of ``x`` on ``device`` in ``mode``, returned on the CPU."""
    model.eval()
    if mode == "compile":
        model = torch.compile(model, backend="tpu" if device.startswith("tpu") else "inductor")
    memory_format = torch.channels_last if args.channels_last else torch.contiguous_format
    with torch.no_grad(), harness.mode_context(device, mode):
        return model(x.to(device).contiguous(memory_format=memory_format)).cpu()


def top5(logits: torch.Tensor) -> list[str]:
    p = logits.softmax(-1)
    values, classes = p.topk(min(5, p.shape[-1]), dim=-1)
    return [" ".join(f"{c:3d} ({v:.3f})" for c, v in zip(cs.tolist(), vs.tolist())) for cs, vs in zip(classes, values)]


def main(argv: list[str] | None = None) -> torch.Tensor:
    args = parser(__doc__.splitlines()[1], steps=3).parse_args(argv)
    run = harness.train(task(args.arch, args.size, args.channels_last), args.device, args.mode, args.steps, args.bf16, args.seed)
    x, _ = images(args.steps, args.size)  # the batch after the training batches: unseen
    logits = classify(run.model, x, args, args.device, args.mode)
    for i, line in enumerate(top5(logits)):
        print(f"{args.device} image {i}: top-5 {line}")
    if args.compare:
        reference = build(args.arch, args.size, args.channels_last)
        reference.load_state_dict({k: v.cpu() for k, v in run.model.state_dict().items()})
        expected = classify(reference, x, args, "cpu", "eager")
        for i, line in enumerate(top5(expected)):
            print(f" cpu image {i}: top-5 {line}")
        harness.check_against_cpu(logits, expected, "logit")
    return logits


if __name__ == "__main__":
    main()
