"""The causal Wan 2.1 DiT: block-autoregressive video diffusion (Self-Forcing / CausVid), one file.

One implementation at every size: ``self-forcing``, ``causvid`` and ``wan2.1-1.3b-causal`` are
Wan-2.1-T2V-1.3B (dim 1536, 30 blocks, 12 heads of 128), ``world-tiny`` is the same code at dim 128
with the variant flags its weights were trained under (``WorldModelConfig.qk_norm``, ``adaln``,
``pos_embed``, ``rope_dims``). Module and parameter names are Wan's (``WanModel``, Self-Forcing's
``CausalWanModel``), so a Wan checkpoint loads by name (``models.world.checkpoints``).

Forward of noisy latents ``x [B, F, C, H, W]`` at diffusion timesteps ``t [B, F]`` (0..1000):

1. ``patch_embedding`` (Conv3d, kernel and stride ``(1, p, p)``): ``F * h * w`` tokens, frame-major
   then row-major (``h = H / p``, ``w = W / p``); world-tiny adds a learned spatial embedding;
2. per frame, ``e = time_embedding(sinusoid(t))`` (plus ``action_embedding(action)`` where the
   model takes actions), and the blocks' modulation ``e0 = time_projection(e)`` (6 rows of dim);
3. each block, with ``(shift1, scale1, gate1, shift2, scale2, gate2) = block.modulation + e0``:
   ``x += gate1 * self_attn(norm1(x) * (1 + scale1) + shift1)`` (q and k RMS-normed, rotated by
   3-axis RoPE: the frame's **absolute** index, the row, the column; the keys are the resident
   past's and the block's own), ``x += cross_attn(norm3(x), text)``, and
   ``x += gate2 * ffn(norm2(x) * (1 + scale2) + shift2)``;
4. the head: ``(shift, scale) = head.modulation + e``, ``head(norm(x) * (1 + scale) + shift)``,
   unpatchified to ``[B, F, C, H, W]``: Wan's flow prediction ``v = noise - x0`` (the sampler
   takes ``x0 = x - sigma v``).

The text context (``text_embedding``, a 2-layer MLP from ``text_dim``) and each block's
cross-attention K/V are computed once per prompt (:meth:`CausalDiT.cross_kv`), the resident
cross-attention cache. Cached self-attention keys are stored already roped at their absolute frame
index, so they stay valid however the window rolls; frame positions, the visibility mask and the
past K/V are arguments, so the same code runs a cached block forward (the past gathered from the
pool) and a full masked recompute (``block_causal_mask``): "cached == recompute" is testable.

Precision follows Self-Forcing's inference, which runs the whole DiT in bf16: the timestep
sinusoid is computed in float64, the RoPE rotation in float32, norms with float32 statistics;
everything else in the model's dtype.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.world.attention import Kernel, attend, splits_for
from models.world.configs import WorldModelConfig

KV = tuple[Tensor, Tensor]  # [B, N, heads, head_dim] each
Angles = tuple[Tensor, Tensor]  # cos, sin [B, N, 1, head_dim / 2], float32 (float64 for a float64 model)


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


def sinusoidal_embedding(t: Tensor, dim: int) -> Tensor:
    """Wan's timestep embedding ``[cos(t f), sin(t f)]``, ``f_i = 10000^(-i / (dim / 2))``, in float64."""
    half = dim // 2
    freqs = torch.pow(10_000, -torch.arange(half, dtype=torch.float64, device=t.device) / half)
    args = t.to(torch.float64)[..., None] * freqs
    return torch.cat([args.cos(), args.sin()], dim=-1)


