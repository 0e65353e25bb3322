"""Bytes the world model needs outside its per-session pools, from the config alone.

Capacity is planned once, before anything is allocated (``realtime/kinds/world.py``), so the
fixed share of device memory must be known from the geometry: the weights, and the transient
memory of one batched tick at ``max_batch`` — the gathered KV (:meth:`KVGeometry.scratch_bytes`),
the DiT's activations and the decoder's. In the world pipeline the DiT of block ``k + 1`` runs
while block ``k`` is decoded, so both activation peaks are counted at once.

The activation figures are upper estimates of the tensors alive at a layer's peak (measured
against ``torch.cuda.max_memory_allocated`` on the H200 for the Wan-1.3B shape: see
``docs/benchmarks.md``), times :data:`ALLOCATOR_MARGIN` for the caching allocator's rounding and
fragmentation, plus :data:`KERNEL_WORKSPACE_BYTES`.
"""

from __future__ import annotations

import torch

from models.world import taehv, vae, wan_vae
from models.world.configs import WorldModelConfig
from models.world.decoders import build_decoder
from models.world.dit import CausalDiT
from models.world.kv_cache import KVGeometry
from models.world.prompts import WordEmbedding

ALLOCATOR_MARGIN = 1.25
KERNEL_WORKSPACE_BYTES = 256 * 2**20  # cuDNN convolution and cuBLAS workspaces of one tick


def weight_bytes(cfg: WorldModelConfig, dtype: torch.dtype) -> int:
    """Parameters and buffers of the DiT, the decoder and the word-prompt table (where the config
    has one) in ``dtype``, built on the meta device. (A umT5 text encoder is counted by its owner.)"""
    with torch.device("meta"):
        parts = [CausalDiT(cfg), build_decoder(cfg), *([WordEmbedding(cfg)] if cfg.text_vocab else [])]
    elem = torch.empty((), dtype=dtype).element_size()
    return sum(t.numel() * elem for m in parts for t in (*m.parameters(), *m.buffers()))


def decoder_state_bytes(cfg: WorldModelConfig, dtype: torch.dtype) -> int:
    """Bytes of one session's decoder temporal cache (the small causal decoder's, Wan's VAE's or
    TAEHV's)."""
    if cfg.vae == "wan2.1":
        return wan_vae.decoder_state_bytes(wan_vae.WAN_VAE, cfg.latent_height, cfg.latent_width, dtype)
    if cfg.vae == "taehv":
        return taehv.decoder_state_bytes(taehv.TAEHV, cfg.latent_height, cfg.latent_width, dtype)
    return vae.decoder_state_bytes(cfg, dtype)


def dit_activation_bytes(
    cfg: WorldModelConfig, dtype: torch.dtype, max_batch: int, masked: bool = True
) -> int:
    """Peak live activations of one DiT forward over ``max_batch`` sessions' blocks: per token the
    residual stream, the normed input, QKV, the roped Q/K, the attention output and the MLP's
    hidden layer before and after its GELU; plus, with ``masked``, a block-causal mask (a batch
    mixing phases needs one)."""
    elem = torch.empty((), dtype=dtype).element_size()
    tokens = max_batch * cfg.frames_per_block * cfg.tokens_per_frame
    per_token = (10 * cfg.dim + 2 * cfg.ffn_dim) * elem
    keys = (cfg.sink_frames + cfg.window_frames + cfg.frames_per_block) * cfg.tokens_per_frame
    mask = max_batch * cfg.frames_per_block * cfg.tokens_per_frame * keys if masked else 0  # bool
    return tokens * per_token + mask


def decoder_activation_bytes(cfg: WorldModelConfig, dtype: torch.dtype, max_batch: int) -> int:
    """Peak live activations of decoding ``max_batch`` blocks: at the largest level the level's
    input plus three tensors at its width (the convolution's output and its activation, or a
    residual block's input and two intermediates), for every frame the level holds."""
    elem = torch.empty((), dtype=dtype).element_size()
    if cfg.vae == "taehv":
        levels = taehv.activation_levels(
            taehv.TAEHV, cfg.frames_per_block, cfg.latent_height * cfg.latent_width
        )
    else:
        levels = _wan_levels(cfg) if cfg.vae == "wan2.1" else _causal_levels(cfg)
    return (
        max_batch * max(frames * pixels * (c_in + 3 * c_out) for frames, pixels, c_in, c_out in levels) * elem
    )


def _causal_levels(cfg: WorldModelConfig) -> list[tuple[int, int, int, int]]:
    """(frames, pixels, input width, width) of the small decoder's upsampling levels for one later block."""
    ch = cfg.decoder_channels
    widths = [ch[min(i + 1, len(ch) - 1)] for i in range(len(ch))]
    frames, cells = cfg.frames_for_block(False), cfg.latent_height * cfg.latent_width
    return [
        (frames, cells * 4 ** (i + 1), c_in, c_out)
        for i, (c_in, c_out) in enumerate(zip(ch, widths, strict=True))
    ]


def _wan_levels(cfg: WorldModelConfig) -> list[tuple[int, int, int, int]]:
    """The same for the Wan 2.1 VAE decoder (``wan_vae.WanVAEDecoder``): its middle, then each
    level's residual blocks at the frames and pixels they see (x2 in time after the first two
    levels, x2 in space after the first three; an upsample halves the width)."""
    w = wan_vae.WAN_VAE
    dims = [w.dim * m for m in (w.dim_mult[-1], *reversed(w.dim_mult))]
    frames, pixels = cfg.frames_per_block, cfg.latent_height * cfg.latent_width
    levels = [(frames, pixels, dims[0], dims[0])]
    for i, c_out in enumerate(dims[1:]):
        levels.append((frames, pixels, dims[i] if i == 0 else dims[i] // 2, c_out))
        if i < len(w.temporal_upsample):
            frames *= 2 if w.temporal_upsample[i] else 1
            pixels *= 4
    return levels


def graph_bytes(cfg: WorldModelConfig, dtype: torch.dtype, max_batch: int) -> int:
    """What CUDA graphs of the DiT's steady pass hold on top (``models.world.graphs``): their
    memory pool, one unmasked forward's activations at ``max_batch`` beside the caching allocator's
    own, and their static cross-attention K/V. (Their past K/V is the gather scratch counted anyway.)"""
    activations = dit_activation_bytes(cfg, dtype, max_batch, masked=False)
    return activations + max_batch * KVGeometry.of(cfg, dtype).cross_bytes


def fixed_bytes(cfg: WorldModelConfig, dtype: torch.dtype, max_batch: int, graphs: bool = False) -> int:
    """Everything but the per-session pools: weights plus one batched tick's transient memory,
    plus :func:`graph_bytes` with ``graphs``."""
    transient = (
        KVGeometry.of(cfg, dtype).scratch_bytes(max_batch)
        + dit_activation_bytes(cfg, dtype, max_batch)
        + decoder_activation_bytes(cfg, dtype, max_batch)
        + (graph_bytes(cfg, dtype, max_batch) if graphs else 0)
    )
    return weight_bytes(cfg, dtype) + KERNEL_WORKSPACE_BYTES + int(ALLOCATOR_MARGIN * transient)
