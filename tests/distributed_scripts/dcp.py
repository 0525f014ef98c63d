"""Distributed checkpoint on tpu: save a FSDP2-sharded model on N ranks, load it on M.

    torchrun --nproc-per-node=2 tests/distributed_scripts/dcp.py save DIR
    python tests/distributed_scripts/dcp.py load DIR          # one process, no process group

"save" trains two steps, saves the sharded state with torch.distributed.checkpoint and
the full state (gathered, on CPU) with torch.save as the reference; "load" loads the
checkpoint into an unsharded model on tpu and reports whether it equals the reference.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples", "distributed"))
sys.path.insert(0, HERE)
from _common import report  # noqa: E402
from common import LR, batches, loss_fn, make_model  # noqa: E402


def save(path: str) -> None:
    dist.init_process_group("tpu")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = make_model().to("tpu")
    mesh = init_device_mesh("tpu", (world,))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for x, y in batches(2):
        loss_fn(model(x.chunk(world)[rank].to("tpu")), y.chunk(world)[rank].to("tpu")).backward()
        opt.step()
        opt.zero_grad()
    state = model.state_dict()
    sharded = all(isinstance(v, DTensor) for v in state.values())
    dcp.save({"model": state}, checkpoint_id=os.path.join(path, "ckpt"))
    full = {k: (v.full_tensor() if isinstance(v, DTensor) else v).cpu() for k, v in state.items()}
    if rank == 0:
        torch.save(full, os.path.join(path, "reference.pt"))
    dist.barrier()
    report({"saved": True, "sharded": sharded})
    dist.destroy_process_group()


def load(path: str) -> None:
    model = make_model(seed=99).to("tpu")  # different initial values: the load must overwrite them
    state = model.state_dict()
    dcp.load({"model": state}, checkpoint_id=os.path.join(path, "ckpt"))
    model.load_state_dict(state)
    ref = torch.load(os.path.join(path, "reference.pt"))
    got = {k: v.cpu() for k, v in model.state_dict().items()}
    bad = [k for k in ref if not torch.equal(ref[k], got[k])]
    report({"loaded": True, "on_tpu": all(v.device.type == "tpu" for v in state.values()), "mismatched": bad})


if __name__ == "__main__":
    {"save": save, "load": load}[sys.argv[1]](sys.argv[2])