def rope_angles(cfg: WorldModelConfig, frame_pos: Tensor, dtype: torch.dtype) -> Angles:
    """cos and sin of every token's rotation, for frames at absolute indices ``frame_pos [B, F]``.

    Wan's RoPE: the head dim is split into pairs ``(x[2i], x[2i+1])``; the first pairs rotate by
    the frame index, the next by the row, the last by the column (``cfg.rope_split``), pair ``i`` of
    an axis with ``d_axis`` dims at ``theta^(-2i / d_axis)``. Angles in float64 from the integer
    positions, so any frame index (no table horizon) gives the same values in every path.
    """
    b, f = frame_pos.shape
    hp, wp = cfg.latent_height // cfg.patch, cfg.latent_width // cfg.patch
    device = frame_pos.device
    rows = torch.arange(hp, device=device).repeat_interleave(wp).repeat(f)  # [F*h*w]
    cols = torch.arange(wp, device=device).repeat(hp * f)
    frames = frame_pos.repeat_interleave(hp * wp, dim=1)  # [B, F*h*w]
    parts = []
    for pos, dims in zip((frames, rows.expand(b, -1), cols.expand(b, -1)), cfg.rope_split, strict=True):
        if dims:
            freqs = cfg.rope_theta ** (-torch.arange(0, dims, 2, dtype=torch.float64, device=device) / dims)
            parts.append(pos.to(torch.float64)[..., None] * freqs)
    angles = torch.cat(parts, dim=-1)[:, :, None, :]  # [B, N, 1, head_dim / 2]
    work = torch.promote_types(dtype, torch.float32)
    return angles.cos().to(work), angles.sin().to(work)


def apply_rope(x: Tensor, angles: Angles) -> Tensor:
    """Rotate each pair ``(x[2i], x[2i+1])`` of ``x [B, N, H, D]`` by its angle (in the angles'
    precision: float32 for a bf16 model)."""
    cos, sin = angles
    x1, x2 = x.to(cos.dtype).unflatten(-1, (-1, 2)).unbind(-1)
    return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2).to(x.dtype)


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
        self.q, self.k, self.v, self.o = (nn.Linear(cfg.dim, cfg.dim) for _ in range(4))
        self.per_head = cfg.qk_norm == "head"
        norm_dim = cfg.head_dim if self.per_head else cfg.dim
        self.norm_q, self.norm_k = RMSNorm(norm_dim, cfg.eps), RMSNorm(norm_dim, cfg.eps)

    def forward(
        self, x: Tensor, angles: Angles, mask: Tensor | None, past: KV | None, splits: int, kernel: Kernel
    ) -> tuple[Tensor, KV]:
        """Attention of ``x [B, N, D]`` over ``past`` (the gathered resident K/V, ending with room
        for these tokens: ``KVPool.gather``) and itself; returns the output and its roped K/V.
        ``splits``: parts to split the keys into; ``kernel``: the attention kernel
        (``models.world.attention``; 1 and ``sdpa`` = one SDPA call)."""
        b, n, d = x.shape

        def heads(t: Tensor) -> Tensor:
            return t.view(b, n, self.heads, d // self.heads)

        if self.per_head:
            q, k = self.norm_q(heads(self.q(x))), self.norm_k(heads(self.k(x)))
        else:
            q, k = heads(self.norm_q(self.q(x))), heads(self.norm_k(self.k(x)))
        q, k, v = apply_rope(q, angles), apply_rope(k, angles), heads(self.v(x))
        if past is None:
            keys, values = k, v
        else:  # the gathered buffers end with room for this forward's tokens
            keys, values = past
            keys[:, -n:] = k
            values[:, -n:] = v
        y = attend(q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2), mask, splits, kernel)
        return self.o(y.transpose(1, 2).reshape(b, n, d)), (k, v)


