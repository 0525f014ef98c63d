#!/usr/bin/env python
"""Greedy generation from a character-level Llama with a static KV cache, prompts of any length.

    python examples/llama/generate.py --compare                   # tpu vs CPU, eager
    python examples/llama/generate.py --mode compile --compare    # prefill and decode compiled

Trains briefly first (train.py's task, --steps 30; --steps 0 keeps the seed's weights).
Then, for each prompt: the prompt is right-padded to a bucket length (a power of two) and
run as one prefill that fills the caches; each decode step feeds one token, writes its
key/value at a position held in a 0-d tensor and attends over the whole cache under the
mask ``arange(max_len) <= pos``. Shapes depend only on the bucket, and no Python number
that changes per token reaches torch.compile, so the programs compiled are one prefill per
bucket and one decode step: the count stops growing once each bucket has been seen.

The generation code here is model-agnostic; qwen/generate.py reuses it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import harness  # noqa: E402

# different lengths, three buckets (8, 16, 32); the last reuses bucket 16 and compiles nothing
PROMPTS = ("Shall", "Rough winds", "And summer's lease hath", "Thou art more")
SMALLEST_BUCKET = 8

MakeTask = Callable[[argparse.Namespace], tuple[harness.Task, harness.CharCorpus]]
Step = Callable[..., tuple[torch.Tensor, torch.Tensor]]


def bucket(n: int) -> int:
    """The padded prompt length: the next power of two (at least SMALLEST_BUCKET)."""
    return max(SMALLEST_BUCKET, 1 << (n - 1).bit_length())


@torch.no_grad()
def prefill(
    model: nn.Module, idx: torch.Tensor, caches: list[nn.Module], last: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the padded prompt (positions 0..bucket-1) through the model, filling the caches;
    return the token after position ``last`` (a 1-element tensor: the prompt's end) and the
    position it goes to. The padding's keys/values land past the prompt, where the mask
    hides them until decode steps overwrite them."""
    logits = model(idx, caches)
    return logits.index_select(1, last).argmax(-1), last[0] + 1


@torch.no_grad()
def decode(
    model: nn.Module, token: torch.Tensor, caches: list[nn.Module], pos: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One step: ``token`` (batch, 1) at position ``pos`` (a 0-d tensor) -> the next token
    and position."""
    logits = model(token, caches, pos.view(1))
    return logits[:, -1:].argmax(-1), pos + 1


@dataclass
class Generation:
    """What one prompt produced, and what it cost."""

    prompt: str
    text: str
    tokens: list[int]
    decode_seconds: float
    decode_tokens: int
    programs: int  # XLA programs compiled so far (tpu only)


def steps_for(device: str, mode: str) -> tuple[Step, Step]:
    """The prefill and decode functions, compiled for --mode compile. dynamic=False: each
    bucket is its own static program (Dynamo would otherwise make the prompt length a
    symbol after the second bucket)."""
    if mode != "compile":
        return prefill, decode
    backend = "tpu" if device.startswith("tpu") else "inductor"
    return torch.compile(prefill, backend=backend, dynamic=False), torch.compile(decode, backend=backend, dynamic=False)


def generate(
    model: nn.Module, corpus: harness.CharCorpus, device: str, mode: str, new_tokens: int, max_len: int
) -> list[Generation]:
    """Greedy ``new_tokens`` characters after each of PROMPTS, with one set of caches."""
    model.eval()
    # one cache set for every prompt: each prefill rewrites positions 0..bucket-1 and each
    # decode step writes its own position before attending, so nothing stale is ever seen
    caches = model.new_caches(1, max_len, device)
    prefill_fn, decode_fn = steps_for(device, mode)
    out = []
    with harness.mode_context(device, mode):
        for prompt in PROMPTS:
            n = len(prompt)
            if bucket(n) + new_tokens > max_len:
                raise ValueError(f"prompt of {n} characters + {new_tokens} new ones do not fit a cache of {max_len}")
            idx = torch.zeros(1, bucket(n), dtype=torch.long)
            idx[0, :n] = corpus.encode(prompt)
            token, pos = prefill_fn(model, idx.to(device), caches, torch.tensor([n - 1]).to(device))
            tokens = [token]
            harness.synchronize(device)
            t0 = time.perf_counter()
            for _ in range(new_tokens - 1):
                token, pos = decode_fn(model, token, caches, pos)
                tokens.append(token)
            ids = torch.cat(tokens, dim=1)[0].tolist()  # waits for the device
            seconds = time.perf_counter() - t0
            out.append(Generation(prompt, corpus.decode(ids), ids, seconds, new_tokens - 1, harness.programs_built(device)))
    return out


def report(name: str, device: str, mode: str, gens: list[Generation], programs_before: int) -> str:
    """Print each prompt's text and program count; return the summary line."""
    for g in gens:
        print(f"{len(g.prompt):>3} chars (bucket {bucket(len(g.prompt))}): {g.prompt!r} -> {g.text!r}")
        print(f"    programs compiled so far: {g.programs - programs_before}")
    # the first prompt's decode compiles its step; the rate counts the prompts after it
    timed = gens[1:] or gens
    rate = sum(g.decode_tokens for g in timed) / sum(g.decode_seconds for g in timed)
    settled = gens[-1].programs - gens[-2].programs if len(gens) > 1 else 0
    return (
        f"{name} generate {device} {mode}: {len(gens)} prompts, {len(gens[0].tokens)} new tokens each, "
        f"decode {rate:,.0f} tokens/s, {gens[-1].programs - programs_before} programs compiled "
        f"({settled} for the last prompt, whose bucket was seen)"
    )


def run(
    description: str,
    make_task: MakeTask,
    argv: list[str] | None,
    extra: Callable[[argparse.ArgumentParser], None] | None = None,
) -> None:
    """Train briefly, generate for every prompt on --device, and with --compare also on the
    CPU from the same weights; exit 1 if any token differs."""
    p = harness.parser(description, steps=30)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--max-len", type=int, default=128, help="KV cache length")
    if extra is not None:
        extra(p)
    args = p.parse_args(argv)
    task, corpus = make_task(args)
    # --bf16 trains under autocast; generation runs in float32 (the caches' dtype)
    model = harness.train(task, args.device, args.mode, args.steps, args.bf16, args.seed).model
    before = harness.programs_built(args.device)
    gens = generate(model, corpus, args.device, args.mode, args.new_tokens, args.max_len)
    line = report(task.name, args.device, args.mode, gens, before)
    differ = False
    if args.compare:
        reference = task.build()
        reference.load_state_dict(model.state_dict())  # the trained weights, copied to the CPU
        cpu = generate(reference, corpus, "cpu", "eager", args.new_tokens, args.max_len)
        differ = any(g.tokens != c.tokens for g, c in zip(gens, cpu))
        for g, c in zip(gens, cpu):
            if g.tokens != c.tokens:
                print(f"DIFFERENT from the CPU after {g.prompt!r}: cpu -> {c.text!r}")
        print("generated tokens: " + ("DIFFERENT from the CPU" if differ else "same as the CPU"))
    print(line)
    if differ:
        sys.exit(1)


def main(argv: list[str] | None = None) -> None:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import train

    run(__doc__.splitlines()[1], lambda args: train.task(args.size), argv)


if __name__ == "__main__":
    main()
