"""python -m torchtpu.testing.resumable: the full conformance run in pieces that resume."""

from __future__ import annotations

import json

import pytest

from torchtpu.testing import opinfo, resumable

CASES = [opinfo.Case("abs", "float32", "fwd"), opinfo.Case("neg", "float32", "fwd"), opinfo.Case("abs", "int64", "fwd")]


@pytest.fixture
def build(tmp_path, monkeypatch):
    monkeypatch.setattr(resumable, "BUILD", str(tmp_path))
    monkeypatch.setattr(resumable, "PREFIX", str(tmp_path / "opinfo-full.jsonl"))
    monkeypatch.setattr(opinfo, "cases", lambda dtypes=None, modes=opinfo.MODES: list(CASES))
    return tmp_path


def test_parts_share_the_cases_and_a_rerun_skips_what_is_recorded(build, capsys) -> None:
    assert resumable.main(["run", "--part", "1/2"]) == 0  # every second case from the second
    recorded = [json.loads(line)["case_id"] for line in (build / "opinfo-full.jsonl.1of2").read_text().splitlines()]
    assert recorded == [CASES[1].id]
    assert resumable.main(["run"]) == 0  # the rest, once
    recorded = [json.loads(line)["case_id"] for line in (build / "opinfo-full.jsonl.0of1").read_text().splitlines()]
    assert recorded == [CASES[0].id, CASES[2].id]
    assert resumable.main(["run"]) == 0
    assert "0 to run" in capsys.readouterr().out
    assert resumable.main(["merge"]) == 0
    _, results = opinfo.read_json(str(build / "opinfo-full.json"))
    assert sorted(f"{r.op_id}-{r.dtype}-{r.mode}" for r in results) == sorted(c.id for c in CASES)
    assert all(r.status == "pass" for r in results)


def test_a_rerun_overrides_the_recorded_result(build) -> None:
    line = dict(op_id="abs", dtype="float32", mode="fwd", status="fail", case_id=CASES[0].id)
    (build / "opinfo-full.jsonl.0of1").write_text(json.dumps(line) + '\n{"op_id": "ne')  # a run killed mid-line
    assert resumable.main(["run", "--rerun-failing"]) == 0
    assert resumable.main(["merge"]) == 0
    _, results = opinfo.read_json(str(build / "opinfo-full.json"))
    assert [r.status for r in results] == ["pass"]
