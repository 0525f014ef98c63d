"""Failure behaviour of the "tpu" process group. One scenario per run:

    RANK=r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=p python failures.py SCENARIO

hang      rank 1 never calls the collective: rank 0 must fail after the group's timeout
dead      rank 1 exits right after joining: rank 0's collective must fail, not hang
shapes    the ranks all_reduce tensors of different shapes
kinds     rank 0 calls all_reduce, rank 1 broadcast
absent    only rank 0 is started: init_process_group must time out

Each rank reports {"error": type and message, "seconds": time to fail} (or "no error").
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import attempt, report  # noqa: E402

TIMEOUT = timedelta(seconds=float(os.environ.get("TORCHTPU_TEST_TIMEOUT", "4")))


def main(scenario: str) -> None:
    rank = int(os.environ["RANK"])
    if scenario == "absent":
        attempt(lambda: dist.init_process_group("tpu", timeout=TIMEOUT))
        return
    dist.init_process_group("tpu", timeout=TIMEOUT)
    t = torch.ones(4, 4).to("tpu")
    if scenario == "hang":
        if rank == 1:
            time.sleep(TIMEOUT.total_seconds() + 2)  # alive (socket open) past rank 0's timeout
            report({"error": "skipped", "seconds": 0})
            os._exit(0)
        attempt(lambda: dist.all_reduce(t))
    elif scenario == "dead":
        if rank == 1:
            dist.barrier()
            os._exit(3)
        dist.barrier()
        time.sleep(0.5)
        # then: read the tensor the failed all_reduce was given (in place on the cpu platform)
        attempt(lambda: [dist.all_reduce(t) for _ in range(3)], then=lambda: t.cpu())
    elif scenario == "shapes":
        x = torch.ones(4, 4 + rank).to("tpu")
        attempt(lambda: dist.all_reduce(x))
    elif scenario == "kinds":
        attempt(lambda: dist.all_reduce(t) if rank == 0 else dist.broadcast(t, src=0))
    os._exit(0)  # skip the shutdown handshake: the peer may be gone


if __name__ == "__main__":
    main(sys.argv[1])
