"""pi0 and pi0.5 (Black et al., "pi0: A Vision-Language-Action Flow Model"; "pi0.5"), batched.

The math is openpi's PyTorch model (``src/openpi/models_pytorch/pi0_pytorch.py`` with its patched
transformers Gemma/SigLIP), checked against it in ``docs/models.md``. At the real size
(:data:`PI0`, :data:`PI05`):

Prefix, run once per tick and kept as per-layer K/V:
    each camera -> uint8 224x224 -> [-1, 1] -> SigLIP So400m/14: 14x14 patch conv + learned
                   position embedding, 27 pre-LayerNorm layers (width 1152, 16 heads, GELU-tanh MLP
                   of 4304), final LayerNorm, linear projector to 2048: 256 tokens per camera
    prompt     -> PaliGemma token embedding (257152 x 2048) scaled by sqrt(2048)
    -> Gemma-2B: 18 layers of RMSNorm (x * (1 + w)), multi-query attention (8 query heads of
       256, one K/V head) with RoPE, GeGLU (GELU-tanh) MLP of 16384; bidirectional over the valid
       prefix tokens; positions count valid tokens only (``cumsum(mask) - 1``).
Suffix, the Gemma-300M action expert (width 1024, MLP 4096, same heads), whose attention in every
layer reads that layer's prefix K/V plus its own (joint attention, openpi's "causal blocks"):
    pi0:   [state token] + 50 action tokens. The state token (``state_proj(state)``) attends the
           prefix and itself; action tokens ``action_time_mlp(action_in_proj(x_t) ++ time)``
           attend the prefix, the state and each other. The state token never sees the actions
           and carries no time, so its K/V are computed once per tick, with the prefix.
    pi0.5: 50 action tokens ``action_in_proj(x_t)``; the flow time conditions every expert norm
           (adaRMS: ``x * (1 + scale) + shift`` and a gate on each residual branch, from
           ``silu(time_mlp_out(silu(time_mlp_in(time))))``); the state arrives as text tokens
           in the prompt (``models.policy.processing``).
    -> final (ada)RMSNorm -> ``action_out_proj`` -> velocity v = noise - action (float32).
Attention reads per-layer K/V buffers laid out ``[actions | state | prefix]``, the prefix packed
valid tokens first, so each row's keys are one contiguous run (:class:`KeySpan`): on a GPU in half
precision FlashAttention-2's variable-length kernel in torch reads them with no mask
(:func:`attend`).
Flow matching: x_1 = noise, then 10 Euler steps ``x += dt * v(x, t)``, dt = -0.1, t from 1
accumulated in float32 as openpi does. The time embedding is openpi's sine-cosine one (periods
4e-3 to 4, computed in float64).

Weights: the transformer stacks in ``config.dtype``; norms, the patch and position embeddings,
and the small state/action/time projections in float32 (as openpi keeps them), so actions come
out of a float32 head. The noise is one fixed ``[H, 32]`` tensor seeded from ``config.seed``:
an observation always maps to the same chunk, whatever else shares its batch (up to rounding).

:data:`PI0_TINY` is the same code at a test size (CPU real time, a byte vocabulary): the
embedded default policy. Checkpoints in openpi's and LeRobot's layouts load through
``models.policy.checkpoint``; :func:`openpi_names` is the one table between the two namings.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from models.policy.rtc import guided_velocity

Attention = Literal["flash2", "sdpa"]
ATTENTION_CHOICES = ("auto", "flash2", "sdpa")


@dataclass(frozen=True)
class Pi0Config:
    pi05: bool = False
    # SigLIP vision tower
    image_size: int = 224
    patch_size: int = 14
    vision_width: int = 1152
    vision_depth: int = 27
    vision_heads: int = 16
    vision_mlp_width: int = 4304
    # PaliGemma's Gemma (the prefix) and the action expert: same depth and heads (joint attention)
    vocab_size: int = 257152
    width: int = 2048
    mlp_width: int = 16384
    expert_width: int = 1024
    expert_mlp_width: int = 4096
    depth: int = 18
    n_head: int = 8
    n_kv_head: int = 1
    head_dim: int = 256
    rope_theta: float = 10000.0
    # inputs and outputs
    max_cameras: int = 3
    prompt_len: int = 48  # openpi's max_token_len: 48 for pi0, 200 for pi0.5
    state_dim: int = 32
    action_dim: int = 32
    action_horizon: int = 50
    num_steps: int = 10
    dtype: str = "bfloat16"
    seed: int = 0

    @property
    def n_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @property
    def state_tokens(self) -> int:
        """Suffix tokens before the actions: pi0's state token (pi0.5 has none)."""
        return 0 if self.pi05 else 1


