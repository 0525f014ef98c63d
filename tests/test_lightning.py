"""PyTorch Lightning on tpu (torchtpu/integrations/lightning.py): ``Trainer`` and
``Fabric`` with ``accelerator="tpu"`` (and ``"auto"``) against the same code with
``accelerator="cpu"``, in one process. Before, Lightning's "tpu" was torch_xla's and
raised ``Requirement 'torch_xla>=1.13' not met``; "auto" trained on the CPU.

Models without dropout, so that the two devices' generators do not enter the comparison;
where a test is about the tpu generator it compares tpu with tpu."""

from __future__ import annotations

import os
import warnings
from typing import Any

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

L = pytest.importorskip("lightning")

TPU = "tpu"
# float32 after a few optimizer steps: a few ulps of drift per step (examples/harness.py)
TOL = dict(rtol=1e-4, atol=1e-5)
# bfloat16 autocast: PyTorch's own bfloat16 tolerances (torch.testing)
BF16_TOL = dict(rtol=1.6e-2, atol=1e-5)


@pytest.fixture(autouse=True)
def _quiet() -> Any:
    with warnings.catch_warnings():  # Lightning's hints (workers, logging intervals, litlogger)
        warnings.simplefilter("ignore")
        yield


@pytest.fixture(autouse=True)
def _environment() -> Any:
    """Lightning's distributed strategies export MASTER_ADDR, LOCAL_RANK, WORLD_SIZE... for
    the processes they would launch; left set, the next library in this process (accelerate)
    takes itself for a torchrun rank."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


class Regressor(L.LightningModule):
    def __init__(self, dropout: float = 0.0, noisy_validation: bool = False) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(dropout), nn.Linear(16, 1))
        self.noisy_validation = noisy_validation
        self.losses: list[float] = []

    def training_step(self, batch: Any, index: int) -> torch.Tensor:
        x, y = batch
        loss = F.mse_loss(self.net(x), y)
        self.losses.append(loss.item())
        self.log("loss", loss, on_epoch=True)
        return loss

    def validation_step(self, batch: Any, index: int) -> None:
        x, y = batch
        if self.noisy_validation:  # draws from the device's generator, as a diffusion model's sampling does
            x = x + torch.randn_like(x)
        self.log("val_loss", F.mse_loss(self.net(x), y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


def _loader() -> DataLoader:
    g = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(48, 8, generator=g), torch.randn(48, 1, generator=g)), batch_size=16)


def fit(accelerator: str, epochs: int = 2, validate: bool = False, ckpt_path: str | None = None, **options: Any) -> tuple[Regressor, Any]:
    module_options = {k: options.pop(k) for k in ("dropout", "noisy_validation") if k in options}
    L.seed_everything(0, verbose=False)
    model = Regressor(**module_options)
    trainer = L.Trainer(
        accelerator=accelerator,
        devices=1,
        max_epochs=epochs,
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        num_sanity_val_steps=2 if validate else 0,
        limit_val_batches=2 if validate else 0,
        **options,
    )
    trainer.fit(model, _loader(), _loader() if validate else None, ckpt_path=ckpt_path)
    return model, trainer


def test_trainer_on_tpu_trains_as_on_the_cpu(caplog: pytest.LogCaptureFixture) -> None:
    """The accelerator, strategy and root device are tpu's, the start-up lines say so, and
    the losses are the CPU's."""
    with caplog.at_level("INFO"):
        model, trainer = fit(TPU)
    cpu_model, _ = fit("cpu")
    assert type(trainer.accelerator).__name__ == "TPUAccelerator"
    assert type(trainer.strategy).__name__ == "SingleDeviceStrategy"
    assert trainer.strategy.root_device == torch.device(TPU, 0)
    assert "TPU available: True, using: 1 TPU cores" in caplog.text
    assert len(model.losses) == 6
    torch.testing.assert_close(model.losses, cpu_model.losses, **TOL)
    assert trainer.callback_metrics["loss_epoch"].item() == pytest.approx(sum(model.losses[3:]) / 3, rel=1e-5)


def test_auto_accelerator_picks_tpu() -> None:
    """As "auto" picks CUDA where it is available."""
    trainer = L.Trainer(accelerator="auto", devices=1, logger=False, enable_progress_bar=False)
    assert type(trainer.accelerator).__name__ == "TPUAccelerator"
    assert trainer.strategy.root_device.type == TPU


def test_sanity_check_does_not_shift_the_training_generator() -> None:
    """The Trainer validates two batches before training inside ``isolate_rng``, which
    restores CUDA's generator after it; the tpu generator is restored too now. Before, a
    validation step that draws tpu random numbers shifted every dropout mask of the
    training that followed."""
    plain, _ = fit(TPU, epochs=1, dropout=0.5)
    checked, _ = fit(TPU, epochs=1, dropout=0.5, validate=True, noisy_validation=True)
    assert checked.losses == plain.losses


