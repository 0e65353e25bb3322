"""Few-step flow sampling of one latent block per session, batched across sessions.

One tick of a session generates block ``b`` (latent frames ``b*fpb .. b*fpb + fpb - 1``):

1. **staged denoise passes** at the configured noise levels (``cfg.sigmas``, the DiT seeing
   ``cfg.step_timesteps``: Self-Forcing's warped [1000, 750, 500, 250] at shift 5 are timesteps
   1000, 937.5, 833.3, 625): each predicts the clean block x0 (``x - sigma * v`` from the DiT's flow
   prediction, in float32) against the session's resident KV (read-only) and re-noises it to the
   next level with fresh noise (Self-Forcing / DMD few-step sampling); a request that carries a start
   latent (a session's first block, when the model ships start frames) has its first frame held
   at that latent after every pass;
2. a **clean pass** at timestep 0 over the final x0 whose K/V are the only thing committed to the
   pool (Self-Forcing's "rerun with timestep zero", its ``context_noise`` 0; world_engine's cache pass).

Noise is counter-based: ``block_noise(seed, block, step)``, so a session's output depends only on
its seed, prompt and action history, never on which other sessions share the batch or on the
order of ticks (replay after reset is bit-identical). It is drawn by the device's own generator
(the CPU's, or CUDA's Philox on the GPU, where it costs no host time: 4 passes of Wan-1.3B noise
take ~16 ms of one CPU core), so the same seed gives other noise on the CPU than on a GPU.
``denoise`` never writes, and ``commit`` is one call at the end, so an exception anywhere before
it leaves the session's cache as it was.

``recompute_x0`` is the cache-free reference (Oasis-style full masked recompute over a clean
latent history) used by the correctness tests and as the recompute baseline of the bench.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from models.transfer import to_device
from models.world.dit import KV, CausalDiT, block_causal_mask
from models.world.graphs import DiTGraphs
from models.world.kv_cache import KVPool
from models.world.profiling import OFF, Profiler


def block_noise(
    seed: int, block: int, step: int, shape: Sequence[int], device: torch.device | str = "cpu"
) -> Tensor:
    """Deterministic float32 noise for (seed, block, denoise step), drawn on ``device`` by its
    generator seeded from the three (on the meta device, shape-only runs, an empty tensor)."""
    if torch.device(device).type == "meta":
        return torch.empty(tuple(shape), device=device)
    g = torch.Generator(device=device).manual_seed((seed * 1_000_003 + block * 1009 + step) % (2**63 - 1))
    return torch.randn(tuple(shape), generator=g, device=device)


def block_noises(reqs: Sequence[BlockRequest], steps: int, shape: Sequence[int], like: Tensor) -> Tensor:
    """Every denoise step's noise of a batch, ``[steps, B, *shape]`` in ``like``'s dtype, drawn on
    its device (:func:`block_noise` per request and step)."""
    noise = [
        torch.stack([block_noise(r.seed, r.block, i, shape, like.device) for r in reqs]) for i in range(steps)
    ]
    return torch.stack(noise).to(like.dtype)


@dataclass(frozen=True)
class BlockRequest:
    """One session's block to generate: ``actions [frames_per_block, action_dim]``."""

    session_id: str
    block: int
    seed: int
    actions: Tensor
    start: Tensor | None = None  # [C, h, w]: a start latent held as the block's first frame


def x0_from_flow(x: Tensor, flow: Tensor, sigma: float) -> Tensor:
    """The clean latents of ``x`` at noise ``sigma`` from the DiT's flow prediction
    (``v = noise - x0``, so ``x0 = x - sigma v``), computed in float32."""
    return (x.float() - sigma * flow.float()).to(x.dtype)


def renoise(x0: Tensor, noise: Tensor, sigma: float) -> Tensor:
    """``x0`` moved to noise level ``sigma``: ``(1 - sigma) x0 + sigma noise``, in float32."""
    return ((1 - sigma) * x0.float() + sigma * noise.float()).to(x0.dtype)


def pin_starts(reqs: Sequence[BlockRequest], x0: Tensor) -> Tensor:
    """``x0`` with each start-carrying request's first frame replaced by its start latent
    (replacement inpainting: the block's other frames are denoised around it)."""
    rows = [i for i, r in enumerate(reqs) if r.start is not None]
    if not rows:
        return x0
    x0 = x0.clone()
    x0[rows, 0] = torch.stack([reqs[i].start for i in rows]).to(x0)
    return x0


