"""The temporal transformer's KV, resident in place per slot: ``[slots, layers, 2, heads, context, head_dim]``.

Allocated once for ``slot_capacity`` sessions and never grown or concatenated: a step writes each
session's new key and value at its position's index and attends over the slot's whole row with a
visibility mask, so rows at different positions batch together.

Positions and rolling (sink + window, StreamingLLM's scheme):

- Keys are stored **roped with their absolute frame index** ``f``; the query of step ``t`` is
  roped with ``t``. RoPE scores depend only on ``t - f``, so before the context fills (``t <
  context``) a cached step equals a full causal recompute of the stream.
- Frame ``f`` lives at index ``f`` while ``f < context``; later frames overwrite the ring of
  ``window = context - sink`` indices after the sink: ``sink + (f - sink) % window``. Step ``t``
  therefore sees the ``sink`` first frames and the last ``window`` frames (itself included).
- After a roll the window keys keep their true distances (at most ``window``), and the sink keys
  are **re-rotated at read time** by ``shift = t - (context - 1)``, as if the kept frames sat at
  positions ``0 .. context - 1``: no distance ever exceeds the context the model works in. Only
  the ``sink`` keys are rotated per step (cheap); nothing stored is re-roped.

Transactionality: the write at step ``t`` replaces, after a roll, the frame ``t - window``, which
step ``t`` itself no longer sees, and an unrolled step writes past every visible frame; a step
that fails before its commit is retried as the same step ``t``, which rewrites the same index.
So the in-place write never changes what any future step reads.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from models.duplex.configs import DuplexModelConfig
from models.world.dit import rope


@dataclass(frozen=True)
class KVGeometry:
    layers: int
    heads: int
    head_dim: int
    context: int
    sink: int
    dtype_bytes: int

    @classmethod
    def of(cls, cfg: DuplexModelConfig, dtype: torch.dtype) -> KVGeometry:
        size = torch.empty((), dtype=dtype, device="meta").element_size()
        return cls(cfg.layers, cfg.heads, cfg.head_dim, cfg.context, cfg.sink, size)

    @property
    def bytes_per_session(self) -> int:
        return self.layers * 2 * self.heads * self.context * self.head_dim * self.dtype_bytes


@dataclass(frozen=True)
class StepRows:
    """The rows of one batched step: pool ``slots [B]`` at positions ``t [B]`` (on the device);
    ``span``, the same slots as a contiguous range when they are one (read as views of the pool,
    not a gathered copy); ``rolled``, whether any row is past the context (host-side, so the
    sink re-rotation costs no device sync when nothing rolled)."""

    slots: Tensor
    t: Tensor
    span: range | None
    rolled: bool

    @classmethod
    def of(cls, slots: list[int], steps: list[int], context: int, device: str) -> StepRows:
        span = range(min(slots), max(slots) + 1)
        return cls(
            torch.tensor(slots, dtype=torch.long, device=device),
            torch.tensor(steps, dtype=torch.long, device=device),
            span if len(span) == len(slots) and slots == list(span) else None,
            max(steps) >= context,
        )


class SlotKV:
    def __init__(
        self, geometry: KVGeometry, slots: int, dtype: torch.dtype, device: str, theta: float
    ) -> None:
        g = self.geometry = geometry
        self.theta = theta
        self.kv = torch.zeros(slots, g.layers, 2, g.heads, g.context, g.head_dim, dtype=dtype, device=device)

    def index(self, t: Tensor) -> Tensor:
        """The ring index of frame ``t [B]``."""
        g = self.geometry
        window = g.context - g.sink
        return torch.where(t < g.context, t, g.sink + (t - g.sink) % window)

    def write(self, layer: int, rows: StepRows, k: Tensor, v: Tensor) -> None:
        """Store each row's roped key and value ``[B, heads, head_dim]`` of frame ``rows.t`` in place."""
        idx = self.index(rows.t)
        self.kv[rows.slots, layer, 0, :, idx] = k
        self.kv[rows.slots, layer, 1, :, idx] = v

    def read(self, layer: int, rows: StepRows) -> tuple[Tensor, Tensor, Tensor]:
        """Keys and values ``[B, heads, context, head_dim]`` and the mask ``[B, 1, 1, context]``
        (True = attend) that each row's step sees; sink keys re-rotated after a roll."""
        g, t, span = self.geometry, rows.t, rows.span
        pool = self.kv[span.start : span.stop, layer] if span is not None else self.kv[rows.slots, layer]
        k, v = pool[:, 0], pool[:, 1]
        if g.sink and rows.rolled:
            shift = (t - (g.context - 1)).clamp(min=0)
            k = k.clone()  # rotate a copy: the pool keeps keys roped at their absolute positions
            sink = k[:, :, : g.sink].transpose(1, 2)  # [B, sink, H, Dh]
            k[:, :, : g.sink] = rope(sink, shift[:, None].expand(-1, g.sink), self.theta).transpose(1, 2)
        visible = torch.arange(g.context, device=t.device)[None, :] <= t[:, None]
        return k, v, visible[:, None, None, :]

    def reset(self, slot: int) -> None:
        self.kv[slot].zero_()
