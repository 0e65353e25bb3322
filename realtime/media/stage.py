"""``MediaEncodeStage``: the last stage of the world pipeline, encoding decoded frames for the wire.

A stateful batched stage (``models/stage.py``) on its own CPU worker thread, so encoding block k
overlaps the decoding and denoising of the blocks after it. Per slot it keeps the session's H.264
stream (``fmp4``: one init segment, then one fragment per block, decode times continuing); a
block 0 starts a new stream (session start and every reset). ``jpeg`` blocks are stateless.
The item's payload is a :class:`models.world.stage.WorldFrames` whose ``extra`` is a
:class:`MediaSettings`; the output is :class:`EncodedMedia`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from models.stage import StageItem
from models.world.stage import WorldFrames
from realtime.media.video import Fmp4Encoder, encode_jpeg_batch


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
    encode_ms: float
    batch_size: int


class MediaEncodeStage:
    device = "cpu"

    def __init__(self, slot_capacity: int, name: str = "world-encode") -> None:
        self.name = name
        self.slot_capacity = slot_capacity
        self._streams: list[Fmp4Encoder | None] = [None] * slot_capacity

    def state_bytes(self) -> int:
        return 0  # encoder state is a few KiB of host memory

    def open_state(self, session_id: str, slot: int) -> None:
        self._streams[slot] = None

    def release_state(self, session_id: str, slot: int, state: object) -> None:
        self._streams[slot] = None

    def forward(self, items: Sequence[StageItem]) -> list[EncodedMedia | Exception]:
        return [self._encode(item.slot, item.payload) for item in items]

    def _encode(self, slot: int, block: WorldFrames) -> EncodedMedia | Exception:
        t0 = time.perf_counter()
        settings: MediaSettings = block.extra
        frames = block.frames.numpy()
        count, height, width = frames.shape[0], frames.shape[1], frames.shape[2]
        try:
            if settings.format == "fmp4":
                stream = self._streams[slot]
                if stream is None or block.block == 0:
                    stream = self._streams[slot] = Fmp4Encoder(width, height, settings.fps)
                init, fragment = stream.encode(frames)
                data, init_bytes = init + fragment, len(init)
            else:
                data, init_bytes = encode_jpeg_batch(frames, settings.jpeg_quality), 0
        except Exception as exc:  # this block only; the others of the batch are encoded
            return exc
        ms = (time.perf_counter() - t0) * 1000.0
        return EncodedMedia(
            data, init_bytes, count, width, height, block.forward_ms, block.decode_ms, ms, block.batch_size
        )
