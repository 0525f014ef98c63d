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

    return harness.language_task("llama", lambda: Llama(c), corpus, BATCH[size], BLOCK[size]), corpus


def main(argv: list[str] | None = None) -> harness.Run:
    args = harness.parser(__doc__.splitlines()[1], steps=30).parse_args(argv)
    run, _ = harness.main(task(args.size)[0], args)
    return run


if __name__ == "__main__":
    main()
