"""pi0-tiny: the pi0 architecture in miniature (Black et al., "pi0: A Vision-Language-Action Flow Model").

Shapes follow openpi's ``Pi0Config`` defaults (3 cameras, 48 prompt tokens, state and action dim
32, action horizon 50, 10 Euler steps); widths and depths are tiny so a CPU runs it in real time.

Prefix (run once per tick, cached as per-layer K/V):
    3 cameras -> uint8 HWC, 4x average pool, scale to [-1, 1], conv patch encoder (8x8 patches:
                 49 per camera)
                 + patch and camera embeddings
    prompt    -> byte-level tokens (no tokenizer download) -> token embeddings
    state     -> one linear state token
    -> ``depth`` pre-norm transformer layers, bidirectional over the valid prefix tokens
Action expert (run 10 times per tick):
    noisy actions x_t + sinusoidal time embedding -> MLP -> action tokens
    -> ``depth`` expert layers whose attention reads [prefix K/V of the same layer, own K/V]
    -> velocity v = noise - action
Flow matching, openpi's convention: x_1 = noise, x_{t+dt} = x_t + dt * v(x_t, t), dt = -1/10.

The same code builds pi0 at its real shapes (:data:`PI0_SHAPED`, random init, for timing on a
GPU): a SigLIP-So400m-shaped vision tower (14x14 patches, 256 per camera, 27 layers of width
1152), a Gemma-2B-shaped prefix (18 layers, width 2048, 8 query heads of 256 sharing one K/V head,
GeGLU MLP of 16384) and a Gemma-300M-shaped action expert (width 1024, MLP 4096) whose layers
attend jointly with the prefix's, as in pi0.

Device: ``Pi0TinyPolicy(device=...)`` holds the weights there and runs the forward there (batches
are collated on the host, then copied once); the returned chunks are host numpy arrays. On CUDA,
unguided batches replay a CUDA graph of the whole forward (prefix + 10 flow steps) captured per
batch-size bucket at warmup (``models.cuda_graphs``); RTC-guided batches run eagerly (their
vector-Jacobian product needs autograd).

Everything is seeded: weights from ``config.seed``, the starting noise is one fixed
``[H, D]`` tensor from the same seed, so an observation always maps to the same chunk, whatever
else shares its batch (up to float rounding).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from models.cuda_graphs import BatchGraphs
from models.fp8 import convert_linears
from models.policy import presets
from models.policy.interface import ObservationError, PolicySpec
from models.policy.rtc import Guide, RTCOptions, RTCState, guided_velocity


@dataclass(frozen=True)
class Pi0TinyConfig:
    image_size: int = 224
    pool: int = 4  # average-pool factor before patching (a cheap stand-in for SigLIP's cost)
    patch_size: int = 8
    max_cameras: int = 3
    prompt_len: int = 48
    state_dim: int = 32
    action_dim: int = 32
    action_horizon: int = 50
    num_steps: int = 10
    width: int = 64  # prefix ("VLM") width
    expert_width: int = 32  # action expert width (pi0: 1024 vs 2048)
    n_head: int = 4
    head_dim: int = 16
    depth: int = 2
    seed: int = 0
    n_kv_head: int = 0  # K/V heads shared by the query heads (Gemma: 1); 0: one per query head
    mlp_width: int = 0  # prefix MLP hidden width; 0: 4 x width
    expert_mlp_width: int = 0  # action expert MLP hidden width; 0: 4 x expert_width
    gated_mlp: bool = False  # GeGLU MLPs (Gemma) instead of GELU
    vision_depth: int = 0  # transformer layers over the patches (So400m: 27); 0: patches go straight in
    vision_width: int = 0
    vision_heads: int = 0
    vision_head_dim: int = 0
    vision_mlp_width: int = 0
    dtype: str = "float32"  # weights and activations ("bfloat16" for the real shapes)

    @property
    def n_patches(self) -> int:
        return (self.image_size // self.pool // self.patch_size) ** 2

    @property
    def patch_width(self) -> int:
        return self.vision_width if self.vision_depth else self.width


PI0_SHAPED = Pi0TinyConfig(
    pool=1,
    patch_size=14,
    width=2048,
    expert_width=1024,
    n_head=8,
    head_dim=256,
    depth=18,
    n_kv_head=1,
    mlp_width=16384,
    expert_mlp_width=4096,
    gated_mlp=True,
    vision_depth=27,
    vision_width=1152,
    vision_heads=16,
    vision_head_dim=72,
    vision_mlp_width=4304,
    dtype="bfloat16",
)
"""pi0's shapes (openpi ``Pi0Config``: PaliGemma = So400m + Gemma-2B, Gemma-300M expert), random init."""

