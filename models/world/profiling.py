"""Where a world block's time goes inside the model stages, behind one seam that is free when off.

A :class:`Profiler` is given to the model once (``WorldModel.build(profiler=...)``). The default,
:data:`OFF`, records nothing: a mark is an empty method call, no CUDA event exists, and no block
carries timings. :class:`DeviceProfiler` (the world kind's ``world.stage_timing``) records each
mark as a CUDA event on the current stream (device time) on CUDA, or as the host clock on the CPU.

Marks go to the innermost :meth:`Profiler.collect` of the calling thread, so the block stage's
thread and the decode stage's thread each collect their own. Who marks what:

- the model, around a forward of the block stage: ``begin`` (before its first work on the DiT
  stream: the prompt K/V, the gather, the inputs) and ``committed`` (after its KV commit);
- the sampler, around the DiT passes of a block: ``denoise`` (before the first denoise pass),
  ``denoised`` (after the last), ``clean`` and ``cleaned`` (around the committing clean pass);
- the decode stage: ``decode`` (its decoder forward starts, after the wait for the DiT),
  ``decoded``, ``copied`` (the frames' device-to-host copy queued).

Marks are read only after the decode stage's wait for the frames' copy, the one point where this
path already waits for the GPU (the DiT's marks precede the event the decode stream waited for),
so timing adds no synchronisation. :func:`block_timings` turns one block's marks into
:class:`BlockTimings`, which travel with its media to the kind's ``world_stage_seconds``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

Mark = torch.cuda.Event | float  # a recorded CUDA event, or a time.perf_counter() on the CPU
Marks = dict[str, Mark]


class Profiler:
    """The seam, off: :meth:`mark` records nothing and :meth:`collect` yields an empty record."""

    def mark(self, name: str) -> None:
        """Mark the calling thread's work at this point as ``name`` (off: nothing)."""

    @contextmanager
    def collect(self) -> Iterator[Marks]:
        """The marks this thread makes inside the block, by name (filled once it exits)."""
        yield {}


OFF = Profiler()


class DeviceProfiler(Profiler):
    """Marks as CUDA events on the current stream (``cuda``) or host clocks."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self._local = threading.local()

    def mark(self, name: str) -> None:
        marks: Marks | None = getattr(self._local, "marks", None)
        if marks is None:
            return
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            marks[name] = event
        else:
            marks[name] = time.perf_counter()

    @contextmanager
    def collect(self) -> Iterator[Marks]:
        outer = getattr(self._local, "marks", None)
        self._local.marks = marks = {}
        try:
            yield marks
        finally:
            self._local.marks = outer


def elapsed_ms(start: Mark, end: Mark) -> float:
    """Milliseconds between two marks; CUDA marks must have completed (no wait here)."""
    if isinstance(start, float):
        return (end - start) * 1000.0  # type: ignore[operator]
    return float(start.elapsed_time(end))  # type: ignore[arg-type]


@dataclass(frozen=True)
class BlockTimings:
    """Where one block's time went inside the model stages (device time on CUDA, host time on
    the CPU). ``started_at`` is ``time.monotonic()`` when the block stage's forward began, i.e.
    when the engine picked the batch: the kind measures the queue wait up to it."""

    started_at: float
    # host time of the block stage's forward: queueing the DiT's work (CUDA), doing it (CPU)
    launch_ms: float
    # the DiT stream from the previous forward's clean pass to this forward's first pass: the
    # KV commit and gather, inputs and noise, plus any idle while the host had not launched it
    # (0 for the stage's first forward)
    gap_ms: float
    # the part of the gap the DiT stream sat idle, from the previous forward's commit to this
    # forward's first work: a ``begin`` event the host records while the GPU is still busy reads
    # as the previous work's end (idle 0), one recorded late reads as the host's clock. So a
    # nonzero idle is GPU time lost waiting for the host (0 for the stage's first forward)
    idle_ms: float
    denoise_ms: float  # the staged denoise passes (with the re-noising between them)
    clean_ms: float  # the committing clean pass
    decode_ms: float  # the VAE decoder forward (with the uint8 conversion)
    d2h_ms: float  # the frames' copy to host memory


DIT_MARKS = ("begin", "denoise", "denoised", "clean", "cleaned", "committed")
DECODE_MARKS = ("decode", "decoded", "copied")


def block_timings(
    started_at: float, launch_ms: float, dit: Marks, previous: Marks | None, decode: Marks
) -> BlockTimings | None:
    """One block's timings from its DiT forward's marks (``previous``: the stage's forward before
    it) and its decode's, once they completed; ``None`` if either lacks a mark (profiling off)."""
    if any(name not in dit for name in DIT_MARKS) or any(name not in decode for name in DECODE_MARKS):
        return None
    gap_ms = (
        0.0 if not previous or "cleaned" not in previous else elapsed_ms(previous["cleaned"], dit["denoise"])
    )
    idle_ms = (
        0.0
        if not previous or "committed" not in previous
        else elapsed_ms(previous["committed"], dit["begin"])
    )
    return BlockTimings(
        started_at,
        launch_ms,
        max(0.0, gap_ms),
        max(0.0, idle_ms),
        elapsed_ms(dit["denoise"], dit["denoised"]),
        elapsed_ms(dit["clean"], dit["cleaned"]),
        elapsed_ms(decode["decode"], decode["decoded"]),
        elapsed_ms(decode["decoded"], decode["copied"]),
    )