class CrossAttention(nn.Module):
    def __init__(self, cfg: WorldModelConfig) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.q, self.k, self.v, self.o = (nn.Linear(cfg.dim, cfg.dim) for _ in range(4))
        self.normed = cfg.qk_norm == "dim"  # world-tiny's cross-attention has no q/k norms
        if self.normed:
            self.norm_q, self.norm_k = RMSNorm(cfg.dim, cfg.eps), RMSNorm(cfg.dim, cfg.eps)

    def project(self, context: Tensor) -> KV:
        """The cross-attention cache entry of one prompt: K, V ``[B, L, heads, head_dim]``."""
        b, length, d = context.shape
        k = self.k(context)
        if self.normed:
            k = self.norm_k(k)
        return k.view(b, length, self.heads, -1), self.v(context).view(b, length, self.heads, -1)

    def forward(self, x: Tensor, kv: KV, kernel: Kernel) -> Tensor:
        b, n, d = x.shape
        q = self.norm_q(self.q(x)) if self.normed else self.q(x)
        q = q.view(b, n, self.heads, d // self.heads).transpose(1, 2)
        y = attend(q, kv[0].transpose(1, 2), kv[1].transpose(1, 2), kernel=kernel)
        return self.o(y.transpose(1, 2).reshape(b, n, d))


class DiTBlock(nn.Module):
    def __init__(self, cfg: WorldModelConfig) -> None:
        super().__init__()
        self.dim = cfg.dim
        self.norm1 = nn.LayerNorm(cfg.dim, eps=cfg.eps, elementwise_affine=False)
        self.self_attn = SelfAttention(cfg)
        self.norm3 = nn.LayerNorm(cfg.dim, eps=cfg.eps)  # Wan's cross_attn_norm: affine
        self.cross_attn = CrossAttention(cfg)
        self.norm2 = nn.LayerNorm(cfg.dim, eps=cfg.eps, elementwise_affine=False)
        self.ffn = nn.Sequential(
            nn.Linear(cfg.dim, cfg.ffn_dim), nn.GELU(approximate="tanh"), nn.Linear(cfg.ffn_dim, cfg.dim)
        )
        if cfg.adaln == "shared":  # Wan: a learned offset to the model's one time projection
            self.modulation = nn.Parameter(torch.randn(1, 6, cfg.dim) / cfg.dim**0.5)
        else:  # world-tiny: the block's own projection of the time (+ action) embedding
            self.adaln = nn.Linear(cfg.dim, 6 * cfg.dim)

    def forward(
        self,
        x: Tensor,
        e: Tensor,
        e0: Tensor | None,
        angles: Angles,
        mask: Tensor | None,
        cross_kv: KV,
        past: KV | None,
        splits: int = 1,
        kernel: Kernel = "sdpa",
    ) -> tuple[Tensor, KV]:
        """``x [B, F*T, D]`` frame-major tokens; ``e [B, F, D]`` the time (+ action) embedding
        of each frame and ``e0 [B, F, 6, D]`` its shared projection (``None`` with a Linear adaLN
        of the block's own): the modulation is per frame, broadcast over the frame's tokens.
        ``splits``: the self-attention's key split; ``kernel``: both attentions' kernel
        (``models.world.attention``)."""
        b, f = e.shape[:2]
        mods = self.modulation + e0 if e0 is not None else self.adaln(F.silu(e)).unflatten(-1, (6, self.dim))
        shift1, scale1, gate1, shift2, scale2, gate2 = mods[:, :, None].unbind(3)  # each [B, F, 1, D]

        def per_frame(t: Tensor) -> Tensor:
            return t.view(b, f, -1, t.shape[-1])

        h = torch.addcmul(shift1, per_frame(self.norm1(x)), 1 + scale1).view_as(x)
        h, kv = self.self_attn(h, angles, mask, past, splits, kernel)
        x = torch.addcmul(per_frame(x), gate1, per_frame(h)).view_as(x)
        x = x + self.cross_attn(self.norm3(x), cross_kv, kernel)
        h = torch.addcmul(shift2, per_frame(self.norm2(x)), 1 + scale2).view_as(x)
        x = torch.addcmul(per_frame(x), gate2, per_frame(self.ffn(h))).view_as(x)
        return x, kv


class Head(nn.Module):
    def __init__(self, cfg: WorldModelConfig) -> None:
        super().__init__()
        self.dim, self.shared = cfg.dim, cfg.adaln == "shared"
        self.norm = nn.LayerNorm(cfg.dim, eps=cfg.eps, elementwise_affine=False)
        self.head = nn.Linear(cfg.dim, cfg.patch * cfg.patch * cfg.latent_channels)
        if self.shared:  # Wan: a learned offset to the (unprojected) time embedding
            self.modulation = nn.Parameter(torch.randn(1, 2, cfg.dim) / cfg.dim**0.5)
        else:
            self.adaln = nn.Linear(cfg.dim, 2 * cfg.dim)

    def forward(self, x: Tensor, e: Tensor) -> Tensor:
        """``x [B, F*T, D]``, ``e [B, F, D]`` -> each token's patch ``[B, F*T, p*p*C]``."""
        b, f = e.shape[:2]
        if self.shared:
            mods = self.modulation + e[:, :, None]
        else:
            mods = self.adaln(F.silu(e)).unflatten(-1, (2, self.dim))
        shift, scale = mods[:, :, None].unbind(3)  # [B, F, 1, D]
        h = torch.addcmul(shift, self.norm(x).view(b, f, -1, x.shape[-1]), 1 + scale)
        return self.head(h.view_as(x))


def _mark_dynamic(dims: tuple[int, ...], *tensors: Tensor | None) -> None:
    """Mark ``dims`` of each tensor dynamic for a compiled block (the batch from 2 on, the key
    length): one graph for all their sizes. A hint only: eager forwards are unaffected."""
    for t in tensors:
        if t is not None:
            for dim in dims:
                torch._dynamo.maybe_mark_dynamic(t, dim)


class CausalDiT(nn.Module):
    def __init__(self, cfg: WorldModelConfig) -> None:
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        p = cfg.patch
        self.patch_embedding = nn.Conv3d(cfg.latent_channels, cfg.dim, (1, p, p), stride=(1, p, p))
        if cfg.pos_embed:
            self.pos_embedding = nn.Parameter(torch.randn(cfg.tokens_per_frame, cfg.dim) * 0.02)
        self.text_embedding = nn.Sequential(
            nn.Linear(cfg.text_dim, cfg.dim), nn.GELU(approximate="tanh"), nn.Linear(cfg.dim, cfg.dim)
        )
        self.time_embedding = nn.Sequential(
            nn.Linear(cfg.freq_dim, cfg.dim), nn.SiLU(), nn.Linear(cfg.dim, cfg.dim)
        )
        if cfg.adaln == "shared":
            self.time_projection = nn.Sequential(nn.SiLU(), nn.Linear(cfg.dim, 6 * cfg.dim))
        if cfg.action_dim:
            self.action_embedding = nn.Sequential(
                nn.Linear(cfg.action_dim, cfg.dim), nn.SiLU(), nn.Linear(cfg.dim, cfg.dim)
            )
        self.blocks = nn.ModuleList(DiTBlock(cfg) for _ in range(cfg.depth))
        self.head = Head(cfg)
        self.compiled = False  # compiled blocks: mark their inputs' batch and key-length dimensions dynamic
        self.attention: Kernel = "sdpa"  # both attentions' kernel; WorldModel.build resolves world.attention

    def compile_blocks(self, backend: str | Callable = "inductor") -> None:
        """``torch.compile`` every block (fuses the norms, modulation, RoPE and GELU around the
        matmuls; -9 % DiT time at the Wan-1.3B shape on the H200); the blocks share their graphs.

        Shapes are static but for the batch and the key length. Batch 1 has graphs of its own,
        every batch of 2 or more shares one whose batch dimension is dynamic; the past's length
        (``KVPool.gather``: a first block's room alone, the frames a window holds so far, the whole
        sink + window once it is full) is dynamic in all of them (``forward`` marks both). So
        there are four graphs: batch 1 x {past}, batch >= 2 x {the room alone (a first block:
        there dynamo keeps the length it traced), past, past under a mask (a batch mixing
        phases)}; a caller passing no past (``recompute_x0``, training) meets one more per batch
        class. The world kind's load-time warm-up (``measure_step_seconds``) meets all four, so a
        session never compiles while it is served. ``backend``: ``torch.compile``'s (tests count
        compilations with a counting backend).
        """
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
        for i, blk in enumerate(self.blocks):
            self.blocks[i] = torch.compile(blk, dynamic=False, backend=backend)
        self.compiled = True

    def cross_kv(self, context: Tensor) -> list[KV]:
        """Per-block cross-attention K/V for text contexts ``[B, text_len, text_dim]``."""
        text = self.text_embedding(context)
        return [blk.cross_attn.project(text) for blk in self.blocks]

    def unpatchify(self, patches: Tensor, frames: int) -> Tensor:
        """``[B, F*h*w, p*p*C]`` (Wan's order within a patch: row, column, channel) -> ``[B, F, C, H, W]``."""
        cfg, p = self.cfg, self.cfg.patch
        hp, wp = cfg.latent_height // p, cfg.latent_width // p
        x = patches.view(patches.shape[0], frames, hp, wp, p, p, cfg.latent_channels)
        return x.permute(0, 1, 6, 2, 4, 3, 5).reshape(
            patches.shape[0], frames, cfg.latent_channels, cfg.latent_height, cfg.latent_width
        )

    def forward(
        self,
        x: Tensor,
        frame_pos: Tensor,
        t: Tensor,
        actions: Tensor,
        cross_kv: list[KV],
        mask: Tensor | None,
        past: list[KV] | None = None,
    ) -> tuple[Tensor, list[KV]]:
        """The flow prediction (``noise - x0``) for noisy latents ``x [B, F, C, H, W]`` at
        diffusion timesteps ``t [B, F]``.

        ``frame_pos [B, F]`` absolute latent frame indices, ``actions [B, F, action_dim]`` (ignored
        by a model without actions), ``mask`` bool broadcastable to ``[B, heads, F*T, P + F*T]``
        (``None``: every key visible, which lets attention use its fastest kernels) where ``P`` is
        the number of ``past`` tokens per block (``past[l] = (K, V)`` each ``[B, P + F*T, heads,
        head_dim]``: the cached tokens, then room the forward overwrites with its own tokens' K/V,
        as ``KVPool.gather(..., room=F*T)`` returns them).
        Returns the prediction ``[B, F, C, H, W]`` and each block's roped ``(K, V)`` of the input tokens.
        """
        cfg = self.cfg
        b, f = x.shape[:2]
        tpf = cfg.tokens_per_frame
        # [B, F*T, D], contiguous like every block's output (one compiled graph for both)
        tokens = self.patch_embedding(x.transpose(1, 2)).flatten(2).transpose(1, 2).contiguous()
        if cfg.pos_embed:
            tokens = tokens + self.pos_embedding.repeat(f, 1)
        e = self.time_embedding(sinusoidal_embedding(t, cfg.freq_dim).to(tokens.dtype))  # [B, F, D]
        if cfg.action_dim:
            e = e + self.action_embedding(actions)
        e0 = self.time_projection(e).unflatten(-1, (6, cfg.dim)) if cfg.adaln == "shared" else None
        angles = rope_angles(cfg, frame_pos, tokens.dtype)
        keys = f * tpf if past is None else past[0][0].shape[1]
        splits = splits_for(x.device, b, cfg.heads, f * tpf, keys, mask is not None)
        if self.compiled and (b > 1 or tpf % 2):
            # a compiled graph takes the split as a constant: batches of 2+ share one graph, and
            # with an odd frame size the key count's parity (can it halve?) changes as a window fills
            splits = 1
        batch = (0,) if b > 1 else ()
        if self.compiled:
            _mark_dynamic(batch, e, e0, *angles)
            _mark_dynamic((*batch, 3), mask)
        new_kv: list[KV] = []
        for i, blk in enumerate(self.blocks):
            layer_past = None if past is None else past[i]
            if self.compiled:
                _mark_dynamic(batch, tokens, *cross_kv[i])
                _mark_dynamic((*batch, 1), *(layer_past or ()))
            tokens, kv = blk(tokens, e, e0, angles, mask, cross_kv[i], layer_past, splits, self.attention)
            new_kv.append(kv)
        return self.unpatchify(self.head(tokens, e), f), new_kv
