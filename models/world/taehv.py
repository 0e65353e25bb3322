"""TAEHV's decoder for Wan 2.1 latents (``taew2_1.pth``), streaming, its temporal memory owned by the session.

TAEHV (``github.com/madebyollin/taehv``, MIT) is a tiny streaming autoencoder trained on the latent
space of Wan 2.1's VAE: ``taew2_1.pth`` decodes the same latents as ``Wan2.1_VAE.pth`` at a few
percent of its cost and memory, at some cost in quality (the decoder realtime Wan demos serve).
This is its decoder alone, with the official module tree (``decoder`` an ``nn.Sequential`` with
the same indices), so the file's ``decoder.*`` tensors load by name; its ``encoder.*`` are skipped.

``decoder``, at the release widths ``(256, 128, 64, 64)`` and 16 latent channels:

1. ``Clamp`` (``3 tanh(z / 3)``: TAEHV takes the DiT's latents as they are, no de-normalisation),
   a 3x3 conv to 256 channels, ReLU;
2. three levels of three ``MemBlock`` s, then a nearest x2 upsample, a ``TGrow`` (a 1x1 conv to
   ``stride`` times the channels, whose channel groups become consecutive time steps: x1 after the
   first level, x2 after the other two, so x4 in all) and a 3x3 conv to the next width;
3. ReLU and a 3x3 conv to RGB, clamped to ``[0, 1]``.

Every conv is per frame; time is carried only by the ``MemBlock`` s, each of which reads its own
input at the previous time step (``conv(cat(x_t, x_{t-1}))`` + a skip), zeros before a stream's
first step. Streaming therefore needs one cached slice per ``MemBlock`` (its last input), which is
a :class:`~models.world.vae.DecoderState` here as for Wan's decoder: created by
:meth:`TAEHVDecoder.init_state` (zeros), passed to :meth:`TAEHVDecoder.forward` and returned
updated, never stored in the module. A chunk of any number of latents is decoded at once (parallel
over its time steps, as TAEHV's ``decode_video(parallel=True)``); chunked decoding of a session
equals decoding the whole clip, and sessions in the same phase batch through one forward
(``vae.stack_states`` / ``vae.split_state``).

Frame counts are Wan's: TAEHV turns ``n`` latents into ``4n`` frames and drops the stream's first
``frames_to_trim = 3`` (``decode_video``'s alignment with Wan's VAE, whose first latent is one
frame), so a session's first latent gives 1 frame and every later one 4. The trimmed frames are
still computed: the ``MemBlock`` s after the temporal upsamples remember them.

State per session: the 9 ``MemBlock`` s' last inputs, 3 x 256 channels at the latents' size, 3 x 128
at twice their height and width, 3 x 64 at four times (5,376 values per latent cell): at 480x832
(60x104 latents) 33.5 M values, 67 MB in bf16 (``decoder_state_bytes``; Wan's decoder: 1.89 GB).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.world.configs import CheckpointError
from models.world.vae import DecoderState
from models.world.wan_vae import read_state_dict


@dataclass(frozen=True)
class TAEHVConfig:
    """The decoder's shape: ``taew2_1.pth``'s (``TAEHV``'s defaults) unless a test shrinks it."""

    latent_channels: int = 16
    widths: tuple[int, int, int, int] = (256, 128, 64, 64)  # TAEHV's n_f
    time_upscale: tuple[bool, bool, bool] = (False, True, True)  # x2 in time after each level
    memblocks: int = 3  # per level
    frames_to_trim: int = 3  # a stream's first decoded frames dropped (t_upscale - 1)

    @property
    def temporal_factor(self) -> int:
        return 2 ** sum(self.time_upscale)

    def validate(self) -> None:
        if self.frames_to_trim != self.temporal_factor - 1:
            raise ValueError("frames_to_trim must be temporal_factor - 1 (a first latent gives one frame)")


TAEHV = TAEHVConfig()
TAEHV_TEST = TAEHVConfig(latent_channels=4, widths=(16, 8, 8, 4))


def _conv(c_in: int, c_out: int, bias: bool = True) -> nn.Conv2d:
    return nn.Conv2d(c_in, c_out, 3, padding=1, bias=bias)


class Clamp(nn.Module):
    """A soft clamp of the latents to (-3, 3)."""

    def forward(self, x: Tensor) -> Tensor:
        return torch.tanh(x / 3) * 3


class MemBlock(nn.Module):
    """``relu(conv(cat(x_t, past)) + skip(x_t))``; ``past`` is this block's input one step earlier."""

    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__()
        self.conv = nn.Sequential(
            _conv(c_in * 2, c_out), nn.ReLU(), _conv(c_out, c_out), nn.ReLU(), _conv(c_out, c_out)
        )
        self.skip = nn.Conv2d(c_in, c_out, 1, bias=False) if c_in != c_out else nn.Identity()

    def forward(self, x: Tensor, past: Tensor) -> Tensor:
        return F.relu(self.conv(torch.cat([x, past], 1)) + self.skip(x))


class TGrow(nn.Module):
    """x ``stride`` in time: a 1x1 conv to ``stride * channels``; channel group ``k`` of frame ``t``
    becomes frame ``stride * t + k`` (frames are the batch axis, time-major within a sample). The
    output keeps the conv's memory layout (channels last stays channels last, in one copy)."""

    def __init__(self, channels: int, stride: int) -> None:
        super().__init__()
        self.stride = stride
        self.conv = nn.Conv2d(channels, channels * stride, 1, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        nt, c, h, w = x.shape
        y = self.conv(x)
        if not y.is_contiguous(memory_format=torch.channels_last) or y.is_contiguous():
            return y.reshape(nt * self.stride, c, h, w)
        pixels = y.permute(0, 2, 3, 1).reshape(nt, h, w, self.stride, c)  # [t, h, w, k, c] in memory
        return pixels.permute(0, 3, 1, 2, 4).reshape(nt * self.stride, h, w, c).permute(0, 3, 1, 2)


class TAEHVDecoder(nn.Module):
    """TAEHV's decoder for latents of ``latent_height x latent_width`` (the size sets the state's
    shapes only; the weights fit any size).

    Its convolutions run channels last (weights and activations): in bf16 on a GPU, cuDNN's
    kernels take NHWC, and an NCHW call adds a layout transform around every convolution, at
    full resolution a pass over hundreds of MB (one steady block on an H100: 14.2 -> 12.5 ms). The
    frames come out channels last too, which is the ``[T, H, W, 3]`` layout the media encoder
    takes, with no transpose."""

    def __init__(self, cfg: TAEHVConfig, latent_height: int, latent_width: int) -> None:
        super().__init__()
        cfg.validate()
        self.cfg, self.latent_height, self.latent_width = cfg, latent_height, latent_width
        n = cfg.widths
        layers: list[nn.Module] = [Clamp(), _conv(cfg.latent_channels, n[0]), nn.ReLU()]
        for level in range(3):
            layers += [MemBlock(n[level], n[level]) for _ in range(cfg.memblocks)]
            layers += [
                nn.Upsample(scale_factor=2),
                TGrow(n[level], 2 if cfg.time_upscale[level] else 1),
                _conv(n[level], n[level + 1], bias=False),
            ]
        self.decoder = nn.Sequential(*layers, nn.ReLU(), _conv(n[3], 3))
        self.to(memory_format=torch.channels_last)  # kept by loads and device moves

    def memory_shapes(self) -> list[tuple[int, int, int]]:
        """``(channels, height, width)`` of each ``MemBlock``'s remembered input, in order."""
        h, w, shapes = self.latent_height, self.latent_width, []
        for layer in self.decoder:
            if isinstance(layer, MemBlock):
                shapes.append((layer.conv[0].in_channels // 2, h, w))
            elif isinstance(layer, nn.Upsample):
                h, w = 2 * h, 2 * w
        return shapes

    def init_state(self, batch: int = 1) -> DecoderState:
        """A fresh stream's state (zeros: TAEHV's empty memory)."""
        p = self.decoder[1].weight
        return DecoderState(
            [torch.zeros(batch, c, h, w, dtype=p.dtype, device=p.device) for c, h, w in self.memory_shapes()]
        )

    def forward(self, z: Tensor, state: DecoderState) -> tuple[Tensor, DecoderState]:
        """Decode latents ``z [B, n, C, h, w]`` of ``B`` sessions in the same phase.

        Returns frames ``[B, T, 3, 8h, 8w]`` in ``[0, 1]`` (``T = 1 + 4(n - 1)`` if ``state.first``,
        else ``4n``) and the state after them; ``state`` itself is not modified."""
        state.check_latents(z, self.cfg.latent_channels, self.latent_height, self.latent_width)
        b, t, c, h, w = z.shape
        memory = iter(state.caches)
        remembered: list[Tensor] = []
        channels_last = self.decoder[1].weight.is_contiguous(memory_format=torch.channels_last)
        layout = torch.channels_last if channels_last else torch.contiguous_format  # the weights'
        x = z.reshape(b * t, c, h, w).contiguous(memory_format=layout)
        for layer in self.decoder:
            if isinstance(layer, MemBlock):
                steps = x.view(b, t, *x.shape[1:])
                past = torch.cat([next(memory).unsqueeze(1), steps[:, :-1]], 1).reshape(x.shape)
                past = past.contiguous(memory_format=layout)
                remembered.append(steps[:, -1].clone(memory_format=torch.contiguous_format))
                x = layer(x, past)
            else:
                x = layer(x)
                if isinstance(layer, TGrow):
                    t *= layer.stride
        frames = x.view(b, t, 3, x.shape[-2], x.shape[-1]).clamp(0.0, 1.0)
        if state.first:
            frames = frames[:, self.cfg.frames_to_trim :]
        return frames, DecoderState(remembered, first=False)


def decoder_state_bytes(cfg: TAEHVConfig, latent_height: int, latent_width: int, dtype: torch.dtype) -> int:
    """Bytes of one session's decoder state (shapes only: the decoder is built on the meta device)."""
    with torch.device("meta"):
        shapes = TAEHVDecoder(cfg, latent_height, latent_width).memory_shapes()
    elem = torch.empty((), dtype=dtype).element_size()
    return sum(c * h * w for c, h, w in shapes) * elem


def activation_levels(cfg: TAEHVConfig, latents: int, pixels: int) -> list[tuple[int, int, int, int]]:
    """``(frames, pixels, input width, width)`` of the decoder's levels for a chunk of ``latents``
    latents of ``pixels`` cells (``models.world.memory``'s activation estimate): each level's
    ``MemBlock`` s (their input is twice the width: the frame and its past), then the head at full
    resolution and all ``4 latents`` frames."""
    n, frames, levels = cfg.widths, latents, []
    for level in range(3):
        levels.append((frames, pixels, 2 * n[level], n[level]))
        frames, pixels = frames * (2 if cfg.time_upscale[level] else 1), pixels * 4
    return [*levels, (frames, pixels, n[3], n[3])]


def load_taehv_decoder(
    path: Path,
    latent_height: int,
    latent_width: int,
    cfg: TAEHVConfig = TAEHV,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
) -> TAEHVDecoder:
    """The decoder of ``taew2_1.pth`` (TAEHV's whole state dict, or a safetensors file with the same
    keys), eval mode, on ``device`` in ``dtype``. Every ``decoder.*`` tensor must be present with its
    shape and no other may be; a ``TGrow`` conv stored with more output channels than this decoder's
    keeps the last ones (TAEHV's ``patch_tgrow_layers``: the last time steps). :class:`CheckpointError`
    names the file and the first problem otherwise."""
    path = Path(path)
    tensors = read_state_dict(path)
    with torch.device(device):
        decoder = TAEHVDecoder(cfg, latent_height, latent_width)
    grows = {
        f"decoder.{i}.conv.weight" for i, layer in enumerate(decoder.decoder) if isinstance(layer, TGrow)
    }
    state = {}
    for name, param in decoder.state_dict().items():
        if name not in tensors:
            raise CheckpointError(path, f"missing tensor {name!r} (not a TAEHV checkpoint for Wan 2.1?)")
        tensor = tensors[name]
        if name in grows and tensor.shape[1:] == param.shape[1:] and tensor.shape[0] % param.shape[0] == 0:
            tensor = tensor[-param.shape[0] :]
        if tensor.shape != param.shape:
            raise CheckpointError(
                path,
                f"tensor {name!r} has shape {tuple(tensor.shape)}, expected {tuple(param.shape)} "
                "(taew2_1.pth: Wan 2.1's 16-channel latents)",
            )
        if not tensor.is_floating_point():
            raise CheckpointError(path, f"tensor {name!r} is {tensor.dtype}, not a float type")
        state[name] = tensor
    extra = sorted(k for k in tensors if k.startswith("decoder.") and k not in state)
    if extra:
        raise CheckpointError(path, f"unexpected decoder tensor {extra[0]!r} (another TAEHV variant?)")
    if not decoder.decoder[1].weight.is_meta:  # on the meta device (a config check) nothing is read
        decoder.load_state_dict(state)
    return decoder.to(dtype=dtype).eval().requires_grad_(False)
