"""Shared helpers for the worker scripts (run under torchrun or the tests' launcher)."""

from __future__ import annotations

import json
import os
import sys
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


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    try:
        torch.testing.assert_close(a.cpu(), b.cpu())
        return True
    except AssertionError:
        return False
