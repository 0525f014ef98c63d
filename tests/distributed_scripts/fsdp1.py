"""FSDP1 (``FullyShardedDataParallel``) on tpu: ``fsdp1.py``, spawned on 2 ranks. The model
is wrapped per layer and as a whole (FULL_SHARD, the original parameters kept), trained
three AdamW steps with ``clip_grad_norm_`` on half the batch per rank; rank 0 gathers the
full state dict to the CPU and trains the same model on the whole batch in one process on
the CPU. FSDP1 frees and restores its unsharded parameters by resizing their storage,
which needs the C++ hooks (torchtpu/csrc/hooks.cpp)."""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from _common import report
from torch.distributed.fsdp import FullStateDictConfig, ShardingStrategy, StateDictType
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

warnings.filterwarnings("ignore")
STEPS = 3


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 1))


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(32, 8, generator=g), torch.randn(32, 1, generator=g)


def sharded(rank: int) -> tuple[list[float], dict[str, torch.Tensor]]:
    model = FSDP(
        _model(),
        sharding_strategy=ShardingStrategy.FULL_SHARD,
        auto_wrap_policy=ModuleWrapPolicy({nn.Linear}),
        device_id=torch.device("tpu", 0),
        use_orig_params=True,
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = _data()
    losses = []
    for _ in range(STEPS):
        loss = F.mse_loss(model(x[rank::2].to("tpu")), y[rank::2].to("tpu"))
        loss.backward()
        model.clip_grad_norm_(1.0)
        optimizer.step()
        optimizer.zero_grad()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append(mean.item() / 2)
    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, FullStateDictConfig(offload_to_cpu=True, rank0_only=True)):
        state = model.state_dict()
    return losses, state


def single_process() -> tuple[list[float], dict[str, torch.Tensor]]:
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = _data()
    losses = []
    for _ in range(STEPS):
        loss = (F.mse_loss(model(x[0::2]), y[0::2]) + F.mse_loss(model(x[1::2]), y[1::2])) / 2
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses, model.state_dict()


def main() -> None:
    dist.init_process_group("tpu")
    rank = dist.get_rank()
    losses, state = sharded(rank)
    result = {"losses": losses}
    if rank == 0:
        ref_losses, ref_state = single_process()
        result["reference"] = ref_losses
        result["state_keys"] = sorted(state) == sorted(ref_state)
        result["max_weight_diff"] = max((state[k].cpu() - v).abs().max().item() for k, v in ref_state.items())
    report(result)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
