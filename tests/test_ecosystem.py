"""Libraries users put on top of PyTorch, on tpu against the CPU: PEFT (LoRA fine-tuning,
merged back into the base model), diffusers (a conditional UNet trained with the DDPM loss
and sampled with DDIM, a VAE), torchmetrics (metrics accumulated on the device) and
transformers' ``save_pretrained``/``from_pretrained(device_map="tpu")`` (safetensors).

None of them knows the tpu device: each runs through ``torch`` alone, as on CUDA. The same
seeds run on both devices in one process; randomness is drawn on the CPU and moved, since
the two devices' generators differ (as CUDA's and the CPU's do)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torchtpu

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

TPU = "tpu"
# float32 after a few optimizer steps: a few ulps of drift per step (examples/harness.py)
TOL = dict(rtol=1e-4, atol=1e-5)
# a UNet's 3 x 3 convolutions and group norms sum in another order on XLA than in oneDNN
UNET_TOL = dict(rtol=1e-3, atol=1e-4)


def _mode(device: str, mode: str) -> contextlib.AbstractContextManager:
    return torchtpu.eager_mode("defer_and_fuse") if device == TPU and mode == "defer" else contextlib.nullcontext()


def _both(fn: Callable[[str], Any]) -> tuple[Any, Any]:
    """``fn`` on the CPU, then on tpu with the results brought back."""
    cpu = fn("cpu")
    tpu = torch.utils._pytree.tree_map(lambda t: t.cpu() if isinstance(t, torch.Tensor) else t, fn(TPU))
    return cpu, tpu


# -- PEFT ----------------------------------------------------------------------------------
def _llama() -> nn.Module:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2
    )
    return transformers.LlamaForCausalLM(config)


# DeferAndFuse and compiled in make test-all (5 and 7 s; make test keeps eager)
@pytest.mark.parametrize("mode", ["eager", pytest.param("defer", marks=pytest.mark.slow), pytest.param("compile", marks=pytest.mark.slow)])
def test_lora_fine_tuning_and_merge_match_the_cpu(mode: str) -> None:
    """LoRA on q/v projections (lora_B drawn non-zero, so the adapters change the output
    from the first step), three AdamW steps on the adapters only, then
    ``merge_and_unload()``: the losses, the adapters and the merged model's logits."""
    peft = pytest.importorskip("peft")
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))

    def run(device: str) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
        model = peft.get_peft_model(_llama(), peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
        torch.manual_seed(2)
        for name, p in model.named_parameters():
            if "lora_B" in name:
                nn.init.normal_(p, std=0.1)
        model = model.to(device)
        trained = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(trained, lr=1e-2)

        def step(x: torch.Tensor) -> torch.Tensor:
            loss = model(input_ids=x, labels=x).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss.detach()

        if mode == "compile" and device == TPU:
            step = torch.compile(step, backend="tpu")
        x = ids.to(device)
        with _mode(device, mode):
            losses = torch.stack([step(x) for _ in range(3)])
            adapters = [p.detach().clone() for p in trained]
            logits = model.merge_and_unload()(x).logits
        return losses, adapters, logits

    (cpu_losses, cpu_adapters, cpu_logits), (losses, adapters, logits) = _both(run)
    assert len(adapters) == 8  # q and v in both layers, A and B each
    assert not torch.equal(cpu_losses[0], cpu_losses[-1])  # the adapters trained
    torch.testing.assert_close(losses, cpu_losses, **TOL)
    for got, want in zip(adapters, cpu_adapters):
        torch.testing.assert_close(got, want, **TOL)
    torch.testing.assert_close(logits, cpu_logits, **TOL)


# -- diffusers -----------------------------------------------------------------------------
def _unet(diffusers: Any) -> nn.Module:
    torch.manual_seed(0)
    return diffusers.UNet2DConditionModel(
        sample_size=8,
        in_channels=4,
        out_channels=4,
        layers_per_block=1,
        block_out_channels=(32, 64),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=16,
        attention_head_dim=8,
        norm_num_groups=8,
    )


# Both in the long suite, for XLA's compile times on the cpu platform: eagerly, the first
# step compiles ~250 programs (17 s in all, 5 s of it AdamW's seven foreach ops over 208
# tensors: XLA compiles one loop per output, ~10 ms each); under DeferAndFuse the whole
# training step is one program of 1006 ops, 12 s to compile, twice (without and with
# AdamW's state). examples/unet keeps a diffusion UNet in make test.
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["eager", "defer"])
def test_diffusers_unet_ddpm_training_and_ddim_sampling_match_the_cpu(mode: str) -> None:
    """A cross-attention UNet (time embedding, ResNet blocks with GroupNorm, transformer
    blocks, down/up sampling): two AdamW steps on the DDPM noise-prediction loss (the
    scheduler's ``add_noise`` on the device), then three DDIM sampling steps."""
    diffusers = pytest.importorskip("diffusers")
    g = torch.Generator().manual_seed(3)
    latents, text = torch.randn(2, 4, 8, 8, generator=g), torch.randn(2, 5, 16, generator=g)
    noises = [torch.randn(2, 4, 8, 8, generator=g) for _ in range(2)]
    timesteps = [torch.randint(0, 100, (2,), generator=g) for _ in range(2)]
    start = torch.randn(2, 4, 8, 8, generator=g)

    def run(device: str) -> tuple[torch.Tensor, torch.Tensor]:
        unet = _unet(diffusers).to(device)
        ddpm = diffusers.DDPMScheduler(num_train_timesteps=100)
        opt = torch.optim.AdamW(unet.parameters(), lr=1e-3)
        x, cond = latents.to(device), text.to(device)
        losses = []
        with _mode(device, mode):
            for noise, t in zip(noises, timesteps):
                noise, t = noise.to(device), t.to(device)
                loss = F.mse_loss(unet(ddpm.add_noise(x, noise, t), t, encoder_hidden_states=cond).sample, noise)
                loss.backward()
                opt.step()
                opt.zero_grad()
                losses.append(loss.detach())
            ddim = diffusers.DDIMScheduler(num_train_timesteps=100)
            ddim.set_timesteps(3)
            sample = start.to(device)
            with torch.no_grad():
                for t in ddim.timesteps:
                    sample = ddim.step(unet(sample, t, encoder_hidden_states=cond).sample, t, sample).prev_sample
        return torch.stack(losses), sample

    (cpu_losses, cpu_sample), (losses, sample) = _both(run)
    torch.testing.assert_close(losses, cpu_losses, **UNET_TOL)
    torch.testing.assert_close(sample, cpu_sample, **UNET_TOL)


