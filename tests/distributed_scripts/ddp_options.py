"""DistributedDataParallel's options and communication hooks, each trained twice in one job
whose group is ``"cpu:gloo,tpu:tpu"`` (as CUDA jobs use ``"cpu:gloo,cuda:nccl"``): on CPU
tensors through gloo, the reference, and on tpu tensors. ``find_unused_parameters`` with a
branch that alternates between steps, ``static_graph``, ``gradient_as_bucket_view``, buckets
of one gradient each, the fp16 compression hook, PowerSGD (whose rank-1 bucket is an empty
tensor: its all_reduce failed on tpu), ZeroRedundancyOptimizer, and ``Join`` with one rank
running out of batches first. Also empty tensors through all_reduce, broadcast and
all_gather_into_tensor, and a future's callback that issues the next collective and waits
for it (PowerSGD's pattern: it waited for itself on the thread that completes futures).
Reports each case's losses and final weights per device."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from _common import report
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
from torch.distributed.algorithms.join import Join
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

warnings.filterwarnings("ignore")


class TwoHeads(nn.Module):
    """A trunk and one head, or two: ``forward`` uses one of them, so the other gets no gradient."""

    def __init__(self, other: bool) -> None:
        super().__init__()
        self.trunk = nn.Linear(8, 16)
        self.head = nn.Linear(16, 4)
        self.other = nn.Linear(16, 4) if other else None

    def forward(self, x: torch.Tensor, use_other: bool = False) -> torch.Tensor:
        h = torch.relu(self.trunk(x))
        return self.other(h) if use_other else self.head(h)


def _sgd(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def train(
    device: torch.device,
    rank: int,
    ddp_options: dict | None = None,
    hook: Callable[[DDP], None] | None = None,
    optimizer: Callable[[nn.Module], torch.optim.Optimizer] = _sgd,
    alternate: bool = False,
    steps: int = 5,
    join: bool = False,
) -> dict:
    torch.manual_seed(0)
    options = ddp_options or {}
    unused = options.get("find_unused_parameters", False) or options.get("static_graph", False)
    model = DDP(TwoHeads(other=unused).to(device), **options)
    if hook is not None:
        hook(model)
    opt = optimizer(model)
    g = torch.Generator().manual_seed(10 + rank)
    losses = []
    context: AbstractContextManager = Join([model]) if join else nullcontext()
    with context:
        for step in range(steps):
            x, y = torch.randn(6, 8, generator=g).to(device), torch.randn(6, 4, generator=g).to(device)
            opt.zero_grad()
            loss = F.mse_loss(model(x, alternate and step % 2 == 1), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return {"losses": losses, "weights": [p.detach().cpu().flatten().tolist() for p in model.parameters()]}


def _fp16(model: DDP) -> None:
    model.register_comm_hook(None, default_hooks.fp16_compress_hook)


def _powersgd(model: DDP) -> None:
    # compressing from the third step on; every bucket's 1-D gradients (the biases) go
    # uncompressed in a flat tensor, which is empty when a bucket holds only matrices
    state = powersgd.PowerSGDState(
        process_group=None, matrix_approximation_rank=1, start_powerSGD_iter=2, min_compression_rate=0.1
    )
    model.register_comm_hook(state, powersgd.powerSGD_hook)


def _zero(model: nn.Module) -> torch.optim.Optimizer:
    return ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=0.01)


def empty_collectives(device: torch.device) -> dict:
    summed = torch.empty(0, device=device)
    dist.all_reduce(summed)
    sent = torch.empty(0, 3, device=device)
    dist.broadcast(sent, src=0)
    gathered = torch.empty(0, device=device)
    dist.all_gather_into_tensor(gathered, torch.empty(0, device=device))
    return {"shapes": [list(t.shape) for t in (summed, sent, gathered)], "strides": [list(t.cpu().stride()) for t in (summed, sent)]}


def nested_waits(device: torch.device, rank: int) -> list:
    """Callbacks that all_reduce again and wait, on the future and on the work; 128K
    elements, past the size the host transport runs on the caller's thread."""
    n = 1 << 17
    first, second = torch.full((n,), rank + 1.0, device=device), torch.full((n,), 2.0 * rank, device=device)

    def reduce_again(fut: torch.futures.Future) -> torch.Tensor:
        inner = dist.all_reduce(second, async_op=True).get_future().wait()[0]
        return fut.value()[0] + inner

    def reduce_again_and_wait(fut: torch.futures.Future) -> torch.Tensor:
        dist.all_reduce(second, async_op=True).wait()
        return second.sum()

    summed = dist.all_reduce(first, async_op=True).get_future().then(reduce_again).wait()
    total = dist.all_reduce(first, async_op=True).get_future().then(reduce_again_and_wait).wait()
    return [summed[:3].cpu().tolist(), total.item()]


def cases(device: torch.device, rank: int) -> dict:
    bucket_cap_mb = 4 * 16 * 4 / 2**20  # about one trunk bias or head matrix per bucket
    return {
        "find_unused": train(device, rank, {"find_unused_parameters": True}, alternate=True),
        "static_graph": train(device, rank, {"static_graph": True}),
        "bucket_view": train(device, rank, {"gradient_as_bucket_view": True}),
        "small_buckets": train(device, rank, {"bucket_cap_mb": bucket_cap_mb}),
        "fp16_hook": train(device, rank, hook=_fp16),
        "powersgd": train(device, rank, hook=_powersgd),
        "zero": train(device, rank, optimizer=_zero),
        # without find_unused_parameters: a joined rank then matches the used-parameter
        # all_reduce with process_group.allreduce(tensor), which pybind11 turns into a list
        # of the tensor's elements (PyTorch's; gloo goes on, our cross-rank check raises)
        "join": train(device, rank, steps=5 - 2 * rank, join=True),
        "empty": empty_collectives(device),
        "nested": nested_waits(device, rank),
    }


def main() -> None:
    dist.init_process_group("cpu:gloo,tpu:tpu")
    rank = dist.get_rank()
    report({device: cases(torch.device(device), rank) for device in ("cpu", "tpu")})
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
