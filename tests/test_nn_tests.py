"""PyTorch's common_nn module and criterion tests on tpu against the CPU
(torchtpu/testing/nn_tests.py): each test's outputs, input and parameter gradients and
buffers, eagerly, under DeferAndFuse and compiled.

``make test`` runs the loss tests eagerly (about 10 s; the default suite is near its 15
minutes); every test eagerly, under DeferAndFuse and compiled runs in ``make test-ops`` and
``make test-all`` (``-m slow``, about 4 minutes)."""

from __future__ import annotations

import pytest
from opinfo_check import report

from torchtpu.testing import nn_tests


def _check(case: nn_tests.Case) -> None:
    r = nn_tests.run_case(case)
    if r.status == "skip":
        pytest.skip(r.detail)
    report(r.status, r.detail, "record it, with the numbers, in nn_tests.EXPECTED (and remove an entry that passes)")


LOSSES = nn_tests.criterion_names()


@pytest.mark.parametrize("case", [c for c in nn_tests.cases(("eager",)) if c.test in LOSSES], ids=lambda c: c.id)
def test_nn_losses_eager(case: nn_tests.Case) -> None:
    _check(case)


@pytest.mark.slow
@pytest.mark.parametrize("case", [c for c in nn_tests.cases() if not (c.way == "eager" and c.test in LOSSES)], ids=lambda c: c.id)
def test_nn(case: nn_tests.Case) -> None:
    _check(case)


def test_a_result_beyond_the_tolerance_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """The harness can fail: a module whose tpu output is off by 1e-3 fails."""
    real = nn_tests._run

    def skewed(t, device, dtype, way):  # type: ignore[no-untyped-def]
        out = real(t, device, dtype, way)
        return [x + 1e-3 if device == nn_tests.TPU and x is not None and x.is_floating_point() else x for x in out]

    monkeypatch.setattr(nn_tests, "_run", skewed)
    r = nn_tests.run_case(nn_tests.Case("test_Linear", "eager"))
    assert r.status == "fail" and "mismatch" in r.detail, r.detail
