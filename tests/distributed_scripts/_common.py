"""Shared helpers for the worker scripts (run under torchrun or the tests' launcher)."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import torch


def rank_world() -> tuple[int, int]:
    return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])


def report(obj: Any) -> None:
    """Write this rank's result as JSON to $TORCHTPU_TEST_OUT/rank<r>.json (or stdout)."""
    out = os.environ.get("TORCHTPU_TEST_OUT")
    rank = os.environ.get("RANK", "0")
    if out:
        with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
            json.dump(obj, f)
    else:
        json.dump(obj, sys.stdout)
        print()


def attempt(fn: Callable[[], object]) -> None:
    """Report whether ``fn`` raised (the exception's type and text) and how long it took."""
    t0 = time.perf_counter()
    try:
        fn()
        result = {"error": None}
    except Exception as e:  # noqa: BLE001 - the test inspects it
        result = {"error": f"{type(e).__name__}: {e}"}
    result["seconds"] = time.perf_counter() - t0
    report(result)


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    try:
        torch.testing.assert_close(a.cpu(), b.cpu())
        return True
    except AssertionError:
        return False