class FlowSampler:
    """One batch's block: :meth:`past`, then :meth:`denoise` and :meth:`clean_pass` over the same
    requests (one instance per block: its passes share the block's inputs, made on the device once,
    and load them into the graphs once). ``graphs``: CUDA graphs of the steady pass
    (``models.world.graphs``), replayed for the batches they cover; ``profiler``: marks the denoise
    passes and the clean pass (``models.world.profiling``)."""

    def __init__(
        self, dit: CausalDiT, pool: KVPool, graphs: DiTGraphs | None = None, profiler: Profiler = OFF
    ) -> None:
        self.dit, self.pool, self.cfg = dit, pool, dit.cfg
        self.graphs, self.profiler = graphs, profiler
        self._block: tuple[list[str], list[int], Tensor, Tensor] | None = None  # _inputs, made once
        self._loaded = False  # the graphs hold this block's inputs

    def _pass(
        self,
        x: Tensor,
        t: float,
        pos: Tensor,
        actions: Tensor,
        cross: list[KV],
        mask: Tensor | None,
        past: list[KV] | None,
        replay: bool,
    ) -> tuple[Tensor, list[KV]]:
        """One DiT pass at timestep ``t``: the flow prediction and, from an eager pass, its tokens' K/V."""
        if replay:
            assert self.graphs is not None
            return self.graphs.run(x, t), []
        timesteps = torch.full(x.shape[:2], t, dtype=torch.float32, device=x.device)
        return self.dit(x, pos, timesteps, actions, cross, mask, past)

    def _replays(
        self, past: list[KV] | None, mask: Tensor | None, pos: Tensor, actions: Tensor, cross: list[KV]
    ) -> bool:
        """Whether this block's passes replay a graph (its inputs then loaded)."""
        if self.graphs is None or not self.graphs.covers(past, mask):
            return False
        assert past is not None  # covered
        if not self._loaded:
            self.graphs.load(past, pos, actions, cross)
            self._loaded = True
        return True

    def _inputs(self, reqs: Sequence[BlockRequest]) -> tuple[list[str], list[int], Tensor, Tensor]:
        """The block's session ids, first frames, frame positions ``[B, F]`` and actions
        ``[B, F, A]`` on the device (copied there on the first call of the block)."""
        ids = [r.session_id for r in reqs]
        if self._block is None:
            fpb = self.cfg.frames_per_block
            starts = [r.block * fpb for r in reqs]
            pos = torch.tensor([[s + j for j in range(fpb)] for s in starts], dtype=torch.long)
            p = self.pool.k
            actions = to_device(torch.stack([r.actions for r in reqs]), p)
            self._block = ids, starts, to_device(pos, p, torch.long), actions
        assert self._block[0] == ids, "one FlowSampler per block"
        return self._block

    def past(self, reqs: Sequence[BlockRequest]) -> tuple[list[KV] | None, Tensor | None]:
        """The sessions' resident K/V a block's passes attend to, with room for the block's own,
        and the attention mask (``None`` when every key is visible), from one gather."""
        cfg, fpb = self.cfg, self.cfg.frames_per_block
        ids, starts, _, _ = self._inputs(reqs)
        past, key_mask = self.pool.gather(ids, starts, room=fpb * cfg.tokens_per_frame)
        mask = None  # a full window (the steady state): no mask, so the fastest attention kernels
        if key_mask is not None:
            room = key_mask.new_ones(len(reqs), fpb * cfg.tokens_per_frame)
            mask = torch.cat([key_mask, room], 1)[:, None, None, :]
        return past, mask

    @torch.no_grad()
    def denoise(
        self, reqs: Sequence[BlockRequest], cross: list[KV], past: list[KV] | None, mask: Tensor | None
    ) -> Tensor:
        """Staged denoise passes against ``past`` (:meth:`past`'s, reused by the clean pass);
        returns x0 ``[B, fpb, C, h, w]``. ``cross``: the sessions' prompt cross-attention K/V."""
        cfg, fpb = self.cfg, self.cfg.frames_per_block
        _, _, pos, actions = self._inputs(reqs)
        shape = (fpb, cfg.latent_channels, cfg.latent_height, cfg.latent_width)
        noise = block_noises(reqs, len(cfg.sigmas), shape, self.pool.k)
        replay = self._replays(past, mask, pos, actions, cross)
        x = x0 = noise[0]
        self.profiler.mark("denoise")
        for i, (s, t) in enumerate(zip(cfg.sigmas, cfg.step_timesteps, strict=True)):
            flow, _ = self._pass(x, t, pos, actions, cross, mask, past, replay)
            x0 = pin_starts(reqs, x0_from_flow(x, flow, s))
            if i + 1 < len(cfg.sigmas):
                x = renoise(x0, noise[i + 1], cfg.sigmas[i + 1])
        self.profiler.mark("denoised")
        return x0

    @torch.no_grad()
    def clean_pass(
        self,
        reqs: Sequence[BlockRequest],
        x0: Tensor,
        past: list[KV] | None,
        mask: Tensor | None,
        cross: list[KV],
    ) -> list[KV]:
        """The sigma = 0 pass over the final x0: the block's K/V to commit (nothing written yet;
        from a replayed graph they are views of the past's room, valid until the next gather)."""
        _, _, pos, actions = self._inputs(reqs)
        replay = self._replays(past, mask, pos, actions, cross)
        self.profiler.mark("clean")
        _, kv = self._pass(x0, 0.0, pos, actions, cross, mask, past, replay)
        self.profiler.mark("cleaned")
        if not replay:
            return kv
        assert past is not None  # a graph replays a gathered past only
        room = x0.shape[1] * self.cfg.tokens_per_frame  # where the replayed self-attention wrote them
        return [(k[:, -room:], v[:, -room:]) for k, v in past]


