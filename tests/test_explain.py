"""torchtpu.debug.explain(): why each program was compiled (grouped by cause, with advice),
every host sync with its source line, every CPU fallback; TORCHTPU_EXPLAIN=1 prints it at
exit. The loops below mark the lines the report must point at."""

from __future__ import annotations

import inspect
import io
import os
import re
import subprocess
import sys

import pytest
import torch

import torchtpu
from torchtpu import _spans
from torchtpu.debug.explain import (
    GUARD_FAILURE,
    NEW_DTYPE,
    NEW_LAYOUT,
    NEW_OP,
    NEW_SHAPE,
    NEW_STRUCTURE,
    Report,
    explain,
    explaining,
)

TPU = "tpu"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _line(fn, marker: str) -> str:
    """``file:line`` of the line of ``fn`` that ends with ``# marker``."""
    lines, first = inspect.getsourcelines(fn)
    n = next(first + i for i, text in enumerate(lines) if text.rstrip().endswith(f"# {marker}"))
    return f"{inspect.getsourcefile(fn)}:{n}"


def _loop(widths: tuple[int, ...]) -> float:
    total = 0.0
    for n in widths:
        x = torch.arange(n * 9, dtype=torch.float32).reshape(n, 9).to(TPU)
        y = (x * 3).sum()  # MUL
        total += y.item()  # ITEM
    return total


def _quiet_report() -> Report:
    return explain(file=io.StringIO())


@pytest.fixture
def fresh():
    """Forget eager's and DeferAndFuse's program keys (other tests in this process ran the
    same ops), so that a first call here is a new op; the programs stay in memory."""
    from torchtpu.eager import deferred, dispatch

    dispatch.clear_cache()
    deferred.clear_cache()


def test_eager_loop_that_recompiles_and_syncs(fresh):
    with explaining():
        total = _loop((3, 4, 5))
    assert total == sum(3 * sum(range(n * 9)) for n in (3, 4, 5))
    out = io.StringIO()
    report = explain(file=out)
    assert out.getvalue() == str(report) + "\n"
    groups = report.by_cause()
    mul = [p for p in report.programs if p.name == "aten::mul.Tensor"]
    assert [p.cause for p in mul] == [NEW_OP, NEW_SHAPE, NEW_SHAPE]
    assert mul[1].detail == "self: shape (3, 9) -> (4, 9)" and mul[2].detail == "self: shape (4, 9) -> (5, 9)"
    assert all(p.mode == "eager" and p.where == _line(_loop, "MUL") for p in mul)
    assert {p.name for p in groups[NEW_SHAPE]} >= {"aten::mul.Tensor", "aten::sum"}
    (item,) = [s for s in report.syncs if s.cause == ".item()"]
    assert (item.calls, item.where) == (3, _line(_loop, "ITEM"))
    text = str(report)
    assert f".item() x3 at {_line(_loop, 'ITEM')}" in text
    assert "new shape:" in text and "pad or bucket" in text and "keep values on the device" in text


def test_recording_is_off_outside_explaining():
    assert _spans.explain is None
    with explaining():
        assert _spans.explain is not None
        with explaining():  # nested: the same recording
            torch.ones(2, 3, device=TPU).sum().item()
        assert _spans.explain is not None
    assert _spans.explain is None
    torch.ones(2, 3, device=TPU).sum().item()  # not recorded
    assert _quiet_report().host_syncs == 1


def test_dtype_and_layout_causes(fresh):
    def run() -> None:
        a = torch.ones(10, 10, device=TPU)
        (a - 1).cpu()
        (a.t() - 1).cpu()  # LAYOUT
        (a.double() - 1).cpu()  # DTYPE

    with explaining():
        run()
    subs = [p for p in _quiet_report().programs if p.name == "aten::sub.Tensor"]
    assert [p.cause for p in subs] == [NEW_OP, NEW_LAYOUT, NEW_DTYPE]
    assert subs[1].detail == "self: strides (10, 1) -> (1, 10)"
    assert subs[1].where == _line(run, "LAYOUT") and "dtype float32 -> float64" in subs[2].detail


