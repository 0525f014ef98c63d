"""Weight averaging as users write it: ``torch.optim.swa_utils.AveragedModel`` (an EMA of
parameters and buffers, and an SWA average) next to a model that trains, ``SWALR`` and
``update_bn``, in every execution mode, against the same loop on the CPU.

AveragedModel deep-copies the model, so its tensors start as copies of the model's; the
model's training step then rewrites its own in place. Before storage clones had buffers of
their own, a compiled step donated the model's BatchNorm buffers to XLA and deleted them
under the average ("Buffer has been deleted or donated" at its next update)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from torch.optim.swa_utils import SWALR, AveragedModel, get_ema_multi_avg_fn, update_bn

import torchtpu
from tests.utils import TPU

Batch = tuple[torch.Tensor, torch.Tensor]


def _data() -> list[Batch]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(4, 3, 8, 8, generator=g), torch.randint(0, 2, (4,), generator=g)) for _ in range(4)]


def _train(dev: str, mode: str) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Losses of four steps, and the averages' state and outputs after update_bn."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 2)
    ).to(dev)
    ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.9), use_buffers=True)
    swa = AveragedModel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    sched = SWALR(opt, swa_lr=0.05)

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.detach()

    if dev == TPU and mode == "compile":
        step = torch.compile(step, backend="tpu")
    data = _data()
    losses = []
    with torchtpu.eager_mode("defer_and_fuse" if dev == TPU and mode == "defer" else "eager"):
        for x, y in data:
            losses.append(float(step(x.to(dev), y.to(dev))))
            ema.update_parameters(model)
            swa.update_parameters(model)
            sched.step()
        update_bn([x.to(dev) for x, _ in data], swa)
        state = {f"swa.{k}": v.detach().cpu() for k, v in swa.state_dict().items()}
        state |= {f"ema.{k}": v.detach().cpu() for k, v in ema.state_dict().items()}
        x = data[0][0].to(dev)
        state["swa(x)"] = swa.eval()(x).detach().cpu()
        state["ema(x)"] = ema.eval()(x).detach().cpu()
    return losses, state


@pytest.mark.parametrize("mode", ["eager", "defer", "compile"])
def test_ema_and_swa_averages_match_the_cpu(mode: str) -> None:
    losses, state = _train(TPU, mode)
    want_losses, want = _train("cpu", mode)
    torch.testing.assert_close(losses, want_losses)
    assert state.keys() == want.keys()
    for name, value in want.items():
        torch.testing.assert_close(state[name], value, msg=name)
    # the averages moved away from their start, and apart from each other
    assert not torch.equal(state["ema(x)"], state["swa(x)"])
