"""The op report: ``python -m torchtpu.check_model script.py`` and ``TORCHTPU_OP_REPORT=1``
say, per op, whether it ran lowered, decomposed, missing (CPU fallback) or synced with the
host, with the source line of its first call."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig

import pytest
import torch

from torchtpu import op_report
from torchtpu.lowering import registry

aten = torch.ops.aten
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A user script; the markers name the lines the report must point at.
SCRIPT = """\
import sys
import torch

@torch.library.custom_op("check_model_test::twice", mutates_args=(), device_types="cpu")
def twice(x: torch.Tensor) -> torch.Tensor:  # a CPU kernel only: missing on tpu
    return x * 2

x = torch.arange(6.0).reshape(2, 3).to("tpu")
for _ in range(2):
    y = x @ x.T  # MM
print("twice", twice(x).cpu().tolist())  # TWICE
z = torch.nn.functional.hardswish(x)  # HARDSWISH
n = (y > 20).sum().item()  # ITEM
picked = x[x > 2]  # MASK
print("argv", sys.argv[1:], "n", n, "picked", picked.numel())
"""


def _line(marker: str) -> int:
    return next(i for i, text in enumerate(SCRIPT.splitlines(), 1) if text.endswith(f"# {marker}"))


def _rows(report: str) -> dict[str, tuple[str, int, str]]:
    """op -> (how, calls, first call) from the report's table."""
    rows = {}
    for line in report.splitlines():
        parts = [p for p in line.strip().split("  ") if p]
        if len(parts) == 4 and parts[2].strip().isdigit():
            rows[parts[0].strip()] = (parts[1].strip(), int(parts[2]), parts[3].strip())
    return rows


def _run(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "TORCHTPU_CPU_FALLBACK": "0", **(env or {})}
    return subprocess.run([sys.executable, *args], cwd=REPO, env=full_env, capture_output=True, text=True, timeout=600)


def test_check_model_reports_every_category_with_source_lines(tmp_path):
    script = tmp_path / "user_script.py"
    script.write_text(SCRIPT)
    proc = _run(["-m", "torchtpu.check_model", str(script), "--flag", "7"])
    assert proc.returncode == 0, proc.stderr
    # the script ran to the end, with its arguments, the missing op on the CPU
    assert "twice [[0.0, 2.0, 4.0], [6.0, 8.0, 10.0]]" in proc.stdout
    assert "argv ['--flag', '7'] n 1 picked 3" in proc.stdout
    report = proc.stderr[proc.stderr.index("torchtpu op report") :]
    assert "TORCHTPU_CPU_FALLBACK=1" in report.splitlines()[0]
    rows = _rows(report)
    at = lambda marker: f"{script}:{_line(marker)}"  # noqa: E731
    assert rows["check_model_test::twice"] == ("missing (ran on the CPU)", 1, at("TWICE"))
    assert rows["aten::mm"] == ("lowered", 2, at("MM"))
    hardswish = "lowered" if aten.hardswish.default in registry.RULES else "decomposed"
    assert rows["aten::hardswish"] == (hardswish, 1, at("HARDSWISH"))
    assert rows[op_report.SYNC_NAMES["item"]] == ("host sync", 1, at("ITEM"))
    assert rows["aten::nonzero (data-dependent shape)"] == ("host sync", 1, at("MASK"))
    assert rows[op_report.SYNC_NAMES["to_cpu"]][0] == "host sync"
    assert rows[op_report.SYNC_NAMES["to_cpu"]][2] == at("TWICE")  # the fallback's own copies are not syncs
    # the missing op comes first: what to fix
    assert report.splitlines()[2].strip().startswith("check_model_test::twice")


def test_check_model_passes_on_the_exit_status(tmp_path, capsys, monkeypatch):
    from torchtpu import check_model

    monkeypatch.delenv("TORCHTPU_CPU_FALLBACK", raising=False)
    script = tmp_path / "fails.py"
    script.write_text('import torch\nx = torch.ones(2).to("tpu") + 1\nraise SystemExit(3)\n')
    assert check_model.main([str(script)]) == 3
    assert _rows(capsys.readouterr().err)["aten::add.Tensor"] == ("lowered", 1, f"{script}:2")
    assert "TORCHTPU_CPU_FALLBACK" not in os.environ and op_report.recorder is None  # restored
    assert check_model.main([str(tmp_path / "nope.py")]) == 2
    assert "no such script" in capsys.readouterr().err


def test_op_report_env_var_without_fallback_names_the_missing_op(tmp_path):
    script = tmp_path / "missing.py"
    text = SCRIPT.split("for _ in")[0] + "twice(x)  # FIRST\n"
    script.write_text(text)
    proc = _run([str(script)], env={"TORCHTPU_OP_REPORT": "1"})
    assert proc.returncode != 0 and "NotImplementedError" in proc.stderr
    rows = _rows(proc.stderr[proc.stderr.index("torchtpu op report") :])
    assert rows["check_model_test::twice"] == ("missing (raised NotImplementedError)", 1, f"{script}:{len(text.splitlines())}")


@pytest.fixture
def recorder():
    rec = op_report.start()
    yield rec
    op_report.stop()


def test_decomposed_and_backward_ops_in_process(recorder, monkeypatch):
    # without its rule, hardswish runs as PyTorch's decomposition (and still matches the CPU)
    monkeypatch.delitem(registry.RULES, aten.hardswish.default, raising=False)
    x = torch.linspace(-4, 4, 9)
    torch.testing.assert_close(torch.nn.functional.hardswish(x.to("tpu")).cpu(), torch.nn.functional.hardswish(x))
    w = torch.ones(3, device="tpu", requires_grad=True)
    torch.sigmoid(w).sum().backward()
    entries = {(e.category, e.name): e for e in recorder.entries.values()}
    here = os.path.abspath(__file__)
    decomposed = entries[(op_report.DECOMPOSED, "aten::hardswish")]
    assert decomposed.where.startswith(f"{here}:") and decomposed.user_where is None
    # sigmoid_backward runs in the autograd engine, called by backward(): its node, not that line
    backward = [e for (_, name), e in entries.items() if name == "aten::sigmoid_backward"]
    assert [e.where for e in backward] == ["backward (SigmoidBackward0)"]


def test_source_line_names_the_user_frame_behind_a_library(recorder):
    """A call from an installed library (transformers, say) is shown with the user's line."""
    library_file = os.path.join(sysconfig.get_paths()["purelib"], "some_library", "layers.py")
    code = compile("def forward(x):\n    return x.exp()\n", library_file, "exec")
    namespace: dict = {}
    exec(code, namespace)
    namespace["forward"](torch.ones(2, device="tpu"))  # USER LINE
    entry = recorder.entries[(op_report.LOWERED, "aten::exp")]
    assert entry.where == f"{library_file}:2"
    user_line = next(i for i, t in enumerate(open(__file__).read().splitlines(), 1) if t.endswith("# USER LINE"))
    assert entry.user_where == f"{os.path.abspath(__file__)}:{user_line}"


def test_nothing_is_recorded_when_off():
    assert op_report.recorder is None
    (torch.ones(2, device="tpu") * 3).sum().item()
    assert op_report.recorder is None
