"""Extremal values on tpu (issue 16; docs/conformance.md): the elementwise ops and
reductions on NaN, +-inf, +-0, the dtype's limits and PyTorch's small/large-value inputs,
against the CPU. Subnormals are compared with the CPU flushing them
(``torch.set_flush_denormal(True)``): XLA's CPU runtime always does.

``make test`` runs float32 and the first ``SAMPLES`` samples of each op: every sample of the
unary and binary ops (at most 6), the first six inputs of each reduction refilled with the
values (with and without subnormals; reductions average 120 samples, 75% of the run).
``make test-ops`` runs every dtype and every sample.
"""

from __future__ import annotations

import torch
from opinfo_check import conformance_test

from torchtpu.testing import opinfo

SAMPLES = 12
EXTREMAL = opinfo.cases([torch.float32], ("extremal",))
# igamma/igammac: ~13 s each on CI's machine, nearly all XLA compiling their while loops anew
# for each sample shape; they run in make test-all and make test-ops
SLOW = {"igamma-float32-extremal", "igammac-float32-extremal"}
_write_extremal, test_opinfo_extremal = conformance_test("extremal", EXTREMAL, SAMPLES, slow=SLOW)
