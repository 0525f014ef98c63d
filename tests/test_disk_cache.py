"""The persistent compilation cache: warm second runs, corruption, concurrent processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = r"""
import json, sys
import torch, torchtpu
x = torch.arange(12, dtype=torch.float32).reshape(3, 4).to("tpu")
w = torch.ones(4, 5, device="tpu")
y = torch.relu(x @ w - 3.0).sum(0)
print(json.dumps({"y": y.cpu().tolist(), **{k: v for k, v in torchtpu.metrics.snapshot().items()}}))
"""


def _run(cache_dir: Path, extra_env: dict | None = None) -> dict:
    env = {**os.environ, "TORCHTPU_CACHE_DIR": str(cache_dir), **(extra_env or {})}
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def _expected() -> list[float]:
    import torch

    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    return torch.relu(x @ torch.ones(4, 5) - 3.0).sum(0).tolist()


def test_second_process_compiles_nothing(tmp_path):
    cold = _run(tmp_path)
    assert cold["compiles"] > 0 and cold.get("disk_cache_hits", 0) == 0
    warm = _run(tmp_path)
    assert warm["compiles"] == 0, warm
    assert warm["disk_cache_hits"] == cold["compiles"]
    assert warm["y"] == cold["y"] == _expected()


@pytest.mark.slow  # make test-all (make test stays within 15 minutes)
def test_defer_and_fuse_training_step_starts_warm_in_a_second_process(tmp_path):
    env = {"TORCHTPU_DEFER_AND_FUSE": "1"}
    cold = _run(tmp_path, env)
    assert cold["flushes"] > 0 and cold["compiles"] > 0
    warm = _run(tmp_path, env)
    assert warm["compiles"] == 0 and warm["disk_cache_hits"] == cold["compiles"]
    assert warm["y"] == cold["y"] == _expected()


def test_empty_cache_dir_disables_the_disk_layer(tmp_path):
    env_dir = tmp_path / "unused"
    out = _run(env_dir, {"TORCHTPU_CACHE_DIR": ""})
    assert out["compiles"] > 0 and out.get("disk_cache_hits", 0) == 0
    assert not env_dir.exists()


@pytest.mark.slow  # make test-all (moved out of make test's 15 minutes)
def test_corrupted_entries_are_ignored_and_rewritten(tmp_path):
    cold = _run(tmp_path)
    entries = sorted(tmp_path.rglob("*.xex"))
    assert len(entries) == cold["compiles"]
    for i, e in enumerate(entries):
        damage = ("truncate", "flip", "garbage")[i % 3]
        blob = e.read_bytes()
        if damage == "truncate":
            e.write_bytes(blob[: len(blob) // 2])
        elif damage == "flip":
            mid = len(blob) // 2
            e.write_bytes(blob[:mid] + bytes([blob[mid] ^ 0xFF]) + blob[mid + 1 :])
        else:
            e.write_bytes(b"not an executable")
    again = _run(tmp_path)
    assert again["y"] == cold["y"] == _expected()
    assert again["compiles"] == cold["compiles"]
    assert again["disk_cache_corrupt"] == cold["compiles"]
    warm = _run(tmp_path)  # the rewritten entries are good again
    assert warm["compiles"] == 0 and warm["y"] == cold["y"]


@pytest.mark.slow  # make test-all (moved out of make test's 15 minutes)
def test_two_processes_share_one_directory(tmp_path):
    env = dict(os.environ, TORCHTPU_CACHE_DIR=str(tmp_path))
    procs = [subprocess.Popen([sys.executable, "-c", SCRIPT], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert results[0]["y"] == results[1]["y"]
    n_programs = len(list(tmp_path.rglob("*.xex")))
    # every program was compiled by at least one of them, and written once
    assert sum(r["compiles"] for r in results) >= n_programs
    assert sum(r.get("disk_cache_writes", 0) for r in results) == n_programs
    assert not list(tmp_path.rglob("*.lock")) and not list(tmp_path.rglob("*.tmp"))
    assert _run(tmp_path)["compiles"] == 0


def test_live_executables_are_bounded_and_evicted_ones_come_back(monkeypatch):
    import torch

    import torchtpu
    from torchtpu.runtime import cache

    monkeypatch.setenv("TORCHTPU_MAX_EXECUTABLES", "4")
    torchtpu.metrics.reset()
    xs = [torch.arange(float(n), device="tpu") for n in range(3, 11)]
    outs = [(x * 3 - 1).cpu() for x in xs]  # 8 shapes: 8+ programs through a 4-entry cache
    assert len(cache._memory) <= 4
    assert torchtpu.metrics.snapshot()["executables_evicted"] > 0
    again = (xs[0] * 3 - 1).cpu()  # its program was evicted: reloaded (disk) or recompiled
    assert again.tolist() == outs[0].tolist() == [-1.0, 2.0, 5.0]