CONFIGS = {"pi0-tiny": Pi0TinyConfig(), "pi0-shaped": PI0_SHAPED}


VOCAB = 257  # UTF-8 bytes + padding id
PAD_ID = 256


class GeGLU(nn.Module):
    """Gemma's gated MLP: down(gelu(gate(x)) * up(x))."""

    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.gate_up = nn.Linear(width, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.gelu(gate, approximate="tanh") * up)


class Layer(nn.Module):
    """Pre-norm transformer layer whose attention may also read cached K/V of another stream.

    ``n_kv_head`` < ``n_head`` shares each K/V head among a group of query heads (Gemma's
    multi-query attention); ``mlp_width`` is the MLP's hidden width (default 4 x width).
    """

    def __init__(
        self,
        width: int,
        n_head: int,
        head_dim: int,
        n_kv_head: int = 0,
        mlp_width: int = 0,
        gated_mlp: bool = False,
    ) -> None:
        super().__init__()
        self.n_head, self.head_dim = n_head, head_dim
        self.n_kv_head = n_kv_head or n_head
        self.norm1 = nn.RMSNorm(width)
        self.qkv = nn.Linear(width, (n_head + 2 * self.n_kv_head) * head_dim, bias=False)
        self.proj = nn.Linear(n_head * head_dim, width, bias=False)
        self.norm2 = nn.RMSNorm(width)
        hidden = mlp_width or 4 * width
        self.mlp = (
            GeGLU(width, hidden)
            if gated_mlp
            else nn.Sequential(
                nn.Linear(width, hidden), nn.GELU(approximate="tanh"), nn.Linear(hidden, width)
            )
        )

    def forward(
        self, x: torch.Tensor, bias: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """``bias`` [B, 1, 1, keys] is additive (0 or -inf). With ``kv`` (buffers holding another
        stream's K/V followed by room for this one's), this stream's K/V are written into the tail and
        attention reads the whole buffer: no per-step concatenation."""
        B, T, _ = x.shape
        nh, nkv, hd = self.n_head, self.n_kv_head, self.head_dim
        q, k, v = self.qkv(self.norm1(x)).split([nh * hd, nkv * hd, nkv * hd], dim=-1)
        q = q.view(B, T, nh, hd).transpose(1, 2)
        k = k.view(B, T, nkv, hd).transpose(1, 2)
        v = v.view(B, T, nkv, hd).transpose(1, 2)
        if kv is not None:
            kv[0][:, :, -T:] = k
            kv[1][:, :, -T:] = v
            k, v = kv
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, enable_gqa=nkv != nh)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, -1))
        x = x + self.mlp(self.norm2(x))
        return x, (k, v)