@pytest.mark.slow  # 9 s of XLA compiles on a cold cache (make test-all)
def test_diffusers_vae_encode_decode_and_gradients_match_the_cpu() -> None:
    """AutoencoderKL: the posterior's mean and KL, the reconstruction, and the encoder's
    first-layer gradient of reconstruction + KL."""
    diffusers = pytest.importorskip("diffusers")
    images = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(4))

    def run(device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        torch.manual_seed(0)
        vae = diffusers.AutoencoderKL(
            down_block_types=("DownEncoderBlock2D",) * 2,
            up_block_types=("UpDecoderBlock2D",) * 2,
            block_out_channels=(16, 32),
            latent_channels=4,
            norm_num_groups=8,
        ).to(device)
        x = images.to(device)
        posterior = vae.encode(x).latent_dist
        reconstruction = vae.decode(posterior.mean).sample
        loss = F.mse_loss(reconstruction, x) + posterior.kl().mean()
        loss.backward()
        return reconstruction.detach(), loss.detach(), vae.encoder.conv_in.weight.grad

    cpu, tpu = _both(run)
    for got, want in zip(tpu, cpu):
        torch.testing.assert_close(got, want, **UNET_TOL)


# -- torchmetrics --------------------------------------------------------------------------
def test_torchmetrics_accumulated_on_the_device_match_the_cpu() -> None:
    """Metric modules moved with ``.to("tpu")`` keep their states on the device across
    ``update`` calls (four batches); ``compute`` gives the CPU's values. AUROC and the
    calibration error sort and bin on the device."""
    torchmetrics = pytest.importorskip("torchmetrics")
    g = torch.Generator().manual_seed(5)
    probs, target = torch.randn(64, 5, generator=g).softmax(-1), torch.randint(0, 5, (64,), generator=g)

    def run(device: str) -> list[torch.Tensor]:
        metrics = [
            torchmetrics.Accuracy(task="multiclass", num_classes=5),
            torchmetrics.F1Score(task="multiclass", num_classes=5, average="macro"),
            torchmetrics.AUROC(task="multiclass", num_classes=5),
            torchmetrics.CalibrationError(task="multiclass", num_classes=5),
            torchmetrics.ConfusionMatrix(task="multiclass", num_classes=5),
        ]
        regression = [torchmetrics.MeanSquaredError(), torchmetrics.PearsonCorrCoef()]
        for m in metrics + regression:
            m.to(device)
        p, y = probs.to(device), target.to(device)
        for rows in torch.arange(64).split(16):
            for m in metrics:
                m.update(p[rows], y[rows])
            for m in regression:
                m.update(p[rows, 0], p[rows, 1])
        assert all(s.device.type == device for m in metrics for s in m.metric_state.values() if isinstance(s, torch.Tensor))
        return [m.compute() for m in metrics + regression]

    cpu, tpu = _both(run)
    for got, want in zip(tpu, cpu):
        torch.testing.assert_close(got, want, **TOL)


# -- transformers' save_pretrained -----------------------------------------------------------
def test_save_pretrained_from_tpu_loads_on_tpu_and_on_the_cpu(tmp_path: Any) -> None:
    """``save_pretrained`` of a model on tpu writes safetensors; ``from_pretrained`` with
    ``device_map="tpu"`` loads it onto tpu, and without onto the CPU, with the same logits."""
    model = _llama().to(TPU)
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists()
    on_tpu = transformers.LlamaForCausalLM.from_pretrained(tmp_path, device_map=TPU)
    on_cpu = transformers.LlamaForCausalLM.from_pretrained(tmp_path)
    assert {p.device.type for p in on_tpu.parameters()} == {TPU}
    ids = torch.randint(0, 64, (2, 6), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        want = on_cpu(ids).logits
        torch.testing.assert_close(model(ids.to(TPU)).logits.cpu(), want, **TOL)
        torch.testing.assert_close(on_tpu(ids.to(TPU)).logits.cpu(), want, **TOL)


def test_safetensors_files_round_trip_through_the_cpu(tmp_path: Any) -> None:
    """safetensors' ``save_file`` takes tpu tensors. Its ``load_file(device=...)`` parses
    the device string in Rust against its own list (cpu, cuda, mps, npu, xpu, xla, ...),
    which has no tpu, so it refuses ``device="tpu"`` before torch sees it: the README says to
    load to the CPU and move, which this checks, and that the refusal is still there."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file, save_file

    tensors = {"w": torch.randn(3, 4).to(TPU), "ids": torch.arange(5).to(TPU), "half": torch.randn(2).half().to(TPU)}
    save_file(tensors, tmp_path / "t.safetensors")
    loaded = {k: v.to(TPU) for k, v in load_file(tmp_path / "t.safetensors").items()}
    assert loaded.keys() == tensors.keys()
    for k, v in tensors.items():
        assert loaded[k].device.type == TPU and loaded[k].dtype == v.dtype
        assert torch.equal(loaded[k].cpu(), v.cpu())
    with pytest.raises(SafetensorError, match="device tpu is invalid"):
        load_file(tmp_path / "t.safetensors", device=TPU)
