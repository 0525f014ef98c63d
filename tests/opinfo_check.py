"""What the OpInfo conformance test files share: running one case, turning its verdict into
a pytest outcome, and writing each file's results to ``build/opinfo-<name>.json``."""

from __future__ import annotations

import os
from collections.abc import Collection, Iterator
from typing import Any

import pytest

from torchtpu.testing import opinfo

BUILD = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "build")


class Results:
    """The results of one run (``quick``, ``sweep-fwd``, ``full``...), written at the end."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.results: list[opinfo.Result] = []

    def write(self) -> None:
        if not self.results:
            return
        os.makedirs(BUILD, exist_ok=True)
        path = os.path.join(BUILD, f"opinfo-{self.name}.json")
        opinfo.write_json(self.results, path, {"description": f"OpInfo conformance: {self.name} run"})

    def check(self, case: opinfo.Case, samples: int | None) -> None:
        """Run ``case`` (its first ``samples`` samples; all if None) and report its verdict."""
        r = opinfo.run_case(case, samples)
        self.results.append(r)
        report(
            r.status,
            f"{r.kind}: {r.detail}" if r.status == "fail" else r.detail,
            "record it with python -m torchtpu.testing.record_failures and say why in expected_failures.py XFAIL",
        )


def report(status: str, detail: str, record_hint: str) -> None:
    """A conformance verdict as the pytest outcome: skip, (strict) xfail, or a failure that
    says how to record an acceptable difference (``record_hint``)."""
    if status == "skip":
        pytest.skip(detail)
    if status == "xfail":
        pytest.xfail(detail)
    if status == "xpass":
        pytest.fail(f"strict xpass: {detail}", pytrace=False)
    if status == "fail":
        pytest.fail(f"{detail}\n(if the difference is acceptable, find out why against float64, {record_hint})", pytrace=False)


def conformance_test(name: str, cases: list[opinfo.Case], samples: int | None, slow: Collection[str] = ()) -> tuple[Any, Any]:
    """A test module's parametrized conformance test over ``cases`` and the autouse fixture
    that writes its results to ``build/opinfo-<name>.json``; assign both at module level.
    Cases whose id is in ``slow`` run only outside ``make test`` (``-m slow``, ``make test-all``)."""
    results = Results(name)

    @pytest.fixture(scope="module", autouse=True)
    def write_results() -> Iterator[None]:
        yield
        results.write()

    params = [pytest.param(c, id=c.id, marks=(pytest.mark.slow,) if c.id in slow else ()) for c in cases]

    @pytest.mark.parametrize("case", params)
    def test(case: opinfo.Case) -> None:
        results.check(case, samples)

    return write_results, test
