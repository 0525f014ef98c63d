#!/usr/bin/env python
"""Greedy generation from a character-level Qwen3 (--moe: Qwen3-MoE) with a static KV cache.

    python examples/qwen/generate.py --compare                   # tpu vs CPU, eager
    python examples/qwen/generate.py --moe --mode compile --compare

Trains briefly first (train.py's task, --steps 30; --steps 0 keeps the seed's weights),
then generates for prompts of different lengths exactly as examples/llama/generate.py
does (its model-agnostic generation code is reused here): each prompt padded to a bucket
and run as one prefill, then one decode step per token at a position held in a tensor.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train  # noqa: E402  (examples/qwen/train.py)
from llama.generate import run  # noqa: E402  (examples/llama/generate.py, as a package module)


def main(argv: list[str] | None = None) -> None:
    run(__doc__.splitlines()[1], lambda args: train.task(args.size, args.moe), argv, train.add_moe_flag)


if __name__ == "__main__":
    main()
