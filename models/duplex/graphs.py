"""The speech LM's step over buckets of pool rows, replayed from CUDA graphs on CUDA.

Eagerly the step launches thousands of small kernels (32 temporal layers, the depth transformer's
``n_q x depth_layers`` blocks, sampling): at Moshi-7B's shape it costs ~50 ms at any batch size,
launch-bound. A CUDA graph replays them without the host in the loop.

The bucketed form (:meth:`DuplexLM.bucket_step`): a step of bucket ``b`` computes pool rows
``0 .. b - 1``, the smallest bucket holding the batch's highest slot (the engine hands out the
lowest free slot first, so ``n`` sessions sit in about the first ``n`` rows). Rows of the bucket
that are not in the batch are **padding**: position ``-1``, which writes its key and value into
the slot row's scratch column (never a session's KV, see ``kv_cache.py``) and gives tokens that
are dropped. Their previous tokens and seeds are whatever their rows hold (read, never written:
the stage commits the batch's rows only). The KV is read as views of rows ``0 .. b - 1``: no copy.

Buckets: :func:`models.cuda_graphs.buckets` of the slot capacity with step 8 (1, 2, 4, 8, 16,
24, ...): a padding row reads a whole KV row, so buckets are finer than powers of two. Every
bucket is captured at construction (``capture``), from padding rows only, so the warm-up runs
touch no session.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from models.cuda_graphs import BatchGraphs, buckets
from models.duplex.kv_cache import SlotKV
from models.duplex.lm import BOS, DuplexLM

# eager: the step over the batch's rows; buckets: the bucketed form run eagerly (what a graph
# replays, on any device); cuda_graphs: the bucketed form replayed from CUDA graphs.
StepMode = Literal["eager", "buckets", "cuda_graphs"]
BUCKET_STEP = 8  # bucket sizes are multiples of this above it (powers of two below)


class BucketedStep:
    """:meth:`DuplexLM.bucket_step` per bucket of pool rows (see the module docstring); with
    ``graphs`` (CUDA only) every bucket is captured here and replayed per call."""

    def __init__(self, lm: DuplexLM, kv: SlotKV, slot_capacity: int, device: str, graphs: bool) -> None:
        self.lm, self.kv, self.device = lm, kv, device
        self.sizes = buckets(slot_capacity, BUCKET_STEP)
        self.graphs: BatchGraphs | None = None
        if graphs:
            self.graphs = BatchGraphs(
                partial(lm.bucket_step, kv), slot_capacity, sizes=self.sizes, stateful=True
            )
            with torch.inference_mode():
                self.graphs.capture(self._padding(self.sizes[-1]))

    def __call__(
        self,
        slots: Sequence[int],
        steps: np.ndarray,
        rows: Tensor,
        user: Tensor,
        text: Tensor,
        audio: Tensor,
        seeds: Tensor,
    ) -> tuple[Tensor, Tensor]:
        """Text ``[B]`` and audio ``[B, n_q]`` tokens of the batch ``slots`` (host, ascending;
        ``rows`` the same on the device) at positions ``steps``, with this frame's ``user [B, n_q]``
        codes; ``text``, ``audio``, ``seeds`` are the stage's per-slot pools (read only)."""
        b = next(s for s in self.sizes if s > slots[-1])
        t = np.full(b, -1, dtype=np.int64)
        t[list(slots)] = steps
        codes = user.new_zeros(b, user.shape[1])
        codes[rows] = user
        inputs = (text[:b], audio[:b], codes, seeds[:b], torch.from_numpy(t).to(self.device))
        out = self.graphs(*inputs) if self.graphs is not None else self.lm.bucket_step(self.kv, *inputs)
        out = out[rows]
        return out[:, 0], out[:, 1:]

    def _padding(self, b: int) -> tuple[Tensor, ...]:
        """Inputs of ``b`` padding rows (their writes go to the scratch column only)."""
        n_q, device = self.lm.cfg.n_q, self.device
        return (
            torch.full((b,), BOS, dtype=torch.long, device=device),
            torch.full((b, n_q), self.lm.start_audio, dtype=torch.long, device=device),
            torch.zeros(b, n_q, dtype=torch.long, device=device),
            torch.zeros(b, dtype=torch.long, device=device),
            torch.full((b,), -1, dtype=torch.long, device=device),
        )
