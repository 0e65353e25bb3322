"""The temporal transformer's KV, resident in place per slot: ``[slots, layers, 2, heads, context + 1, head_dim]``.

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

Scratch column: every slot row has one column past the context, ``context``, that no row ever
sees. A padding row of a bucketed step (``t = -1``: a CUDA graph runs a fixed batch of pool rows
``0 .. b - 1``, some of which are not stepping) writes its key and value there, so padding never
changes a session's KV; the row sees only that column (no row attends over nothing).

Per-step traffic: each layer reads the batch's rows of the pool as views when they are one
contiguous range (always in the bucketed form), a gathered copy otherwise; after a roll, the
``sink`` keys are rotated **in place** and restored right after the layer's attention (a copy of
``sink`` columns, never of the whole row).

Transactionality: the write at step ``t`` replaces, after a roll, the frame ``t - window``, which
step ``t`` itself no longer sees, and an unrolled step writes past every visible frame; a step
that fails before its commit is retried as the same step ``t``, which rewrites the same index.
So the in-place write never changes what any future step reads.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from models.duplex import kv_fp8
from models.duplex.configs import DuplexModelConfig
from models.rope import rope


@dataclass(frozen=True)
class KVGeometry:
    layers: int
    heads: int
    head_dim: int
    context: int
    sink: int
    dtype_bytes: int
    scale_bytes: int = 0  # per stored vector (FP8 storage: its float32 scale)

    @classmethod
    def of(cls, cfg: DuplexModelConfig, dtype: torch.dtype, fp8: bool = False) -> KVGeometry:
        """The KV of ``cfg`` stored in ``dtype``, or in FP8 with a scale per vector (``fp8``)."""
        if fp8:
            return cls(cfg.layers, cfg.heads, cfg.head_dim, cfg.context, cfg.sink, 1, kv_fp8.SCALE_BYTES)
        size = torch.empty((), dtype=dtype, device="meta").element_size()
        return cls(cfg.layers, cfg.heads, cfg.head_dim, cfg.context, cfg.sink, size)

    @property
    def columns(self) -> int:
        """KV positions stored per slot: the context and the scratch column."""
        return self.context + 1

    @property
    def fp8(self) -> bool:
        return self.scale_bytes > 0

    @property
    def bytes_per_session(self) -> int:
        per_vector = self.head_dim * self.dtype_bytes + self.scale_bytes
        return self.layers * 2 * self.heads * self.columns * per_vector


@dataclass(frozen=True)
class StepRows:
    """The rows of one batched step: pool ``slots [B]`` at positions ``t [B]`` (on the device;
    ``t = -1`` marks a padding row); ``span``, the same slots as a contiguous range when they are
    one (read as views of the pool, not a gathered copy); ``rolled``, whether any row may be past
    the context (host-side, so the sink re-rotation costs nothing when nothing rolled)."""

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

    @classmethod
    def bucket(cls, t: Tensor) -> StepRows:
        """Pool rows ``0 .. len(t) - 1`` at positions ``t`` (``-1``: padding), with no host-side
        knowledge: the form a CUDA graph captures once per bucket (any row may have rolled)."""
        b = t.shape[0]
        return cls(torch.arange(b, device=t.device), t, range(b), True)


@dataclass(frozen=True)
class StepView:
    """What every layer of one step shares: the column each row writes ``[B]``, the visibility
    mask ``[B, 1, 1, columns]`` (True = attend), and the sink keys' read positions ``[B, sink]``
    (None when no row rolled or there is no sink)."""

    columns: Tensor
    visible: Tensor
    sink_positions: Tensor | None


class SlotKV:
    """The pool; ``geometry.fp8`` stores it as FP8 with a float32 scale per vector
    (``models/duplex/kv_fp8.py``), in ``scales [slots, layers, 2, heads, columns]``."""

    def __init__(
        self, geometry: KVGeometry, slots: int, dtype: torch.dtype, device: str, theta: float
    ) -> None:
        g = self.geometry = geometry
        self.theta = theta
        stored = kv_fp8.FP8 if g.fp8 else dtype
        self.kv = torch.zeros(slots, g.layers, 2, g.heads, g.columns, g.head_dim, dtype=stored, device=device)
        self.scales = (
            torch.zeros(slots, g.layers, 2, g.heads, g.columns, dtype=torch.float32, device=device)
            if g.fp8
            else None
        )

    def index(self, t: Tensor) -> Tensor:
        """The ring index of frame ``t [B]`` (``t >= 0``)."""
        g = self.geometry
        window = g.context - g.sink
        return torch.where(t < g.context, t, g.sink + (t - g.sink) % window)

    def view(self, rows: StepRows) -> StepView:
        """The step's shared tensors (computed once per step, not per layer)."""
        g, t = self.geometry, rows.t
        columns = torch.where(t >= 0, self.index(t), g.context)
        col = torch.arange(g.columns, device=t.device)[None, :]
        visible = ((col <= t[:, None]) & (col < g.context)) | (col == columns[:, None])
        sink = None
        if g.sink and rows.rolled:
            shift = (t - (g.context - 1)).clamp(min=0)  # 0 (an exact identity) for unrolled rows
            sink = shift[:, None].expand(-1, g.sink)
        return StepView(columns, visible[:, None, None, :], sink)

    def attend(self, layer: int, rows: StepRows, view: StepView, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """Store each row's roped key and value (``k / v [B, heads, 1, head_dim]``) in place at
        its column, then attend ``q [B, heads, 1, head_dim]`` over what the row sees: the sink keys
        re-rotated after a roll, as if the kept frames sat at positions ``0 .. context - 1``."""
        if self.scales is not None:
            return self._attend_fp8(layer, rows, view, q, k, v)
        self.kv[rows.slots, layer, 0, :, view.columns] = k[:, :, 0]
        self.kv[rows.slots, layer, 1, :, view.columns] = v[:, :, 0]
        span = rows.span
        pool = self.kv[span.start : span.stop, layer] if span is not None else self.kv[rows.slots, layer]
        keys, values = pool[:, 0], pool[:, 1]
        if view.sink_positions is None:
            return F.scaled_dot_product_attention(q, keys, values, attn_mask=view.visible)
        sink = keys[:, :, : self.geometry.sink]  # a view of the pool (or of the gathered copy)
        stored = sink.clone()
        sink.copy_(rope(stored.transpose(1, 2), view.sink_positions, self.theta).transpose(1, 2))
        try:
            return F.scaled_dot_product_attention(q, keys, values, attn_mask=view.visible)
        finally:
            sink.copy_(stored)  # the pool keeps keys roped at their absolute positions

    def _attend_fp8(
        self, layer: int, rows: StepRows, view: StepView, q: Tensor, k: Tensor, v: Tensor
    ) -> Tensor:
        """:meth:`attend` over FP8 storage: each vector quantized as it is written; the read is
        the fused kernel, or after a roll with a sink, a dequantized copy whose sink keys are
        re-rotated (the stored bytes never change). The bucketed form assumes any row may have
        rolled, so a model with a sink (``duplex-small``) always reads the copy there; Moshi's
        shape has none (``moshi-7b-shaped``: sink 0)."""
        assert self.scales is not None
        for i, x in enumerate((k, v)):
            values, scales = kv_fp8.quantize(x[:, :, 0])
            self.kv[rows.slots, layer, i, :, view.columns] = values
            self.scales[rows.slots, layer, i, :, view.columns] = scales
        span = rows.span
        if span is not None:
            pool, scales = self.kv[span.start : span.stop, layer], self.scales[span.start : span.stop, layer]
        else:
            pool, scales = self.kv[rows.slots, layer], self.scales[rows.slots, layer]
        if view.sink_positions is None:
            return kv_fp8.attend(q, pool[:, 0], pool[:, 1], scales[:, 0], scales[:, 1], view.visible)
        keys = kv_fp8.dequantize(pool[:, 0], scales[:, 0], q.dtype)
        values = kv_fp8.dequantize(pool[:, 1], scales[:, 1], q.dtype)
        sink = keys[:, :, : self.geometry.sink]
        sink.copy_(rope(sink.transpose(1, 2), view.sink_positions, self.theta).transpose(1, 2))
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=view.visible)

    def store(self, slot: int, layer: int, columns: Tensor, k: Tensor, v: Tensor) -> None:
        """Write one slot's keys and values ``[heads, N, head_dim]`` of ``layer`` at ``columns
        [N]`` (a prefill; FP8 storage quantizes them as a step does)."""
        for i, x in enumerate((k, v)):
            if self.scales is None:
                self.kv[slot, layer, i][:, columns] = x
            else:
                values, scales = kv_fp8.quantize(x)
                self.kv[slot, layer, i][:, columns] = values
                self.scales[slot, layer, i][:, columns] = scales

    def reset(self, slot: int) -> None:
        self.kv[slot].zero_()
        if self.scales is not None:
            self.scales[slot].zero_()
