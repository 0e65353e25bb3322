"""The Wan 2.1 VAE decoder, streaming, with its per-session temporal cache owned by the session.

Loads the decoder half of the official ``Wan2.1_VAE.pth`` (``WanVAE_``'s ``conv2`` and
``decoder.*``; the encoder keys are skipped) and decodes normalised latents ``[B, n, 16, h, w]``
into RGB frames ``[B, frames, 3, 8h, 8w]`` in ``[0, 1]``:

1. de-normalisation ``z * std + mean`` with the 16 per-channel constants Wan hard-codes;
2. ``post_quant_conv`` (Wan's ``conv2``, a 1x1x1 conv);
3. ``conv_in``, then the middle: residual block, single-head spatial self-attention (per frame),
   residual block, all at 384 channels;
4. four levels of ``num_res_blocks + 1`` residual blocks (RMS norm, SiLU, causal 3x3x3 conv, twice,
   plus a 1x1x1 shortcut where the width changes); after each of the first three levels an
   upsample: nearest-exact x2 with a 3x3 conv halving the channels, preceded at the first two by a
   causal ``time_conv`` doubling the channels into two time steps (x2 in time, twice: x4);
5. the head: RMS norm, SiLU, causal conv to RGB. Wan's output lies in ``[-1, 1]``; :meth:`forward`
   clamps it to ``[-1, 1]`` (as ``WanVAE.decode`` does) and maps it to ``[0, 1]``, the world
   stage's contract (``models/world/vae.py``).

Streaming: Wan decodes one latent at a time and keeps, for every causal conv with a time kernel
of 3, the last ``CACHE_T = 2`` time slices of its input (``feat_cache``). Here that cache is a
:class:`~models.world.vae.DecoderState` (the same type as the small decoder's): created by
:meth:`WanVAEDecoder.init_state` (zeros, which is what Wan's zero padding amounts to), passed to
:meth:`WanVAEDecoder.forward` and returned updated, never stored in the module. So chunked decoding
of a session equals decoding the whole clip, interleaved sessions never share temporal context,
and several sessions in the same phase decode in one batched forward (every conv is per sample;
``vae.stack_states`` / ``vae.split_state`` batch and unbatch their states). A chunk may hold several
latents: the result is the same as Wan's one-latent-at-a-time loop.

A session's first latent decodes to 1 frame, every later one to 4 (``1 + 4(n - 1)`` frames for a
first chunk of ``n`` latents, ``4n`` after): Wan's ``time_conv`` skips the very first time slice
of a stream (its ``'Rep'`` marker), and its cache only starts with the slices after it. The
:attr:`DecoderState.first` flag carries that phase.

The state is large at Wan's full width: 32 cached convs, 75,664 channel-slices per latent cell,
twice over (``CACHE_T``): 1.89 GB per session in bf16 at 480x832 (``decoder_state_bytes``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.world.configs import CheckpointError
from models.world.vae import DecoderState

CACHE_T = 2  # time slices each causal conv keeps from its previous input (its kernel is 3)

# Wan 2.1's latent statistics (wan/modules/vae.py, WanVAE): decode(z * std + mean)
WAN_LATENT_MEAN = (
    -0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508,
    0.4134, -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921,
)  # fmt: skip
WAN_LATENT_STD = (
    2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
    3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160,
)  # fmt: skip


@dataclass(frozen=True)
class WanVAEConfig:
    """The decoder's architecture (Wan 2.1's ``_video_vae`` defaults) and latent statistics."""

    dim: int = 96
    z_dim: int = 16
    dim_mult: tuple[int, ...] = (1, 2, 4, 4)
    num_res_blocks: int = 2
    # x2 in time after decoder level i (Wan's temperal_downsample (False, True, True), reversed)
    temporal_upsample: tuple[bool, ...] = (True, True, False)
    latent_mean: tuple[float, ...] = WAN_LATENT_MEAN
    latent_std: tuple[float, ...] = WAN_LATENT_STD

    @property
    def spatial_factor(self) -> int:
        return 2 ** (len(self.dim_mult) - 1)

    @property
    def temporal_factor(self) -> int:
        return 2 ** sum(self.temporal_upsample)

    def validate(self) -> None:
        if len(self.temporal_upsample) != len(self.dim_mult) - 1:
            raise ValueError("temporal_upsample needs one flag per upsample (len(dim_mult) - 1)")
        if len(self.latent_mean) != self.z_dim or len(self.latent_std) != self.z_dim:
            raise ValueError("latent_mean and latent_std need z_dim values each")
        if any(s <= 0 for s in self.latent_std):
            raise ValueError("latent_std must be positive")


WAN_VAE = WanVAEConfig()
# Test size: Wan's structure (levels, blocks, upsamples, caches) at widths 8..32, 4 latent channels.
WAN_VAE_TEST = WanVAEConfig(dim=8, z_dim=4, latent_mean=WAN_LATENT_MEAN[:4], latent_std=WAN_LATENT_STD[:4])


class CausalConv3d(nn.Conv3d):
    """A conv whose time kernel looks only backwards: the caller prepends the cached slices."""

    def __init__(self, c_in: int, c_out: int, kernel: tuple[int, int, int]) -> None:
        super().__init__(c_in, c_out, kernel, padding=(0, kernel[1] // 2, kernel[2] // 2))


class _Caches:
    """One forward's walk over the causal convs, in order: hands each conv its cached slices and
    collects the slices the next call needs. ``first``: the chunk starts the session's stream."""

    def __init__(self, state: DecoderState) -> None:
        self._old = iter(state.caches)
        self.new: list[Tensor] = []
        self.first = state.first

    def conv(self, conv: CausalConv3d, x: Tensor) -> Tensor:
        xin = torch.cat([next(self._old), x], dim=2)
        self.new.append(xin[:, :, -CACHE_T:].clone(memory_format=torch.contiguous_format))
        return conv(xin)

    def skip(self) -> None:
        """A conv that got no time slices this call keeps its cache."""
        self.new.append(next(self._old))


