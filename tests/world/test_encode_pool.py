"""``MediaEncodeStage`` with an encode pool (``world.encode_threads``): the blocks of a batch and
the frames of one block encode on several threads at once, to the same bytes as one thread."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from models.stage import StageItem
from models.world.stage import WorldFrames
from realtime.media import stage as media_stage
from realtime.media.stage import EncodedMedia, MediaEncodeStage, MediaSettings
from realtime.media.video import Fmp4Decoder, decode_jpeg_batch


def _frames(seed: int, count: int = 5) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    ramp = np.linspace(0, 255, 64 * 48 * 3).reshape(48, 64, 3)
    return torch.from_numpy(
        np.stack([(ramp + rng.integers(0, 40, ramp.shape)) % 256 for _ in range(count)]).astype(np.uint8)
    )


def _items(fmt: str, sessions: int = 3, block: int = 0, frames: int = 5) -> list[StageItem]:
    settings = MediaSettings(fmt, 16)
    return [
        StageItem(
            f"s{i}",
            0,
            WorldFrames(_frames(i + 10 * block, frames), block, 1.0, 1.0, sessions, settings),
            slot=i,
        )
        for i in range(sessions)
    ]


@pytest.mark.parametrize("fmt", ["jpeg", "fmp4"])
def test_pooled_encoding_gives_the_bytes_of_one_thread(fmt):
    serial, pooled = MediaEncodeStage(4), MediaEncodeStage(4, threads=4)
    decoder = Fmp4Decoder()
    for block in range(3):  # fmp4: a continuing stream per session
        one = serial.forward(_items(fmt, block=block))
        many = pooled.forward(_items(fmt, block=block))
        assert all(isinstance(m, EncodedMedia) for m in one + many)
        assert [m.data for m in one] == [m.data for m in many]
        assert [m.init_bytes for m in one] == [m.init_bytes for m in many]
        decoded = decode_jpeg_batch(many[0].data) if fmt == "jpeg" else decoder.decode(many[0].data)
        assert len(decoded) == 5


def test_jpeg_runs_of_a_batch_encode_concurrently(monkeypatch):
    """Every run of frames waits at a barrier for all the others: a pool that encoded them one
    after another would break it (and fail the blocks) instead of returning the batch."""
    threads = 4  # 2 blocks of 2 frames, in runs of one frame: 4 runs that must all run at once
    barrier = threading.Barrier(threads, timeout=10)
    real = media_stage.encode_jpegs
    seen: set[str] = set()

    def gated(frames, quality):
        seen.add(threading.current_thread().name)
        barrier.wait()
        return real(frames, quality)

    monkeypatch.setattr(media_stage, "encode_jpegs", gated)
    out = MediaEncodeStage(4, threads=threads).forward(_items("jpeg", sessions=2, frames=2))
    assert all(isinstance(m, EncodedMedia) for m in out), out
    assert len(seen) == threads


def test_threads_must_be_positive():
    with pytest.raises(ValueError, match="threads"):
        MediaEncodeStage(1, threads=0)
