"""Causal VAE-style decoder with a per-session temporal cache (Wan VAE decoder in miniature).

Latents ``[B, n, C, h, w]`` decode to RGB frames ``[B, frames, 3, H, W]`` in ``[0, 1]``:

1. a causal 3-D conv on the latent time axis;
2. temporal upsampling x4 (a causal conv to ``4 * channels`` whose channel groups become time
   steps); the very first latent of a session keeps only its last step, so a session's first
   chunk of ``n`` latents gives ``1 + 4(n - 1)`` frames and later chunks give ``4n``;
3. a causal 3-D conv on the pixel time axis;
4. per-frame 2-D upsampling stages (nearest x2 + conv, then at the first ``decoder_res_levels``
   levels a residual block of two 3x3 convs) and a conv to RGB.

Every causal conv keeps the last two input slices of the previous call in a
:class:`DecoderState`, owned by the session (never by the module), so chunked decoding of a
session equals decoding the whole clip at once, and interleaved sessions never share temporal
context (the failure vllm-omni's ``StreamingDecodeState`` fixed). The state cannot be recomputed:
releasing it ends the stream.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.world.configs import WorldModelConfig

CACHE_SLICES = 2


@dataclass
class DecoderState:
    """One session's decoder temporal cache, whichever decoder's (here the last 2 input slices of each
    causal conv; Wan's VAE keeps the same, TAEHV each ``MemBlock``'s last input frame)."""

    caches: list[Tensor]
    first: bool = True

    @property
    def nbytes(self) -> int:
        return sum(c.numel() * c.element_size() for c in self.caches)

    def check_latents(self, z: Tensor, channels: int, height: int, width: int) -> None:
        """Refuse latents ``z`` that are not ``[B, n, channels, height, width]`` for this state's
        ``B`` sessions (a ``ValueError`` saying which)."""
        if tuple(z.shape[2:]) != (channels, height, width):
            raise ValueError(f"latents {tuple(z.shape)}: expected [B, n, {channels}, {height}, {width}]")
        if self.caches[0].shape[0] != z.shape[0]:
            raise ValueError(f"decoder state holds {self.caches[0].shape[0]} sessions, latents {z.shape[0]}")


def decoder_state_bytes(cfg: WorldModelConfig, dtype: torch.dtype) -> int:
    """Bytes of one session's :class:`DecoderState` (without building the decoder)."""
    channels = cfg.latent_channels + 2 * cfg.decoder_channels[0]
    elem = torch.empty((), dtype=dtype).element_size()
    return channels * CACHE_SLICES * cfg.latent_height * cfg.latent_width * elem


class CausalConv3d(nn.Module):
    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__()
        self.c_in = c_in
        self.conv = nn.Conv3d(c_in, c_out, kernel_size=3, padding=(0, 1, 1))

    def forward(self, x: Tensor, cache: Tensor) -> tuple[Tensor, Tensor]:
        """``x [B, C, T, H, W]`` with ``cache [B, C, 2, H, W]`` -> output and the new cache."""
        xin = torch.cat([cache, x], dim=2)
        return self.conv(xin), xin[:, :, -CACHE_SLICES:]


class ResBlock2d(nn.Module):
    """``x + conv(silu(conv(x)))``, 3x3 convs at a constant width (per frame, no temporal cache)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.conv2(F.silu(self.conv1(x)))


class CausalDecoder(nn.Module):
    def __init__(self, cfg: WorldModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        ch = cfg.decoder_channels
        self.conv_in = CausalConv3d(cfg.latent_channels, ch[0])
        self.time_up = CausalConv3d(ch[0], ch[0] * cfg.temporal_factor)
        self.conv_mid = CausalConv3d(ch[0], ch[0])
        widths = [ch[min(i + 1, len(ch) - 1)] for i in range(len(ch))]
        self.ups = nn.ModuleList(nn.Conv2d(ch[i], widths[i], 3, padding=1) for i in range(len(ch)))
        self.res = nn.ModuleList(ResBlock2d(widths[i]) for i in range(cfg.decoder_res_levels))
        self.to_rgb = nn.Conv2d(ch[-1], 3, 3, padding=1)
        # latent normalisation fitted after autoencoder training: decode(z * std + mean)
        self.register_buffer("latent_mean", torch.zeros(cfg.latent_channels))
        self.register_buffer("latent_std", torch.ones(cfg.latent_channels))

    def init_state(self, batch: int = 1) -> DecoderState:
        cfg, ch = self.cfg, self.cfg.decoder_channels
        p = next(self.parameters())
        shape = (batch, CACHE_SLICES, cfg.latent_height, cfg.latent_width)
        caches = [
            torch.zeros(shape[0], c, *shape[1:], dtype=p.dtype, device=p.device)
            for c in (cfg.latent_channels, ch[0], ch[0])
        ]
        return DecoderState(caches)

    def forward(self, z: Tensor, state: DecoderState) -> tuple[Tensor, DecoderState]:
        """Decode ``z [B, n, C, h, w]``; returns frames and the next state (``state`` untouched)."""
        cfg = self.cfg
        z = z * self.latent_std[:, None, None] + self.latent_mean[:, None, None]
        x = z.permute(0, 2, 1, 3, 4)  # [B, C, n, h, w]
        x, c0 = self.conv_in(x, state.caches[0])
        x, c1 = self.time_up(F.silu(x), state.caches[1])
        b, _, n, h, w = x.shape
        x = x.view(b, -1, cfg.temporal_factor, n, h, w).permute(0, 1, 3, 2, 4, 5).reshape(b, -1, n * 4, h, w)
        if state.first:
            x = x[:, :, cfg.temporal_factor - 1 :]
        x, c2 = self.conv_mid(F.silu(x), state.caches[2])
        t = x.shape[2]
        y = F.silu(x).permute(0, 2, 1, 3, 4).reshape(b * t, -1, h, w)
        # channels-last: the per-frame convs run faster in it, on CPU and on cuDNN's tensor cores
        y = y.contiguous(memory_format=torch.channels_last)
        for i, conv in enumerate(self.ups):
            y = F.silu(conv(F.interpolate(y, scale_factor=2.0, mode="nearest")))
            if i < len(self.res):
                y = self.res[i](y)
        rgb = torch.sigmoid(self.to_rgb(y))
        return rgb.reshape(b, t, 3, rgb.shape[-2], rgb.shape[-1]), DecoderState([c0, c1, c2], first=False)


def stack_states(states: list[DecoderState]) -> DecoderState:
    """Batch several sessions' states (all must share ``first``)."""
    return DecoderState(
        [torch.cat(cs, 0) for cs in zip(*(s.caches for s in states), strict=True)], states[0].first
    )


def split_state(state: DecoderState, batch: int) -> list[DecoderState]:
    return [DecoderState([c[i : i + 1].clone() for c in state.caches], state.first) for i in range(batch)]
