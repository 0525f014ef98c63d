"""The dtype and variant sweep of the OpInfo conformance run (part of ``make test``): the
first sample of every op forward in bfloat16, int64 and uint8 (16-bit floats, signed and
unsigned integers: the dtype classes whose kernels differ most from float32's), plus the
in-place and ``out=`` variants in float32, so that (say) a uint8 kernel returning zeros
cannot land. Same rules as tests/test_opinfo.py; results in ``build/opinfo-sweep.json``.
Split over three files (this one: bfloat16; test_opinfo_sweep_int.py: int64 and uint8;
test_opinfo_sweep_variants.py: in-place and out=) so pytest-xdist, which keeps a file on
one worker, can balance them against the quick run.

Sized to keep ``make test`` under 15 minutes on 2 cores (about 2,000 cases, 4-5 minutes of
one core): float16, float64, int8, bool and complex forward and 16-bit gradients (another
2,900 cases, about 7 minutes) run in ``make test-ops``.
"""

from __future__ import annotations

import torch
from opinfo_check import conformance_test

from torchtpu.testing import opinfo

SWEEP_SAMPLES = 1
SWEEP = opinfo.cases([torch.bfloat16], ("fwd",))
_write_results, test_opinfo_sweep = conformance_test("sweep-bf16", SWEEP, SWEEP_SAMPLES)
