"""Duplex-model configs: the embedded small default, a test size, and Moshi-7B shapes.

``DuplexModelConfig`` is the one geometry contract the parts read (codec, LM, KV pool, stage).
All embedded weights are **random** (seeded): the model has Moshi's architecture and timing but
says nothing meaningful. ``MOSHI_7B`` has Moshi-7B's temporal and depth transformer shapes
(4096 dim, 32 layers, 32 heads, 3000-frame context, 8 + 8 codebooks of 2048, depth transformer
1024 dim x 6 layers) for GPU capacity work; it is buildable on the ``meta`` device, where its
``state_bytes`` is exact without allocating anything.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

SAMPLE_RATE = 24_000  # model audio rate, mono float32 in [-1, 1]
FRAME_MS = 80
FRAME_SAMPLES = SAMPLE_RATE * FRAME_MS // 1000  # 1920: one codec / LM frame (12.5 Hz)

ContextPolicy = Literal["roll", "end"]


@dataclass(frozen=True)
class DuplexModelConfig:
    name: str = "duplex-small"
    dtype: str = "float32"  # torch dtype name of weights, KV and codec state
    # streaming codec: causal strided convs, 24 kHz -> one latent per 1920 samples (12.5 Hz)
    codec_strides: tuple[int, ...] = (2, 4, 5, 6, 8)  # product == FRAME_SAMPLES
    codec_channels: tuple[int, ...] = (8, 16, 32, 64, 128)  # encoder output width per stride
    latent_dim: int = 64
    n_q: int = 8  # residual VQ codebooks per stream (model and user each)
    codebook_size: int = 256
    # temporal transformer (one position per 80 ms frame)
    dim: int = 128
    heads: int = 4
    layers: int = 4
    ffn_dim: int = 384
    rope_theta: float = 10_000.0
    context: int = 256  # KV positions per session (frames): 256 x 80 ms = 20.5 s
    sink: int = 4  # frames kept at the front when the KV rolls
    context_policy: ContextPolicy = "roll"
    # depth transformer (one position per codebook within a frame)
    depth_dim: int = 64
    depth_heads: int = 4
    depth_layers: int = 1
    depth_ffn_dim: int = 192
    # text stream: token 0 = PAD (the model listens), token 1 = BOS (stream start)
    text_vocab: int = 64
    pad_bias: float = 3.0  # initial PAD logit bias of the text head (random weights: ~half listening)
    # sampling (Gumbel-max over counter-based noise; 0 = greedy)
    text_temperature: float = 0.7
    audio_temperature: float = 0.8

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads

    @property
    def depth_head_dim(self) -> int:
        return self.depth_dim // self.depth_heads

    @property
    def window(self) -> int:
        """Frames of recent context kept after a roll (the rest of the context is the sink)."""
        return self.context - self.sink

    def validate(self) -> None:
        product = 1
        for s in self.codec_strides:
            product *= s
        if product != FRAME_SAMPLES:
            raise ValueError(f"codec strides multiply to {product}, need {FRAME_SAMPLES}")
        if len(self.codec_channels) != len(self.codec_strides):
            raise ValueError("codec_channels needs one width per stride")
        if self.dim % self.heads or self.head_dim % 2:
            raise ValueError("dim must split into heads of even head_dim (RoPE)")
        if self.depth_dim % self.depth_heads:
            raise ValueError("depth_dim must split into depth_heads")
        if not 0 <= self.sink < self.context:
            raise ValueError("0 <= sink < context required")
        if self.context_policy not in ("roll", "end"):
            raise ValueError("context_policy is 'roll' or 'end'")
        if self.text_vocab < 3 or self.n_q < 1 or self.codebook_size < 2:
            raise ValueError("text_vocab >= 3, n_q >= 1, codebook_size >= 2 required")
        if self.text_temperature < 0 or self.audio_temperature < 0:
            raise ValueError("temperatures must be >= 0")


SMALL = DuplexModelConfig()

# Random-init, test-sized: every structural property at unit-test speed.
TEST = dataclasses.replace(
    SMALL, name="duplex-test", codec_channels=(4, 8, 8, 16, 16), latent_dim=16, n_q=4, codebook_size=32,
    dim=32, heads=2, layers=2, ffn_dim=64, context=48, sink=2, depth_dim=16, depth_heads=2,
    depth_layers=1, depth_ffn_dim=32, text_vocab=16,
)  # fmt: skip

MOSHI_7B = DuplexModelConfig(
    name="moshi-7b-shaped",
    dtype="bfloat16",
    codec_channels=(64, 128, 256, 512, 512),
    latent_dim=512,
    n_q=8,
    codebook_size=2048,
    dim=4096,
    heads=32,
    layers=32,
    ffn_dim=11_264,  # Moshi: dim_feedforward 4.125 x dim, gated -> 2/3 of it per matrix
    context=3000,
    sink=0,  # Moshi's KV is a plain ring of 3000 frames (no sink)
    depth_dim=1024,
    depth_heads=16,
    depth_layers=6,
    depth_ffn_dim=2816,
    text_vocab=32_000,
)

CONFIGS: dict[str, DuplexModelConfig] = {c.name: c for c in (SMALL, TEST, MOSHI_7B)}
