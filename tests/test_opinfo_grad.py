"""The quick OpInfo run's gradients (tests/test_opinfo.py has the rules and the forward
half): float32 gradients of every op, the first sample, against the CPU. Its own file
so pytest-xdist can run it beside the forward half."""

from __future__ import annotations

import torch
from opinfo_check import conformance_test

from torchtpu.testing import opinfo

QUICK_SAMPLES = 1
QUICK_GRAD = opinfo.cases([torch.float32], ("grad",))
_write_results, test_opinfo_quick = conformance_test("quick-grad", QUICK_GRAD, QUICK_SAMPLES)
