"""FSDP2's options and tensor parallelism's loss_parallel, each trained twice in one job whose
group is ``"cpu:gloo,tpu:tpu"``: on CPU tensors through gloo (the reference) and on tpu
tensors. FSDP2: plain, ``reshard_after_forward=False``, gradient accumulation with
``set_requires_gradient_sync(False)``, ``CPUOffloadPolicy``, activation checkpointing
(``checkpoint_wrapper``) and ``clip_grad_norm_`` on the sharded gradients; the full state
dict gathered by ``get_model_state_dict``. Tensor parallel: Colwise/Rowwise blocks, and a
column-parallel head whose cross-entropy runs under ``loss_parallel``. Reports each case's
losses and the sum of every parameter per device."""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from _common import report
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, loss_parallel, parallelize_module

warnings.filterwarnings("ignore")
STEPS = 3


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(16)
        self.up = nn.Linear(16, 32)
        self.down = nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.norm(x))))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block() for _ in range(2)])
        self.head = nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def batch(device: str, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(4, 6, 16, generator=g).to(device), torch.randint(0, 8, (4, 6), generator=g).to(device)


def loss_of(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(x).flatten(0, 1), y.flatten())


def fsdp(device: str, rank: int, kind: str) -> dict:
    torch.manual_seed(0)
    model = Net()
    if kind == "checkpointing":
        for i, block in enumerate(model.blocks):
            model.blocks[i] = checkpoint_wrapper(block)
    model = model.to(device)
    mesh = init_device_mesh(device, (2,))
    options: dict = {
        "no_reshard": {"reshard_after_forward": False},
        "offload": {"offload_policy": CPUOffloadPolicy(pin_memory=False)},
    }.get(kind, {})
    for block in model.blocks:
        fully_shard(block, mesh=mesh, **options)
    fully_shard(model, mesh=mesh, **options)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    losses = []
    for step in range(STEPS):
        opt.zero_grad()
        if kind == "accumulate":  # a first micro-batch whose gradients stay local
            model.set_requires_gradient_sync(False)
            loss_of(model, *batch(device, 1000 + 100 * step + rank)).backward()
            model.set_requires_gradient_sync(True)
        loss = loss_of(model, *batch(device, 100 * step + rank))
        loss.backward()
        if kind == "clip":
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
        opt.step()
        losses.append(loss.item())
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {"losses": losses, "sums": {k: v.double().sum().item() for k, v in state.items()}}


def tensor_parallel(device: str, kind: str) -> dict:
    torch.manual_seed(0)
    model = Net().to(device)
    mesh = init_device_mesh(device, (2,))
    for block in model.blocks:
        parallelize_module(block, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    if kind == "loss_parallel":
        parallelize_module(model, mesh, {"head": ColwiseParallel(use_local_output=False)})
    # foreach=False: the norms' parameters stay plain tensors, and a foreach update of
    # DTensors and tensors together raises (on CUDA too)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, foreach=False)
    losses = []
    for step in range(STEPS):
        opt.zero_grad()
        x, y = batch(device, 100 * step)  # the same batch on both ranks
        if kind == "loss_parallel":
            with loss_parallel():
                loss = loss_of(model, x, y)
                loss.backward()
            loss = loss.full_tensor()
        else:
            loss = loss_of(model, x, y)
            loss.backward()
        opt.step()
        losses.append(loss.item())
    full = {k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in model.state_dict().items()}
    return {"losses": losses, "sums": {k: v.detach().cpu().double().sum().item() for k, v in full.items()}}


def cases(device: str, rank: int) -> dict:
    out = {f"fsdp_{kind}": fsdp(device, rank, kind) for kind in ("plain", "no_reshard", "accumulate", "offload", "checkpointing", "clip")}
    out.update({f"tp_{kind}": tensor_parallel(device, kind) for kind in ("plain", "loss_parallel")})
    return out


def main() -> None:
    dist.init_process_group("cpu:gloo,tpu:tpu")
    rank = dist.get_rank()
    report({device: cases(device, rank) for device in ("cpu", "tpu")})
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