@torch.no_grad()
def recompute_x0(
    dit: CausalDiT,
    history: Tensor,
    history_pos: Tensor,
    history_actions: Tensor,
    x: Tensor,
    block: int,
    step: int,
    actions: Tensor,
    cross: list[KV],
) -> Tensor:
    """Cache-free reference: one full masked forward over ``[clean history ; noisy block]``.

    ``history [B, H, C, h, w]`` clean latents at absolute frames ``history_pos [H]`` with their
    actions ``[B, H, A]``; ``x [B, fpb, ...]`` is block ``block`` at the schedule's ``step``.
    Returns the block's x0. With the full history this equals the cached path exactly; with only
    the last ``sink + window`` frames it is the recompute-the-window baseline.
    """
    cfg = dit.cfg
    fpb, b = cfg.frames_per_block, x.shape[0]
    block_pos = torch.arange(block * fpb, block * fpb + fpb, device=x.device)
    pos = torch.cat([history_pos.to(x.device), block_pos])
    t = torch.cat([torch.zeros(history.shape[1]), torch.full((fpb,), cfg.step_timesteps[step])])
    tok_frames = pos.repeat_interleave(cfg.tokens_per_frame)
    mask = block_causal_mask(tok_frames, tok_frames, fpb, cfg.sink_frames, cfg.window_frames)
    flow, _ = dit(
        torch.cat([history, x], 1),
        pos.expand(b, -1),
        t.to(x.device).expand(b, -1),
        torch.cat([history_actions, actions], 1),
        cross,
        mask,
    )
    return x0_from_flow(x, flow[:, history.shape[1] :], cfg.sigmas[step])


@torch.no_grad()
def recompute_generate(
    dit: CausalDiT,
    history: Tensor,
    history_pos: Tensor,
    history_actions: Tensor,
    reqs: Sequence[BlockRequest],
    cross: list[KV],
) -> Tensor:
    """The full sampler loop of one block with ``recompute_x0`` at every step (no KV cache)."""
    cfg = dit.cfg
    shape = (cfg.frames_per_block, cfg.latent_channels, cfg.latent_height, cfg.latent_width)
    block = reqs[0].block
    noise = block_noises(reqs, len(cfg.sigmas), shape, history)
    actions = torch.stack([r.actions for r in reqs]).to(history)
    x = x0 = noise[0]
    for i in range(len(cfg.sigmas)):
        x0 = recompute_x0(dit, history, history_pos, history_actions, x, block, i, actions, cross)
        if i + 1 < len(cfg.sigmas):
            x = renoise(x0, noise[i + 1], cfg.sigmas[i + 1])
    return x0
