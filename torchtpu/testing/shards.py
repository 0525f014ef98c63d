"""Run the full OpInfo conformance suite as N pytest processes, one slice of op_db each.

``python -m torchtpu.testing.shards [N] [--jobs J]`` (what ``make test-ops`` runs). One
process per shard, J at a time, bounds memory and isolates a crash: if a process dies (a signal), the shard is
reported with the test it was running and the other shards still run. The per-shard
results are merged into ``build/opinfo-full.json`` for ``python -m torchtpu.coverage``.
The exit status is non-zero if any test failed or any shard crashed.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys

from . import opinfo

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.join(ROOT, "build")


def run_shard(i: int, n: int) -> tuple[int, str]:
    """Run shard ``i`` of ``n``; returns (exit status, the last test it started)."""
    env = dict(os.environ, TORCHTPU_OPINFO_SHARD=f"{i}/{n}")
    cmd = [
        sys.executable,
        "-X",
        "faulthandler",
        "-m",
        "pytest",
        "tests/test_opinfo.py",
        "-rN",
        "-p",
        "no:cacheprovider",
        "-m",
        "slow",
        "-k",
        "test_opinfo and not quick",
        "-v",
    ]
    last = ""
    with subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as p:
        assert p.stdout is not None
        for line in p.stdout:
            if "::test_opinfo[" in line:
                last = line.split(" ")[0].strip()
                if " FAILED" in line or " XPASS" in line:
                    print(line.rstrip(), flush=True)
            elif line.startswith(("Fatal Python error", "=")) and ("passed" in line or "failed" in line or "Fatal" in line):
                print(f"shard {i}/{n}: {line.rstrip()}", flush=True)
    return p.returncode, last


def merge(n: int) -> str:
    results, parts = [], sorted(glob.glob(os.path.join(BUILD, f"opinfo-full-shard*of{n}.json")))
    for path in parts:
        results.extend(opinfo.read_json(path)[1])
    out = os.path.join(BUILD, "opinfo-full.json")
    opinfo.write_json(results, out, {"description": f"make test-ops: {len(parts)} of {n} shards, every dtype, mode and sample"})
    return out


def main(argv: list[str]) -> int:
    """``[N] [--jobs J]``: N shards (default 8), J of them at a time (default: the CPU count,
    at most 4; each shard process holds its own XLA client and executables)."""
    import argparse
    from concurrent.futures import ThreadPoolExecutor

    parser = argparse.ArgumentParser(prog="python -m torchtpu.testing.shards")
    parser.add_argument("n", nargs="?", type=int, default=8)
    parser.add_argument("--jobs", type=int, default=min(4, os.cpu_count() or 1))
    args = parser.parse_args(argv)
    n = args.n
    os.makedirs(BUILD, exist_ok=True)
    for stale in glob.glob(os.path.join(BUILD, "opinfo-full-shard*.json")):
        os.remove(stale)
    worst = 0
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        outcomes = list(pool.map(lambda i: (i, *run_shard(i, n)), range(n)))
    for i, rc, last in outcomes:
        if rc < 0 or rc > 1:
            print(f"shard {i}/{n} CRASHED (status {rc}) while running {last}; its results are lost", flush=True)
            worst = 2
        elif rc == 1:
            worst = max(worst, 1)
    print(f"merged results: {merge(n)}")
    return worst


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
