"""Frame batches to wire payloads and back, with PyAV (FFmpeg): JPEG batches and fMP4 (H.264).

- ``encode_jpeg_batch(frames, quality)``: ``[u32 LE count]`` then per frame ``[u32 LE length][JPEG]``
  (the length-prefixed batch of Biome's binary envelope, without its JSON header: our header is
  the ``chunk.metadata`` text frame sent just before).
- :class:`Fmp4Encoder`: one session's continuing H.264 stream (libx264 ``preset=ultrafast,
  tune=zerolatency``, ``yuv420p``) as fragmented MP4 for Media Source Extensions: the init segment
  (``ftyp`` + ``moov``) once, then bare ``moof``/``mdat`` fragments per chunk (FastVideo's
  fMP4-over-WS transport; vllm-omni's ``/v1/realtime/video`` m4s settings).
- ``decode_jpeg_batch`` / :class:`Fmp4Decoder` are the inverse (clients and tests).

Everything here is synchronous and CPU-bound: call it through ``asyncio.to_thread``.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Iterator
from fractions import Fraction

import av
import numpy as np
from av.container import InputContainer
from av.video.reformatter import VideoReformatter

MAX_BATCH_FRAMES = 4096
TICKS_PER_FRAME = 1000  # fMP4 track timescale = fps * 1000, so decode times are exact integers


def _rgb_frame(rgb: np.ndarray) -> av.VideoFrame:
    return av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24")


def _converted(frames: np.ndarray, pix_fmt: str, reformatter: VideoReformatter) -> Iterator[av.VideoFrame]:
    """Each ``uint8 [H, W, 3]`` RGB frame of ``frames`` in ``pix_fmt``, through one reformatter:
    its swscale context is made once, where ``VideoFrame.reformat`` makes one per frame (the same
    pixels; a 832x480 JPEG 5.6 -> 4.2 ms on the CPU box, ``realtime/bench/gpu/jpeg_reformat.py``)."""
    for rgb in frames:
        yield reformatter.reformat(_rgb_frame(rgb), format=pix_fmt)


def encode_jpeg_batch(frames: np.ndarray, quality: int = 85) -> bytes:
    """JPEG-encode ``uint8 [T, H, W, 3]`` frames into one length-prefixed batch."""
    return pack_jpeg_batch(encode_jpegs(frames, quality))


def pack_jpeg_batch(images: list[bytes]) -> bytes:
    """JPEG images -> one length-prefixed batch (the inverse of :func:`split_jpeg_batch`)."""
    out = [struct.pack("<I", len(images))]
    for data in images:
        out.append(struct.pack("<I", len(data)))
        out.append(data)
    return b"".join(out)


def jpeg_context(width: int, height: int, quality: int) -> av.CodecContext:
    """An MJPEG encoder of ``width`` x ``height`` yuvj420p frames at ``quality`` (0..100)."""
    ctx = av.CodecContext.create("mjpeg", "w")
    ctx.width, ctx.height = width, height
    ctx.pix_fmt = "yuvj420p"
    ctx.time_base = Fraction(1, 25)
    # FFmpeg's mjpeg quality scale: qscale 2 (best) .. 31 (worst)
    ctx.options = {"qmin": "1", "qmax": "31"}
    ctx.qscale = max(2, min(31, round(31 - (quality / 100) * 29)))
    return ctx


def encode_jpegs(frames: np.ndarray, quality: int = 85) -> list[bytes]:
    """JPEG images of ``uint8 [T, H, W, 3]`` frames; FFmpeg releases the GIL while it encodes,
    so several calls on threads run in parallel (``MediaEncodeStage``)."""
    ctx = jpeg_context(frames.shape[2], frames.shape[1], quality)
    return [
        b"".join(bytes(p) for p in ctx.encode(f)) for f in _converted(frames, "yuvj420p", VideoReformatter())
    ]


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


def _boxes(data: bytes, start: int = 0, end: int | None = None) -> Iterator[tuple[bytes, int, int]]:
    """``(type, offset, size)`` of the ISO-BMFF boxes in ``data[start:end]`` (32-bit sizes)."""
    end = len(data) if end is None else end
    while start < end:
        if start + 8 > end:
            raise ValueError("truncated MP4 box header")
        size, kind = struct.unpack_from(">I4s", data, start)
        if size < 8 or start + size > end:
            raise ValueError(f"bad MP4 box size {size} for {kind!r}")
        yield kind, start, size
        start += size


def _child(data: bytes, parent: int, size: int, kind: bytes) -> list[int]:
    """Offsets of the direct children of type ``kind`` of the box at ``parent``."""
    return [off for k, off, _ in _boxes(data, parent + 8, parent + size) if k == kind]


def _annexb_to_avcc(packet: av.Packet) -> av.Packet:
    """The packet with its Annex B NAL units (start-code separated, as libx264 emits them)
    rewritten as 4-byte length-prefixed units (``avc1`` samples; browsers reject start codes)."""
    data = bytes(packet)
    units = [u.rstrip(b"\x00") for u in data.split(b"\x00\x00\x01")]  # emulation prevention: no 0 0 1 inside
    out = av.Packet(b"".join(struct.pack(">I", len(u)) + u for u in units if u))
    out.pts, out.dts, out.time_base = packet.pts, packet.dts, packet.time_base
    out.is_keyframe = packet.is_keyframe
    return out


class Fmp4Encoder:
    """One session's H.264 stream as fragmented MP4 for Media Source Extensions.

    ``encode(frames)`` returns ``(init, fragment)``: the first call's ``init`` is the init segment
    (``ftyp`` + ``moov``, ``avcC`` of this encoder), later calls return ``b""``; ``fragment`` is
    bare ``moof`` + ``mdat`` (one per chunk, more only if x264 inserts a keyframe mid-chunk)
    continuing the same H.264 stream: one libx264 encoder (``preset=ultrafast``,
    ``tune=zerolatency``, no B-frames) lives as long as this object, so only the very first frame
    is forced a keyframe. Each chunk is muxed by FFmpeg's mp4 muxer in a scratch container; the
    ``moof`` boxes are then renumbered (``mfhd`` sequence continues) and their ``tfdt``
    (baseMediaDecodeTime) shifted to the stream's running decode time, so the fragments append
    to one ``SourceBuffer`` (vllm-omni's ``/v1/realtime/video`` m4s settings).

    Stateful and not thread-safe: call ``encode`` from one thread at a time, in chunk order
    (the server chains a connection's encodes on worker threads).
    """

    def __init__(self, width: int, height: int, fps: int) -> None:
        self.width, self.height, self.fps = width, height, fps
        self.codec = av.CodecContext.create("libx264", "w")
        self.codec.width, self.codec.height = width, height
        self.codec.pix_fmt = "yuv420p"
        self.codec.time_base = Fraction(1, fps)
        self.codec.framerate = Fraction(fps, 1)
        self.codec.options = {"preset": "ultrafast", "tune": "zerolatency"}
        self.frames = 0  # frames encoded so far = the next frame's pts
        self.sequence = 0  # moof boxes emitted so far
        self._template: InputContainer | None = None  # the init segment, read back: its stream
        self._reformatter = VideoReformatter()

    def encode(self, frames: np.ndarray) -> tuple[bytes, bytes]:
        """Encode ``uint8 [T, H, W, 3]``; returns ``(init segment or b"", fragment)``."""
        packets = []
        for frame in _converted(frames, "yuv420p", self._reformatter):
            frame.pts, frame.time_base = self.frames + len(packets), self.codec.time_base
            packets.extend(self.codec.encode(frame))
        if len(packets) != len(frames):
            raise RuntimeError("libx264 held frames back despite tune=zerolatency")
        data = self._mux(packets)
        init = b""
        if self._template is None:
            init = b"".join(data[o : o + n] for k, o, n in _boxes(data) if k in (b"ftyp", b"moov"))
            self._template = av.open(io.BytesIO(init), mode="r", format="mp4")
        base = self.frames * TICKS_PER_FRAME
        fragment = bytearray()
        for kind, off, size in _boxes(data):
            if kind in (b"moof", b"mdat"):
                start = len(fragment)
                fragment += data[off : off + size]
                if kind == b"moof":
                    self._patch_moof(fragment, start, size, base)
        self.frames += len(frames)
        return init, bytes(fragment)

    def _mux(self, packets: list[av.Packet]) -> bytes:
        buf = io.BytesIO()
        options = {
            "movflags": "frag_keyframe+empty_moov+default_base_moof",
            "video_track_timescale": str(self.fps * TICKS_PER_FRAME),
        }
        with av.open(buf, mode="w", format="mp4", options=options) as out:
            if self._template is None:
                stream = out.add_mux_stream("h264", rate=self.fps, width=self.width, height=self.height)
            else:  # the same track (timescale, avcC) as the init segment already sent
                stream = out.add_stream_from_template(self._template.streams.video[0])
                # an avcC sample entry tells the muxer the samples are length-prefixed already
                packets = [_annexb_to_avcc(p) for p in packets]
            for packet in packets:
                packet.stream = stream
                out.mux(packet)
        return buf.getvalue()

    def _patch_moof(self, data: bytearray, moof: int, size: int, base: int) -> None:
        self.sequence += 1
        for mfhd in _child(data, moof, size, b"mfhd"):
            struct.pack_into(">I", data, mfhd + 12, self.sequence)
        for traf in _child(data, moof, size, b"traf"):
            traf_size = struct.unpack_from(">I", data, traf)[0]
            for tfdt in _child(data, traf, traf_size, b"tfdt"):
                fmt = ">Q" if data[tfdt + 8] == 1 else ">I"
                struct.pack_into(fmt, data, tfdt + 12, struct.unpack_from(fmt, data, tfdt + 12)[0] + base)


class Fmp4Decoder:
    """Decodes the payloads of one fMP4 stream in order (clients and tests).

    A payload starting with ``ftyp`` carries an init segment: it starts a new stream (a new
    decoder). Other payloads are fragments continuing the current stream; the H.264 decoder keeps
    its reference frames across payloads.
    """

    def __init__(self) -> None:
        self.init: bytes | None = None
        self.codec: av.CodecContext | None = None

    def decode(self, payload: bytes) -> list[np.ndarray]:
        """``uint8 [H, W, 3]`` RGB frames of one payload (raises ``ValueError`` when malformed)."""
        if payload[4:8] == b"ftyp":
            boxes = list(_boxes(payload))
            end = max(o + n for k, o, n in boxes if k in (b"ftyp", b"moov"))
            self.init, self.codec, payload = payload[:end], None, payload[end:]
        if self.init is None:
            raise ValueError("fMP4 fragment before any init segment")
        if not payload:
            return []
        try:
            with av.open(io.BytesIO(self.init + payload), mode="r", format="mp4") as container:
                stream = container.streams.video[0]
                if self.codec is None:
                    self.codec = av.CodecContext.create("h264", "r")
                    self.codec.extradata = stream.codec_context.extradata
                    self.codec.thread_count = 1  # frame threading would delay output frames
                return [
                    frame.to_ndarray(format="rgb24")
                    for packet in container.demux(stream)
                    if packet.size
                    for frame in self.codec.decode(packet)
                ]
        except av.FFmpegError as exc:
            raise ValueError(f"malformed fMP4 payload: {exc}") from None
