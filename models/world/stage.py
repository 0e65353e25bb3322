"""The world model as two stateful batched stages of a pipeline (``models/stage.py``).

``WorldBlockStage`` (the DiT) -> ``WorldDecodeStage`` (the causal VAE decoder); the world kind adds
a media encoder after them. Splitting at the latent lets the runtime's pipeline decode (and
encode) block k on their own worker threads while block k + 1 denoises.

- :class:`WorldBlockStage`: one batch = one ``WorldModel.generate`` over the batch's sessions: all
  their blocks denoise in one forward and commit their rolling KV (transactional: nothing changes
  if it raises). Payload :class:`WorldBlockInput`, output :class:`WorldBlock` (the clean latent).
  A payload for block 0 starts the session's world afresh with the tick's seed; one that carries
  ``restore`` (a session moved here from another replica) first rebuilds the session's KV from
  those blocks (``WorldModel.restore``) and hands their last consecutive run on
  (``WorldBlock.warmup``). Per-session state
  (rolling self-attention KV + prompt cross-attention KV) lives in the model's pool at the slot
  the runtime's slot table allocated.
- :class:`WorldDecodeStage`: one batch = one ``WorldModel.decode_blocks``; the decoder's temporal
  cache is this stage's per-slot state, advanced only after a successful forward; a block with
  ``warmup`` rebuilds it first by decoding those latents from a fresh cache (frames dropped:
  exact when they start at block 0, and the cache forgets what lies past its receptive field).
  Output :class:`WorldFrames` (``uint8 [T, H, W, 3]`` on the CPU) with the block as a restore
  would need it (``held``: its clean latent copied to the host with the frames).

On CUDA the decoder runs on its own stream. Both stages' threads would otherwise queue kernels
on the one default stream, so the decode of block k (and its device-to-host copy, which waits for
everything queued before it) would wait for the DiT's forward of block k + 1: the first frame
came one whole DiT block late. The block stage records an event after each forward
(``WorldBlock.ready``); the decode stream waits for exactly that event.

Both carry the input's ``extra`` (opaque to the model: the kind's media settings) through.

Stage timing goes through the model's profiler (``models.world.profiling``, off by default): the
block stage collects the marks its forward's DiT passes make and keeps its last forward's, so a
block also tells the DiT stream's time between the previous forward and its own; the decode stage
marks its decoder forward and its device-to-host copy and turns a block's marks into
``BlockTimings`` after the copy's wait, the one point where this path already waits for the GPU.
The frames land in pinned host memory, copied without a wait per session.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from models.stage import StageItem
from models.transfer import to_device
from models.world.controls import KEYS_TRACK, MOUSE_TRACK, action_vector
from models.world.memory import decoder_state_bytes
from models.world.model import HeldBlock, WorldModel, WorldTick
from models.world.profiling import BlockTimings, Marks, block_timings
from models.world.vae import DecoderState


@dataclass(frozen=True)
class WorldBlockInput:
    tick: WorldTick
    seed: int
    extra: Any = None
    restore: tuple[HeldBlock, ...] = ()  # a moved session's resident blocks, rebuilt before this one


@dataclass(frozen=True)
class WorldBlock:
    latent: Tensor  # [frames_per_block, C, h, w]
    block: int
    forward_ms: float
    batch_size: int
    extra: Any = None
    ready: torch.cuda.Event | None = None  # CUDA: recorded after the forward that made ``latent``
    started_at: float = 0.0  # time.monotonic() when the forward began
    marks: Marks = field(default_factory=dict)  # the DiT forward's profiler marks (empty when off)
    previous: Marks | None = None  # those of the stage's forward before this one
    action: Tensor | None = None  # the tick's (``WorldTick.action``)
    prompt: str | None = None  # the tick's
    warmup: tuple[Tensor, ...] = ()  # restore: the latents the decoder's cache is rebuilt from


@dataclass(frozen=True)
class WorldFrames:
    frames: Tensor  # uint8 [T, H, W, 3], CPU
    block: int
    forward_ms: float  # the DiT forward of this block
    decode_ms: float  # the decode stage's forward, host wall time
    batch_size: int
    extra: Any = None
    timings: BlockTimings | None = None
    held: HeldBlock | None = None  # the block as a restore needs it (host latent)


def world_input(snapshot: Any) -> WorldBlockInput:
    """Tick snapshot -> block input (the world's control adapter).

    ``keys`` is sticky (the newest ``keys`` control so far, the default reducer's rule); ``mouse``
    deltas are summed over the events applied in this block only. ``snapshot.payload`` carries the
    session's ``seed``, start ``prompt`` and the kind's ``extra``.
    """
    payload = snapshot.payload
    keys = snapshot.control(KEYS_TRACK)
    dx = dy = 0.0
    for event in snapshot.events:
        for control in event.controls:
            if control.track == MOUSE_TRACK:
                dx += float(control.data.get("dx", 0))
                dy += float(control.data.get("dy", 0))
    action = action_vector(keys.data["pressed"] if keys is not None else (), dx, dy)
    prompt = snapshot.prompt if snapshot.prompt is not None else payload.prompt
    tick = WorldTick(snapshot.session_id, snapshot.chunk_index, prompt, action)
    return WorldBlockInput(tick, payload.seed, payload.extra, payload.restore)


class WorldBlockStage:
    def __init__(self, model: WorldModel, name: str = "world-dit", device: str = "cpu") -> None:
        self.model = model
        self.name = name
        self.device = device
        self.slot_capacity = model.pool.slots
        self._last_marks: Marks | None = None  # the last forward's (BlockTimings.gap_ms)

    def state_bytes(self) -> int:
        return self.model.pool.geometry.bytes_per_session

    def open_state(self, session_id: str, slot: int) -> str:
        self.model.open(session_id, seed=0, slot=slot)
        return session_id

    def release_state(self, session_id: str, slot: int, state: object) -> None:
        self.model.release(session_id)

    def forward(self, items: Sequence[StageItem]) -> list[WorldBlock]:
        started_at, t0 = time.monotonic(), time.perf_counter()
        inputs: list[WorldBlockInput] = [item.payload for item in items]
        for inp in inputs:
            if inp.restore:
                self.model.restore(inp.tick.session_id, inp.seed, inp.restore)
            elif inp.tick.block == 0:
                self.model.reset(inp.tick.session_id, seed=inp.seed)
        with self.model.profiler.collect() as marks:
            latents = self.model.generate([inp.tick for inp in inputs])
        ready = None
        if latents.is_cuda:
            ready = torch.cuda.Event()
            ready.record()
        ms = (time.perf_counter() - t0) * 1000.0
        previous, self._last_marks = self._last_marks, marks
        return [
            WorldBlock(
                latents[i],
                inp.tick.block,
                ms,
                len(items),
                inp.extra,
                ready,
                started_at,
                marks,
                previous,
                inp.tick.action,
                inp.tick.prompt,
                self._warmup(inp.restore, latents),
            )
            for i, inp in enumerate(inputs)
        ]

    @staticmethod
    def _warmup(held: Sequence[HeldBlock], like: Tensor) -> tuple[Tensor, ...]:
        """The latents of ``held``'s last run of consecutive blocks, on the model's device."""
        run: list[HeldBlock] = []
        for h in held:
            run = [*run, h] if run and h.block == run[-1].block + 1 else [h]
        return tuple(to_device(h.latent, like) for h in run)


class WorldDecodeStage:
    def __init__(self, model: WorldModel, name: str = "world-decode", device: str = "cpu") -> None:
        self.model = model
        self.name = name
        self.device = device
        self.slot_capacity = model.pool.slots
        self._states: list[DecoderState | None] = [None] * self.slot_capacity
        self._stream = torch.cuda.Stream(model.pool.k.device) if model.pool.k.is_cuda else None

    def state_bytes(self) -> int:
        return decoder_state_bytes(self.model.cfg, self.model.pool.k.dtype)

    def open_state(self, session_id: str, slot: int) -> None:
        if self._stream is None:
            self._states[slot] = self.model.init_decoder_state()
            return
        with torch.cuda.stream(self._stream):  # zero-filled where it is used
            self._states[slot] = self.model.init_decoder_state()

    def release_state(self, session_id: str, slot: int, state: object) -> None:
        self._states[slot] = None

    def forward(self, items: Sequence[StageItem]) -> list[WorldFrames]:
        if self._stream is None:
            return self._forward(items)
        with torch.cuda.stream(self._stream):
            for event in {id(b.ready): b.ready for b in (item.payload for item in items) if b.ready}.values():
                self._stream.wait_event(event)
            for item in items:  # made on the DiT's stream, read on this one: keep the allocator honest
                item.payload.latent.record_stream(self._stream)
            return self._forward(items)

    def _forward(self, items: Sequence[StageItem]) -> list[WorldFrames]:
        t0 = time.perf_counter()
        profiler = self.model.profiler
        blocks: list[WorldBlock] = [item.payload for item in items]
        with profiler.collect() as marks:
            profiler.mark("decode")  # on CUDA after the wait for the DiT: the decoder's own time
            for item, block in zip(items, blocks, strict=True):
                if block.warmup:  # a session moved here: its cache rebuilt from its last blocks
                    self._states[item.slot] = self._warmed(block.warmup)
                elif block.block == 0:  # a fresh world: a fresh temporal cache
                    self._states[item.slot] = self.model.init_decoder_state()
            states = [self._states[item.slot] for item in items]
            latents = blocks[0].latent.new_empty((len(blocks), *blocks[0].latent.shape))
            for i, block in enumerate(blocks):
                latents[i] = block.latent
            frames, after = self.model.decode_blocks(latents, states, host=False)
            profiler.mark("decoded")
            frames = [_to_host(f) for f in frames]
            held = [_held(b) for b in blocks]
            profiler.mark("copied")
        if self._stream is not None:
            self._stream.synchronize()  # the frames must be on the host: the wait this stage always had
        for item, state in zip(items, after, strict=True):  # commit: the forward succeeded
            self._states[item.slot] = state
        ms = (time.perf_counter() - t0) * 1000.0
        return [
            WorldFrames(
                f,
                b.block,
                b.forward_ms,
                ms,
                b.batch_size,
                b.extra,
                block_timings(b.started_at, b.forward_ms, b.marks, b.previous, marks),
                h,
            )
            for f, b, h in zip(frames, blocks, held, strict=True)
        ]

    def _warmed(self, latents: Sequence[Tensor]) -> DecoderState:
        """A fresh temporal cache after decoding ``latents`` (one block each) in order."""
        state = self.model.init_decoder_state()
        for latent in latents:
            _, (state,) = self.model.decode_blocks(latent[None], [state], host=False)
        return state


def _held(block: WorldBlock) -> HeldBlock | None:
    """``block`` as a restore needs it, its latent copied to the host (without a wait on CUDA)."""
    if block.action is None:
        return None
    latent = _to_host(block.latent) if block.latent.is_cuda else block.latent.clone()  # not a batch's view
    return HeldBlock(block.block, latent, block.action, block.prompt)


def _to_host(frames: Tensor) -> Tensor:
    """Contiguous host frames; from CUDA a copy into pinned memory that does not wait."""
    if not frames.is_cuda:
        return frames.contiguous()
    host = torch.empty(frames.shape, dtype=frames.dtype, pin_memory=True)
    return host.copy_(frames, non_blocking=True)
