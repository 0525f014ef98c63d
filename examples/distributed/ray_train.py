"""The DDP training of ddp.py, run by Ray actors, one per device.

    pip install 'torchtpu[ray]'
    python examples/distributed/ray_train.py [--workers 2] [--compare]

Each actor is one process driving its own device (tpu:0); the driver hands every actor
its rank and a rendezvous address, and the actors form a "tpu" process group exactly as
under torchrun. On a cluster, give each actor its accelerator (e.g. resources={"TPU": 1})
and Ray places one per device.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys

import ray

HERE = os.path.dirname(os.path.abspath(__file__))


@ray.remote
class Trainer:
    def __init__(self, rank: int, world: int, addr: str, port: int) -> None:
        os.environ.update(RANK=str(rank), LOCAL_RANK="0", WORLD_SIZE=str(world), MASTER_ADDR=addr, MASTER_PORT=str(port))
        sys.path.insert(0, HERE)

    def train(self) -> list[float]:
        import torch
        import torch.distributed as dist
        from common import LR, batches, loss_fn, make_model
        from torch.nn.parallel import DistributedDataParallel as DDP

        dist.init_process_group("tpu")
        rank, world = dist.get_rank(), dist.get_world_size()
        model = DDP(make_model().to("tpu"))
        opt = torch.optim.SGD(model.parameters(), lr=LR)
        losses = []
        for x, y in batches():
            loss = loss_fn(model(x.chunk(world)[rank].to("tpu")), y.chunk(world)[rank].to("tpu"))
            loss.backward()
            opt.step()
            opt.zero_grad()
            step = loss.detach().reshape(1)
            dist.all_reduce(step, op=dist.ReduceOp.AVG)
            losses.append(step.item())
        dist.destroy_process_group()
        return losses


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--compare", action="store_true")
    args = p.parse_args()
    ray.init(num_cpus=args.workers, include_dashboard=False, log_to_driver=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    actors = [Trainer.remote(r, args.workers, "127.0.0.1", port) for r in range(args.workers)]
    losses = ray.get([a.train.remote() for a in actors])[0]
    sys.path.insert(0, HERE)
    from common import compare_and_report, reference_losses

    compare_and_report("ray_train", losses, reference_losses if args.compare else None, rank=0)
    ray.shutdown()


if __name__ == "__main__":
    main()
