"""OpInfo's float32 samples with the op run through ``torch.compile(backend="tpu")``: the
forward (``compile``) and the gradients through the compiled backward (``compile-grad``),
against the CPU's eager results, under the same rules as tests/test_opinfo.py.

A compiled op does not take the eager op's path: AOTAutograd decomposes and functionalizes
it first, keeps some ops whole that eager runs as their composite parts, and traces fake
tensors through our meta functions. Run this way the samples found three failures the eager
run could not: ``nn.Bilinear``, ``cholesky_solve`` and ``linalg.pinv`` did not lower, a
compiled ``torch.sgn``'s backward returned a CPU tensor, and ``masked_scatter``'s backward
(LLaVA's image-feature merge) did not lower. Two samples per case (one Dynamo compile each,
about 10 minutes of one core): ``make test-ops`` and ``make test-all``, not ``make test``.
Results in ``build/opinfo-compile.json``."""

from __future__ import annotations

import pytest
import torch
from opinfo_check import conformance_test

from torchtpu.testing import opinfo

pytestmark = pytest.mark.slow

COMPILE_SAMPLES = 2
CASES = opinfo.cases([torch.float32], opinfo.COMPILE_MODES)
_write_results, test_opinfo_compile = conformance_test("compile", CASES, COMPILE_SAMPLES)
