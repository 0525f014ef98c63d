"""The OpInfo dtype sweep (tests/test_opinfo_sweep.py has the rules): int64 and uint8 forward, the first
sample of every op."""

from __future__ import annotations

import torch
from opinfo_check import conformance_test

from torchtpu.testing import opinfo

SWEEP = opinfo.cases([torch.int64, torch.uint8], ("fwd",))
_write_results, test_opinfo_sweep = conformance_test("sweep-int", SWEEP, 1)
