"""The quick OpInfo run's gradients (tests/test_opinfo.py has the rules and the forward
half): float32 gradients of every op, the first 2 samples, against the CPU. Its own file
so pytest-xdist can run it beside the forward half."""

from __future__ import annotations

import pytest
import torch
from opinfo_check import Results

from torchtpu.testing import opinfo

QUICK_SAMPLES = 2
QUICK_GRAD = opinfo.cases([torch.float32], ("grad",))
_RESULTS = Results("quick-grad")


@pytest.fixture(scope="module", autouse=True)
def _write_results():
    yield
    _RESULTS.write()


@pytest.mark.parametrize("case", QUICK_GRAD, ids=[c.id for c in QUICK_GRAD])
def test_opinfo_quick(case: opinfo.Case) -> None:
    _RESULTS.check(case, QUICK_SAMPLES)
