"""PyTorch's ModuleInfo database on tpu against the CPU (torchtpu/testing/moduleinfo.py):
every nn module's sample constructors and inputs, train and eval, each sample's outputs,
input and parameter gradients and buffers, eagerly, under DeferAndFuse and compiled.

``make test`` runs the first FAST_SAMPLES samples of each module eagerly in train mode, in
float32 and float64 (about 45 s); every sample, train and eval, in every way in float32, and
eagerly and under DeferAndFuse in float64 (about 35 minutes) runs in ``make test-ops`` and
``make test-all`` (``-m slow``). (Compiled float64 is left to the long run's float32: its
first two samples of every module passed when measured, 456 samples.)"""

from __future__ import annotations

import pytest
from opinfo_check import report

from torchtpu.testing import moduleinfo

FAST_SAMPLES = 1
# First samples that alone take 2-3 s here, of modules make test covers elsewhere (the
# recurrent and transformer layers in tests/test_recurrent.py and test_transformer_fastpath.py,
# circular padding in OpInfo's pad samples): the long run only.
LONG_FIRST_SAMPLE = {"nn.Transformer", "nn.TransformerEncoder", "nn.RNN", "nn.LSTM", "nn.GRU", "nn.CircularPad3d"}


def _check(case: moduleinfo.Case, samples: int | None) -> None:
    r = moduleinfo.run_case(case, samples)
    report(r.status, r.detail, "record it, with the numbers, in moduleinfo.EXPECTED (and remove an entry that passes)")


FAST = [
    c
    for dtype in moduleinfo.DTYPES
    for c in moduleinfo.cases(("eager",), dtype)
    if c.training == "train" and c.module not in LONG_FIRST_SAMPLE
]
LONG = moduleinfo.cases() + moduleinfo.cases(("eager", "defer"), "float64")


@pytest.mark.parametrize("case", FAST, ids=lambda c: c.id)
def test_module_first_samples(case: moduleinfo.Case) -> None:
    _check(case, FAST_SAMPLES)


@pytest.mark.slow
@pytest.mark.parametrize("case", LONG, ids=lambda c: c.id)
def test_module(case: moduleinfo.Case) -> None:
    _check(case, None)


def test_a_sample_beyond_the_tolerance_is_reported_with_its_index(monkeypatch: pytest.MonkeyPatch) -> None:
    """The harness can fail: a module whose tpu output is off by 1e-3 fails on every sample."""
    real = moduleinfo._run

    def skewed(info, sample, training, device, dtype, way):  # type: ignore[no-untyped-def]
        out = real(info, sample, training, device, dtype, way)
        return [t + 1e-3 if device == moduleinfo.TPU and t is not None and t.is_floating_point() else t for t in out]

    monkeypatch.setattr(moduleinfo, "_run", skewed)
    r = moduleinfo.run_case(moduleinfo.Case("nn.Linear", "train", "eager"), 2)
    assert r.status == "fail" and "first #0 mismatch" in r.detail, r.detail
