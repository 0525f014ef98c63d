"""PyTorch's OpInfo database (op_db: core, linalg, fft, special, ...) run on tpu against
the CPU, one case per op x dtype x mode (``add-float32-fwd``, ``add-float32-grad``,
``add_-int64-inplace``, ``add-float64-out``).

``make test`` runs two bounded subsets: ``test_opinfo_quick`` here and in
tests/test_opinfo_grad.py (float32 forward and gradients, the first sample of each
op) and tests/test_opinfo_sweep*.py (the first
sample of every op in the other dtype classes and variants); ``make test-ops`` runs every
dtype, mode and sample (``test_opinfo``, marked slow). docs/conformance.md has the rules:

A sample passes when the tpu result matches the CPU's within PyTorch's tolerance for the
dtype (loosened only where the OpInfo says so for the CPU comparison), or when it is at
least as close to the sample computed in float64 on the CPU as the CPU's result is.
Expected failures are strict (``torchtpu/testing/expected_failures.py``): a listed case
must fail exactly as recorded, and a listed case that passes fails the run. Each run
writes its results to ``build/opinfo-<quick|full>.json`` (what
``python -m torchtpu.coverage --from`` and ``python -m torchtpu.testing.record_failures`` read).
"""

from __future__ import annotations

import os

import pytest
import torch
from opinfo_check import conformance_test

from torchtpu.testing import opinfo
from torchtpu.testing.observed import SampleFailure

QUICK_SAMPLES = 1
QUICK = opinfo.cases([torch.float32], ("fwd",))  # the gradients: tests/test_opinfo_grad.py
FULL = opinfo.shard(opinfo.cases(None, opinfo.MODES), os.environ.get("TORCHTPU_OPINFO_SHARD"))
_SHARD_SUFFIX = os.environ.get("TORCHTPU_OPINFO_SHARD", "").replace("/", "of")
_write_quick, test_opinfo_quick = conformance_test("quick", QUICK, QUICK_SAMPLES)
_write_full, test_opinfo = conformance_test(f"full-shard{_SHARD_SUFFIX}" if _SHARD_SUFFIX else "full", FULL, None)
test_opinfo = pytest.mark.slow(test_opinfo)


def test_expected_failure_keys_name_real_cases() -> None:
    """Every key of the expected-failure tables names an OpInfo entry, a dtype and a mode
    that exist (a typo would silently expect nothing)."""
    from torchtpu.testing import expected_failures as xf

    ids = {opinfo.op_id(op) for op in opinfo.op_db()}
    dtypes = {opinfo.dtype_name(d) for d in opinfo.PLATFORM_DTYPES}
    for table in (xf.XFAIL, xf.SKIP):
        for (op, dtype, mode), reason in table.items():
            assert op in ids, f"{op!r} is not an OpInfo entry"
            assert dtype is None or dtype in dtypes, f"{dtype!r} is not a platform dtype"
            assert mode is None or mode in opinfo.MODES + opinfo.COMPILE_MODES, f"{mode!r} is not a mode"
            assert len(reason) > 12, f"{op}: give a specific reason"
            assert "not root-caused" not in reason, f"{op}: find the cause"


def test_every_recorded_failure_has_a_reason() -> None:
    """Each recorded failure is explained, and each reason explains a recorded failure (a
    reason nothing fails for any more is stale)."""
    from torchtpu.testing import expected_failures as xf

    cases = {c.key for c in opinfo.cases(None, opinfo.MODES + opinfo.COMPILE_MODES)}
    for key in xf.OBSERVED:
        assert key in cases, f"{key} is not a conformance case"
        assert xf.lookup(xf.XFAIL, *key) is not None, f"{key} fails as recorded, but no XFAIL reason says why"
    for key in xf.XFAIL:
        assert any(xf.lookup({key: ""}, *case) is not None for case in xf.OBSERVED), f"XFAIL {key} explains no recorded failure"



def test_frame_walking_extract_test_fn_finds_what_pytorchs_finds() -> None:
    """The harness swaps PyTorch's ``extract_test_fn`` (``inspect.stack()``, 80% of a case's
    time) for a frame walk: both must name the same TestCase method, or None outside one,
    since OpInfo seeds each sample from that method's name."""
    import unittest

    from torch.testing._internal import common_utils
    from torch.testing._internal.opinfo import core

    opinfo.op_db()  # installs the frame walk
    assert common_utils.extract_test_fn is opinfo._extract_test_fn is core.extract_test_fn
    pytorchs = opinfo._PYTORCHS_EXTRACT_TEST_FN
    found = {}

    class TestFoo(unittest.TestCase):
        def test_bar(self) -> None:
            found["ours"], found["pytorch"] = opinfo._extract_test_fn(), pytorchs()

    with open(os.devnull, "w") as devnull:
        assert unittest.TextTestRunner(stream=devnull).run(TestFoo("test_bar")).wasSuccessful()
    assert found == {"ours": TestFoo.test_bar, "pytorch": TestFoo.test_bar}
    assert opinfo._extract_test_fn() is None and pytorchs() is None


def test_the_referee_does_not_pass_what_it_cannot_judge() -> None:
    """An infinite summed error cannot be compared: a NaN where the CPU overflowed was
    "no farther from float64" (inf <= inf). Only the elements where tpu and the CPU differ
    are weighed then: an overflow both have counts for neither."""
    inf, nan = float("inf"), float("nan")
    precise = [torch.tensor([1.00006, 1e39], dtype=torch.float64)]

    def judged(actual: list[float], expected: list[float]) -> object:
        out = opinfo.Outputs([torch.tensor(actual)], [torch.tensor(expected)], lambda: precise)
        return opinfo.compare(0, out, torch.float32, None)

    assert isinstance(judged([nan, 5.0], [1.0, inf]), SampleFailure)
    assert isinstance(judged([1.0, -inf], [1.0, inf]), SampleFailure)
    assert isinstance(judged([1.0001, inf], [1.0, inf]), opinfo.Refereed)  # as close as the CPU, both overflow
    assert isinstance(judged([1.001, inf], [1.0, inf]), SampleFailure)


def test_an_overflow_to_the_right_infinity_is_no_error() -> None:
    """A result that overflows its dtype where the exact value does (float16 matrix_exp: an
    entry of 1.2e5 is inf in float16) is correctly rounded, not infinitely far from float64:
    tpu's finite entries and that inf beat the CPU's all-NaN result. The wrong infinity
    still counts."""
    precise = [torch.tensor([1.5, 1.2e5], dtype=torch.float64)]

    def judged(actual: list[float]) -> object:
        out = opinfo.Outputs([torch.tensor(actual, dtype=torch.float16)], [torch.tensor([float("nan")] * 2, dtype=torch.float16)], lambda: precise)
        return opinfo.compare(0, out, torch.float16, None)

    assert isinstance(judged([1.5, float("inf")]), opinfo.Refereed)
    assert isinstance(judged([1.5, -float("inf")]), SampleFailure)
