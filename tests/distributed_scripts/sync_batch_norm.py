"""``nn.SyncBatchNorm`` across the ranks of the "tpu" group against one ``nn.BatchNorm2d``
over the whole batch on the CPU: the ranks hold uneven slices (3 and 5 images), every
rank's outputs, input gradients, summed weight and bias gradients, and the running
statistics after three training steps and in eval mode.

    torchrun --nproc-per-node=2 tests/distributed_scripts/sync_batch_norm.py

Writes {error: None | text, diffs: {what: largest difference}} per rank.
"""

from __future__ import annotations

import traceback

import torch
import torch.distributed as dist
import torch.nn as nn
from _common import rank_world, report

SPLIT = [3, 5]  # images per rank (2 ranks)
MODES = ["eager", "defer_and_fuse"]


def layer() -> nn.Module:
    torch.manual_seed(0)
    bn = nn.BatchNorm2d(4, momentum=0.3)
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-0.5, 0.5)
    return bn


def step_data(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    return torch.randn(sum(SPLIT), 4, 5, 6, generator=g) * 2 + 1, torch.randn(sum(SPLIT), 4, 5, 6, generator=g)


def largest(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.cpu().double() - b.double()).abs().max())


def run(rank: int, world: int, mode: str) -> dict[str, float]:
    import torchtpu

    reference = layer()
    synced = nn.SyncBatchNorm.convert_sync_batchnorm(nn.Sequential(layer())).to("tpu")
    lo, hi = sum(SPLIT[:rank]), sum(SPLIT[: rank + 1])
    diffs: dict[str, float] = {}
    for step in range(3):
        x, w = step_data(step)
        xr = x.clone().requires_grad_()
        want = reference(xr)
        (want * w).sum().backward()
        xt = x[lo:hi].to("tpu").requires_grad_()
        with torchtpu.eager_mode(mode):
            got = synced(xt)
            (got * w[lo:hi].to("tpu")).sum().backward()
        grads = torch.cat([synced[0].weight.grad, synced[0].bias.grad])
        dist.all_reduce(grads)  # SyncBatchNorm leaves the parameters' gradients to DDP
        for name, a, b in [
            ("output", got.detach(), want.detach()[lo:hi]),
            ("input grad", xt.grad, xr.grad[lo:hi]),
            ("weight and bias grads", grads, torch.cat([reference.weight.grad, reference.bias.grad])),
            ("running mean", synced[0].running_mean, reference.running_mean),
            ("running var", synced[0].running_var, reference.running_var),
        ]:
            diffs[name] = max(diffs.get(name, 0.0), largest(a, b))
        reference.zero_grad()
        synced.zero_grad()
    synced.eval()
    reference.eval()
    x, _ = step_data(9)
    diffs["eval output"] = largest(synced(x[lo:hi].to("tpu")), reference(x)[lo:hi])
    return diffs


def main() -> None:
    rank, world = rank_world()
    dist.init_process_group("tpu")
    try:
        report({"error": None, "diffs": {mode: run(rank, world, mode) for mode in MODES}})
    except Exception:  # noqa: BLE001 - the test shows it
        report({"error": traceback.format_exc()})
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
