"""What the examples share: their command line, the execution mode switch, a training loop
with a progress bar, and ``--compare`` (the same seeds on the CPU, in the same process).

An example describes its model and data as a :class:`Task`; everything here is plain
PyTorch except :func:`mode_context`, the one place that names torchtpu (DeferAndFuse is a
torchtpu mode; on CUDA the line would not exist).

    --device tpu|cpu   --mode eager|defer|compile   --steps N   --size tiny|small|base
    --bf16             --compare                    --seed S
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

try:
    from tqdm import tqdm
except ImportError:  # the progress bar is optional

    def tqdm(it: Iterable[Any], **kwargs: Any) -> Iterable[Any]:  # type: ignore[no-redef]
        return it


MODES = ("eager", "defer", "compile")
SIZES = ("tiny", "small", "base")
# The first steps compile (the first also creates the optimizer's state, so the second
# runs another program); throughput counts the steps after them.
WARMUP_STEPS = 2
# The last steps of a run must compile nothing (every program is cached by then).
SETTLED_STEPS = 2
# Loss agreement with the CPU after a few optimizer steps: float32 round-off grows with the
# steps (each step's update feeds the next), so this is a few ulps per step, not a fit
# to any example. bfloat16 autocast: one bfloat16 ulp (2**-8) relative.
FLOAT32_TOLERANCE = dict(rtol=1e-4, atol=1e-5)
BFLOAT16_TOLERANCE = dict(rtol=2**-8, atol=1e-3)
DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")


@dataclass
class Task:
    """A training example: how to build the model, its optimizer and data, and its loss.

    ``batch(step)`` returns the step's inputs on the CPU (deterministic in ``step``), a
    tensor or a tuple of tensors; ``loss(model, batch)`` computes the training loss from
    the batch moved to the model's device. ``items(batch)`` counts what the throughput is
    reported in (``unit``: tokens, images, samples).
    """

    name: str
    build: Callable[[], nn.Module]
    optimizer: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]
    batch: Callable[[int], Any]
    loss: Callable[[nn.Module, Any], torch.Tensor]
    unit: str
    items: Callable[[Any], int]


@dataclass
class Run:
    """What one training run measured."""

    device: str
    mode: str
    losses: list[float]
    seconds: float  # the steps after the first WARMUP_STEPS (which compile)
    first_step_seconds: float
    items_per_second: float
    settled_compiles: int  # XLA programs compiled during the last SETTLED_STEPS steps
    settled_graphs: int  # torch.compile graphs captured during those steps
    model: nn.Module = field(repr=False)


def parser(description: str, steps: int = 20) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--device", default="tpu", help="tpu or cpu (default tpu)")
    p.add_argument("--mode", choices=MODES, default="eager", help="compile: torch.compile of the whole step")
    p.add_argument("--steps", type=int, default=steps)
    p.add_argument("--size", choices=SIZES, default="tiny", help="tiny: seconds on the cpu platform; base: the real size")
    p.add_argument("--bf16", action="store_true", help="train under torch.autocast(dtype=torch.bfloat16)")
    p.add_argument("--compare", action="store_true", help="also run on the CPU and fail when the losses differ")
    p.add_argument("--seed", type=int, default=0)
    return p


def mode_context(device: str, mode: str) -> contextlib.AbstractContextManager[Any]:
    """DeferAndFuse for ``--mode defer`` on tpu (record the step's ops, run them as one
    fused program); nothing otherwise."""
    if mode == "defer" and device.startswith("tpu"):
        import torchtpu

        return torchtpu.eager_mode("defer_and_fuse")
    return contextlib.nullcontext()


def to_device(batch: Any, device: str) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    return type(batch)(to_device(b, device) for b in batch)


def _counters(device: str) -> tuple[int, int]:
    """(XLA programs built, torch.compile graphs) so far, for a tpu device."""
    if not device.startswith("tpu"):
        return 0, 0
    import torchtpu

    return programs_built(device), torchtpu.metrics.snapshot().get("compiled_graphs", 0)


def programs_built(device: str) -> int:
    """XLA programs this process has compiled so far on a tpu device, counting those loaded
    from torchtpu's disk cache (a second run loads them instead of compiling: a program
    new to the run is new either way)."""
    if not device.startswith("tpu"):
        return 0
    import torchtpu

    m = torchtpu.metrics.snapshot()
    return m["compiles"] + m["disk_cache_hits"]


def synchronize(device: str) -> None:
    if device.startswith("tpu"):
        torch.tpu.synchronize()


def make_step(task: Task, model: nn.Module, opt: torch.optim.Optimizer, device: str, bf16: bool) -> Callable[[Any], torch.Tensor]:
    """One training step: forward (under autocast with --bf16), backward, optimizer step."""
    autocast_device = torch.device(device).type

    def step(batch: Any) -> torch.Tensor:
        with torch.autocast(autocast_device, dtype=torch.bfloat16, enabled=bf16):
            loss = task.loss(model, batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    return step


def train(task: Task, device: str, mode: str, steps: int, bf16: bool = False, seed: int = 0) -> Run:
    """Train ``task`` for ``steps`` steps on ``device`` in ``mode``; the model starts from
    ``seed`` on the CPU, so every device starts from the same weights."""
    torch.manual_seed(seed)
    model = task.build().to(device)
    opt = task.optimizer(model.parameters())
    step = make_step(task, model, opt, device, bf16)
    if mode == "compile":
        step = torch.compile(step, backend="tpu" if device.startswith("tpu") else "inductor")
    losses: list[torch.Tensor] = []
    settled = (0, 0)
    first = total = 0.0
    items = 0
    quiet = not sys.stderr.isatty()  # no progress bar in logs
    bar = tqdm(range(steps), desc=f"{task.name} {device} {mode}", unit="step", ncols=100, leave=False, disable=quiet)
    with mode_context(device, mode):
        for i in bar:
            batch = task.batch(i)
            if i == steps - SETTLED_STEPS:
                synchronize(device)
                settled = _counters(device)
            t0 = time.perf_counter()
            losses.append(step(to_device(batch, device)))
            synchronize(device)
            dt = time.perf_counter() - t0
            if i == 0:
                first = dt
            elif i >= WARMUP_STEPS:
                total += dt
                items += task.items(batch)
            if hasattr(bar, "set_postfix_str") and total:
                bar.set_postfix_str(f"{items / total:,.0f} {task.unit}/s")
    after = _counters(device)
    return Run(
        device=device,
        mode=mode,
        losses=[float(v) for v in losses],
        seconds=total,
        first_step_seconds=first,
        items_per_second=items / total if total else math.nan,
        settled_compiles=after[0] - settled[0],
        settled_graphs=after[1] - settled[1],
        model=model,
    )


def next_token_loss(model: nn.Module, batch: Any) -> torch.Tensor:
    """Cross-entropy of the model's logits (batch, time, vocab) against the next tokens."""
    x, y = batch
    logits = model(x)
    return F.cross_entropy(logits.view(-1, logits.size(-1)), y.reshape(-1))