def test_defer_and_fuse_names_the_first_differing_node(fresh):
    with explaining(), torchtpu.eager_mode("defer_and_fuse"):
        _loop((2, 3, 3))
        picked = torch.arange(4.0, device=TPU)
        picked = picked[picked > 1]  # MASK
    assert picked.cpu().tolist() == [2.0, 3.0]
    report = _quiet_report()
    graphs = [p for p in report.programs if p.mode == "defer_and_fuse"]
    assert graphs[0].cause in (NEW_OP, NEW_STRUCTURE)
    shape = [p for p in graphs if p.cause == NEW_SHAPE]
    assert len(shape) == 1 and "(aten::mul.Tensor): self: shape (2, 9) -> (3, 9)" in shape[0].detail
    assert shape[0].where == _line(_loop, "ITEM")  # the .item() ran the graph
    (item,) = [s for s in report.syncs if s.cause == ".item()"]
    assert item.calls == 3
    (mask,) = [s for s in report.syncs if "nonzero" in s.cause]
    assert mask.where == _line(test_defer_and_fuse_names_the_first_differing_node, "MASK")


def test_torch_compile_guard_failure_and_dynamic_size():
    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x * 2).sum(0)

    torch._dynamo.reset()
    cf = torch.compile(f, backend="tpu")
    with explaining():
        # 4 makes the size dynamic; automatic dynamic sizes are bucketed (docs/compile.md), so
        # 20 (bucket 32) needs a program of another shape where 5 (bucket 8, as 4's) would not
        for n in (3, 4, 20):
            x = torch.full((n, 13), 1.5, device=TPU)
            assert cf(x).cpu().tolist() == [3.0 * n] * 13
    report = _quiet_report()
    compiled = [p for p in report.programs if p.mode == "compiled"]
    causes = [p.cause for p in compiled]
    assert causes == [NEW_OP, GUARD_FAILURE, NEW_SHAPE], compiled
    assert "size mismatch at index 0" in compiled[1].detail and "expected 3, actual 4" in compiled[1].detail
    assert "(a dynamic size): 8 -> 32" in compiled[2].detail, compiled[2].detail
    assert "mark_dynamic" in str(report)


def test_cpu_fallback_is_listed_and_its_copies_are_not_syncs(monkeypatch):
    monkeypatch.setenv("TORCHTPU_CPU_FALLBACK", "1")

    @torch.library.custom_op("explain_test::thrice", mutates_args=(), device_types="cpu")
    def thrice(x: torch.Tensor) -> torch.Tensor:
        return x * 3

    def run() -> torch.Tensor:
        return thrice(torch.ones(3, device=TPU))  # FALLBACK

    with pytest.warns(UserWarning, match="no tpu lowering"), explaining():
        out = run()
    assert out.cpu().tolist() == [3.0, 3.0, 3.0]
    report = _quiet_report()
    (fb,) = report.fallbacks
    assert (fb.op, fb.calls, fb.where) == ("explain_test::thrice", 1, _line(run, "FALLBACK"))
    assert report.host_syncs == 0  # the fallback's copies belong to it
    assert "CPU fallbacks: 1" in str(report)


def test_disk_tier_is_reported():
    from torchtpu.eager import dispatch
    from torchtpu.runtime import cache

    x = torch.ones(4, 29, device=TPU)
    (x * 11).cpu()
    dispatch.clear_cache()
    cache.clear_memory()
    with explaining():
        (x * 11).cpu()
    (p,) = [p for p in _quiet_report().programs if p.name == "aten::mul.Tensor"]
    assert p.tier == "disk"


SCRIPT = """\
import torch
x = torch.ones(4, 5).to("tpu")
for n in range(2):
    (x * (n + 2)).sum().item()  # ITEM
print(x.sum())  # PRINT
"""


def test_env_var_prints_the_report_at_exit(tmp_path):
    script = tmp_path / "loop.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "TORCHTPU_EXPLAIN": "1"}
    proc = subprocess.run([sys.executable, str(script)], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = proc.stderr[proc.stderr.index("torchtpu explain:") :]
    assert f".item() x2 at {script}:4" in report
    # formatting a tensor reads it several times (.item()s, a masked_select): one line
    assert re.search(rf"print / str\(tensor\) x\d+ at {re.escape(str(script))}:5\n", report), report
    assert "new op:" in report
