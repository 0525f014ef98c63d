"""The model zoo's low-precision judge (tests/models/compare.py) tells a wrong value from
rounding: each tensor's error to the float64 value, against the CPU's."""

from __future__ import annotations

import torch
from models.compare import Reference, _compare_low_precision


def _judge(actual: torch.Tensor, expected: torch.Tensor, reference: torch.Tensor, check_dtype: bool = True):  # noqa: ANN202
    return _compare_low_precision([("t", actual, expected)], Reference({"t": reference}, torch.float64), check_dtype)


def _rounded(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    exact = torch.randn(256, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return exact, exact.to(torch.bfloat16)


def test_rounding_passes() -> None:
    exact, cpu = _rounded(0)
    noisy = (exact * (1 + 2**-9 * torch.randn(256, generator=torch.Generator().manual_seed(1), dtype=torch.float64))).to(torch.bfloat16)
    assert _judge(noisy, cpu, exact).ok


def test_a_wrong_element_fails() -> None:
    exact, cpu = _rounded(0)
    wrong = cpu.clone()
    wrong[7] = -wrong[7] * 3
    result = _judge(wrong, cpu, exact)
    assert not result.ok and result.missed_bound and "relative error to float64" in result.detail


def test_an_accumulation_in_bfloat16_fails() -> None:
    """A sum accumulated in bfloat16 (rounded at every step) where the CPU accumulates in
    float32 and rounds once."""
    terms = torch.rand(64, 512, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    exact = terms.sum(1)
    cpu = terms.float().sum(1).to(torch.bfloat16)
    running = torch.zeros(64, dtype=torch.bfloat16)
    for column in terms.to(torch.bfloat16).unbind(1):
        running = running + column
    result = _judge(running, cpu, exact)
    assert not result.ok, result.detail


def test_another_dtype_fails_in_bfloat16() -> None:
    exact, cpu = _rounded(0)
    result = _judge(cpu.float(), cpu, exact)
    assert not result.ok and not result.missed_bound and "dtype" in result.detail
    assert _judge(cpu.float(), cpu, exact, check_dtype=False).ok  # autocast: the policies' dtypes are tested op by op


def test_noise_where_the_value_is_zero() -> None:
    """A gradient softmax cancels (exactly 0): both sides' values are rounding noise; only
    noise of another order fails."""
    exact = torch.full((32,), 1e-20, dtype=torch.float64)
    cpu = torch.randn(32, generator=torch.Generator().manual_seed(3)).mul(1e-4).to(torch.bfloat16)
    tpu = torch.randn(32, generator=torch.Generator().manual_seed(4)).mul(2e-4).to(torch.bfloat16)
    assert _judge(tpu, cpu, exact).ok
    assert not _judge(tpu * 100, cpu, exact).ok


def test_a_stage_judged_by_its_mean() -> None:
    """Chance roundings make one tensor worse and another better: the stage passes; every
    tensor six times as far from float64 as the CPU (a systematic loss) fails it."""
    pairs, values = [], {}
    for i in range(8):
        exact, cpu = _rounded(10 + i)
        scale = 4.0 if i % 2 else 0.25  # tpu's error 4x the CPU's in half the tensors, 1/4 in the others
        tpu = exact + scale * (cpu.double() - exact)
        pairs.append((f"t{i}", tpu, cpu))
        values[f"t{i}"] = exact
    reference = Reference(values, torch.float64)
    assert _compare_low_precision(pairs, reference, check_dtype=False).ok
    worse = [(n, values[n] + 6 * (cpu.double() - values[n]), cpu) for n, _, cpu in pairs]
    result = _compare_low_precision(worse, reference, check_dtype=False)
    assert not result.ok and result.missed_bound and "times the CPU's" in result.detail
