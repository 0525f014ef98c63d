"""PyTorch's error inputs and extremal values on tpu (issue 16; docs/conformance.md).

- ``errors``: every OpInfo ``error_inputs`` case (one case per op) must raise on tpu what
  it raises on the CPU: the same exception type and a message matching OpInfo's regex. A
  device-side check counts when it raises at the next wait, as CUDA's asserts do.
- ``extremal``: the elementwise ops and reductions on NaN, +-inf, +-0, the dtype's limits
  and PyTorch's small/large-value inputs, against the CPU (``make test`` runs float32;
  ``make test-ops`` every dtype). Subnormals are compared with the CPU flushing
  them (``torch.set_flush_denormal(True)``): XLA's CPU runtime always does.
"""

from __future__ import annotations

import torch
from opinfo_check import conformance_test

from torchtpu.testing import opinfo

ERRORS = opinfo.cases(None, ("errors",))
EXTREMAL = opinfo.cases([torch.float32], ("extremal",))  # every dtype: make test-ops
_write_errors, test_opinfo_errors = conformance_test("errors", ERRORS, None)
_write_extremal, test_opinfo_extremal = conformance_test("extremal", EXTREMAL, None)


def test_every_op_with_error_inputs_is_run() -> None:
    """The error run covers each op that has ``error_inputs`` (a filter bug would skip them)."""
    with_errors = {opinfo.op_id(op) for op in opinfo.op_db() if op.error_inputs_func is not None and opinfo.platform_dtypes(op)}
    assert {c.op_id for c in ERRORS} == with_errors
    assert len(ERRORS) > 200
