"""PyTorch's ModuleInfo database on tpu against the CPU (torchtpu/testing/moduleinfo.py):
every nn module's sample constructors and inputs, train and eval, each sample's outputs,
input and parameter gradients and buffers, eagerly, under DeferAndFuse and compiled.

``make test`` runs the first FAST_SAMPLES samples of each module eagerly in train mode
(about 30 s); every sample, train and eval, in every way (about 15 minutes) runs in
``make test-ops`` and ``make test-all`` (``-m slow``)."""

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


@pytest.mark.parametrize("case", [c for c in moduleinfo.cases(("eager",)) if c.training == "train" and c.module not in LONG_FIRST_SAMPLE], ids=lambda c: c.id)
def test_module_first_samples(case: moduleinfo.Case) -> None:
    _check(case, FAST_SAMPLES)


@pytest.mark.slow
@pytest.mark.parametrize("case", moduleinfo.cases(), ids=lambda c: c.id)
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
