"""Frame batches to wire payloads and back, with PyAV (FFmpeg): JPEG batches and fMP4 (H.264).

- ``encode_jpeg_batch(frames, quality)``: ``[u32 LE count]`` then per frame ``[u32 LE length][JPEG]``
  (the length-prefixed batch of Biome's binary envelope, without its JSON header: our header is
  the ``chunk.metadata`` text frame sent just before).
- ``encode_fmp4(frames, fps, first_frame)``: one self-contained fragmented MP4 per chunk
  (``ftyp`` + ``moov`` init segment, then ``moof``/``mdat``), H.264 from libx264 with
  ``preset=ultrafast, tune=zerolatency``, ``yuv420p``, the chunk's first frame a keyframe and
  timestamps continuing from ``first_frame`` (time base 1/fps), so a player can append chunks in
  order (vllm-omni's ``/v1/realtime/video`` m4s settings; FastVideo's fMP4-over-WS transport).
- ``decode_jpeg_batch`` / ``decode_fmp4`` are the inverse (clients and tests).

All functions are synchronous and CPU-bound: call them through ``asyncio.to_thread``.
"""

from __future__ import annotations

import io
import struct
from fractions import Fraction

import av
import numpy as np

MAX_BATCH_FRAMES = 4096


def _rgb_frame(rgb: np.ndarray) -> av.VideoFrame:
    return av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24")


def encode_jpeg_batch(frames: np.ndarray, quality: int = 85) -> bytes:
    """JPEG-encode ``uint8 [T, H, W, 3]`` frames into one length-prefixed batch."""
    ctx = av.CodecContext.create("mjpeg", "w")
    ctx.width, ctx.height = frames.shape[2], frames.shape[1]
    ctx.pix_fmt = "yuvj420p"
    ctx.time_base = Fraction(1, 25)
    # FFmpeg's mjpeg quality scale: qscale 2 (best) .. 31 (worst)
    ctx.options = {"qmin": "1", "qmax": "31"}
    ctx.qscale = max(2, min(31, round(31 - (quality / 100) * 29)))
    out = [struct.pack("<I", len(frames))]
    for rgb in frames:
        frame = _rgb_frame(rgb).reformat(format="yuvj420p")
        packets = ctx.encode(frame)
        data = b"".join(bytes(p) for p in packets)
        out.append(struct.pack("<I", len(data)))
        out.append(data)
    return b"".join(out)


def split_jpeg_batch(payload: bytes) -> list[bytes]:
    """The JPEG images of a batch (raises ``ValueError`` on a malformed batch)."""
    if len(payload) < 4:
        raise ValueError("JPEG batch shorter than its count field")
    (count,) = struct.unpack_from("<I", payload)
    if count > MAX_BATCH_FRAMES:
        raise ValueError(f"JPEG batch claims {count} frames")
    offset, images = 4, []
    for _ in range(count):
        if offset + 4 > len(payload):
            raise ValueError("JPEG batch truncated")
        (length,) = struct.unpack_from("<I", payload, offset)
        offset += 4
        if offset + length > len(payload):
            raise ValueError("JPEG batch truncated")
        images.append(payload[offset : offset + length])
        offset += length
    if offset != len(payload):
        raise ValueError("trailing bytes after the JPEG batch")
    return images


def decode_jpeg_batch(payload: bytes) -> list[np.ndarray]:
    """Decode a JPEG batch to ``uint8 [H, W, 3]`` RGB frames."""
    ctx = av.CodecContext.create("mjpeg", "r")
    frames = []
    for image in split_jpeg_batch(payload):
        for frame in ctx.decode(av.Packet(image)):
            frames.append(frame.to_ndarray(format="rgb24"))
    return frames


def encode_fmp4(frames: np.ndarray, fps: int, first_frame: int = 0) -> bytes:
    """H.264 fragmented MP4 of ``uint8 [T, H, W, 3]`` frames (self-contained; see module doc)."""
    buf = io.BytesIO()
    options = {"movflags": "frag_keyframe+empty_moov+default_base_moof"}
    with av.open(buf, mode="w", format="mp4", options=options) as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width, stream.height = frames.shape[2], frames.shape[1]
        stream.pix_fmt = "yuv420p"
        stream.options = {"preset": "ultrafast", "tune": "zerolatency"}
        stream.codec_context.time_base = Fraction(1, fps)
        for i, rgb in enumerate(frames):
            frame = _rgb_frame(rgb)
            frame.pts = first_frame + i
            frame.time_base = stream.codec_context.time_base
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    return buf.getvalue()


def decode_fmp4(payload: bytes) -> list[np.ndarray]:
    """Decode an fMP4 payload to ``uint8 [H, W, 3]`` RGB frames."""
    with av.open(io.BytesIO(payload), mode="r", format="mp4") as container:
        return [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
