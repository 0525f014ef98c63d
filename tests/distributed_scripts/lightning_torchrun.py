"""PyTorch Lightning under torchrun: ``lightning_torchrun.py cpu|tpu``. A ``Trainer`` with
``strategy="ddp"``, a ``Fabric`` loop with ``strategy="ddp"``, a ``Trainer`` with
``ModelParallelStrategy`` (FSDP2: ``fully_shard`` in ``configure_model`` of a module built on
the CPU) and one with ``strategy="fsdp"`` (FSDP1), each on 2 devices. Each rank reports what Lightning set up (strategy,
process-group backend, world size, rank, device) and the losses it saw (averaged over the
ranks)."""

from __future__ import annotations

import sys
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F
from _common import report
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, TensorDataset

warnings.filterwarnings("ignore")
import lightning as L  # noqa: E402
from lightning.pytorch.strategies import ModelParallelStrategy  # noqa: E402


def _data() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(64, 8, generator=g), torch.randn(64, 1, generator=g))


def _net() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))


class Regressor(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = _net()
        self.losses: list[float] = []

    def training_step(self, batch: list[torch.Tensor], index: int) -> torch.Tensor:
        x, y = batch
        loss = F.mse_loss(self.net(x), y)
        self.log("loss", loss, sync_dist=True)
        self.losses.append(self.all_gather(loss.detach()).mean().item())
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


class ShardedRegressor(Regressor):
    def configure_model(self) -> None:
        mesh = self.device_mesh["data_parallel"]
        for layer in self.net:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(self.net, mesh=mesh)


def trainer_run(device: str, strategy: str = "ddp") -> dict:
    """``strategy``: "ddp", "fsdp" (FSDP1; on the CPU, where Lightning refuses it, the DDP
    run it must equal) or "model_parallel" (FSDP2 in ``configure_model``)."""
    L.seed_everything(0, verbose=False)
    model = ShardedRegressor() if strategy == "model_parallel" else Regressor()
    if strategy == "model_parallel":
        strategy = ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1)
    elif strategy == "fsdp" and device == "cpu":
        strategy = "ddp"
    trainer = L.Trainer(
        accelerator=device, devices=2, strategy=strategy, max_epochs=2, logger=False,
        enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False,
    )
    trainer.fit(model, DataLoader(_data(), batch_size=16))
    return {
        "strategy": type(trainer.strategy).__name__,
        "backend": torch.distributed.get_backend(),
        "world_size": trainer.world_size,
        "rank": trainer.global_rank,
        "device": str(trainer.strategy.root_device),
        "losses": model.losses,
    }


def fabric_run(device: str) -> dict:
    fabric = L.Fabric(accelerator=device, devices=2, strategy="ddp")
    fabric.launch()
    fabric.seed_everything(0)
    model = _net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, optimizer = fabric.setup(model, optimizer)
    losses = []
    for x, y in fabric.setup_dataloaders(DataLoader(_data(), batch_size=16)):
        loss = F.mse_loss(model(x), y)
        optimizer.zero_grad()
        fabric.backward(loss)
        optimizer.step()
        losses.append(fabric.all_reduce(loss.detach(), reduce_op="mean").item())
    return {"device": str(fabric.device), "world_size": fabric.world_size, "losses": losses}


if __name__ == "__main__":
    device = sys.argv[1]
    report(
        {
            "trainer": trainer_run(device),
            "fabric": fabric_run(device),
            "sharded": trainer_run(device, "model_parallel"),
            "fsdp1": trainer_run(device, "fsdp"),
        }
    )
