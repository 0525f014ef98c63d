#!/usr/bin/env python
"""Train a character-level Llama (RMSNorm, RoPE, GQA, SwiGLU) on five of Shakespeare's sonnets.

    python examples/llama/train.py --size tiny --compare            # tpu vs CPU, eager
    python examples/llama/train.py --mode defer --steps 200
    python examples/llama/train.py --mode compile --bf16

Plain PyTorch: the device string is the only change from a CUDA script (harness.py holds
the command line, the mode switch and --compare). generate.py samples from the model.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from model import BLOCK, SIZES, Llama, LlamaConfig  # noqa: E402

BATCH = {"tiny": 8, "small": 32, "base": 8}


def config(size: str, corpus: harness.CharCorpus) -> LlamaConfig:
    return LlamaConfig(**{"vocab_size": corpus.vocab_size, **SIZES[size]})


def task(size: str) -> tuple[harness.Task, harness.CharCorpus]:
    corpus = harness.CharCorpus.load()
    c = config(size, corpus)

    def loss(model: Llama, batch: Any) -> torch.Tensor:
        x, y = batch
        logits = model(x)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), y.reshape(-1))

    return harness.Task(
        name="llama",
        build=lambda: Llama(c),
        optimizer=lambda params: torch.optim.AdamW(params, lr=3e-3, weight_decay=0.1),
        batch=lambda step: corpus.batch(step, BATCH[size], BLOCK[size]),
        loss=loss,
        unit="tokens",
        items=lambda batch: batch[0].numel(),
    ), corpus


def main(argv: list[str] | None = None) -> harness.Run:
    args = harness.parser(__doc__.splitlines()[1], steps=30).parse_args(argv)
    run, _ = harness.main(task(args.size)[0], args)
    return run


if __name__ == "__main__":
    main()
