"""Failure behaviour of the xla transport (TORCHTPU_COLLECTIVES=xla). One scenario per run:

    RANK=r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=p python xla_failures.py SCENARIO

kill0     rank 0 (whose helper hosts the coordination service) is SIGKILLed after a barrier
kill1     rank 1 is SIGKILLed after a barrier
hang      rank 1 stays alive but never calls the collective (the XLA collective timeout)

The survivor all_reduces and reads the result (with TORCHTPU_DIST_CHECK=0 the failure
comes from the XLA program itself; under DeferAndFuse from the graph the read runs), reports {"error": type and message, "seconds": time to fail}, then exits
*normally* (atexit runs, the distributed client disconnects): the test checks its exit code
is 0, i.e. nothing aborted the process.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import attempt, report  # noqa: E402

TIMEOUT = timedelta(seconds=float(os.environ.get("TORCHTPU_TEST_TIMEOUT", "20")))


def main(scenario: str) -> None:
    rank = int(os.environ["RANK"])
    dist.init_process_group("tpu", timeout=TIMEOUT)
    t = torch.ones(4, 4).to("tpu")
    dist.all_reduce(t)  # the group works before the failure
    victim = {"kill0": 0, "kill1": 1, "hang": None}[scenario]
    dist.barrier()
    if rank == victim:
        os.kill(os.getpid(), signal.SIGKILL)
    if scenario == "hang" and rank == 1:
        time.sleep(TIMEOUT.total_seconds() + 5)  # alive, socket open, past the peer's timeout
        report({"error": "skipped", "seconds": 0})
        os._exit(0)
    time.sleep(0.5)

    def reduce_and_read() -> None:
        for _ in range(3):
            dist.all_reduce(t)
        t.sum().item()  # under DeferAndFuse the all_reduces run here

    attempt(reduce_and_read)
    # a normal exit: atexit disconnects from the coordination service


if __name__ == "__main__":
    main(sys.argv[1])
