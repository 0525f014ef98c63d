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


def _outcome(fn: Callable[[], object]) -> str | None:
    try:
        fn()
        return None
    except Exception as e:  # noqa: BLE001 - the test inspects it
        return f"{type(e).__name__}: {e}"


def attempt(fn: Callable[[], object], then: Callable[[], object] | None = None) -> None:
    """Report whether ``fn`` raised (the exception's type and text) and how long it took;
    with ``then``, also whether that raised afterwards (``then_error``)."""
    t0 = time.perf_counter()
    result: dict[str, object] = {"error": _outcome(fn)}
    result["seconds"] = time.perf_counter() - t0
    if then is not None:
        result["then_error"] = _outcome(then)
    report(result)


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    try:
        torch.testing.assert_close(a.cpu(), b.cpu())
        return True
    except AssertionError:
        return False
