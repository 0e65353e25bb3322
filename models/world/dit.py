"""Causal DiT: block-autoregressive video diffusion transformer (Wan / Self-Forcing in miniature).

Layout of one forward:

- latents ``[B, F, C, H, W]`` are patchified (``patch`` x ``patch``) into ``tokens_per_frame``
  tokens per frame, frame-major, plus a learned spatial embedding;
- each frame carries its own conditioning ``c = time_emb(sigma) + action_emb(action)``, fed to
  every block through adaLN modulation (shift/scale/gate for attention and MLP);
- blocks: self-attention -> text cross-attention -> MLP;
- self-attention applies temporal RoPE with the **absolute** latent frame index to q and k, so
  cached keys are stored already roped and stay valid however the window rolls;
- the frame positions, the visibility mask and optional past keys/values (the resident rolling KV)
  are arguments: the same code runs a cached block forward (past K/V gathered from the pool, all
  visible) and a full masked recompute (``block_causal_mask`` over every frame), which is what
  makes "cached forward == full recompute" testable exactly.

``forward`` returns the predicted clean latents (x0) and, per layer, the roped K and V of the
input tokens so that a clean pass can commit them.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.world.attention import Kernel, attend, splits_for
from models.world.configs import WorldModelConfig

KV = tuple[Tensor, Tensor]  # [B, N, heads, head_dim] each


def block_causal_mask(
    q_frames: Tensor, k_frames: Tensor, frames_per_block: int, sink: int, window: int
) -> Tensor:
    """Boolean mask (True = attend) for tokens with the given frame indices, ``[Nq, Nk]``.

    A query in block ``b`` (start ``s = b * frames_per_block``) sees its own block, and past
    frames ``f < s`` that are sink frames (``f < sink``) or inside the window (``f >= s - window``).
    """
    qb = q_frames // frames_per_block
    start = (qb * frames_per_block)[:, None]
    same_block = qb[:, None] == (k_frames // frames_per_block)[None, :]
    kf = k_frames[None, :]
    visible = (kf < start) & ((kf < sink) | (kf >= start - window))
    return same_block | visible


def rope_angles(positions: Tensor, head_dim: int, theta: float, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """cos and sin ``[B, N, 1, head_dim / 2]`` of the rotation for the frame index of each token
    ``positions [B, N]``, computed once per forward (every layer rotates by the same angles).

    Angles are computed in float64 from the integer positions, so any position (no table horizon)
    gives the same values in the cached and the recompute path.
    """
    half = head_dim // 2
    freqs = theta ** (-torch.arange(half, dtype=torch.float64, device=positions.device) / half)
    angles = positions.to(torch.float64)[..., None] * freqs  # [B, N, half]
    cos, sin = angles.cos(), angles.sin()
    # full width, so a rotation is x * cos + swap_halves(x) * sin: fewer kernels per call
    return torch.cat([cos, cos], -1).to(dtype)[:, :, None, :], torch.cat([-sin, sin], -1).to(dtype)[
        :, :, None, :
    ]


def rope(x: Tensor, positions: Tensor, theta: float) -> Tensor:
    """Rotate ``x [B, N, H, D]`` by the frame index of each token ``positions [B, N]``."""
    return apply_rope(x, rope_angles(positions, x.shape[-1], theta, x.dtype))


def apply_rope(x: Tensor, angles: tuple[Tensor, Tensor]) -> Tensor:
    """Rotate ``x [B, N, H, D]`` by precomputed :func:`rope_angles`: the halves ``(x1, x2)``
    become ``(x1 cos - x2 sin, x2 cos + x1 sin)``."""
    cos, sin = angles
    half = x.shape[-1] // 2
    return torch.addcmul(x * cos, torch.cat([x[..., half:], x[..., :half]], dim=-1), sin)


def _mark_dynamic(dims: tuple[int, ...], *tensors: Tensor | None) -> None:
    """Mark ``dims`` of each tensor dynamic for a compiled block (the batch from 2 on, the key
    length): one graph for all their sizes. A hint only: eager forwards are unaffected."""
    for t in tensors:
        if t is not None:
            for dim in dims:
                torch._dynamo.maybe_mark_dynamic(t, dim)


def timestep_embedding(sigma: Tensor, dim: int) -> Tensor:
    """Sinusoidal embedding of ``sigma * 1000`` for ``sigma [...]`` -> ``[..., dim]``."""
    half = dim // 2
    freqs = torch.exp(-math.log(10_000) * torch.arange(half, device=sigma.device, dtype=sigma.dtype) / half)
    args = (sigma * 1000.0)[..., None] * freqs
    return torch.cat([args.cos(), args.sin()], dim=-1)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:  # x * rsqrt(mean(x^2) + eps) * weight, one fused kernel
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


class SelfAttention(nn.Module):
    def __init__(self, cfg: WorldModelConfig) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.qkv = nn.Linear(cfg.dim, 3 * cfg.dim)
        self.q_norm = RMSNorm(cfg.head_dim)
        self.k_norm = RMSNorm(cfg.head_dim)
        self.out = nn.Linear(cfg.dim, cfg.dim)

    def forward(
        self,
        x: Tensor,
        angles: tuple[Tensor, Tensor],
        mask: Tensor | None,
        past: KV | None,
        splits: int = 1,
        kernel: Kernel = "sdpa",
    ) -> tuple[Tensor, KV]:
        """``splits``: parts to split the keys into; ``kernel``: the attention kernel
        (``models.world.attention``; 1 and ``sdpa`` = one SDPA call)."""
        b, n, d = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, d // self.heads).unbind(2)
        q = apply_rope(self.q_norm(q), angles)
        k = apply_rope(self.k_norm(k), angles)
        if past is None:
            keys, values = k, v
        else:  # the gathered buffers end with room for this forward's tokens (KVPool.gather)
            keys, values = past
            keys[:, -n:] = k
            values[:, -n:] = v
        y = attend(q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2), mask, splits, kernel)
        return self.out(y.transpose(1, 2).reshape(b, n, d)), (k, v)


class CrossAttention(nn.Module):
    def __init__(self, cfg: WorldModelConfig) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.q = nn.Linear(cfg.dim, cfg.dim)
        self.kv = nn.Linear(cfg.dim, 2 * cfg.dim)
        self.out = nn.Linear(cfg.dim, cfg.dim)

    def project(self, ctx: Tensor) -> KV:
        """The cross-attention cache entry of one prompt: K, V ``[B, L, heads, head_dim]``."""
        b, length, d = ctx.shape
        k, v = self.kv(ctx).view(b, length, 2, self.heads, d // self.heads).unbind(2)
        return k, v

    def forward(self, x: Tensor, kv: KV, kernel: Kernel = "sdpa") -> Tensor:
        b, n, d = x.shape
        q = self.q(x).view(b, n, self.heads, d // self.heads).transpose(1, 2)
        y = attend(q, kv[0].transpose(1, 2), kv[1].transpose(1, 2), kernel=kernel)
        return self.out(y.transpose(1, 2).reshape(b, n, d))


class DiTBlock(nn.Module):
    def __init__(self, cfg: WorldModelConfig) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.dim, elementwise_affine=False, eps=1e-6)
        self.attn = SelfAttention(cfg)
        self.norm_cross = nn.LayerNorm(cfg.dim, eps=1e-6)
        self.cross = CrossAttention(cfg)
        self.norm2 = nn.LayerNorm(cfg.dim, elementwise_affine=False, eps=1e-6)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.dim, cfg.ffn_dim), nn.GELU(approximate="tanh"), nn.Linear(cfg.ffn_dim, cfg.dim)
        )
        self.modulation = nn.Linear(cfg.dim, 6 * cfg.dim)

    def forward(
        self,
        x: Tensor,
        cond: Tensor,
        angles: tuple[Tensor, Tensor],
        mask: Tensor | None,
        cross_kv: KV,
        past: KV | None,
        splits: int = 1,
        kernel: Kernel = "sdpa",
    ) -> tuple[Tensor, KV]:
        """``x [B, F*T, D]`` frame-major tokens; ``cond [B, F, D]`` one conditioning per frame: the
        adaLN modulation is computed per frame and broadcast over the frame's tokens. ``splits``:
        the self-attention's key split; ``kernel``: both attentions' kernel (``models.world.attention``)."""
        b, f = cond.shape[:2]
        mods = self.modulation(F.silu(cond))[:, :, None, :].chunk(6, dim=-1)  # each [B, F, 1, D]
        shift1, scale1, gate1, shift2, scale2, gate2 = mods

        def per_frame(t: Tensor) -> Tensor:
            return t.view(b, f, -1, t.shape[-1])

        h = torch.addcmul(shift1, per_frame(self.norm1(x)), 1 + scale1).view_as(x)
        h, kv = self.attn(h, angles, mask, past, splits, kernel)
        x = torch.addcmul(per_frame(x), gate1, per_frame(h)).view_as(x)
        x = x + self.cross(self.norm_cross(x), cross_kv, kernel)
        h = torch.addcmul(shift2, per_frame(self.norm2(x)), 1 + scale2).view_as(x)
        x = torch.addcmul(per_frame(x), gate2, per_frame(self.mlp(h))).view_as(x)
        return x, kv


class CausalDiT(nn.Module):
    def __init__(self, cfg: WorldModelConfig) -> None:
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        patch_dim = cfg.latent_channels * cfg.patch * cfg.patch
        self.patch_embed = nn.Linear(patch_dim, cfg.dim)
        self.pos_embed = nn.Parameter(torch.randn(cfg.tokens_per_frame, cfg.dim) * 0.02)
        self.time_embed = nn.Sequential(nn.Linear(256, cfg.dim), nn.SiLU(), nn.Linear(cfg.dim, cfg.dim))
        self.action_embed = nn.Sequential(
            nn.Linear(cfg.action_dim, cfg.dim), nn.SiLU(), nn.Linear(cfg.dim, cfg.dim)
        )
        self.text_embed = nn.Embedding(cfg.text_vocab, cfg.text_dim)
        self.text_proj = nn.Sequential(nn.Linear(cfg.text_dim, cfg.dim), nn.GELU(approximate="tanh"))
        self.blocks = nn.ModuleList(DiTBlock(cfg) for _ in range(cfg.depth))
        self.norm_out = nn.LayerNorm(cfg.dim, elementwise_affine=False, eps=1e-6)
        self.mod_out = nn.Linear(cfg.dim, 2 * cfg.dim)
        self.proj_out = nn.Linear(cfg.dim, patch_dim)
        self.compiled = False  # compiled blocks: mark their inputs' batch and key-length dimensions dynamic
        self.attention: Kernel = "sdpa"  # both attentions' kernel; WorldModel.build resolves world.attention

    def compile_blocks(self, backend: str | Callable = "inductor") -> None:
        """``torch.compile`` every block (fuses the norms, modulation, RoPE and GELU around the
        matmuls; -9 % DiT time at the Wan-1.3B shape on the H200); the blocks share their graphs.

        Shapes are static but for the batch and the key length. Batch 1 has graphs of its own,
        every batch of 2 or more shares one whose batch dimension is dynamic; the past's length
        (``KVPool.gather``: the frames a window holds so far, the whole sink + window once it is
        full) is dynamic in all of them (``forward`` marks both). So there are five graphs: batch
        1 x {no past (a first block), past}, batch >= 2 x {no past, past, past under a mask (a
        batch mixing phases)}. The world kind's load-time warm-up (``measure_step_seconds``)
        meets all five, so a session never compiles while it is served. ``backend``:
        ``torch.compile``'s (tests count compilations with a counting backend).
        """
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
        for i, blk in enumerate(self.blocks):
            self.blocks[i] = torch.compile(blk, dynamic=False, backend=backend)
        self.compiled = True

    def cross_kv(self, tokens: Tensor) -> list[KV]:
        """Per-layer cross-attention K/V for prompt token ids ``[B, text_len]``."""
        ctx = self.text_proj(self.text_embed(tokens))
        return [blk.cross.project(ctx) for blk in self.blocks]

    def patchify(self, x: Tensor) -> Tensor:
        b, f, c, h, w = x.shape
        p = self.cfg.patch
        x = x.view(b, f, c, h // p, p, w // p, p).permute(0, 1, 3, 5, 2, 4, 6)
        return x.reshape(b, f * (h // p) * (w // p), c * p * p)

    def unpatchify(self, t: Tensor, frames: int) -> Tensor:
        cfg, p = self.cfg, self.cfg.patch
        hp, wp = cfg.latent_height // p, cfg.latent_width // p
        x = t.view(t.shape[0], frames, hp, wp, cfg.latent_channels, p, p).permute(0, 1, 4, 2, 5, 3, 6)
        return x.reshape(t.shape[0], frames, cfg.latent_channels, cfg.latent_height, cfg.latent_width)

    def forward(
        self,
        x: Tensor,
        frame_pos: Tensor,
        sigma: Tensor,
        actions: Tensor,
        cross_kv: list[KV],
        mask: Tensor | None,
        past: list[KV] | None = None,
    ) -> tuple[Tensor, list[KV]]:
        """Predict clean latents for noisy latents ``x [B, F, C, H, W]`` at noise ``sigma [B, F]``.

        ``frame_pos [B, F]`` absolute latent frame indices, ``actions [B, F, action_dim]``,
        ``mask`` bool broadcastable to ``[B, heads, F*T, P + F*T]`` (``None``: every key visible,
        which lets attention use its fastest kernels) where ``P`` is the number of ``past`` tokens
        per layer (``past[l] = (K, V)`` each ``[B, P + F*T, heads, head_dim]``: the cached tokens,
        then room the forward overwrites with its own tokens' K/V, as ``KVPool.gather(...,
        room=F*T)`` returns them).
        Returns ``x0 [B, F, C, H, W]`` and each layer's roped ``(K, V)`` of the input tokens.
        """
        b, f = x.shape[:2]
        tpf = self.cfg.tokens_per_frame
        tokens = self.patch_embed(self.patchify(x)) + self.pos_embed.repeat(f, 1)
        cond = self.time_embed(timestep_embedding(sigma, 256)) + self.action_embed(actions)  # [B, F, D]
        positions = frame_pos.repeat_interleave(tpf, dim=1)
        angles = rope_angles(positions, self.cfg.head_dim, self.cfg.rope_theta, tokens.dtype)
        keys = f * tpf if past is None else past[0][0].shape[1]
        splits = splits_for(x.device, b, self.cfg.heads, f * tpf, keys, mask is not None)
        if self.compiled and (b > 1 or tpf % 2):
            # a compiled graph takes the split as a constant: batches of 2+ share one graph, and
            # with an odd frame size the key count's parity (can it halve?) changes as a window fills
            splits = 1
        batch = (0,) if b > 1 else ()
        if self.compiled:
            _mark_dynamic(batch, cond, *angles)
            _mark_dynamic((*batch, 3), mask)
        new_kv: list[KV] = []
        for i, blk in enumerate(self.blocks):
            layer_past = None if past is None else past[i]
            if self.compiled:
                _mark_dynamic(batch, tokens, *cross_kv[i])
                _mark_dynamic((*batch, 1), *(layer_past or ()))
            tokens, kv = blk(tokens, cond, angles, mask, cross_kv[i], layer_past, splits, self.attention)
            new_kv.append(kv)
        shift, scale = self.mod_out(F.silu(cond))[:, :, None, :].chunk(2, dim=-1)
        out = torch.addcmul(shift, self.norm_out(tokens).view(b, f, tpf, -1), 1 + scale).view_as(tokens)
        out = self.proj_out(out)
        velocity = self.unpatchify(out, f)
        return x - sigma[:, :, None, None, None] * velocity, new_kv
