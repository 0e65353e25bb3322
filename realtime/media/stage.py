"""``MediaEncodeStage``: the last stage of the world pipeline, encoding decoded frames for the wire.

A stateful batched stage (``models/stage.py``) on its own CPU worker thread, so encoding block k
overlaps the decoding and denoising of the blocks after it. Per slot it keeps the session's H.264
stream (``fmp4``: one init segment, then one fragment per block, decode times continuing); a
block 0 starts a new stream (session start and every reset). ``jpeg`` blocks are stateless.
The item's payload is a :class:`models.world.stage.WorldFrames` whose ``extra`` is a
:class:`MediaSettings`; the output is :class:`EncodedMedia`.

With ``threads`` > 1 (``world.encode_threads``) a batch's encoding runs on a pool of that many
threads (FFmpeg encodes without the GIL): each JPEG block is split into up to ``threads`` runs of
frames and every session's fMP4 block is one task, all submitted at once, so the blocks of a
batched round (4 sessions x 12 frames) and the frames of one block no longer encode one after
another on the stage's single worker thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from models.stage import StageItem
from models.world.model import HeldBlock
from models.world.profiling import BlockTimings
from models.world.stage import WorldFrames
from realtime.media.video import Fmp4Encoder, encode_jpegs, pack_jpeg_batch
from sessions.threads import prestarted_pool


@dataclass(frozen=True)
class MediaSettings:
    format: str  # "jpeg" or "fmp4"
    fps: int
    jpeg_quality: int = 85


@dataclass(frozen=True)
class EncodedMedia:
    data: bytes
    init_bytes: int  # leading init-segment bytes of ``data`` (fmp4, first block of a stream)
    frame_count: int
    width: int
    height: int
    forward_ms: float
    decode_ms: float
    encode_ms: float  # the encode stage's forward (its whole batch: the blocks leave together)
    batch_size: int
    timings: BlockTimings | None = None  # the model stages' (``WorldFrames.timings``)
    held: HeldBlock | None = None  # the block as a restore needs it (``WorldFrames.held``)


class MediaEncodeStage:
    device = "cpu"

    def __init__(self, slot_capacity: int, name: str = "world-encode", threads: int = 1) -> None:
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        self.name = name
        self.slot_capacity = slot_capacity
        self.threads = threads
        self._streams: list[Fmp4Encoder | None] = [None] * slot_capacity
        self._pool = prestarted_pool(threads, name) if threads > 1 else None

    def state_bytes(self) -> int:
        return 0  # encoder state is a few KiB of host memory

    def open_state(self, session_id: str, slot: int) -> None:
        self._streams[slot] = None

    def release_state(self, session_id: str, slot: int, state: object) -> None:
        self._streams[slot] = None

    def forward(self, items: Sequence[StageItem]) -> list[EncodedMedia | Exception]:
        t0 = time.perf_counter()
        # every task of the batch is submitted before any is awaited: no task waits on another
        tasks = [self._tasks(item.slot, item.payload) for item in items]
        encoded = [self._collect(item.payload, parts) for item, parts in zip(items, tasks, strict=True)]
        ms = (time.perf_counter() - t0) * 1000.0  # every block of the batch leaves when all are done
        return [
            out if isinstance(out, Exception) else _media(item.payload, *out, ms)
            for item, out in zip(items, encoded, strict=True)
        ]

    def _tasks(self, slot: int, block: WorldFrames) -> list[Future]:
        """The block's encoding as pool tasks: runs of JPEG frames, or one fMP4 fragment."""
        settings: MediaSettings = block.extra
        frames = block.frames.numpy()
        if settings.format == "fmp4":
            return [self._run(self._fragment, slot, block.block, settings.fps, frames)]
        step = max(1, -(-len(frames) // self.threads))
        runs = [frames[i : i + step] for i in range(0, len(frames), step)] or [frames]
        return [self._run(encode_jpegs, run, settings.jpeg_quality) for run in runs]

    def _run(self, fn: Callable[..., Any], *args: Any) -> Future:
        if self._pool is not None:
            return self._pool.submit(fn, *args)
        done: Future = Future()
        try:
            done.set_result(fn(*args))
        except Exception as exc:
            done.set_exception(exc)
        return done

    def _fragment(self, slot: int, block: int, fps: int, frames: Any) -> tuple[bytes, int]:
        stream = self._streams[slot]
        if stream is None or block == 0:
            stream = self._streams[slot] = Fmp4Encoder(frames.shape[2], frames.shape[1], fps)
        init, fragment = stream.encode(frames)
        return init + fragment, len(init)

    @staticmethod
    def _collect(block: WorldFrames, parts: list[Future]) -> tuple[bytes, int] | Exception:
        """(data, init-segment bytes) of one block, or its error (the other blocks are encoded)."""
        try:
            if block.extra.format == "fmp4":
                return parts[0].result()
            return pack_jpeg_batch([image for part in parts for image in part.result()]), 0
        except Exception as exc:
            return exc


def _media(block: WorldFrames, data: bytes, init_bytes: int, encode_ms: float) -> EncodedMedia:
    count, height, width = block.frames.shape[0], block.frames.shape[1], block.frames.shape[2]
    return EncodedMedia(
        data,
        init_bytes,
        count,
        width,
        height,
        block.forward_ms,
        block.decode_ms,
        encode_ms,
        block.batch_size,
        block.timings,
        block.held,
    )
