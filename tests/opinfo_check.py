"""What the OpInfo conformance test files share: running one case, turning its verdict into
a pytest outcome, and writing each file's results to ``build/opinfo-<name>.json``."""

from __future__ import annotations

import os

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
        if r.status == "skip":
            pytest.skip(r.detail)
        if r.status == "xfail":
            pytest.xfail(r.detail)
        if r.status == "xpass":
            pytest.fail(f"strict xpass: {r.detail}", pytrace=False)
        if r.status == "fail":
            pytest.fail(
                f"{r.kind}: {r.detail}\n(if the difference is acceptable, find out why against float64, record it with "
                "python -m torchtpu.testing.record_failures and say why in expected_failures.py XFAIL)",
                pytrace=False,
            )
