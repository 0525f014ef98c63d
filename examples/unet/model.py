"""A diffusion UNet in the style of DDPM (Ho et al., 2020) and its Gaussian diffusion.

The UNet predicts the noise in a noised image x_t given t: a sinusoidal embedding of t
through an MLP, ResBlocks (GroupNorm, SiLU, 3x3 conv, the time embedding added between the
two convs), single-head self-attention at the low resolutions, downsampling by a strided
conv, upsampling by nearest interpolation and a conv, and skip connections concatenated on
the way up. ``Diffusion`` holds the linear beta schedule, the training loss and the
ancestral sampler.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class UNetConfig:
    image_size: int
    ch: int  # base channels
    ch_mult: tuple[int, ...]  # channels per resolution level, in units of ch
    attn_levels: tuple[int, ...]  # the levels (0 = full resolution) with self-attention
    num_res_blocks: int
    groups: int = 32  # GroupNorm groups
    in_channels: int = 3
    timesteps: int = 1000
    dropout: float = 0.0


# tiny: seconds on the cpu platform; small: a minute; base: the DDPM CIFAR-10 model (35.7M).
SIZES = {
    "tiny": dict(image_size=16, ch=16, ch_mult=(1, 2), attn_levels=(1,), num_res_blocks=1, groups=8),
    "small": dict(image_size=32, ch=32, ch_mult=(1, 2, 2), attn_levels=(1,), num_res_blocks=1, groups=8),
    "base": dict(image_size=32, ch=128, ch_mult=(1, 2, 2, 2), attn_levels=(1,), num_res_blocks=2, groups=32),
}


def timestep_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    """The transformer's sinusoidal position encoding of the timesteps ``t`` (batch,):
    (batch, dim), sines then cosines, frequencies from 1 down to 1/10000."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000) * torch.arange(half, device=t.device, dtype=torch.float32) / (half - 1))
    args = t.float()[:, None] * freqs[None]
    return torch.cat([torch.sin(args), torch.cos(args)], dim=1)