PI0 = Pi0Config()
"""pi0 (openpi ``Pi0Config()``: PaliGemma = SigLIP So400m/14 + Gemma-2B, Gemma-300M expert)."""
PI05 = Pi0Config(pi05=True, prompt_len=200)
"""pi0.5 (openpi ``Pi0Config(pi05=True)``)."""
PI0_TINY = Pi0Config(
    patch_size=32,
    vision_width=32,
    vision_depth=1,
    vision_heads=2,
    vision_mlp_width=64,
    vocab_size=257,
    width=64,
    mlp_width=128,
    expert_width=32,
    expert_mlp_width=64,
    depth=2,
    n_head=4,
    head_dim=16,
    dtype="float32",
)
"""pi0 at a test size (7x7 patches per camera, 2 layers, byte tokens): random weights, CPU real time."""


class RMSNorm(nn.Module):
    """Gemma's RMSNorm ``x / rms(x) * (1 + w)``, computed in float32; ``cond_width`` makes it
    pi0.5's adaRMS: scale, shift and a residual gate from a conditioning vector (the flow time)."""

    def __init__(self, width: int, cond_width: int = 0, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        if cond_width:
            self.modulation = nn.Linear(cond_width, 3 * width)
        else:
            self.weight = nn.Parameter(torch.zeros(width))

    def forward(
        self, x: torch.Tensor, cond: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(normed x in x's dtype, gate or None)``; ``cond`` is ``[B, cond_width]``."""
        width = (x.shape[-1],)
        if cond is None:  # one fused kernel on CUDA
            return F.rms_norm(x.float(), width, 1.0 + self.weight.float(), self.eps).to(x.dtype), None
        normed = F.rms_norm(x.float(), width, None, self.eps)
        scale, shift, gate = self.modulation(cond)[:, None, :].chunk(3, dim=-1)
        return (normed * (1.0 + scale.float()) + shift.float()).to(x.dtype), gate.to(x.dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """RoPE on ``[B, T, heads, head_dim]`` with tables ``[B, T, head_dim]`` from :func:`rope`:
    HF Gemma's ``x * cos + rotate_half(x) * sin``, the half swap as a roll and its sign in the
    table (the same products and sums, two kernels fewer)."""
    return x * cos[:, :, None] + torch.roll(x, x.shape[-1] // 2, dims=-1) * signed_sin[:, :, None]


def rope(
    positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gemma's rotary tables for integer ``positions [B, T]`` in ``dtype``: ``cos`` and the sine
    with the first half negated (see :func:`rotate`)."""
    inv_freq = 1.0 / theta ** (
        torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device) / head_dim
    )
    freqs = positions.float()[..., None] * inv_freq
    sin = freqs.sin().to(dtype)
    return torch.cat([freqs, freqs], dim=-1).cos().to(dtype), torch.cat([-sin, sin], dim=-1)


class KeySpan(NamedTuple):
    """The keys one kind of call attends in the K/V buffers ``[B, L, kv_heads, head_dim]``, whose
    rows hold ``[actions | state | prefix]`` with the prefix's valid tokens first: batch row
    ``b`` attends rows ``[offset, offset + lengths[b])``, one contiguous run, so no mask is needed.
    ``query_starts`` (``b * T``) and ``key_starts`` (``b * L + offset``) are FlashAttention's
    ``cu_seqlens`` over the flattened batch; ``kernel`` is the one :func:`attend` runs
    (:meth:`Pi0.attention_kernel`)."""

    offset: int
    lengths: torch.Tensor  # [B] int32
    query_starts: torch.Tensor  # [B + 1] int32
    key_starts: torch.Tensor  # [B + 1] int32
    kernel: Attention

    @classmethod
    def of(
        cls, lengths: torch.Tensor, queries: int, buffer_rows: int, offset: int, kernel: Attention
    ) -> KeySpan:
        rows = torch.arange(lengths.shape[0] + 1, dtype=torch.int32, device=lengths.device)
        return cls(offset, lengths.to(torch.int32), rows * queries, rows * buffer_rows + offset, kernel)


def attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, span: KeySpan) -> torch.Tensor:
    """``q [B, T, heads, head_dim]`` over the buffers ``keys``/``values`` ``[B, L, kv_heads,
    head_dim]``, each row's queries over its keys of ``span``; returns ``[B, T, heads * head_dim]``.

    FlashAttention-2's variable-length kernel (``span.kernel`` ``flash2``) reads each row's run
    of keys as they lie (no mask, no copy: a masked call costs about twice as much at pi0's
    sizes, docs/benchmarks-log.md "pi0's attention kernels"). Where it does not run (``sdpa``:
    CPU, float32; or under autograd, RTC's guided steps) SDPA reads the same keys under a key mask."""
    B, T, nh, hd = q.shape
    L, nkv = keys.shape[1], keys.shape[2]
    if span.kernel == "flash2" and not torch.is_grad_enabled():
        y = torch.ops.aten._flash_attention_forward(
            q.reshape(B * T, nh, hd),
            keys.view(B * L, nkv, hd),
            values.view(B * L, nkv, hd),
            span.query_starts,
            span.key_starts,
            T,
            L - span.offset,
            0.0,
            False,
            False,
            seqused_k=span.lengths,
        )[0]
        return y.view(B, T, nh * hd)
    keys, values = keys[:, span.offset :].transpose(1, 2), values[:, span.offset :].transpose(1, 2)
    valid = torch.arange(keys.shape[2], device=q.device) < span.lengths[:, None]
    bias = torch.zeros(valid.shape, dtype=q.dtype, device=q.device).masked_fill(~valid, float("-inf"))
    # the query heads of one K/V head folded into its query rows: the mask is over keys only, so
    # this is exact, and one head of 8T rows takes the fused kernels that grouped-query attention
    # under a mask does not
    folded = q.transpose(1, 2).reshape(B, nkv, nh // nkv * T, hd)
    y = F.scaled_dot_product_attention(folded, keys, values, attn_mask=bias[:, None, None])
    return y.view(B, nh, T, hd).transpose(1, 2).reshape(B, T, nh * hd)


class GemmaLayer(nn.Module):
    """A Gemma decoder layer whose attention can also read K/V of another stream.

    Its K/V are written into the per-layer buffers ``kv`` at rows ``[start, start + T)`` and its
    queries attend the rows ``span`` names (:class:`KeySpan`): the prefix reads its own, the
    expert's tokens the prefix's and theirs, with no per-step concatenation. ``cond`` makes both
    norms adaptive (pi0.5's expert), whose gates scale the residual branches."""

    def __init__(self, width: int, mlp_width: int, c: Pi0Config, cond_width: int = 0) -> None:
        super().__init__()
        self.c = c
        self.input_norm = RMSNorm(width, cond_width)
        self.qkv = nn.Linear(width, (c.n_head + 2 * c.n_kv_head) * c.head_dim, bias=False)
        self.out = nn.Linear(c.n_head * c.head_dim, width, bias=False)
        self.post_attention_norm = RMSNorm(width, cond_width)
        self.gate_up = nn.Linear(width, 2 * mlp_width, bias=False)
        self.down = nn.Linear(mlp_width, width, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        rotary: tuple[torch.Tensor, torch.Tensor],
        kv: tuple[torch.Tensor, torch.Tensor],
        start: int,
        span: KeySpan,
        cond: torch.Tensor | None = None,
    ) -> torch.Tensor:
        B, T, _ = x.shape
        nh, nkv, hd = self.c.n_head, self.c.n_kv_head, self.c.head_dim
        h, gate = self.input_norm(x, cond)
        qkv = self.qkv(h).view(B, T, nh + 2 * nkv, hd)
        q, k = rotate(qkv[:, :, : nh + nkv], *rotary).split([nh, nkv], dim=2)  # q and k in one pass
        kv[0][:, start : start + T] = k
        kv[1][:, start : start + T] = qkv[:, :, nh + nkv :]
        y = self.out(attend(q, *kv, span))
        x = x + (y if gate is None else y * gate)
        h, gate = self.post_attention_norm(x, cond)
        g, u = self.gate_up(h).chunk(2, dim=-1)
        y = self.down(F.gelu(g, approximate="tanh") * u)
        return x + (y if gate is None else y * gate)


class VisionLayer(nn.Module):
    """A SigLIP encoder layer: pre-LayerNorm attention and GELU-tanh MLP, all with biases."""

    def __init__(self, c: Pi0Config) -> None:
        super().__init__()
        w = c.vision_width
        self.heads = c.vision_heads
        self.norm1 = nn.LayerNorm(w, eps=1e-6)
        self.qkv = nn.Linear(w, 3 * w)
        self.out = nn.Linear(w, w)
        self.norm2 = nn.LayerNorm(w, eps=1e-6)
        self.fc1 = nn.Linear(w, c.vision_mlp_width)
        self.fc2 = nn.Linear(c.vision_mlp_width, w)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, W = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(B, T, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v)
        x = x + self.out(y.transpose(1, 2).reshape(B, T, W))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x)), approximate="tanh"))


class SigLIP(nn.Module):
    """The vision tower and PaliGemma's projector: images in [-1, 1] -> ``n_patches`` tokens of ``width``."""

    def __init__(self, c: Pi0Config) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, c.vision_width, c.patch_size, c.patch_size)
        self.position = nn.Parameter(torch.zeros(c.n_patches, c.vision_width))
        self.layers = nn.ModuleList(VisionLayer(c) for _ in range(c.vision_depth))
        self.norm = nn.LayerNorm(c.vision_width, eps=1e-6)
        self.projector = nn.Linear(c.vision_width, c.width)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        x = self.patch(pixels).flatten(2).transpose(1, 2) + self.position
        x = x.to(self.projector.weight.dtype)
        for layer in self.layers:
            x = layer(x)
        return self.projector(self.norm(x))


def time_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    """openpi's ``create_sinusoidal_pos_embedding`` of the flow time ``t [B]`` (float64 inside)."""
    fraction = torch.linspace(0.0, 1.0, dim // 2, dtype=torch.float64, device=t.device)
    period = 4e-3 * (4.0 / 4e-3) ** fraction
    angle = (1.0 / period * 2 * math.pi)[None, :] * t[:, None]
    return torch.cat([torch.sin(angle), torch.cos(angle)], dim=1).float()


def flow_times(steps: int) -> list[float]:
    """The times openpi's sampler visits: 1, then ``+= -1/steps`` accumulated in float32."""
    dt, t, times = np.float32(-1.0 / steps), np.float32(1.0), []
    while t >= -dt / 2:
        times.append(float(t))
        t = np.float32(t + dt)
    return times


def pack_valid_first(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``x [B, P, W]`` with each row's ``mask``-valid tokens moved to the front, in their order,
    the others after them."""
    before = mask.cumsum(1) - 1  # a valid token's index among the valid ones
    others = mask.sum(1, keepdim=True) + torch.arange(mask.shape[1], device=mask.device) - before - 1
    rows = torch.where(mask, before, others)
    return torch.empty_like(x).scatter_(1, rows[..., None].expand_as(x), x)


@dataclass
class PrefixCache:
    """One tick's step-invariant state: per-layer K/V buffers ``[B, H + S + P, kv_heads,
    head_dim]`` (room for the action tokens, pi0's state token, then the prefix, valid tokens
    first), the action queries' keys and their rotary tables."""

    kv: list[tuple[torch.Tensor, torch.Tensor]]
    span: KeySpan
    rotary: tuple[torch.Tensor, torch.Tensor]


class Pi0(nn.Module):
    def __init__(self, config: Pi0Config) -> None:
        super().__init__()
        c = self.config = config
        E = c.expert_width
        cond = E if c.pi05 else 0
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(c.seed)
            self.vision = SigLIP(c)
            self.token_embedding = nn.Embedding(c.vocab_size, c.width)
            self.prefix_layers = nn.ModuleList(GemmaLayer(c.width, c.mlp_width, c) for _ in range(c.depth))
            self.expert_layers = nn.ModuleList(
                GemmaLayer(E, c.expert_mlp_width, c, cond) for _ in range(c.depth)
            )
            self.expert_norm = RMSNorm(E, cond)
            self.action_in_proj = nn.Linear(c.action_dim, E)
            self.action_out_proj = nn.Linear(E, c.action_dim)
            if c.pi05:
                self.time_mlp_in = nn.Linear(E, E)
                self.time_mlp_out = nn.Linear(E, E)
            else:
                self.state_proj = nn.Linear(c.state_dim, E)
                self.action_time_mlp_in = nn.Linear(2 * E, E)
                self.action_time_mlp_out = nn.Linear(E, E)
            # drawn on the host from the seed, so every device (and dtype) starts from the same noise
            noise = torch.randn(
                c.action_horizon, c.action_dim, generator=torch.Generator().manual_seed(c.seed), device="cpu"
            )  # device named: a model built under ``with torch.device('cuda')`` still draws on the host
            self.register_buffer("noise", noise.to(self.action_out_proj.weight.device), persistent=False)
            for p in self.parameters():  # what a checkpoint replaces: sane random weights
                nn.init.normal_(p, std=0.02) if p.dim() > 1 else nn.init.zeros_(p)
            for m in self.modules():
                if isinstance(m, nn.LayerNorm):
                    nn.init.ones_(m.weight)
                elif isinstance(m, RMSNorm) and hasattr(m, "modulation"):  # adaRMS gates open
                    nn.init.ones_(m.modulation.bias.view(3, -1)[2])
        self.attention = "auto"  # one of ATTENTION_CHOICES (robot.attention; Pi0.attention_kernel)
        self.eval()

    def attention_kernel(self) -> Attention:
        """The kernel :func:`attend` runs for ``attention``. ``auto``: ``flash2`` (FlashAttention-2's,
        in torch) for half precision on a GPU that has it (sm80+, head dim <= 256), else ``sdpa``.
        FlashAttention-3's (``flash3``) was withdrawn: it failed its GPU equivalence test against
        the masked kernel (docs/models.md). A kernel named where it cannot run raises
        ``ValueError`` saying why (``Pi0Policy`` asks at load)."""
        if self.attention not in ATTENTION_CHOICES:
            raise ValueError(f"pi0 attention must be one of {ATTENTION_CHOICES}, not {self.attention!r}")
        w = self.token_embedding.weight
        if self.attention == "sdpa":
            return "sdpa"
        flash2 = (
            w.is_cuda
            and w.dtype in (torch.float16, torch.bfloat16)
            and self.config.head_dim <= 256
            and torch.backends.cuda.is_flash_attention_available()
            and torch.cuda.get_device_capability(w.device)[0] >= 8
        )
        if self.attention == "flash2" and not flash2:
            raise ValueError("attention kernel flash2 needs an sm80+ CUDA device and float16 or bfloat16")
        return "flash2" if flash2 else "sdpa"

    def float32_parameters(self) -> Iterator[nn.Parameter]:
        """The parameters openpi keeps in float32 whatever the model's dtype."""
        kept = [self.vision.patch, self.action_in_proj, self.action_out_proj]
        kept += [m for m in self.modules() if isinstance(m, RMSNorm)]
        kept += [getattr(self, n) for n in ("time_mlp_in", "time_mlp_out", "state_proj") if hasattr(self, n)]
        kept += [getattr(self, n) for n in ("action_time_mlp_in", "action_time_mlp_out") if hasattr(self, n)]
        yield self.vision.position
        for module in kept:
            yield from module.parameters()

    def compile_layers(self, backend: str | Callable = "inductor") -> None:
        """``torch.compile`` every transformer layer (SigLIP's, the prefix's, the expert's) in
        place: fuses the float32 norms and their casts, RoPE, the GELU gates and the residual
        adds around the matmuls, which at batch 1 are most of a tick's ~4,000 small kernels.

        Batch, sequence and key lengths are dynamic, so each kind of call (a vision layer, a
        prefix layer, the state token, an action step; batch 1 apart from larger batches) has
        one graph whatever the bucket or camera count, and the layers of a stack share it. The
        policy's warm-up meets them all before serving. ``backend``: ``torch.compile``'s."""
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
        for layer in (*self.vision.layers, *self.prefix_layers, *self.expert_layers):
            layer.compile(dynamic=True, backend=backend)

    def to_dtype(self, dtype: torch.dtype) -> Pi0:
        """The stacks in ``dtype``, :meth:`float32_parameters` in float32."""
        self.to(dtype)
        for p in self.float32_parameters():
            p.data = p.data.float()
        return self

    @property
    def dtype(self) -> torch.dtype:
        return self.token_embedding.weight.dtype

    def embed_prefix(
        self,
        images: torch.Tensor,  # [B, C, R, R, 3] uint8
        image_mask: torch.Tensor,  # [B, C] bool
        tokens: torch.Tensor,  # [B, L] long
        token_mask: torch.Tensor,  # [B, L] bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The prefix tokens ``[B, C * n_patches + L, width]`` and their validity mask."""
        B, C = image_mask.shape
        pixels = images.flatten(0, 1).permute(0, 3, 1, 2).float() / 255.0 * 2.0 - 1.0
        patches = self.vision(pixels).view(B, C * self.config.n_patches, -1)
        text = self.token_embedding(tokens) * math.sqrt(self.config.width)
        mask = torch.cat([image_mask.repeat_interleave(self.config.n_patches, dim=1), token_mask], dim=1)
        return torch.cat([patches, text.to(patches.dtype)], dim=1), mask

    def prefix_cache(self, emb: torch.Tensor, mask: torch.Tensor, state: torch.Tensor) -> PrefixCache:
        """Run the prefix once (bidirectional over valid tokens) and, for pi0, the state token;
        keep their K/V for the flow steps. The prefix runs packed, valid tokens first: their
        positions (which count valid tokens only) are then ``0 .. n - 1`` and every row's keys
        one run of the buffers."""
        c = self.config
        B, P, _ = emb.shape
        S, H = c.state_tokens, c.action_horizon
        rows, kernel = H + S + P, self.attention_kernel()
        valid = mask.sum(1)
        positions = torch.arange(P, device=mask.device).expand(B, P)
        rotary = rope(positions, c.head_dim, c.rope_theta, emb.dtype)
        # every row a span reads is written before it is read
        kv = [
            tuple(emb.new_empty(B, rows, c.n_kv_head, c.head_dim) for _ in "kv") for _ in self.prefix_layers
        ]
        x, span = pack_valid_first(emb, mask), KeySpan.of(valid, P, rows, H + S, kernel)
        for layer, buffers in zip(self.prefix_layers, kv, strict=True):
            x = layer(x, rotary, buffers, H + S, span)
        suffix_positions = valid[:, None] + torch.arange(S + H, device=mask.device)
        cos, sin = rope(suffix_positions, c.head_dim, c.rope_theta, emb.dtype)
        if S:  # pi0's state token: attends the prefix and itself, never the actions
            x, span = (
                self.state_proj(state.float())[:, None, :].to(emb.dtype),
                KeySpan.of(valid + S, S, rows, H, kernel),
            )
            for layer, buffers in zip(self.expert_layers, kv, strict=True):
                x = layer(x, (cos[:, :S], sin[:, :S]), buffers, H, span)
        return PrefixCache(kv, KeySpan.of(valid + S + H, H, rows, 0, kernel), (cos[:, S:], sin[:, S:]))

    def velocity(self, cache: PrefixCache, x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """The action expert: v(x_t, t) ``[B, H, action_dim]`` float32 given the cached prefix."""
        c = self.config
        B, H, _ = x_t.shape
        time = time_embedding(t, c.expert_width)
        actions = self.action_in_proj(x_t.float())
        cond = None
        if c.pi05:
            cond = F.silu(self.time_mlp_out(F.silu(self.time_mlp_in(time))))
            x = actions
        else:
            x = torch.cat([actions, time[:, None, :].expand(B, H, -1)], dim=-1)
            x = self.action_time_mlp_out(F.silu(self.action_time_mlp_in(x)))
        x = x.to(self.dtype)
        for layer, buffers in zip(self.expert_layers, cache.kv, strict=True):
            x = layer(x, cache.rotary, buffers, 0, cache.span, cond)
        x, _ = self.expert_norm(x, cond)
        return self.action_out_proj(x.float())

    @torch.no_grad()
    def sample(self, cache: PrefixCache, guide: tuple[torch.Tensor, ...] | None = None) -> torch.Tensor:
        """The Euler steps from the seeded noise; ``guide`` = (target, weights, max_weight) for RTC."""
        B = cache.span.lengths.shape[0]
        dt = float(np.float32(-1.0 / self.config.num_steps))
        x = self.noise.expand(B, -1, -1).clone()
        for t in flow_times(self.config.num_steps):
            t_vec = torch.full((B,), t, device=x.device)
            if guide is None:
                v = self.velocity(cache, x, t_vec)
            else:
                v = guided_velocity(lambda xt, tv=t_vec: self.velocity(cache, xt, tv), x, t, *guide)
            x = x + dt * v
        return x

    def forward(self, images, image_mask, tokens, token_mask, state) -> torch.Tensor:  # noqa: ANN001
        """The whole unguided tick (prefix, then the flow steps): what the CUDA graphs capture."""
        return self.sample(
            self.prefix_cache(*self.embed_prefix(images, image_mask, tokens, token_mask), state)
        )


def build(config: Pi0Config, device: str) -> Pi0:
    """Random weights on ``device`` in ``config.dtype`` (float32 models are built on the host, so
    the same seed gives the same weights on every device; the real sizes on the device)."""
    dtype = getattr(torch, config.dtype)
    if dtype == torch.float32:
        return Pi0(config).to(device)
    with torch.device(device):
        return Pi0(config).to_dtype(dtype)


# --- openpi's parameter names -------------------------------------------------------------------

_PALIGEMMA = "paligemma_with_expert.paligemma.model."
_VISION = _PALIGEMMA + "vision_tower.vision_model."
_EXPERT = "paligemma_with_expert.gemma_expert."


def _gemma_layer(ours: str, theirs: str, adaptive: bool) -> list[tuple[str, tuple[str, ...]]]:
    norms = ("dense.weight", "dense.bias") if adaptive else ("weight",)
    ours_norms = ("modulation.weight", "modulation.bias") if adaptive else ("weight",)
    names = [
        (f"{ours}.qkv.weight", tuple(f"{theirs}.self_attn.{p}_proj.weight" for p in "qkv")),
        (f"{ours}.out.weight", (f"{theirs}.self_attn.o_proj.weight",)),
        (f"{ours}.gate_up.weight", (f"{theirs}.mlp.gate_proj.weight", f"{theirs}.mlp.up_proj.weight")),
        (f"{ours}.down.weight", (f"{theirs}.mlp.down_proj.weight",)),
    ]
    for norm, their_norm in (
        ("input_norm", "input_layernorm"),
        ("post_attention_norm", "post_attention_layernorm"),
    ):
        names += [
            (f"{ours}.{norm}.{o}", (f"{theirs}.{their_norm}.{t}",))
            for o, t in zip(ours_norms, norms, strict=True)
        ]
    return names


def openpi_names(config: Pi0Config) -> list[tuple[str, tuple[str, ...]]]:
    """Each parameter of :class:`Pi0` and the openpi ``PI0Pytorch`` parameters it is made of
    (several: concatenated along dim 0, e.g. ``qkv`` = q, k, v). Names as openpi's
    ``convert_jax_model_to_pytorch.py`` writes them (transformers 4.53 layout)."""
    c = config
    names: list[tuple[str, tuple[str, ...]]] = [
        ("vision.patch.weight", (_VISION + "embeddings.patch_embedding.weight",)),
        ("vision.patch.bias", (_VISION + "embeddings.patch_embedding.bias",)),
        ("vision.position", (_VISION + "embeddings.position_embedding.weight",)),
        ("vision.norm.weight", (_VISION + "post_layernorm.weight",)),
        ("vision.norm.bias", (_VISION + "post_layernorm.bias",)),
        ("vision.projector.weight", (_PALIGEMMA + "multi_modal_projector.linear.weight",)),
        ("vision.projector.bias", (_PALIGEMMA + "multi_modal_projector.linear.bias",)),
        ("token_embedding.weight", (_PALIGEMMA + "language_model.embed_tokens.weight",)),
    ]
    for i in range(c.vision_depth):
        theirs = f"{_VISION}encoder.layers.{i}"
        for p in ("weight", "bias"):
            names += [
                (f"vision.layers.{i}.qkv.{p}", tuple(f"{theirs}.self_attn.{n}_proj.{p}" for n in "qkv")),
                (f"vision.layers.{i}.out.{p}", (f"{theirs}.self_attn.out_proj.{p}",)),
                (f"vision.layers.{i}.norm1.{p}", (f"{theirs}.layer_norm1.{p}",)),
                (f"vision.layers.{i}.norm2.{p}", (f"{theirs}.layer_norm2.{p}",)),
                (f"vision.layers.{i}.fc1.{p}", (f"{theirs}.mlp.fc1.{p}",)),
                (f"vision.layers.{i}.fc2.{p}", (f"{theirs}.mlp.fc2.{p}",)),
            ]
    for i in range(c.depth):
        names += _gemma_layer(f"prefix_layers.{i}", f"{_PALIGEMMA}language_model.layers.{i}", False)
        names += _gemma_layer(f"expert_layers.{i}", f"{_EXPERT}model.layers.{i}", c.pi05)
    if c.pi05:
        names += [("expert_norm.modulation.weight", (_EXPERT + "model.norm.dense.weight",))]
        names += [("expert_norm.modulation.bias", (_EXPERT + "model.norm.dense.bias",))]
    else:
        names += [("expert_norm.weight", (_EXPERT + "model.norm.weight",))]
    projections = ["action_in_proj", "action_out_proj"]
    projections += (
        ["time_mlp_in", "time_mlp_out"]
        if c.pi05
        else ["state_proj", "action_time_mlp_in", "action_time_mlp_out"]
    )
    names += [(f"{p}.{w}", (f"{p}.{w}",)) for p in projections for w in ("weight", "bias")]
    return names


def openpi_unused(config: Pi0Config) -> dict[str, tuple[int, ...]]:
    """Parameters ``PI0Pytorch`` holds that inference never reads (name -> shape): the prefix's
    final norm and the two language-model heads. A checkpoint written in openpi's layout carries
    them (openpi loads strictly); loading ignores them."""
    return {
        _PALIGEMMA + "language_model.norm.weight": (config.width,),
        "paligemma_with_expert.paligemma.lm_head.weight": (config.vocab_size, config.width),
        _EXPERT + "lm_head.weight": (config.vocab_size, config.expert_width),
    }


__all__ = [
    "PI0",
    "PI05",
    "PI0_TINY",
    "Pi0",
    "Pi0Config",
    "PrefixCache",
    "build",
    "openpi_names",
    "openpi_unused",
]