def sinusoidal(t: torch.Tensor, dim: int, min_period: float = 4e-3, max_period: float = 4.0) -> torch.Tensor:
    """openpi's ``posemb_sincos`` of the flow time (periods between 4e-3 and 4)."""
    fraction = torch.linspace(0.0, 1.0, dim // 2, dtype=torch.float32, device=t.device)
    period = min_period * (max_period / min_period) ** fraction
    angle = t[:, None] * (2 * math.pi / period)[None, :]
    return torch.cat([torch.sin(angle), torch.cos(angle)], dim=-1)


def attention_bias(valid: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """[B, K] bool (True = attend) -> additive [B, 1, 1, K] bias of ``dtype`` (the queries')."""
    bias = torch.zeros(valid.shape, dtype=dtype, device=valid.device)
    return bias.masked_fill(~valid, float("-inf"))[:, None, None, :]


@dataclass
class PrefixCache:
    """Per-layer K/V buffers ``[B, heads, P + H, head_dim]``: the prefix's K/V, then room for the
    action tokens' K/V; ``bias`` is the expert's attention bias over those keys."""

    kv: list[tuple[torch.Tensor, torch.Tensor]]
    bias: torch.Tensor


class Pi0Tiny(nn.Module):
    def __init__(self, config: Pi0TinyConfig) -> None:
        super().__init__()
        c = self.config = config
        attention = {"n_kv_head": c.n_kv_head, "gated_mlp": c.gated_mlp}
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(c.seed)
            self.patch = nn.Conv2d(3, c.patch_width, c.patch_size, c.patch_size)
            self.patch_pos = nn.Parameter(0.02 * torch.randn(c.n_patches, c.patch_width))
            self.camera_emb = nn.Parameter(0.02 * torch.randn(c.max_cameras, c.width))
            self.token_emb = nn.Embedding(VOCAB, c.width)
            self.token_pos = nn.Parameter(0.02 * torch.randn(c.prompt_len, c.width))
            self.state_in = nn.Linear(c.state_dim, c.width)
            self.prefix_layers = nn.ModuleList(
                Layer(c.width, c.n_head, c.head_dim, mlp_width=c.mlp_width, **attention)
                for _ in range(c.depth)
            )
            self.action_in = nn.Linear(c.action_dim, c.expert_width)
            self.action_time_mlp = nn.Sequential(
                nn.Linear(2 * c.expert_width, c.expert_width),
                nn.SiLU(),
                nn.Linear(c.expert_width, c.expert_width),
            )
            self.action_pos = nn.Parameter(0.02 * torch.randn(c.action_horizon, c.expert_width))
            self.expert_layers = nn.ModuleList(
                Layer(c.expert_width, c.n_head, c.head_dim, mlp_width=c.expert_mlp_width, **attention)
                for _ in range(c.depth)
            )
            self.action_norm = nn.RMSNorm(c.expert_width)
            self.action_out = nn.Linear(c.expert_width, c.action_dim)
            self.register_buffer("noise", torch.randn(c.action_horizon, c.action_dim), persistent=False)
            # the vision tower (none in pi0-tiny: its patches go straight into the prefix)
            self.vision_layers = nn.ModuleList(
                Layer(c.vision_width, c.vision_heads, c.vision_head_dim, mlp_width=c.vision_mlp_width)
                for _ in range(c.vision_depth)
            )
            self.vision_out = nn.Linear(c.vision_width, c.width) if c.vision_depth else nn.Identity()
        self.eval()

    def to_fp8(self) -> int:
        """FP8 matmuls (``models.fp8``) for every projection and MLP of the vision, prefix and
        expert layers; returns how many Linears were swapped (4 per layer). The patch convolution,
        ``vision_out``, the state, action and time embeddings and the action head stay in
        ``config.dtype``: each is <= 0.1 % of the FLOPs at pi0's shapes. Call it after the last
        ``.to(dtype)`` and before any CUDA graph is captured."""
        stacks = (self.vision_layers, self.prefix_layers, self.expert_layers)
        return sum(convert_linears(layers) for layers in stacks)

    def embed_prefix(
        self,
        images: torch.Tensor,  # [B, C, R, R, 3] uint8
        image_mask: torch.Tensor,  # [B, C] bool
        tokens: torch.Tensor,  # [B, L] long
        token_mask: torch.Tensor,  # [B, L] bool
        state: torch.Tensor,  # [B, S]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        B, C = image_mask.shape
        dtype = self.noise.dtype
        # pool the raw pixels (channels-last view, no layout copy), then scale to [-1, 1]
        pixels = images.flatten(0, 1).to(dtype).permute(0, 3, 1, 2)
        pooled = (F.avg_pool2d(pixels, self.config.pool) if self.config.pool > 1 else pixels) / 127.5 - 1.0
        patches = self.patch(pooled).flatten(2).transpose(1, 2) + self.patch_pos  # [B*C, N, W]
        for layer in self.vision_layers:  # per camera, bidirectional over its patches
            patches, _ = layer(patches, None)
        patches = self.vision_out(patches).view(B, C, -1, self.config.width) + self.camera_emb[:C, None, :]
        emb = torch.cat(
            [
                patches.flatten(1, 2),
                self.token_emb(tokens) + self.token_pos,
                self.state_in(state.to(dtype))[:, None, :],
            ],
            dim=1,
        )
        mask = torch.cat(
            [
                image_mask.repeat_interleave(self.config.n_patches, dim=1),
                token_mask,
                torch.ones(B, 1, dtype=torch.bool, device=image_mask.device),
            ],
            dim=1,
        )
        return emb, mask

    def prefix_cache(self, emb: torch.Tensor, mask: torch.Tensor) -> PrefixCache:
        """Run the prefix once (bidirectional, padding never attended to) and keep its K/V."""
        B, P, _ = emb.shape
        H = self.config.action_horizon
        bias = attention_bias(mask, emb.dtype)
        kv = []
        x = emb
        for layer in self.prefix_layers:
            x, (k, v) = layer(x, bias)
            buffers = (
                k.new_zeros(B, k.shape[1], P + H, k.shape[3]),
                v.new_zeros(B, v.shape[1], P + H, v.shape[3]),
            )
            buffers[0][:, :, :P] = k
            buffers[1][:, :, :P] = v
            kv.append(buffers)
        action_keys = torch.ones(B, H, dtype=torch.bool, device=mask.device)
        return PrefixCache(kv, attention_bias(torch.cat([mask, action_keys], dim=1), emb.dtype))

    def velocity(self, cache: PrefixCache, x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """The action expert: v(x_t, t) given the cached prefix (one Euler step's model call)."""
        B, H, _ = x_t.shape
        time_emb = sinusoidal(t, self.config.expert_width).to(x_t.dtype)[:, None, :].expand(B, H, -1)
        x = self.action_time_mlp(torch.cat([self.action_in(x_t), time_emb], dim=-1)) + self.action_pos
        for layer, kv in zip(self.expert_layers, cache.kv, strict=True):
            x, _ = layer(x, cache.bias, kv)
        return self.action_out(self.action_norm(x))

    @torch.no_grad()
    def sample(self, cache: PrefixCache, guide: tuple[torch.Tensor, ...] | None = None) -> torch.Tensor:
        """10 Euler steps from the seeded noise; ``guide`` = (target, weights, max_weight) for RTC."""
        B = cache.bias.shape[0]
        steps = self.config.num_steps
        x = self.noise.expand(B, -1, -1).clone()
        for i in range(steps):
            t = 1.0 - i / steps
            t_vec = torch.full((B,), t, device=x.device)
            if guide is None:
                v = self.velocity(cache, x, t_vec)
            else:
                v = guided_velocity(lambda xt, tv=t_vec: self.velocity(cache, xt, tv), x, t, *guide)
            x = x - v / steps
        return x


@dataclass(frozen=True)
class Pi0Input:
    """One validated observation (cheap to build: images stay the wire's arrays) plus its RTC request."""

    observation: presets.Canonical
    rtc: RTCOptions | None


@dataclass(frozen=True)
class Pi0Batch:
    """Model inputs of a batch, built on the worker thread by :meth:`Pi0TinyPolicy.collate`."""

    images: torch.Tensor  # [B, C, R, R, 3] uint8 (missing cameras black)
    image_mask: torch.Tensor  # [B, C] bool
    tokens: torch.Tensor  # [B, L] long
    token_mask: torch.Tensor  # [B, L] bool
    state: torch.Tensor  # [B, S]

    def as_args(self, device: torch.device | str = "cpu") -> tuple[torch.Tensor, ...]:
        """The model's arguments on ``device`` (one host-to-device copy each; none on the CPU)."""
        tensors = (self.images, self.image_mask, self.tokens, self.token_mask, self.state)
        return tuple(t.to(device, non_blocking=True) for t in tensors)


def resize_with_pad(image: np.ndarray, size: int) -> np.ndarray:
    """uint8 HWC of any size -> uint8 [size, size, 3], aspect kept, padded black (openpi's
    ``image_tools.resize_with_pad``; black is -1 after normalisation, like vllm-omni's padding)."""
    h, w = image.shape[:2]
    scale = size / max(h, w)
    nh, nw = max(1, round(h * scale)), max(1, round(w * scale))
    x = torch.tensor(image).permute(2, 0, 1)[None].float()  # a copy: wire arrays are read-only
    x = F.interpolate(x, size=(nh, nw), mode="bilinear", align_corners=False, antialias=True)[0]
    out = np.zeros((size, size, 3), np.uint8)
    top, left = (size - nh) // 2, (size - nw) // 2
    out[top : top + nh, left : left + nw] = x.round().clamp(0, 255).byte().permute(1, 2, 0).numpy()
    return out


class Pi0TinyPolicy:
    """The embedded default robot policy (implements ``models.policy.interface.Policy``).

    ``preset=None`` auto-detects the observation layout per observation and returns the model's
    full ``[50, 32]`` chunk; a fixed preset (``"libero"``, ``"droid"``, ``"aloha"``, ``"pi0"``)
    accepts only that layout and returns the robot's action dims (openpi's ``*Outputs`` slice).
    ``device`` is a torch device string (``"cpu"``, ``"cuda:0"``) for the weights and forwards.
    ``max_prompt_chars`` bounds a prompt's length (``presets.MAX_PROMPT_CHARS`` by default).
    ``fp8``: the layers' matmuls in FP8 (:meth:`Pi0Tiny.to_fp8`; for CUDA from sm89, allowed and
    slower on the CPU); RTC-guided steps then multiply by the dequantized weights (``models.fp8``).
    """

    def __init__(
        self,
        config: Pi0TinyConfig | None = None,
        preset: str | None = None,
        default_prompt: str = "",
        device: str = "cpu",
        max_prompt_chars: int = presets.MAX_PROMPT_CHARS,
        cuda_graphs: bool = True,
        fp8: bool = False,
    ) -> None:
        self.config = config or Pi0TinyConfig()
        self.device = device
        self.max_prompt_chars = max_prompt_chars
        if preset is not None and preset not in presets.PRESETS:
            raise ValueError(f"unknown observation preset {preset!r} (known: {sorted(presets.PRESETS)})")
        self.preset = presets.PRESETS[preset] if preset else None
        self.default_prompt = default_prompt
        self.model = _build(self.config, device)
        if fp8:
            self.model.to_fp8()
        self.graphs: BatchGraphs | None = None  # captured at warmup (CUDA only)
        self._use_graphs = cuda_graphs and torch.device(device).type == "cuda"
        c = self.config
        shown = [self.preset] if self.preset else list(presets.PRESETS.values())
        self.spec = PolicySpec(
            name="pi0-tiny",
            action_horizon=c.action_horizon,
            action_dim=self.preset.action_dim if self.preset else c.action_dim,
            action_space="joint_position",
            image_resolution=(c.image_size, c.image_size),
            camera_keys=tuple(cam.key for cam in (self.preset or presets.PRESETS["pi0"]).cameras),
            state_dim=c.state_dim,
            max_cameras=c.max_cameras,
            extra={
                "num_inference_steps": c.num_steps,
                "observation_preset": self.preset.name if self.preset else "auto",
                "observation_presets": {p.name: p.describe() for p in shown},
                "real_time_chunking": True,
                **(dict(self.preset.metadata) if self.preset else {}),
            },
        )

    def prepare(self, observation: Mapping[str, Any]) -> Pi0Input:
        """Validate everything :meth:`collate` and :meth:`infer` read (``presets.canonicalize``,
        ``RTCOptions.parse``), so an accepted observation cannot fail a batch it shares; cheap
        otherwise (no image copies): tensors are built per batch in :meth:`collate`."""
        preset = self.preset or presets.detect(observation)
        canon = presets.canonicalize(
            preset, observation, self.config.max_cameras, self.default_prompt, self.max_prompt_chars
        )
        return Pi0Input(canon, RTCOptions.parse(observation.get("rtc")))

    def collate(self, batch: Sequence[Pi0Input]) -> Pi0Batch:
        """Stack a batch into model tensors: images stay uint8 (the model pools, then scales them);
        missing cameras are black (-1 once scaled) and masked; state zero-padded or truncated.

        Camera slots after the last one any item of the batch fills are left out altogether (a
        LIBERO batch carries 2 of the 3): masked tokens are never attended to, so computing them
        only costs time (a third of pi0's prefix for two-camera robots)."""
        c = self.config
        B, R = len(batch), c.image_size
        C = max(
            (j + 1 for item in batch for j, im in enumerate(item.observation.images) if im is not None),
            default=1,
        )
        pixels = np.zeros((B, C, R, R, 3), np.uint8)
        image_mask = torch.zeros(B, C, dtype=torch.bool)
        tokens = torch.full((B, c.prompt_len), PAD_ID, dtype=torch.long)
        state = torch.zeros(B, c.state_dim)
        for i, item in enumerate(batch):
            obs = item.observation
            for j, image in enumerate(obs.images[:C]):
                if image is not None:
                    pixels[i, j] = image if image.shape[:2] == (R, R) else resize_with_pad(image, R)
                    image_mask[i, j] = True
            ids = list(obs.prompt.encode("utf-8"))[: c.prompt_len]
            tokens[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            n = min(c.state_dim, obs.state.shape[0])
            state[i, :n] = torch.from_numpy(obs.state[:n].copy())
        return Pi0Batch(torch.from_numpy(pixels), image_mask, tokens, tokens != PAD_ID, state)

    def warmup(self, max_batch: int) -> None:
        """Run blank forwards at batch 1 and ``max_batch`` so first ticks pay no allocation cost."""
        c = self.config
        blank = presets.Canonical(
            (np.zeros((c.image_size, c.image_size, 3), np.uint8),) + (None,) * (c.max_cameras - 1),
            np.zeros(c.state_dim, np.float32),
            "",
        )
        if self._use_graphs:  # every bucket, for every number of camera slots a batch may carry
            self.graphs = BatchGraphs(self._forward, max_batch)
            image = blank.images[0]
            for cameras in range(1, c.max_cameras + 1):
                example = replace(blank, images=(None,) * (cameras - 1) + (image,))
                with torch.no_grad():
                    self.graphs.capture(
                        self.collate([Pi0Input(example, None)]).as_args(self.model.noise.device)
                    )
        for n in sorted({1, max_batch}):
            self.infer([Pi0Input(blank, None)] * n, [None] * n)

    def new_state(self) -> Pi0SessionState:
        return Pi0SessionState(self.spec.action_horizon, self.spec.action_dim)

    def infer(self, batch: Sequence[Pi0Input], snapshots: Sequence[Guide | None]) -> list[np.ndarray]:
        if not batch:
            return []
        args = self.collate(batch).as_args(self.model.noise.device)
        guide = self._guide(snapshots)
        with torch.no_grad():
            if guide is None and self.graphs is not None and len(batch) <= self.graphs.max_batch:
                actions = self.graphs(*args)
            else:
                model = self.model
                actions = model.sample(model.prefix_cache(*model.embed_prefix(*args)), guide)
        chunks = actions[:, :, : self.spec.action_dim].float().cpu().numpy()
        out = []
        for chunk, snap in zip(chunks, snapshots, strict=True):
            if snap is not None:  # frozen actions execute from the previous chunk: make that exact
                chunk[: snap.frozen] = snap.target[: snap.frozen]
            out.append(np.ascontiguousarray(chunk, dtype=np.float32))
        return out

    def _guide(self, snapshots: Sequence[Guide | None]) -> tuple[torch.Tensor, ...] | None:
        if all(s is None for s in snapshots):
            return None
        c, dims = self.config, self.spec.action_dim
        B = len(snapshots)
        target = torch.zeros(B, c.action_horizon, c.action_dim)
        weights = torch.zeros(B, c.action_horizon, c.action_dim)
        max_weight = torch.zeros(B)
        for i, snap in enumerate(snapshots):
            if snap is not None:
                target[i, :, :dims] = torch.from_numpy(snap.target)
                weights[i, :, :dims] = torch.from_numpy(snap.weights)[:, None]
                max_weight[i] = snap.max_guidance_weight
        device, dtype = self.model.noise.device, self.model.noise.dtype
        return target.to(device, dtype), weights.to(device, dtype), max_weight.to(device, dtype)

    def _forward(self, *args: torch.Tensor) -> torch.Tensor:
        """The unguided forward (prefix, then the flow steps): what the CUDA graphs capture."""
        return self.model.sample(self.model.prefix_cache(*self.model.embed_prefix(*args)))


def _build(config: Pi0TinyConfig, device: str) -> Pi0Tiny:
    """The model on ``device`` in ``config.dtype``. float32 models are built on the host (the same
    seeded weights on any device); others (the real shapes, GBs of weights) on the device."""
    dtype = getattr(torch, config.dtype)
    if dtype == torch.float32:
        return Pi0Tiny(config).to(device)
    with torch.device(device):
        return Pi0Tiny(config).to(dtype)


class Pi0SessionState(RTCState):
    """pi0-tiny's per-session state is its RTC state; a tick's snapshot is its guide (or None)."""

    def snapshot(self, prepared: Pi0Input, now: float) -> Guide | None:
        return self.guide(prepared.rtc, now)


__all__ = [
    "CONFIGS",
    "PI0_SHAPED",
    "ObservationError",
    "Pi0Batch",
    "Pi0Input",
    "Pi0Tiny",
    "Pi0TinyConfig",
    "Pi0TinyPolicy",
]
