"""PyTorch's error inputs on tpu (issue 16; docs/conformance.md): every OpInfo
``error_inputs`` case (one case per op) must raise on tpu what it raises on the CPU: the
same exception type and a message matching OpInfo's regex. A device-side check counts when
it raises at the next wait, as CUDA's asserts do. Extremal values: test_opinfo_extremal.py.
"""

from __future__ import annotations

from opinfo_check import conformance_test

from torchtpu.testing import opinfo

ERRORS = opinfo.cases(None, ("errors",))
_write_errors, test_opinfo_errors = conformance_test("errors", ERRORS, None)


def test_every_op_with_error_inputs_is_run() -> None:
    """The error run covers each op that has ``error_inputs`` (a filter bug would skip them)."""
    with_errors = {opinfo.op_id(op) for op in opinfo.op_db() if op.error_inputs_func is not None and opinfo.platform_dtypes(op)}
    assert {c.op_id for c in ERRORS} == with_errors
    assert len(ERRORS) > 200