class ResBlock(nn.Module):
    def __init__(self, in_ch: int, out_ch: int, tdim: int, groups: int, dropout: float) -> None:
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, in_ch)
        self.conv1 = nn.Conv2d(in_ch, out_ch, 3, padding=1)
        self.temb = nn.Linear(tdim, out_ch)
        self.norm2 = nn.GroupNorm(groups, out_ch)
        self.drop = nn.Dropout(dropout)
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, padding=1)
        self.skip = nn.Conv2d(in_ch, out_ch, 1) if in_ch != out_ch else nn.Identity()

    def forward(self, x: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = h + self.temb(F.silu(temb))[:, :, None, None]
        h = self.conv2(self.drop(F.silu(self.norm2(h))))
        return self.skip(x) + h


class AttnBlock(nn.Module):
    """Single-head self-attention over the pixels, with a residual connection."""

    def __init__(self, ch: int, groups: int) -> None:
        super().__init__()
        self.norm = nn.GroupNorm(groups, ch)
        self.qkv = nn.Conv2d(ch, 3 * ch, 1)
        self.proj = nn.Conv2d(ch, ch, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, hh, ww = x.shape
        q, k, v = self.qkv(self.norm(x)).reshape(b, 3, c, hh * ww).transpose(-1, -2).unbind(1)
        h = F.scaled_dot_product_attention(q, k, v)  # (b, pixels, c)
        return x + self.proj(h.transpose(-1, -2).reshape(b, c, hh, ww))


class Downsample(nn.Module):
    def __init__(self, ch: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(ch, ch, 3, stride=2, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


class Upsample(nn.Module):
    def __init__(self, ch: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(ch, ch, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.interpolate(x, scale_factor=2, mode="nearest"))


class Level(nn.Module):
    """The ResBlocks (each followed by attention at the attention levels) of one resolution."""

    def __init__(self, chans: list[tuple[int, int]], tdim: int, attn: bool, c: UNetConfig) -> None:
        super().__init__()
        self.res = nn.ModuleList(ResBlock(i, o, tdim, c.groups, c.dropout) for i, o in chans)
        self.attn = nn.ModuleList(AttnBlock(o, c.groups) if attn else nn.Identity() for _, o in chans)


class UNet(nn.Module):
    def __init__(self, c: UNetConfig) -> None:
        super().__init__()
        self.config = c
        tdim = 4 * c.ch
        self.time_mlp = nn.Sequential(nn.Linear(c.ch, tdim), nn.SiLU(), nn.Linear(tdim, tdim))
        self.head = nn.Conv2d(c.in_channels, c.ch, 3, padding=1)
        widths = [c.ch * m for m in c.ch_mult]
        skips, now = [c.ch], c.ch  # the channels of every skip connection, in order
        self.down, self.downsample = nn.ModuleList(), nn.ModuleList()
        for i, w in enumerate(widths):
            chans = [(now if j == 0 else w, w) for j in range(c.num_res_blocks)]
            self.down.append(Level(chans, tdim, i in c.attn_levels, c))
            now = w
            skips += [w] * c.num_res_blocks
            if i < len(widths) - 1:
                self.downsample.append(Downsample(now))
                skips.append(now)
        self.mid1 = ResBlock(now, now, tdim, c.groups, c.dropout)
        self.mid_attn = AttnBlock(now, c.groups)
        self.mid2 = ResBlock(now, now, tdim, c.groups, c.dropout)
        self.up, self.upsample = nn.ModuleList(), nn.ModuleList()
        for i, w in reversed(list(enumerate(widths))):
            chans = []
            for _ in range(c.num_res_blocks + 1):  # one more than down: it also takes the downsample's skip
                chans.append((now + skips.pop(), w))
                now = w
            self.up.append(Level(chans, tdim, i in c.attn_levels, c))
            if i > 0:
                self.upsample.append(Upsample(now))
        self.out_norm = nn.GroupNorm(c.groups, now)
        self.out = nn.Conv2d(now, c.in_channels, 3, padding=1)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        temb = self.time_mlp(timestep_embedding(t, self.config.ch))
        h = self.head(x)
        hs = [h]
        for i, level in enumerate(self.down):
            for res, attn in zip(level.res, level.attn):
                h = attn(res(h, temb))
                hs.append(h)
            if i < len(self.downsample):
                h = self.downsample[i](h)
                hs.append(h)
        h = self.mid2(self.mid_attn(self.mid1(h, temb)), temb)
        for i, level in enumerate(self.up):
            for res, attn in zip(level.res, level.attn):
                h = attn(res(torch.cat([h, hs.pop()], dim=1), temb))
            if i < len(self.upsample):
                h = self.upsample[i](h)
        return self.out(F.silu(self.out_norm(h)))


class Diffusion(nn.Module):
    """DDPM's Gaussian diffusion around a noise-predicting ``net``: the linear beta
    schedule (1e-4 to 0.02 over ``timesteps``), the simple loss and ancestral sampling."""

    def __init__(self, net: UNet, timesteps: int) -> None:
        super().__init__()
        self.net = net
        self.timesteps = timesteps
        # In float64, then stored as float32 buffers (as DDPM does), so .to(device) moves them.
        betas = torch.linspace(1e-4, 0.02, timesteps, dtype=torch.float64)
        self.register_buffer("alphas_cumprod", torch.cumprod(1 - betas, 0).float())

    def loss(self, x0: torch.Tensor, t: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """The noise-prediction loss at timesteps ``t``, noising ``x0`` with ``noise``."""
        abar = self.alphas_cumprod[t][:, None, None, None]
        xt = abar.sqrt() * x0 + (1 - abar).sqrt() * noise
        return F.mse_loss(self.net(xt, t), noise)

    def forward(self, x0: torch.Tensor, t: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        return self.loss(x0, t, noise)

    @torch.no_grad()
    def sample(self, noise: list[torch.Tensor], steps: int, net: Callable[..., torch.Tensor] | None = None) -> torch.Tensor:
        """Ancestral sampling over ``steps`` evenly spaced timesteps (the schedule respaced
        as in Nichol & Dhariwal: each step's beta from the ratio of the kept alpha-bars).
        ``noise`` holds x_T and the noise of each step but the last; drawing it is the
        caller's business, so every device can be handed the same. ``net`` stands in for
        ``self.net`` (a compiled one, say)."""
        net = self.net if net is None else net
        device = noise[0].device
        ts = torch.linspace(self.timesteps - 1, 0, steps).round().long().tolist()
        abars = self.alphas_cumprod.cpu().double()
        x = noise[0]
        for i, t in enumerate(ts):
            abar = abars[t]
            abar_prev = abars[ts[i + 1]] if i + 1 < steps else torch.tensor(1.0, dtype=torch.float64)
            beta = 1 - abar / abar_prev
            eps = net(x, torch.full((x.shape[0],), t, device=device, dtype=torch.long))
            # DDPM's posterior q(x_{t-1} | x_t, x0) around the predicted x0, clipped to the data range.
            x0 = ((x - (1 - abar).sqrt().item() * eps) / abar.sqrt().item()).clamp(-1, 1)
            c0 = (abar_prev.sqrt() * beta / (1 - abar)).item()
            ct = ((1 - beta).sqrt() * (1 - abar_prev) / (1 - abar)).item()
            x = c0 * x0 + ct * x
            if i + 1 < steps:
                sigma = (beta * (1 - abar_prev) / (1 - abar)).sqrt().item()
                x = x + sigma * noise[i + 1]
        return x


def build(size: str) -> Diffusion:
    c = UNetConfig(**SIZES[size])
    return Diffusion(UNet(c), c.timesteps)