@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed"])
def test_mixed_precision_autocasts_on_tpu(precision: str) -> None:
    """Lightning's rule gives every device but the CPU and MPS CUDA's autocast; on tpu it is
    tpu's, with a tpu ``GradScaler`` for float16. bfloat16: the CPU's bf16-mixed losses.
    float16: the same steps written by hand on the CPU, with ``torch.autocast("cpu",
    torch.float16)`` and a CPU ``GradScaler`` (Lightning turns 16-mixed on the CPU into
    bf16-mixed)."""
    model, trainer = fit(TPU, precision=precision)
    plugin = trainer.precision_plugin
    assert type(plugin).__name__ == "MixedPrecision" and plugin.device == TPU
    if precision == "bf16-mixed":
        assert plugin.scaler is None
        reference = fit("cpu", precision=precision)[0].losses
    else:
        assert plugin.scaler is not None and plugin.scaler._device == TPU
        reference = _float16_steps_on_the_cpu(steps=len(model.losses))
    torch.testing.assert_close(model.losses, reference, **BF16_TOL)


def _float16_steps_on_the_cpu(steps: int) -> list[float]:
    L.seed_everything(0, verbose=False)
    model = Regressor()
    optimizer = model.configure_optimizers()
    scaler = torch.amp.GradScaler("cpu")
    losses = []
    batches = [batch for _ in range(steps // 3) for batch in _loader()]
    for x, y in batches:
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.mse_loss(model.net(x), y)
        losses.append(loss.item())
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    return losses


def test_resumed_training_continues_the_uninterrupted_run(tmp_path: Any) -> None:
    """``trainer.save_checkpoint`` after two epochs, then ``fit(ckpt_path=...)`` to four:
    the last two epochs' losses are the uninterrupted run's (weights and AdamW state
    written from tpu and read back onto it)."""
    full, _ = fit(TPU, epochs=4)
    _, trainer = fit(TPU, epochs=2)
    trainer.save_checkpoint(tmp_path / "two.ckpt")
    resumed, _ = fit(TPU, epochs=4, ckpt_path=str(tmp_path / "two.ckpt"))
    assert resumed.losses == full.losses[6:]


def _fabric_losses(accelerator: str) -> tuple[list[float], Any]:
    fabric = L.Fabric(accelerator=accelerator, devices=1)
    fabric.seed_everything(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, optimizer = fabric.setup(model, optimizer)
    losses = []
    for x, y in fabric.setup_dataloaders(_loader()):
        loss = F.mse_loss(model(x), y)
        optimizer.zero_grad()
        fabric.backward(loss)
        optimizer.step()
        losses.append(loss.item())
    return losses, fabric


def test_fabric_on_tpu_trains_as_on_the_cpu() -> None:
    losses, fabric = _fabric_losses(TPU)
    assert fabric.device == torch.device(TPU, 0)
    torch.testing.assert_close(losses, _fabric_losses("cpu")[0], **TOL)


def test_standalone_pytorch_lightning_package_too() -> None:
    """``import pytorch_lightning as pl`` (the standalone distribution) is extended as
    ``lightning.pytorch`` is."""
    pl = pytest.importorskip("pytorch_lightning")
    trainer = pl.Trainer(accelerator=TPU, devices=1, logger=False, enable_progress_bar=False)
    assert trainer.strategy.root_device == torch.device(TPU, 0)


@pytest.mark.parametrize(
    ("devices", "message"),
    [(0, "not a valid input"), ("3,", "device index 3 is not available"), ([3], "device index 3 is not available")],
)
def test_devices_this_process_has_not_are_refused(devices: Any, message: str) -> None:
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    with pytest.raises((MisconfigurationException, ValueError, RuntimeError), match=message):
        L.Trainer(accelerator=TPU, devices=devices, logger=False)


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_fsdp_strategy_runs_on_tpu(precision: str) -> None:
    """``strategy="fsdp"`` (FSDP1) on one tpu device: Lightning allowed it only on a GPU
    accelerator, and its mixed precision autocast CUDA whatever the device. float32: the
    losses of DDP on one CPU device (the same distributed sampler; FSDP of one rank is the
    plain model); bf16-mixed: tpu's autocast (FSDP also keeps bfloat16 parameters, so its
    numbers are FSDP's own, not compared). Both start a process group of one, closed after."""
    import torch.distributed as dist

    try:
        model, trainer = fit(TPU, strategy="fsdp", precision=precision)
        assert type(trainer.strategy).__name__ == "FSDPStrategy" and trainer.strategy.root_device.type == TPU
        if precision == "32-true":
            torch.testing.assert_close(model.losses, fit("cpu", strategy="ddp")[0].losses, **TOL)
        else:
            context = trainer.precision_plugin.forward_context()
            assert isinstance(context, torch.autocast) and context.device == TPU and context.fast_dtype == torch.bfloat16
            assert len(model.losses) == 6 and all(torch.isfinite(torch.tensor(model.losses)))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
