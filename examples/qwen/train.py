#!/usr/bin/env python
"""Train a character-level Qwen3 (QK-norm, tied embeddings; --moe: top-k mixture of experts) on the sonnets.

    python examples/qwen/train.py --size tiny --compare            # tpu vs CPU, eager
    python examples/qwen/train.py --moe --mode defer --steps 200
    python examples/qwen/train.py --mode compile --bf16

Plain PyTorch: the device string is the only change from a CUDA script (harness.py holds
the command line, the mode switch and --compare). generate.py samples from the model.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from model import BLOCK, MOE_SIZES, SIZES, Qwen3, QwenConfig  # noqa: E402

BATCH = {"tiny": 8, "small": 32, "base": 8}


def config(size: str, moe: bool, corpus: harness.CharCorpus) -> QwenConfig:
    return QwenConfig(**{"vocab_size": corpus.vocab_size, **(MOE_SIZES if moe else SIZES)[size]})


def task(size: str, moe: bool = False) -> tuple[harness.Task, harness.CharCorpus]:
    corpus = harness.CharCorpus.load()
    c = config(size, moe, corpus)

    return harness.language_task("qwen-moe" if moe else "qwen", lambda: Qwen3(c), corpus, BATCH[size], BLOCK[size]), corpus


def add_moe_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--moe", action="store_true", help="Qwen3-MoE: mixture-of-experts MLPs")


def main(argv: list[str] | None = None) -> harness.Run:
    p = harness.parser(__doc__.splitlines()[1], steps=30)
    add_moe_flag(p)
    args = p.parse_args(argv)
    run, _ = harness.main(task(args.size, args.moe)[0], args)
    return run


if __name__ == "__main__":
    main()
