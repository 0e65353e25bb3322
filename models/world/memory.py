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

from models.world.configs import WorldModelConfig
from models.world.dit import CausalDiT
from models.world.kv_cache import KVGeometry
from models.world.vae import CausalDecoder

ALLOCATOR_MARGIN = 1.25
KERNEL_WORKSPACE_BYTES = 256 * 2**20  # cuDNN convolution and cuBLAS workspaces of one tick


def weight_bytes(cfg: WorldModelConfig, dtype: torch.dtype) -> int:
    """Parameters and buffers of the DiT and the decoder in ``dtype`` (built on the meta device)."""
    with torch.device("meta"):
        dit, decoder = CausalDiT(cfg).to(dtype), CausalDecoder(cfg).to(dtype)
    return sum(t.numel() * t.element_size() for m in (dit, decoder) for t in (*m.parameters(), *m.buffers()))


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
    """Peak live activations of decoding ``max_batch`` blocks: at the largest upsampling level the
    upsampled input plus three tensors at the level's width (the convolution's output and its
    activation, or a residual block's input and two intermediates), for every frame of a block."""
    elem = torch.empty((), dtype=dtype).element_size()
    frames = max_batch * cfg.frames_for_block(False)
    ch = cfg.decoder_channels
    widths = [ch[min(i + 1, len(ch) - 1)] for i in range(len(ch))]
    peak = 0
    for level, (c_in, c_out) in enumerate(zip(ch, widths, strict=True)):
        pixels = cfg.latent_height * cfg.latent_width * 4 ** (level + 1)
        peak = max(peak, pixels * (c_in + 3 * c_out))
    return frames * peak * elem


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
