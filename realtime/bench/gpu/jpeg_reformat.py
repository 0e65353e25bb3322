"""The JPEG encoder's colour conversion, on any machine's CPU (no GPU needed): 9 frames of 832x480
(one Self-Forcing block's first chunk) encoded with a swscale context made per frame
(``VideoFrame.reformat``, the encoder before `aab8615`) and with one ``VideoReformatter`` per run
(``realtime.media.video.encode_jpegs``); checks that both give the same bytes.

    python3 realtime/bench/gpu/jpeg_reformat.py
Ends with one JSON line (ms per frame, best of 5 runs each).
"""

from __future__ import annotations

import json
import time

import numpy as np

from realtime.media.video import _rgb_frame, encode_jpegs, jpeg_context


def per_frame_context(frames: np.ndarray, quality: int = 85) -> list[bytes]:
    """``encode_jpegs`` as it was: ``reformat`` on each frame (a swscale context each)."""
    ctx = jpeg_context(frames.shape[2], frames.shape[1], quality)
    return [
        b"".join(bytes(p) for p in ctx.encode(_rgb_frame(rgb).reformat(format="yuvj420p"))) for rgb in frames
    ]


def best_ms_per_frame(fn, frames: np.ndarray) -> float:
    fn(frames[:1])
    runs = []
    for _ in range(5):
        t0 = time.perf_counter()
        fn(frames)
        runs.append((time.perf_counter() - t0) * 1000 / len(frames))
    return min(runs)


def main() -> None:
    y, x = np.mgrid[0:480, 0:832]
    ramps = np.stack([(x * (t + 1) + y + 7 * t) % 256 for t in range(9)])
    frames = np.ascontiguousarray(np.stack([ramps, (ramps * 3) % 256, 255 - ramps], -1)).astype(np.uint8)
    frames[:, 100:200, 100:300] = np.random.default_rng(0).integers(0, 255, (9, 100, 200, 3))
    assert per_frame_context(frames) == encode_jpegs(frames), "the two conversions differ"
    figures = {
        "per_frame_context_ms": round(best_ms_per_frame(per_frame_context, frames), 2),
        "one_reformatter_ms": round(best_ms_per_frame(encode_jpegs, frames), 2),
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