def language_task(name: str, build: Callable[[], nn.Module], corpus: CharCorpus, batch_size: int, block: int) -> Task:
    """Next-character training on ``corpus`` with AdamW (the text examples' task)."""
    return Task(
        name=name,
        build=build,
        optimizer=lambda params: torch.optim.AdamW(params, lr=3e-3, weight_decay=0.1),
        batch=lambda step: corpus.batch(step, batch_size, block),
        loss=next_token_loss,
        unit="tokens",
        items=lambda batch: batch[0].numel(),
    )


def check_against_cpu(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    """Print the largest difference of ``what`` from the CPU's; exit with status 1 when
    the two differ beyond float32 tolerance."""
    agree = torch.allclose(actual, expected, **FLOAT32_TOLERANCE)
    worst = (actual - expected).abs().max().item()
    print(f"largest {what} difference {worst:.2e}: {'same as the CPU' if agree else 'DIFFERENT from the CPU'}")
    if not agree:
        sys.exit(1)


def losses_agree(run: Run, reference: Run, bf16: bool) -> bool:
    tol = BFLOAT16_TOLERANCE if bf16 else FLOAT32_TOLERANCE
    return torch.allclose(torch.tensor(run.losses), torch.tensor(reference.losses), **tol)


def _rate(per_second: float) -> str:
    return "n/a" if math.isnan(per_second) else f"{per_second:,.0f}"  # n/a: no step after the warm-up


def summary(task: Task, run: Run) -> str:
    return (
        f"{task.name} {run.device} {run.mode}: {len(run.losses)} steps, loss {run.losses[0]:.4f} -> {run.losses[-1]:.4f}, "
        f"{_rate(run.items_per_second)} {task.unit}/s (first step {run.first_step_seconds:.2f} s), "
        f"{run.settled_compiles} programs compiled in the last {SETTLED_STEPS} steps"
    )


def main(task: Task, args: argparse.Namespace) -> tuple[Run, Run | None]:
    """Train as ``args`` say; with --compare also on the CPU (eager) from the same seed,
    print both loss curves, and exit with status 1 when they differ."""
    run = train(task, args.device, args.mode, args.steps, args.bf16, args.seed)
    reference = None
    if args.compare:
        reference = train(task, "cpu", "eager", args.steps, args.bf16, args.seed)
        for name, r in ((args.device, run), ("cpu", reference)):
            print(f"{name:>4} losses: " + " ".join(f"{v:.6f}" for v in r.losses))
        worst = max(abs(a - b) for a, b in zip(run.losses, reference.losses))
        agree = losses_agree(run, reference, args.bf16)
        print(f"largest loss difference {worst:.2e}: {'same as the CPU' if agree else 'DIFFERENT from the CPU'}")
    print(summary(task, run))
    if reference is not None and not losses_agree(run, reference, args.bf16):
        sys.exit(1)
    return run, reference


@dataclass
class CharCorpus:
    """A character-level corpus: the bundled text (examples/data/sonnets.txt, five of
    Shakespeare's sonnets, public domain) and its alphabet."""

    text: str
    alphabet: str

    @classmethod
    def load(cls, name: str = "sonnets.txt") -> CharCorpus:
        with open(os.path.join(DATA, name), encoding="utf-8") as f:
            text = f.read()
        return cls(text, "".join(sorted(set(text))))

    @property
    def vocab_size(self) -> int:
        return len(self.alphabet)

    def encode(self, s: str) -> torch.Tensor:
        return torch.tensor([self.alphabet.index(c) for c in s], dtype=torch.long)

    def decode(self, ids: Iterable[int]) -> str:
        return "".join(self.alphabet[i] for i in ids)

    def batch(self, step: int, batch_size: int, block: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``batch_size`` random windows of ``block + 1`` characters (seeded by ``step``):
        the inputs and the next-character targets."""
        data = self.encode(self.text)
        g = torch.Generator().manual_seed(step)
        starts = torch.randint(0, len(data) - block - 1, (batch_size,), generator=g)
        windows = torch.stack([data[s : s + block + 1] for s in starts.tolist()])
        return windows[:, :-1], windows[:, 1:]
