"""World-model configs: the embedded tiny model, a Wan-2.1-1.3B-shaped config, safetensors I/O.

``WorldModelConfig`` is the one geometry contract every part reads (DiT, KV pool, sampler,
decoder). ``TINY`` is the trained embedded default (weights in ``weights/``); ``WAN_1_3B`` has
Wan-2.1-T2V-1.3B's DiT shapes (1560 tokens per latent frame, dim 1536, 12 heads, 30 layers, FFN
8960, 512 text tokens of width 4096, 3 latent frames per block) and is built with random weights
for GPU benchmarks. ``load_model_weights`` loads a safetensors file of the same architecture.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

WEIGHTS_DIR = Path(__file__).parent / "weights"


class CheckpointError(ValueError):
    """A checkpoint file (DiT, VAE, text encoder, tokenizer, prompt embeddings) is missing or
    malformed. ``str()`` is one line naming the file and what is wrong; the config layer reports it
    and exits 2, before any model memory is taken."""

    def __init__(self, path: Path | str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = str(path)
        self.reason = reason


@dataclass(frozen=True)
class WorldModelConfig:
    name: str = "world-tiny"
    # latent video: channels x height x width per latent frame; 1 latent = 4 pixel frames
    latent_channels: int = 16
    latent_height: int = 8
    latent_width: int = 8
    patch: int = 2
    # DiT
    dim: int = 128
    heads: int = 4
    depth: int = 4
    ffn_dim: int = 512
    rope_theta: float = 10_000.0
    # conditioning
    action_dim: int = 6  # 4 buttons (forward, back, left, right) + mouse (dx, dy)
    text_vocab: int = 512
    text_len: int = 8
    text_dim: int = 32
    # autoregression and rolling KV (frames are latent frames); one latent (4 pixel frames, 250 ms
    # at 16 fps) per block: a control waits for at most one block boundary (docs/benchmarks.md)
    frames_per_block: int = 1
    sink_frames: int = 1
    window_frames: int = 4
    # few-step flow sampler: noise levels of the staged denoise passes (then a sigma=0 clean pass)
    sigmas: tuple[float, ...] = (1.0, 0.5)
    # causal decoder: latent -> RGB, spatial x(2**len(decoder_channels)), temporal x4 (the tiny
    # default: 8x8 latents, 16 DiT tokens per frame -> 128x128 frames; the widths of the last,
    # full-resolution levels are what draws brick mortar and floor checks)
    decoder_channels: tuple[int, ...] = (64, 48, 32, 16)
    # residual blocks (two 3x3 convs) after the upsampling conv of the first (lowest-resolution)
    # levels: capacity where it is cheap on CPU (16x16 and 32x32 for the tiny default)
    decoder_res_levels: int = 0
    temporal_factor: int = 4
    fps: int = 16
    extra: dict[str, str] = field(default_factory=dict, compare=False)

    @property
    def tokens_per_frame(self) -> int:
        return (self.latent_height // self.patch) * (self.latent_width // self.patch)

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads

    @property
    def spatial_factor(self) -> int:
        """Pixels per latent cell along each axis (the decoder's spatial upsampling)."""
        return 2 ** len(self.decoder_channels)

    @property
    def frame_height(self) -> int:
        return self.latent_height * self.spatial_factor

    @property
    def frame_width(self) -> int:
        return self.latent_width * self.spatial_factor

    def frames_for_block(self, first: bool) -> int:
        """Pixel frames a block decodes to: 1 + 4(n-1) for a session's first block, else 4n."""
        n = self.frames_per_block
        return 1 + self.temporal_factor * (n - 1) if first else self.temporal_factor * n

    def validate(self) -> None:
        if self.latent_height % self.patch or self.latent_width % self.patch:
            raise ValueError("latent height and width must be multiples of patch")
        if self.latent_channels * self.patch**2 > self.dim:
            # x0 = x - sigma * proj_out(h): noise outside proj_out's rank-dim span is never removed
            raise ValueError("latent_channels * patch**2 must be <= dim (the DiT's output rank)")
        if self.dim % self.heads or self.head_dim % 2:
            raise ValueError("dim must split into heads of even head_dim (RoPE)")
        if self.frames_per_block < 1 or self.sink_frames < 0 or self.window_frames < 1:
            raise ValueError("frames_per_block >= 1, sink_frames >= 0, window_frames >= 1 required")
        if not self.sigmas or any(not 0 < s <= 1 for s in self.sigmas):
            raise ValueError("sigmas must be a non-empty list of noise levels in (0, 1]")
        if not 0 <= self.decoder_res_levels <= len(self.decoder_channels):
            raise ValueError("decoder_res_levels must be in 0..len(decoder_channels)")

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> WorldModelConfig:
        raw = json.loads(text)
        for key in ("sigmas", "decoder_channels"):
            raw[key] = tuple(raw[key])
        return cls(**raw)


TINY = WorldModelConfig()

# Random-init, test-sized variant: fast enough for CPU unit tests of every structural property.
TEST = dataclasses.replace(
    TINY, name="world-test", latent_channels=4, dim=32, heads=2, depth=2, ffn_dim=64,
    decoder_channels=(8, 8), decoder_res_levels=1, text_len=4, text_dim=16, frames_per_block=2,
)  # fmt: skip

WAN_1_3B = WorldModelConfig(
    name="wan2.1-1.3b-causal",
    latent_channels=16,
    latent_height=60,
    latent_width=104,
    patch=2,
    dim=1536,
    heads=12,
    depth=30,
    ffn_dim=8960,
    text_vocab=32_128,
    text_len=512,
    text_dim=4096,
    frames_per_block=3,
    sink_frames=3,
    window_frames=12,
    sigmas=(1.0, 0.75, 0.5, 0.25),
    decoder_channels=(256, 128, 64),
)

CONFIGS: dict[str, WorldModelConfig] = {c.name: c for c in (TINY, TEST, WAN_1_3B)}


def save_model_weights(
    path: Path, config: WorldModelConfig, tensors: dict[str, torch.Tensor], dtype: torch.dtype | None = None
) -> None:
    """Write ``tensors`` as safetensors with the config JSON in the metadata; with ``dtype``,
    floating-point tensors are stored in it (float16 halves the file; loading casts them back to
    the module's dtype, see :func:`load_model_weights`)."""
    out = {
        k: v.detach().to(dtype) if dtype and v.is_floating_point() else v.detach() for k, v in tensors.items()
    }
    save_file({k: v.contiguous() for k, v in out.items()}, str(path), {"config": config.to_json()})


def read_config(path: Path) -> WorldModelConfig:
    """The config stored in a weights file's safetensors metadata."""
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        meta = f.metadata() or {}
    if "config" not in meta:
        raise ValueError(f"{path}: no 'config' in safetensors metadata")
    return WorldModelConfig.from_json(meta["config"])


def load_model_weights(module: torch.nn.Module, path: Path, prefix: str) -> None:
    """Load the ``prefix``-ed tensors of a safetensors file into ``module`` (strict shapes and names;
    tensors stored in another float dtype, such as float16, are cast to the module's)."""
    state = {k[len(prefix) :]: v for k, v in load_file(str(path)).items() if k.startswith(prefix)}
    module.load_state_dict(state, strict=True)
