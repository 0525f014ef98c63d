"""The OpInfo dtype sweep (tests/test_opinfo_sweep.py has the rules): int64 and uint8 forward, the first
sample of every op."""

from __future__ import annotations

import pytest
import torch
from opinfo_check import Results

from torchtpu.testing import opinfo

SWEEP = opinfo.cases([torch.int64, torch.uint8], ("fwd",))
_RESULTS = Results("sweep-int")


@pytest.fixture(scope="module", autouse=True)
def _write_results():
    yield
    _RESULTS.write()


@pytest.mark.parametrize("case", SWEEP, ids=[c.id for c in SWEEP])
def test_opinfo_sweep(case: opinfo.Case) -> None:
    _RESULTS.check(case, 1)
