"""CUDA-graph replay of the world DiT's steady-state and first-block passes: two graphs per batch size.

Why: a DiT pass is ``depth`` compiled blocks, and each block is a Python call that launches its
kernels one by one (dynamo's guards, inductor's wrapper, FlashAttention-4's host-side interface):
milliseconds of host time per pass, which the block stage's thread must keep ahead of the GPU
while it shares the GIL with the event loop, the decode stage and the encode threads. A replayed
graph launches a whole pass in one call (``docs/benchmarks.md``, "world: CUDA graphs").

What is captured, for each batch size ``B`` from 1 to ``max_batch``, is ``CausalDiT.forward`` over
``B`` sessions in one of two phases, each a fixed shape:

- **steady**: windows full (the state every session reaches at ``KVGeometry.steady_block``: every
  resident frame visible, no mask, the full key length);
- **first**: every session's first block, which sees no frame but its own (``KVPool.gather``'s past
  is the room alone). A session's first frames wait for this block alone, and eagerly its host
  launch (~0.3 s at the Wan-1.3B shape) is longer than its GPU work: replayed, the time to first
  frame is the GPU's.

Their inputs are static buffers: the noisy latents, their timesteps, frame positions and actions,
and the cross-attention K/V (this object's, :meth:`DiTGraphs.load` and :meth:`DiTGraphs.run` copy
into them), and the past K/V with room for the block (the pool's scratch,
``KVPool.reserve_scratch``, where ``KVPool.gather`` writes). The denoise passes and the clean pass
replay the same graph (the timestep is an input). The block's K/V that the clean pass leaves to
commit are the past's room, where each pass's self-attention writes its tokens' K/V.

Everything else runs as before, eagerly: a session's blocks while its window fills, a batch
mixing phases (under a mask), the noise, the re-noising between passes, the KV gather and commit
(tens of launches per block against thousands per pass).

Each capture is checked before it is used: the graph replayed over fresh inputs must match an
eager forward over them, or :class:`GraphMismatch` is raised. Graphs share one memory pool and
never replay at once (one block stage thread, one stream).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from models.cuda_graphs import capture
from models.world.dit import KV, CausalDiT
from models.world.kv_cache import KVPool

MISMATCH_TOLERANCE = 0.02  # replay vs eager: max |difference| / max |eager output| (bf16 rounding is ~1e-2)


class GraphMismatch(RuntimeError):
    """A captured DiT pass replayed a result that an eager forward over the same inputs does not give."""


@dataclass
class _Replay:
    graph: torch.cuda.CUDAGraph
    out: Tensor  # the capture's output: every replay rewrites it


class DiTGraphs:
    """The steady and first-block passes of ``dit`` over ``pool`` as CUDA graphs, for batches of 1
    to ``max_batch`` (see the module docstring). Construct, :meth:`capture`, then per block
    :meth:`load` once and :meth:`run` per pass, for a batch that :meth:`covers`."""

    def __init__(self, dit: CausalDiT, pool: KVPool, max_batch: int) -> None:
        cfg, like = dit.cfg, pool.k
        fpb = cfg.frames_per_block
        self.dit, self.pool, self.max_batch = dit, pool, max_batch
        self.room = fpb * cfg.tokens_per_frame  # a first block's keys: the room alone
        self.keys = pool.geometry.resident_frames * cfg.tokens_per_frame + self.room  # a steady block's
        self.x = like.new_zeros(max_batch, fpb, cfg.latent_channels, cfg.latent_height, cfg.latent_width)
        self.t = torch.zeros(max_batch, fpb, dtype=torch.float32, device=like.device)
        self.pos = torch.zeros(max_batch, fpb, dtype=torch.long, device=like.device)
        self.actions = like.new_zeros(max_batch, fpb, cfg.action_dim)
        text = (max_batch, cfg.text_len, cfg.heads, cfg.head_dim)
        self.cross = [(like.new_zeros(text), like.new_zeros(text)) for _ in range(cfg.depth)]
        if pool.scratch_batch < max_batch:
            pool.reserve_scratch(max_batch)
        self._scratch = pool.scratch_past(1, self.keys)[0][0].data_ptr()  # where every gather's past starts
        self._replays: dict[tuple[int, int], _Replay] = {}  # (batch, keys) -> its graph
        self._loaded: _Replay | None = None  # the graph :meth:`load` chose for this block's passes
        self._memory = None
        self.replayed = 0  # passes replayed so far

    @torch.no_grad()
    def capture(self) -> None:
        """Capture and check both phases at every batch size (seconds: a few eager forwards each)."""
        generator = torch.Generator(device=self.x.device).manual_seed(0)
        for k, v in self.pool.scratch_past(self.max_batch, self.keys):  # keys and values to attend to
            k.normal_(generator=generator)
            v.normal_(generator=generator)
        for b in range(1, self.max_batch + 1):
            self._replays[b, self.keys] = self._capture(b, self.keys, generator)
        for b in range(1, self.max_batch + 1):  # the room alone: the forward writes all it reads
            self._replays[b, self.room] = self._capture(b, self.room, generator)

    def covers(self, past: list[KV] | None, mask: Tensor | None) -> bool:
        """Whether a pass over ``past`` and ``mask`` (as ``KVPool.gather`` returned them) replays a
        graph: no mask, a captured phase (the full window, or the room alone) and batch size, the
        pool's scratch."""
        if past is None or mask is not None:
            return False
        k = past[0][0]
        return (k.shape[0], k.shape[1]) in self._replays and k.data_ptr() == self._scratch

    def load(self, past: list[KV], pos: Tensor, actions: Tensor, cross: list[KV]) -> None:
        """A covered block's graph (:meth:`covers` of ``past``), and the inputs that every pass
        shares: ``pos [B, F]``, ``actions [B, F, A]`` and each layer's cross-attention K/V
        ``[B, L, H, D]``."""
        b = pos.shape[0]
        self._loaded = self._replays[b, past[0][0].shape[1]]
        self.pos[:b].copy_(pos)
        self.actions[:b].copy_(actions)
        statics = [t[:b] for kv in self.cross for t in kv]
        torch._foreach_copy_(statics, [t for kv in cross for t in kv])  # one dtype: a few launches, not 60

    def run(self, x: Tensor, t: float) -> Tensor:
        """One pass over ``x [B, F, C, h, w]`` at timestep ``t``: the flow prediction (a fresh tensor)."""
        b = x.shape[0]
        self.x[:b].copy_(x)
        self.t[:b].fill_(t)
        replay = self._loaded
        assert replay is not None and replay.out.shape[0] == b, "load the block first"
        replay.graph.replay()
        self.replayed += 1
        return replay.out.clone()

    def _forward(self, b: int, past: list[KV]) -> Tensor:
        cross = [(k[:b], v[:b]) for k, v in self.cross]
        flow, _ = self.dit(self.x[:b], self.pos[:b], self.t[:b], self.actions[:b], cross, None, past)
        return flow

    def _probe(self, b: int, keys: int, t: float, generator: torch.Generator) -> None:
        """Fresh inputs for ``b`` sessions at the positions of the phase whose past has ``keys``."""
        start = self.pool.geometry.steady_block * self.x.shape[1] if keys == self.keys else 0
        self.x[:b].normal_(generator=generator)
        self.t[:b].fill_(t)
        self.pos[:b].copy_(torch.arange(start, start + self.x.shape[1], device=self.pos.device))
        self.actions[:b].normal_(generator=generator)
        for k, v in self.cross:
            k[:b].normal_(generator=generator)
            v[:b].normal_(generator=generator)

    def _capture(self, b: int, keys: int, generator: torch.Generator) -> _Replay:
        self._probe(b, keys, 750.0, generator)
        if self._memory is None:
            self._memory = torch.cuda.graph_pool_handle()
        past = self.pool.scratch_past(b, keys)
        graph, out = capture(lambda: self._forward(b, past), self._memory)
        self._probe(b, keys, 250.0, generator)  # new inputs: a replay must read them, not the capture's
        want = self._forward(b, past)
        graph.replay()
        error = float((out.float() - want.float()).abs().max())
        scale = float(want.float().abs().max())
        if not error <= MISMATCH_TOLERANCE * scale:  # also catches NaN
            phase = "" if keys == self.keys else ", first block"
            raise GraphMismatch(
                f"batch {b}{phase}: replay differs from the eager pass by {error:.3g} (scale {scale:.3g})"
            )
        return _Replay(graph, out)
