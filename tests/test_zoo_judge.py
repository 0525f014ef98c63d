"""The model zoo's judge (tests/models/compare.py) tells a wrong value from rounding: in low
precision, each tensor's error to the float64 value against the CPU's; in float32, the
tolerance, float64 where the CPU misses it, and other inputs where a kink switched."""

from __future__ import annotations

import pytest
import torch
from models import compare
from models.compare import GRAD_TOL, ModelCase, ModelResult, Reference, StageResult, _compare_all, _compare_low_precision


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


def _float32_stage(tensors: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> StageResult:
    """``tensors``: name -> (tpu, CPU, float64) values of one float32 stage."""
    pairs = [(name, tpu, cpu) for name, (tpu, cpu, _) in tensors.items()]
    reference = Reference({name: exact for name, (_, _, exact) in tensors.items()}, torch.float64)
    return _compare_all(pairs, GRAD_TOL, reference)


def _gradient(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A float64 gradient and the CPU's float32 value of it."""
    exact = torch.randn(512, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return exact, exact.float()


def _switched(values: torch.Tensor, seed: int, share: float = 0.01) -> torch.Tensor:
    """``values`` with a gradient term of ``share`` of its norm switched on: what a ReLU
    input rounded to the other side of 0 does to the gradients behind it."""
    term = torch.randn(values.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return (values.double() + share * values.double().norm() / term.norm() * term).to(values.dtype)


def test_float32_a_kink_switched_on_tpu_alone_is_rerun() -> None:
    """The CPU matches float64 and tpu does not: the first run fails, by its values only,
    which sends the case to other inputs."""
    exact, cpu = _gradient(0)
    result = _float32_stage({"w.grad": (_switched(cpu, 1), cpu, exact)})
    assert not result.ok and result.missed_bound, result.detail


def test_float32_ill_conditioned_stage_passes_when_tpu_is_no_worse() -> None:
    """Both devices switch a kink, each behind another tensor (a term of 0.4% of its norm,
    as in ResNeXt-50's): they differ beyond the tolerance, and the CPU's float32 misses
    float64 too; tpu's errors are within the bound of the CPU's."""
    a, a_cpu = _gradient(0)
    b, b_cpu = _gradient(1)
    result = _float32_stage({"a.grad": (a_cpu, _switched(a_cpu, 2, 0.004), a), "b.grad": (_switched(b_cpu, 3, 0.004), b_cpu, b)})
    assert result.ok, result.detail
    assert "ill-conditioned" in result.detail and "a.grad" in result.detail


def test_float32_ill_conditioned_stage_still_fails_a_wrong_value() -> None:
    a, a_cpu = _gradient(0)
    b, b_cpu = _gradient(1)
    wrong = b_cpu.clone()
    wrong[5] = -3 * wrong[5]
    result = _float32_stage({"a.grad": (a_cpu, _switched(a_cpu, 2), a), "b.grad": (wrong, b_cpu, b)})
    assert not result.ok and "ill-conditioned" in result.detail and "b.grad" in result.detail


@pytest.mark.parametrize("kind", ["nan", "dtype", "none"])
def test_float32_what_no_rounding_does_is_not_rerun(kind: str) -> None:
    exact, cpu = _gradient(0)
    if kind == "nan":
        name, tpu = "w.grad", cpu.clone().index_fill_(0, torch.tensor([3]), float("nan"))
    elif kind == "dtype":
        name, tpu = "w.grad", cpu.double()
    else:
        name, tpu, cpu = f"w.grad {compare.NONE_ON_ONE_SIDE}", torch.ones(1), torch.zeros(1)
        exact = torch.zeros(1, dtype=torch.float64)
    result = _float32_stage({name: (tpu, cpu, exact)})
    assert not result.ok and not result.missed_bound, result.detail


@pytest.mark.parametrize("passing_seeds,decided", [((2, 3), True), ((2,), False), ((), False)])
def test_other_inputs_decide_by_majority(monkeypatch: pytest.MonkeyPatch, passing_seeds: tuple[int, ...], decided: bool) -> None:
    """A switched kink is a chance event of one input; a wrong value recurs on most."""

    def run(case: ModelCase, attn: str | None, compile: bool, precision: str, input_seed: int = 1) -> ModelResult:
        ok = input_seed in passing_seeds
        return ModelResult(case.name, case.family, "default", {"backward": StageResult(ok, "", missed_bound=not ok)})

    monkeypatch.setattr(compare, "_run_case", run)
    case = ModelCase("m", "f", lambda attn: torch.nn.Linear(1, 1), dict)
    first = run(case, None, False, "float32")
    result = compare._other_inputs_decide(first, case, None, False, "float32")
    assert result.passed is decided
    assert result.stages["backward"].passed_on_other_inputs is decided
