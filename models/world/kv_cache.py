"""Pooled, preallocated rolling KV cache: per-session slots of ``[sink | recent window]`` frames.

One pool holds every resident session of a model. It is allocated once, sized from a memory
budget with the session runtime's capacity formula (``required(c) = scratch + c * per_session``),
and never grows: committing a block overwrites the evicted frames in place, so resident memory is
flat however long a session runs.

Per slot and layer the self-attention K/V hold ``sink_frames + window_frames`` frames of
``tokens_per_frame`` tokens, stored **roped with their absolute frame index** (so rolling never
re-ropes). Frames ``f < sink`` live in the sink slots; later frames live in a ring of
``window_frames`` slots at ``sink + (f - sink) % window``. The cross-attention K/V of the
session's prompt live in the same slot (reset on a prompt change).

Contract:
- ``open(session_id, slot=None)`` -> slot (raises ``KVPoolFull``); with ``slot`` the index is
  the stage engine's (the engine owns slot allocation); ``release(session_id)`` frees it
  (idempotent); ``clear(session_id)`` empties its frames (reset).
- ``gather(sessions, block_start, room)`` -> per-layer past ``(K, V)`` ``[B, R*T + room, H, D]``
  (fresh buffers: the slots' frames, then ``room`` rows the forward writes its own tokens' K/V
  into, so attention reads one buffer and nothing is concatenated per pass) and a key mask
  ``[B, R*T]`` of the frames visible to a block starting at ``block_start`` (per session), or
  ``None`` when all of them are. ``R`` is the shortest prefix of frame slots that holds every
  frame visible to the batch: a window still filling is a prefix of the slots (frame ``f`` sits
  in slot ``f`` until the ring wraps), so a session whose window fills attends to its frames
  alone, without a mask (the fastest attention kernels), the whole sink + window once it is full
  (the steady state), and a batch that mixes phases gathers the longest prefix, masked. When no
  session sees any frame (every session's first block) ``R`` is 0: the past is the room alone, so
  the block attends to itself, and a first block is a fixed shape that a CUDA graph replays
  (``models.world.graphs``). ``R`` varies while windows fill: a compiled DiT marks the key length
  dynamic (``CausalDiT.compile_blocks``).
- ``reserve_scratch(max_batch)``: from then on ``gather`` returns views of buffers the pool holds
  (contiguous, as fresh ones would be, and valid until the next ``gather``), so a batch of ``B``
  sessions with full windows, or of ``B`` first blocks, always gets the same addresses: what the
  CUDA graphs of the DiT's passes capture (``models.world.graphs``; ``scratch_past`` are those
  views). In the steady layout each scratch row keeps holding the slot it gathered, and
  ``commit`` writes a block into the row too, so the next gather of the same session into the
  same row copies nothing (a steady stream of blocks reads its window once, not once per block:
  4.3 GB per block at the Wan-1.3B shape).
- ``commit(sessions, block_start, kv)`` writes a block's clean-pass K/V (the only writer).
- denoise passes never write: the pool is read-only until ``commit``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from models.transfer import to_device
from models.world.configs import WorldModelConfig
from models.world.dit import KV


class KVPoolFull(RuntimeError):
    """Every slot of the pool is in use."""


@dataclass(frozen=True)
class KVGeometry:
    layers: int
    heads: int
    head_dim: int
    tokens_per_frame: int
    sink_frames: int
    window_frames: int
    frames_per_block: int
    text_len: int
    dtype_bytes: int

    @classmethod
    def of(cls, cfg: WorldModelConfig, dtype: torch.dtype) -> KVGeometry:
        return cls(
            layers=cfg.depth,
            heads=cfg.heads,
            head_dim=cfg.head_dim,
            tokens_per_frame=cfg.tokens_per_frame,
            sink_frames=cfg.sink_frames,
            window_frames=cfg.window_frames,
            frames_per_block=cfg.frames_per_block,
            text_len=cfg.text_len,
            dtype_bytes=torch.empty((), dtype=dtype).element_size(),
        )

    @property
    def resident_frames(self) -> int:
        return self.sink_frames + self.window_frames

    @property
    def steady_block(self) -> int:
        """The first block that sees a full sink + window (every resident frame visible)."""
        return -(-self.resident_frames // self.frames_per_block)

    @property
    def bytes_per_frame(self) -> int:
        """K and V of one frame in every layer."""
        return 2 * self.layers * self.tokens_per_frame * self.heads * self.head_dim * self.dtype_bytes

    @property
    def cross_bytes(self) -> int:
        return 2 * self.layers * self.text_len * self.heads * self.head_dim * self.dtype_bytes

    @property
    def bytes_per_session(self) -> int:
        """Resident bytes of one slot: sink + window frames of self-attention KV, plus cross KV."""
        return self.resident_frames * self.bytes_per_frame + self.cross_bytes

    def scratch_bytes(self, max_batch: int) -> int:
        """Transient K/V of one batched tick of ``max_batch`` sessions: per session, the gathered
        past with room for its block (:meth:`KVPool.gather`) plus the clean pass's block K/V held
        until the commit."""
        return max_batch * (self.resident_frames + 2 * self.frames_per_block) * self.bytes_per_frame

    def capacity(self, budget_bytes: int, max_batch: int) -> int:
        """Largest ``c`` with ``scratch + c * bytes_per_session <= budget`` (at least 1 if it fits)."""
        free = budget_bytes - self.scratch_bytes(max_batch)
        if free < self.bytes_per_session:
            raise ValueError(
                f"cannot fit one world session: available={budget_bytes} bytes "
                f"required={self.scratch_bytes(max_batch) + self.bytes_per_session} bytes"
            )
        return free // self.bytes_per_session


class KVPool:
    def __init__(self, geometry: KVGeometry, slots: int, dtype: torch.dtype, device: torch.device | str):
        g = self.geometry = geometry
        self.slots = slots
        shape = (g.layers, slots, g.resident_frames * g.tokens_per_frame, g.heads, g.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        cshape = (g.layers, slots, g.text_len, g.heads, g.head_dim)
        self.cross_k = torch.zeros(cshape, dtype=dtype, device=device)
        self.cross_v = torch.zeros(cshape, dtype=dtype, device=device)
        # absolute frame index held by each resident frame slot, -1 = empty (host-side bookkeeping)
        self.frame_pos = torch.full((slots, g.resident_frames), -1, dtype=torch.long)
        self._slot_of: dict[str, int] = {}
        self._scratch: list[KV] | None = None  # reserve_scratch: flat K and V buffers per layer
        self.scratch_batch = 0
        # per scratch row, in the steady layout (all frames + room): the slot whose frames it holds
        # as the pool does (gathered, then kept by every commit), or None
        self._mirrors: list[int | None] = []

    @property
    def resident_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.k, self.v, self.cross_k, self.cross_v))

    def __len__(self) -> int:
        return len(self._slot_of)

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._slot_of

    def open(self, session_id: str, slot: int | None = None) -> int:
        """The session's slot, emptied on first open.

        ``slot`` is the index the owner of slot indices (the runtime's slot table) allocated; the
        pool keeps no free list of its own, so a slot still held by another session is an error.
        ``None`` (standalone use: tests, training) takes the lowest index nobody holds.
        """
        held = self._slot_of.get(session_id)
        if held is not None and slot in (None, held):
            return held
        taken = set(self._slot_of.values())
        if slot is None:
            slot = next((i for i in range(self.slots) if i not in taken), None)
            if slot is None:
                raise KVPoolFull(f"all {self.slots} KV slots are in use")
        elif slot in taken:
            raise KVPoolFull(f"KV slot {slot} is held by {self.holder(slot)!r}")
        elif not 0 <= slot < self.slots:
            raise KVPoolFull(f"KV slot {slot} is outside the pool (0..{self.slots - 1})")
        self.release(session_id)
        self._slot_of[session_id] = slot
        self.frame_pos[slot] = -1
        return slot

    def reserve_scratch(self, max_batch: int) -> None:
        """Hold :meth:`gather`'s buffers for batches of up to ``max_batch`` sessions (a full
        window with room for a block: ``KVGeometry.scratch_bytes`` less the commit's share),
        zero-filled; a larger batch still gets fresh buffers."""
        g = self.geometry
        room = g.frames_per_block * g.tokens_per_frame
        n = max_batch * (g.resident_frames * g.tokens_per_frame + room) * g.heads * g.head_dim
        self._scratch = [(self.k.new_zeros(n), self.v.new_zeros(n)) for _ in range(g.layers)]
        self.scratch_batch = max_batch
        self._steady_keys = g.resident_frames * g.tokens_per_frame + room
        self._steady_rows = self._past_buffers(max_batch, self._steady_keys)  # commit's view of the rows
        self._mirrors = [None] * max_batch

    def scratch_past(self, batch: int, keys: int) -> list[KV]:
        """The views :meth:`gather` returns for ``batch`` sessions whose past holds ``keys`` keys
        (room included: a full window's, or a first block's room alone), for the caller to write
        (the rows then hold no slot's frames)."""
        assert self._scratch is not None and batch <= self.scratch_batch, "reserve_scratch first"
        self._mirrors = [None] * self.scratch_batch
        return self._past_buffers(batch, keys)

    def _held_rows(self, ids: list[int], keys: int) -> set[int]:
        """Rows of a gather into the scratch that already hold their slot's frames (no copy
        needed); every row holds its slot once the gather is done. A gather in another layout
        moves every row's start, so no row holds a slot after it."""
        if self._scratch is None or len(ids) > self.scratch_batch:
            return set()
        if keys != self._steady_keys:
            self._mirrors = [None] * self.scratch_batch
            return set()
        held = {row for row, slot in enumerate(ids) if self._mirrors[row] == slot}
        for row, slot in enumerate(ids):
            self._mirrors = [None if m == slot else m for m in self._mirrors]  # one row per slot
            self._mirrors[row] = slot
        return held

    def _past_buffers(self, batch: int, keys: int) -> list[KV]:
        """Per layer K and V ``[batch, keys, H, D]``: views of the scratch when it holds them, else fresh."""
        shape = (batch, keys, *self.k.shape[3:])
        if self._scratch is None or batch > self.scratch_batch:
            return [(self.k.new_empty(shape), self.v.new_empty(shape)) for _ in range(self.geometry.layers)]
        n = batch * keys * shape[2] * shape[3]
        return [(k[:n].view(shape), v[:n].view(shape)) for k, v in self._scratch]

    def holder(self, slot: int) -> str | None:
        """The session holding ``slot``, if any."""
        return next((sid for sid, index in self._slot_of.items() if index == slot), None)

    def release(self, session_id: str) -> None:
        slot = self._slot_of.pop(session_id, None)
        if slot is not None:
            self.frame_pos[slot] = -1

    def clear(self, session_id: str) -> None:
        self.frame_pos[self._slot_of[session_id]] = -1

    def slot_ids(self, sessions: Sequence[str]) -> list[int]:
        return [self._slot_of[s] for s in sessions]

    def _index(self, frame: int) -> int:
        g = self.geometry
        return frame if frame < g.sink_frames else g.sink_frames + (frame - g.sink_frames) % g.window_frames

    def gather(
        self, sessions: Sequence[str], block_starts: Sequence[int], room: int = 0
    ) -> tuple[list[KV] | None, Tensor | None]:
        """Past K/V per layer ``[B, L*T + room, H, D]`` and the visible-key mask ``[B, L*T]``
        (``None`` when every gathered key is visible), where ``L`` is the shortest prefix of
        frame slots that holds every frame visible to the batch (0 when no session sees a frame:
        the past is the room alone; ``(None, None)`` if there is no room either). Decided on the
        host: no device sync. The buffers are fresh, or views of the scratch
        (:meth:`reserve_scratch`), valid until the next gather."""
        g = self.geometry
        ids = self.slot_ids(sessions)
        slots = torch.tensor(ids, dtype=torch.long)
        pos = self.frame_pos[slots]  # [B, R]
        start = torch.tensor(block_starts, dtype=torch.long)[:, None]
        visible = (pos >= 0) & (pos < start) & ((pos < g.sink_frames) | (pos >= start - g.window_frames))
        seen = visible.any(0).nonzero()
        frames = int(seen[-1]) + 1 if len(seen) else 0
        if not frames and not room:
            return None, None
        visible = visible[:, :frames]  # a filling window is a prefix of the slots
        mask = (
            None
            if bool(visible.all())
            else to_device(visible.repeat_interleave(g.tokens_per_frame, dim=1), self.k, torch.bool)
        )
        length = visible.shape[1] * g.tokens_per_frame
        past = self._past_buffers(len(ids), length + room)
        held = self._held_rows(ids, length + room)
        copies = [(row, slot) for row, slot in enumerate(ids) if row not in held and length]
        for layer, (k, v) in enumerate(past):
            for row, slot in copies:  # slice copies: one pass over the bytes, no index temp
                k[row, :length].copy_(self.k[layer, slot, :length])
                v[row, :length].copy_(self.v[layer, slot, :length])
        return past, mask

    def commit(self, sessions: Sequence[str], block_starts: Sequence[int], kv: list[KV]) -> None:
        """Write the clean-pass K/V (``[B, fpb*T, H, D]`` per layer) of each session's block, in
        its slot and in the scratch row that holds the slot, if one does (``_held_rows``).

        One ``_foreach_copy_`` for the whole batch: a run of the block's frames that lands in
        consecutive frame slots (all of them, but where the ring wraps) is one slice per layer,
        K or V and destination, so a Self-Forcing block is 120 slices in a few multi-tensor
        launches instead of 360 copies launched one by one from Python."""
        tpf = self.geometry.tokens_per_frame
        dsts: list[Tensor] = []
        srcs: list[Tensor] = []
        for b, (slot, start) in enumerate(zip(self.slot_ids(sessions), block_starts, strict=True)):
            row = self._mirrors.index(slot) if slot in self._mirrors else None
            for first, index, count in self._runs(start):
                src, dst, n = first * tpf, index * tpf, count * tpf
                for layer, (k, v) in enumerate(kv):
                    targets = [(self.k[layer, slot], self.v[layer, slot])]
                    if row is not None:
                        held_k, held_v = self._steady_rows[layer]
                        targets.append((held_k[row], held_v[row]))
                    for to_k, to_v in targets:
                        dsts += [to_k[dst : dst + n], to_v[dst : dst + n]]
                        srcs += [k[b, src : src + n], v[b, src : src + n]]
            for j in range(self.geometry.frames_per_block):
                self.frame_pos[slot, self._index(start + j)] = start + j
        torch._foreach_copy_(dsts, srcs)

    def _runs(self, start: int) -> list[tuple[int, int, int]]:
        """The frames of a block starting at frame ``start`` as runs in consecutive frame slots:
        ``(first frame of the block, its slot index, frames)`` each."""
        runs: list[tuple[int, int, int]] = []
        for j in range(self.geometry.frames_per_block):
            index = self._index(start + j)
            if runs and runs[-1][1] + runs[-1][2] == index:
                runs[-1] = (runs[-1][0], runs[-1][1], runs[-1][2] + 1)
            else:
                runs.append((j, index, 1))
        return runs

    def set_cross(self, sessions: Sequence[str], kv: list[KV]) -> None:
        """Store each session's prompt cross-attention K/V (``[B, L, H, D]`` per layer)."""
        idx = to_device(torch.tensor(self.slot_ids(sessions)), self.k, torch.long)
        for layer, (k, v) in enumerate(kv):
            self.cross_k[layer, idx] = k
            self.cross_v[layer, idx] = v

    def cross(self, sessions: Sequence[str]) -> list[KV]:
        """Each layer's prompt cross-attention K/V of ``sessions`` (``[B, L, H, D]``): views of one
        gather over every layer (two index kernels, not two per layer)."""
        idx = to_device(torch.tensor(self.slot_ids(sessions)), self.k, torch.long)
        k, v = self.cross_k[:, idx], self.cross_v[:, idx]
        return list(zip(k.unbind(0), v.unbind(0), strict=True))

    def snapshot(self, session_id: str) -> tuple[Tensor, ...]:
        """Copies of one slot's state, for tests of transactionality."""
        slot = self._slot_of[session_id]
        return (
            self.k[:, slot].clone(),
            self.v[:, slot].clone(),
            self.cross_k[:, slot].clone(),
            self.cross_v[:, slot].clone(),
            self.frame_pos[slot].clone(),
        )
