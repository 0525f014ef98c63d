#!/usr/bin/env python
"""Train a character-level GPT (minGPT) on five of Shakespeare's sonnets, then sample.

    python examples/mingpt/train.py --size tiny --compare            # tpu vs CPU, eager
    python examples/mingpt/train.py --mode defer --steps 200 --sample 200
    python examples/mingpt/train.py --mode compile --bf16

Plain PyTorch: the device string is the only change from a CUDA script (harness.py holds
the command line, the mode switch and --compare).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from model import GPT, SIZES, GPTConfig  # noqa: E402

BATCH = {"tiny": 8, "small": 32, "base": 16}


def task(size: str) -> tuple[harness.Task, harness.CharCorpus]:
    corpus = harness.CharCorpus.load()
    config = GPTConfig(vocab_size=corpus.vocab_size, **SIZES[size])

    return harness.language_task("mingpt", lambda: GPT(config), corpus, BATCH[size], config.block_size), corpus


def main(argv: list[str] | None = None) -> harness.Run:
    p = harness.parser(__doc__.splitlines()[1], steps=30)
    p.add_argument("--sample", type=int, default=0, help="characters to sample after training (greedy)")
    args = p.parse_args(argv)
    t, corpus = task(args.size)
    run, _ = harness.main(t, args)
    if args.sample:
        prompt = corpus.encode("Shall I ")[None].to(args.device)
        out = run.model.eval().generate(prompt, args.sample, temperature=0)
        print(corpus.decode(out[0].tolist()))
    return run


if __name__ == "__main__":
    main()
