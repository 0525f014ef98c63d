#!/usr/bin/env python
"""Check the fused RMSNorm kernels (rms_norm.py) against torch.nn.functional.rms_norm on the CPU.

    python examples/custom_kernels/run.py            # every route, every mode
    python examples/custom_kernels/run.py --routes stablehlo library --modes eager compile

For each route (StableHLO text, a JAX function, a Pallas kernel, a registered lowering)
and mode (eager, DeferAndFuse, torch.compile) it runs ``rms_norm(x * 2, w) + 1`` forward
and backward on tpu and prints the largest absolute difference from the CPU's float64
result, next to the CPU's own float32 difference (the scale of float32 rounding), and the
number of programs each forward ran (DeferAndFuse and torch.compile fuse the kernel with
the ops around it: one program). The JAX routes are skipped, with a note, without jax.
Exits 1 if any route is further from float64 than float32 tolerances allow.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rms_norm  # noqa: E402

import torchtpu  # noqa: E402
from torchtpu import metrics  # noqa: E402

MODES = ("eager", "defer", "compile")
EPS = 1e-6


def step(kernel: Callable, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return kernel(x * 2, w, EPS) + 1


def reference(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Output and gradients of ``step`` with F.rms_norm on the CPU, in x's dtype."""
    x, w = x.clone().requires_grad_(), w.clone().requires_grad_()
    y = F.rms_norm(x * 2, (x.shape[-1],), w, EPS) + 1
    y.sin().sum().backward()
    return y.detach(), x.grad, w.grad


def on_tpu(kernel: Callable, mode: str, x: torch.Tensor, w: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], int]:
    """Output and gradients of ``step`` on tpu, and the programs the forward ran."""
    xt = x.to("tpu").requires_grad_()
    wt = w.to("tpu").requires_grad_()
    fn = torch.compile(step, backend="tpu") if mode == "compile" else step
    ctx = torchtpu.eager_mode("defer_and_fuse") if mode == "defer" else torchtpu.eager_mode("eager")
    with ctx:
        fn(kernel, xt, wt)  # warm-up: compiles the programs
        before = metrics.snapshot()["executions"]
        y = fn(kernel, xt, wt)
        out = y.detach().cpu()  # DeferAndFuse: runs the recorded graph
        programs = metrics.snapshot()["executions"] - before
        y.sin().sum().backward()
        grads = xt.grad.cpu(), wt.grad.cpu()
    return (out, *grads), programs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--routes", nargs="+", default=list(rms_norm.ROUTES), choices=list(rms_norm.ROUTES))
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--shape", type=int, nargs="+", default=[6, 64])
    args = parser.parse_args()

    torch.manual_seed(0)
    x = torch.randn(*args.shape)
    w = torch.randn(args.shape[-1])
    exact = reference(x.double(), w.double())
    cpu32 = reference(x, w)
    err32 = [(a.double() - b).abs().max().item() for a, b in zip(cpu32, exact)]
    print(f"CPU float32 vs float64: output {err32[0]:.2e}  grad x {err32[1]:.2e}  grad w {err32[2]:.2e}\n")
    print(f"{'route':<10} {'mode':<8} {'output':>10} {'grad x':>10} {'grad w':>10} {'programs':>9}")
    ok = True
    for route in args.routes:
        if route in ("jax", "pallas") and not rms_norm.HAVE_JAX:
            print(f"{route:<10} skipped: jax is not installed (pip install 'torchtpu[jax]')")
            continue
        for mode in args.modes:
            got, programs = on_tpu(rms_norm.ROUTES[route], mode, x, w)
            errs = [(a.double() - b).abs().max().item() for a, b in zip(got, exact)]
            # PyTorch's float32 tolerances (torch.testing.assert_close), against the exact result
            close = all(torch.allclose(a.double(), b, rtol=1.3e-6, atol=1e-5) for a, b in zip(got, exact))
            ok &= close
            print(
                f"{route:<10} {mode:<8} {errs[0]:>10.2e} {errs[1]:>10.2e} {errs[2]:>10.2e} {programs:>9}"
                + ("" if close else "  MISMATCH")
            )
    print("\nall routes match the CPU" if ok else "\nsome routes differ from the CPU")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
