"""The OpInfo dtype sweep (tests/test_opinfo_sweep.py has the rules): float32 in-place and out= variants, the first
sample of every op."""

from __future__ import annotations

import torch
from opinfo_check import conformance_test

from torchtpu.testing import opinfo

SWEEP = opinfo.cases([torch.float32], ("inplace", "out"))
_write_results, test_opinfo_sweep = conformance_test("sweep-variants", SWEEP, 1)
