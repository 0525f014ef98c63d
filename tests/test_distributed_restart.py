"""Fault tolerance: torchrun --max-restarts=1 with a DCP checkpoint resumes training after
a killed rank (examples/distributed/restart.py), losing only the steps since the last
checkpoint, and ends with the uninterrupted run's losses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_distributed import EXAMPLES, TORCHRUN, _env, _free_port, run_group

SCRIPT = EXAMPLES / "restart.py"
STEPS, EVERY, KILL_AT = 12, 4, 7


def _train(tmp_path: Path, name: str, restarts: int = 0, kill_at: int = 0, **env: str) -> dict:
    """One torchrun of the example on 2 processes; rank 0's result of the last attempt."""
    out, ckpt = tmp_path / f"{name}_out", tmp_path / f"{name}_ckpt"
    out.mkdir()
    cmd = [*TORCHRUN, "--nproc-per-node=2", f"--master-port={_free_port()}", f"--max-restarts={restarts}", str(SCRIPT)]
    cmd += ["--ckpt", str(ckpt), "--steps", str(STEPS), "--every", str(EVERY), "--kill-at", str(kill_at)]
    rc, output = run_group(cmd, _env(out, **env), timeout=400)
    assert rc == 0, f"torchrun failed (rc {rc}):\n{output[-4000:]}"
    result = json.loads((out / "restart_rank0.json").read_text())
    result["killed"] = (ckpt / "killed_once").exists()
    return result


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["host", "xla"])
def test_killed_rank_resumes_from_the_last_checkpoint(tmp_path: Path, transport: str) -> None:
    env = {"TORCHTPU_COLLECTIVES": transport}
    clean = _train(tmp_path, "clean", **env)
    assert clean["attempt"] == 0 and clean["start"] == 1 and len(clean["losses"]) == STEPS
    resumed = _train(tmp_path, "killed", restarts=1, kill_at=KILL_AT, **env)
    last_ckpt = (KILL_AT - 1) // EVERY * EVERY
    # rank 1 died once; the restarted attempt resumed after the last checkpoint before it
    assert resumed["killed"] and resumed["attempt"] == 1 and resumed["start"] == last_ckpt + 1, resumed
    expected = {k: v for k, v in clean["losses"].items() if int(k) > last_ckpt}
    assert resumed["losses"] == expected  # the same numbers, step for step, to the last bit