class RMSNorm(nn.Module):
    """Wan's ``RMS_norm`` over channels (dim 1): ``normalize(x) * sqrt(C) * gamma``."""

    def __init__(self, channels: int, images: bool) -> None:
        super().__init__()
        self.scale = channels**0.5
        self.gamma = nn.Parameter(torch.ones(channels, *((1, 1) if images else (1, 1, 1))))

    def forward(self, x: Tensor) -> Tensor:
        return F.normalize(x, dim=1) * self.scale * self.gamma


class ResidualBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__()
        self.norm1 = RMSNorm(c_in, images=False)
        self.conv1 = CausalConv3d(c_in, c_out, (3, 3, 3))
        self.norm2 = RMSNorm(c_out, images=False)
        self.conv2 = CausalConv3d(c_out, c_out, (3, 3, 3))
        self.shortcut = nn.Conv3d(c_in, c_out, 1) if c_in != c_out else nn.Identity()

    def forward(self, x: Tensor, caches: _Caches) -> Tensor:
        h = caches.conv(self.conv1, F.silu(self.norm1(x)))
        h = caches.conv(self.conv2, F.silu(self.norm2(h)))
        return self.shortcut(x) + h


class AttentionBlock(nn.Module):
    """Single-head self-attention over the pixels of each frame (no time context)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.norm = RMSNorm(channels, images=True)
        self.to_qkv = nn.Conv2d(channels, channels * 3, 1)
        self.proj = nn.Conv2d(channels, channels, 1)

    def forward(self, x: Tensor, caches: _Caches | None = None) -> Tensor:
        b, c, t, h, w = x.shape
        y = x.transpose(1, 2).reshape(b * t, c, h, w)
        q, k, v = self.to_qkv(self.norm(y)).flatten(2).transpose(1, 2).unsqueeze(1).chunk(3, dim=-1)
        y = F.scaled_dot_product_attention(q, k, v).squeeze(1).transpose(1, 2).reshape(b * t, c, h, w)
        return x + self.proj(y).reshape(b, t, c, h, w).transpose(1, 2)


class Upsample(nn.Module):
    """x2 in space (nearest-exact, then a 3x3 conv to ``channels // 2``); with ``temporal``, first
    x2 in time: a causal (3, 1, 1) conv to ``2 * channels``, the two halves being two time steps."""

    def __init__(self, channels: int, temporal: bool) -> None:
        super().__init__()
        self.time_conv = CausalConv3d(channels, channels * 2, (3, 1, 1)) if temporal else None
        self.conv = nn.Conv2d(channels, channels // 2, 3, padding=1)

    def forward(self, x: Tensor, caches: _Caches) -> Tensor:
        if self.time_conv is not None:
            x = self._upsample_time(x, caches)
        b, c, t, h, w = x.shape
        y = F.interpolate(x.transpose(1, 2).reshape(b * t, c, h, w), scale_factor=2.0, mode="nearest-exact")
        y = self.conv(y)
        return y.reshape(b, t, c // 2, 2 * h, 2 * w).transpose(1, 2)

    def _upsample_time(self, x: Tensor, caches: _Caches) -> Tensor:
        if not caches.first:
            return self._time_conv(x, caches)
        head, rest = x[:, :, :1], x[:, :, 1:]  # the stream's first slice skips time_conv (Wan's 'Rep')
        if rest.shape[2] == 0:
            caches.skip()
            return head
        return torch.cat([head, self._time_conv(rest, caches)], dim=2)

    def _time_conv(self, x: Tensor, caches: _Caches) -> Tensor:
        assert self.time_conv is not None
        y = caches.conv(self.time_conv, x)  # [b, 2c, t, h, w]: channel half k is time step 2t + k
        b, c2, t, h, w = y.shape
        return y.view(b, 2, c2 // 2, t, h, w).permute(0, 2, 3, 1, 4, 5).reshape(b, c2 // 2, 2 * t, h, w)


class WanVAEDecoder(nn.Module):
    """Wan 2.1's VAE decoder for latents of ``latent_height x latent_width`` (the size sets the
    state's shapes only; the weights fit any size)."""

    def __init__(self, cfg: WanVAEConfig, latent_height: int, latent_width: int) -> None:
        super().__init__()
        cfg.validate()
        self.cfg, self.latent_height, self.latent_width = cfg, latent_height, latent_width
        dims = [cfg.dim * m for m in (cfg.dim_mult[-1], *reversed(cfg.dim_mult))]
        self.post_quant_conv = nn.Conv3d(cfg.z_dim, cfg.z_dim, 1)
        self.conv_in = CausalConv3d(cfg.z_dim, dims[0], (3, 3, 3))
        self.middle = nn.ModuleList(
            [ResidualBlock(dims[0], dims[0]), AttentionBlock(dims[0]), ResidualBlock(dims[0], dims[0])]
        )
        # one flat list, as Wan's decoder.upsamples: each level's residual blocks, then its upsample
        layers: list[nn.Module] = []
        for i, c_out in enumerate(dims[1:]):
            c_in = dims[i] if i == 0 else dims[i] // 2  # the previous upsample halved the channels
            for j in range(cfg.num_res_blocks + 1):
                layers.append(ResidualBlock(c_in if j == 0 else c_out, c_out))
            if i < len(cfg.dim_mult) - 1:
                layers.append(Upsample(c_out, cfg.temporal_upsample[i]))
        self.upsamples = nn.ModuleList(layers)
        self.head_norm = RMSNorm(dims[-1], images=False)
        self.head_conv = CausalConv3d(dims[-1], 3, (3, 3, 3))
        self.register_buffer("latent_mean", torch.tensor(cfg.latent_mean), persistent=False)
        self.register_buffer("latent_std", torch.tensor(cfg.latent_std), persistent=False)

    def cache_shapes(self) -> list[tuple[int, int, int]]:
        """``(channels, height, width)`` of each causal conv's cache, in the order forward uses them."""
        h, w = self.latent_height, self.latent_width
        shapes = [(self.conv_in.in_channels, h, w)]
        for layer in [*self.middle, *self.upsamples]:
            if isinstance(layer, ResidualBlock):
                shapes += [(layer.conv1.in_channels, h, w), (layer.conv2.in_channels, h, w)]
            elif isinstance(layer, Upsample):
                if layer.time_conv is not None:
                    shapes.append((layer.time_conv.in_channels, h, w))
                h, w = 2 * h, 2 * w
        return [*shapes, (self.head_conv.in_channels, h, w)]

    def init_state(self, batch: int = 1) -> DecoderState:
        """A fresh stream's state (zeros: what Wan's zero padding of a first chunk amounts to)."""
        p = self.head_conv.weight
        return DecoderState(
            [
                torch.zeros(batch, c, CACHE_T, h, w, dtype=p.dtype, device=p.device)
                for c, h, w in self.cache_shapes()
            ]
        )

    def forward(self, z: Tensor, state: DecoderState) -> tuple[Tensor, DecoderState]:
        """Decode normalised latents ``z [B, n, z_dim, h, w]`` of ``B`` sessions in the same phase.

        Returns frames ``[B, T, 3, 8h, 8w]`` in ``[0, 1]`` (``T = 1 + 4(n - 1)`` if ``state.first``,
        else ``4n``) and the state after them; ``state`` itself is not modified."""
        state.check_latents(z, self.cfg.z_dim, self.latent_height, self.latent_width)
        z = z * self.latent_std.view(-1, 1, 1) + self.latent_mean.view(-1, 1, 1)
        caches = _Caches(state)
        x = caches.conv(self.conv_in, self.post_quant_conv(z.transpose(1, 2)))
        for layer in [*self.middle, *self.upsamples]:
            x = layer(x, caches)
        x = caches.conv(self.head_conv, F.silu(self.head_norm(x)))
        rgb = (x.clamp(-1.0, 1.0) + 1.0) / 2.0  # Wan's clamp to [-1, 1], mapped to [0, 1]
        return rgb.transpose(1, 2), DecoderState(caches.new, first=False)


def decoder_state_bytes(cfg: WanVAEConfig, latent_height: int, latent_width: int, dtype: torch.dtype) -> int:
    """Bytes of one session's decoder state (shapes only: the decoder is built on the meta device)."""
    with torch.device("meta"):
        shapes = WanVAEDecoder(cfg, latent_height, latent_width).cache_shapes()
    elem = torch.empty((), dtype=dtype).element_size()
    return sum(c * CACHE_T * h * w for c, h, w in shapes) * elem


# Our parameter names -> the official checkpoint's (WanVAE_'s state dict).
# Applied in order: the names inside a block first, then the top-level ones.
_WAN_NAMES = [
    (r"\.norm1\.", ".residual.0."),
    (r"\.conv1\.", ".residual.2."),
    (r"\.norm2\.", ".residual.3."),
    (r"\.conv2\.", ".residual.6."),
    (r"\.conv\.(weight|bias)$", r".resample.1.\1"),
    (r"^(middle|upsamples)\.", r"decoder.\1."),
    (r"^post_quant_conv\.", "conv2."),
    (r"^conv_in\.", "decoder.conv1."),
    (r"^head_norm\.", "decoder.head.0."),
    (r"^head_conv\.", "decoder.head.2."),
]


def wan_name(name: str) -> str:
    """The official checkpoint's key for one of :class:`WanVAEDecoder`'s parameters."""
    for pattern, repl in _WAN_NAMES:
        name = re.sub(pattern, repl, name)
    return name


def read_state_dict(path: Path) -> dict[str, Tensor]:
    """A torch state dict (``torch.load(weights_only=True)``) or a safetensors file of tensors;
    :class:`CheckpointError` if missing, unreadable or not a flat name -> tensor mapping."""
    if not path.is_file():
        raise CheckpointError(path, "no such file" if not path.exists() else "not a file")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            tensors = load_file(str(path))
        else:
            tensors = torch.load(path, map_location="cpu", weights_only=True, mmap=True)  # read on demand
    except Exception as exc:  # noqa: BLE001 - any failure to parse is one malformed-file error
        raise CheckpointError(
            path, f"cannot read ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})"
        ) from None
    if not isinstance(tensors, dict) or not all(
        isinstance(k, str) and isinstance(v, Tensor) for k, v in tensors.items()
    ):
        raise CheckpointError(path, "not a state dict (a flat mapping of names to tensors)")
    return tensors


def load_wan_vae_decoder(
    path: Path,
    latent_height: int,
    latent_width: int,
    cfg: WanVAEConfig = WAN_VAE,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
) -> WanVAEDecoder:
    """The decoder of an official ``Wan2.1_VAE.pth`` (or a safetensors file with the same keys),
    eval mode, on ``device`` in ``dtype``. Every decoder tensor must be present with its shape;
    :class:`CheckpointError` names the file and the first problem otherwise."""
    tensors = read_state_dict(Path(path))
    with torch.device(device):
        decoder = WanVAEDecoder(cfg, latent_height, latent_width)
    expected = decoder.state_dict()
    state = {}
    for name, param in expected.items():
        key = wan_name(name)
        if key not in tensors:
            raise CheckpointError(path, f"missing tensor {key!r} (not a Wan 2.1 VAE checkpoint?)")
        if tensors[key].shape != param.shape:
            raise CheckpointError(
                path, f"tensor {key!r} has shape {tuple(tensors[key].shape)}, expected {tuple(param.shape)}"
            )
        state[name] = tensors[key]
    known = {wan_name(n) for n in expected}
    extra = sorted(k for k in tensors if k.startswith(("decoder.", "conv2.")) and k not in known)
    if extra:
        raise CheckpointError(path, f"unexpected decoder tensor {extra[0]!r} (another VAE architecture?)")
    decoder.load_state_dict(state)
    return decoder.to(dtype=dtype).eval().requires_grad_(False)
