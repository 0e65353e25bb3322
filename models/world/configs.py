"""World-model configs: the embedded tiny model, the causal Wan 2.1 checkpoints, safetensors I/O.

``WorldModelConfig`` is the one geometry contract every part reads (DiT, KV pool, sampler,
decoder). The DiT is Wan 2.1's (``dit.py``) at every size:

- ``TINY`` (``world-tiny``) is the trained embedded default (weights in ``weights/``), with the
  variant flags its weights were trained under (``qk_norm``, ``adaln``, ``pos_embed``,
  ``rope_dims``), action conditioning and a word-hash prompt encoder;
- ``SELF_FORCING`` and ``CAUSVID`` are the Wan-2.1-T2V-1.3B causal checkpoints of Self-Forcing
  and CausVid (``checkpoints.py`` loads them): 832x480 frames through the Wan 2.1 VAE, umT5
  prompt embeddings, and each peer's few-step schedule (:func:`flow_schedule`);
- ``WAN_1_3B`` (``wan2.1-1.3b-causal``) is the same DiT with random weights, a word-hash prompt
  encoder and the small causal decoder, for GPU timing without any checkpoint.

``load_model_weights`` loads a safetensors file of our own layout (``dit.*``, ``decoder.*``,
``text.*``, config JSON in the metadata).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

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
    freq_dim: int = 256  # width of the sinusoidal timestep embedding
    eps: float = 1e-6  # of every RMS and layer norm
    # the DiT's variant: Wan 2.1's (the defaults) or world-tiny's, whose weights were trained with
    # "head" (q/k RMSNorm per head in self-attention, none in cross-attention; Wan: over all heads,
    # in both), "per_block" (each block and the head project the time embedding with a Linear of
    # their own; Wan: one shared time_projection plus each block's learned offset), a learned
    # per-token spatial embedding, and RoPE over the frame index alone (rope_dims (head_dim, 0, 0))
    qk_norm: Literal["dim", "head"] = "dim"
    adaln: Literal["shared", "per_block"] = "shared"
    pos_embed: bool = False
    rope_dims: tuple[int, ...] = ()  # head dims rotated by frame, row, column; () = Wan's split
    # conditioning: actions (0 = none: text-to-video) and the prompt's text context [text_len, text_dim]
    action_dim: int = 6  # 4 buttons (forward, back, left, right) + mouse (dx, dy)
    # > 0: prompts are hashed words embedded by the model's own table (models/world/prompts.py);
    # 0: embeddings come from a text encoder (umT5) or a file of precomputed ones
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
    # the DiT's timestep (0..1000) at each level; () = 1000 * sigma (flow_schedule: the peers')
    timesteps: tuple[float, ...] = ()
    # decoder (decoders.py): "causal", the small causal decoder below; "wan2.1", Wan 2.1's VAE decoder
    # (x8, wan_vae.py); "taehv", TAEHV's tiny decoder of the same Wan 2.1 latents (x8, taehv.py)
    vae: Literal["causal", "wan2.1", "taehv"] = "causal"
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
    def rope_split(self) -> tuple[int, int, int]:
        """Head dims rotated by the frame index, the row and the column (Wan: ``d - 4 (d // 6)``,
        ``2 (d // 6)``, ``2 (d // 6)``)."""
        if self.rope_dims:
            return tuple(self.rope_dims)  # type: ignore[return-value]
        d = self.head_dim
        return (d - 4 * (d // 6), 2 * (d // 6), 2 * (d // 6))

    @property
    def step_timesteps(self) -> tuple[float, ...]:
        """The DiT's timestep at each of :attr:`sigmas`."""
        return self.timesteps or tuple(1000.0 * s for s in self.sigmas)

    @property
    def spatial_factor(self) -> int:
        """Pixels per latent cell along each axis (the decoder's spatial upsampling)."""
        return 8 if self.vae in ("wan2.1", "taehv") else 2 ** len(self.decoder_channels)

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
            # x0 = x - sigma * head(h): noise outside the head's rank-dim span is never removed
            raise ValueError("latent_channels * patch**2 must be <= dim (the DiT's output rank)")
        if self.dim % self.heads or self.head_dim % 2:
            raise ValueError("dim must split into heads of even head_dim (RoPE)")
        if (
            len(self.rope_split) != 3
            or sum(self.rope_split) != self.head_dim
            or any(d % 2 for d in self.rope_split)
        ):
            raise ValueError("rope_dims must be 3 even head dims (frame, row, column) summing to head_dim")
        if self.timesteps and len(self.timesteps) != len(self.sigmas):
            raise ValueError("timesteps must give one DiT timestep per sigma")
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
        for key in ("sigmas", "timesteps", "rope_dims", "decoder_channels"):
            if key in raw:
                raw[key] = tuple(raw[key])
        return cls(**raw)


def flow_schedule(steps: Sequence[int], shift: float, warp: bool) -> dict[str, tuple[float, ...]]:
    """The DiT's ``timesteps`` and the ``sigmas`` of a few-step schedule, exactly as Self-Forcing
    and CausVid compute them (their ``FlowMatchScheduler(shift, sigma_min=0, extra_one_step=True)``
    over 1000 training timesteps, in float32): the grid ``sigma_i = shift s / (1 + (shift - 1) s)``
    for ``s = 1 - i / 1000``, ``timestep_i = 1000 sigma_i``. ``warp`` (Self-Forcing's
    ``warp_denoising_step``): step ``k`` becomes the grid's timestep ``1000 - k``; otherwise
    (CausVid) the DiT sees ``k`` itself. Either way a step's sigma (for x0 and the re-noising) is
    the grid's at the timestep nearest to it."""
    s = torch.linspace(1.0, 0.0, 1001)[:-1]
    grid_sigma = shift * s / (1 + (shift - 1) * s)
    grid_t = grid_sigma * 1000
    steps_t = torch.tensor(list(steps), dtype=torch.long)
    t = torch.cat([grid_t, torch.zeros(1)])[1000 - steps_t] if warp else steps_t.to(torch.float64)
    nearest = (grid_t.double()[None, :] - t.double()[:, None]).abs().argmin(1)
    return {"timesteps": tuple(float(x) for x in t), "sigmas": tuple(float(x) for x in grid_sigma[nearest])}


TINY = WorldModelConfig(qk_norm="head", adaln="per_block", pos_embed=True, rope_dims=(32, 0, 0))

# Random-init, test-sized Wan DiT (with world-tiny's actions and word prompts): fast enough for CPU
# unit tests of every structural property.
TEST = dataclasses.replace(
    WorldModelConfig(), name="world-test", latent_channels=4, dim=32, heads=2, depth=2, ffn_dim=64,
    decoder_channels=(8, 8), decoder_res_levels=1, text_len=4, text_dim=16, frames_per_block=2,
)  # fmt: skip

# Wan-2.1-T2V-1.3B's DiT (wan/configs/wan_t2v_1_3B.py): 480x832 video, 16-channel latents of
# 60x104 (1560 tokens per latent frame), dim 1536, 12 heads, 30 blocks, FFN 8960, 512 text tokens
# of umT5-XXL's width 4096; 3 latent frames per block as Self-Forcing and CausVid generate them.
_WAN_DIT = WorldModelConfig(
    latent_channels=16,
    latent_height=60,
    latent_width=104,
    patch=2,
    dim=1536,
    heads=12,
    depth=30,
    ffn_dim=8960,
    action_dim=0,
    text_vocab=0,
    text_len=512,
    text_dim=4096,
    frames_per_block=3,
)

# The peers' own inference: global causal attention over the 21 latent frames they generate; here a
# sink of the first block plus a window of 15 frames, so every block up to frame 21 sees exactly
# what the peer's sees, and later blocks roll with the first block as sink (21 frames attended).
SELF_FORCING = dataclasses.replace(
    _WAN_DIT,
    name="self-forcing",
    sink_frames=3,
    window_frames=15,
    vae="wan2.1",
    # configs/self_forcing_dmd.yaml: denoising_step_list [1000, 750, 500, 250], warp, shift 5
    **flow_schedule((1000, 750, 500, 250), shift=5.0, warp=True),  # type: ignore[arg-type]
)
CAUSVID = dataclasses.replace(
    SELF_FORCING,
    name="causvid",
    # configs/wan_causal_dmd.yaml: denoising_step_list [1000, 757, 522, (0)], no warp, shift 8
    **flow_schedule((1000, 757, 522), shift=8.0, warp=False),  # type: ignore[arg-type]
)
CHECKPOINT_MODELS = {c.name: c for c in (SELF_FORCING, CAUSVID)}  # world.model with world.checkpoint
DECODERS = ("wan2.1", "taehv")  # world.decoder of a checkpoint model


def with_decoder(cfg: WorldModelConfig, decoder: str) -> WorldModelConfig:
    """``cfg`` served with ``world.decoder``: ``taehv`` puts TAEHV's decoder (``taew2_1.pth``) in
    place of the model's Wan 2.1 VAE decoder; ``wan2.1`` leaves ``cfg`` as it is."""
    if decoder not in DECODERS:
        raise ValueError(f"unknown world decoder {decoder!r} (known: {', '.join(DECODERS)})")
    return dataclasses.replace(cfg, vae="taehv") if decoder == "taehv" else cfg


# The same DiT with random weights, hashed-word prompts and the small decoder: GPU timing without
# any checkpoint (the figures of docs/benchmarks.md before the checkpoints).
WAN_1_3B = dataclasses.replace(
    _WAN_DIT,
    name="wan2.1-1.3b-causal",
    action_dim=6,
    text_vocab=32_128,
    sink_frames=3,
    window_frames=12,
    sigmas=(1.0, 0.75, 0.5, 0.25),
    decoder_channels=(256, 128, 64),
)

CONFIGS: dict[str, WorldModelConfig] = {c.name: c for c in (TINY, TEST, WAN_1_3B, SELF_FORCING, CAUSVID)}


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
