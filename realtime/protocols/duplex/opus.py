"""Ogg/Opus audio in memory (PyAV's libopus): the duplex bandwidth option, no I/O.

- :class:`OggOpusEncoder` is one Ogg/Opus stream (one response): 24 kHz mono float32 frames in,
  the Ogg pages they complete out (a page per 20 ms packet, so every 80 ms frame leaves at once).
  The first call's bytes start with the stream's header pages (``OpusHead``, ``OpusTags``): a
  client decodes each response's binary frames as one complete Ogg stream.
- :class:`OggOpusDecoder` is the client's stream: Ogg pages in (split anywhere across binary
  frames), 24 kHz mono float32 out. Malformed input raises :class:`OpusError` (a typed protocol
  error, the socket stays open); at most ``MAX_PENDING_BYTES`` of an unfinished page are buffered.

Both cost real CPU (about 1-2 ms per 80 ms frame): callers run them off the event loop.
"""

from __future__ import annotations

import io

import av
import numpy as np
import soxr

SAMPLE_RATE = 24_000
PAGE_DURATION_US = 20_000
MAX_PENDING_BYTES = 1 << 17  # an Ogg page is at most 65,307 bytes; two of them may be in flight
_OGG = b"OggS"


class OpusError(ValueError):
    """The client's Ogg/Opus stream cannot be decoded."""


class OggOpusEncoder:
    def __init__(self, bitrate: int) -> None:
        self._buf = io.BytesIO()
        self._out = av.open(self._buf, "w", format="ogg", options={"page_duration": str(PAGE_DURATION_US)})
        self._stream = self._out.add_stream("libopus", rate=SAMPLE_RATE, layout="mono")
        self._stream.bit_rate = bitrate
        self._pts = 0

    def encode(self, pcm: np.ndarray) -> bytes:
        """One frame of float32 samples in [-1, 1] -> the Ogg bytes it completes."""
        frame = av.AudioFrame.from_ndarray(
            np.ascontiguousarray(pcm, np.float32)[None, :], format="flt", layout="mono"
        )
        frame.sample_rate = SAMPLE_RATE
        frame.pts = self._pts
        self._pts += pcm.shape[0]
        for packet in self._stream.encode(frame):
            self._out.mux(packet)
        return self._take()

    def close(self) -> bytes:
        """Flush the encoder and end the stream (the last page); the encoder is then unusable."""
        for packet in self._stream.encode(None):
            self._out.mux(packet)
        self._out.close()
        return self._take()

    def _take(self) -> bytes:
        data = self._buf.getvalue()
        self._buf.seek(0)
        self._buf.truncate()
        return data


class OggOpusDecoder:
    def __init__(self) -> None:
        self._pending = b""
        self._packet = b""  # a packet continued across pages
        self._packets = 0
        self._codec: av.CodecContext | None = None
        self._resampler: soxr.ResampleStream | None = None  # libopus decodes at 48 kHz

    def feed(self, data: bytes) -> np.ndarray:
        """Bytes of the stream -> the samples of every packet they complete (may be empty)."""
        self._pending += data
        if len(self._pending) > MAX_PENDING_BYTES:
            raise OpusError(f"over {MAX_PENDING_BYTES} bytes of an unfinished Ogg page")
        out: list[np.ndarray] = []
        for packet in self._pages():
            out.extend(self._decode(packet))
        return np.concatenate(out) if out else np.zeros(0, np.float32)

    def _pages(self) -> list[bytes]:
        packets, buf, i = [], self._pending, 0
        while len(buf) - i >= 27:
            if buf[i : i + 4] != _OGG:
                raise OpusError("not an Ogg stream (no 'OggS' page header)")
            count = buf[i + 26]
            body = i + 27 + count
            if len(buf) < body:
                break
            lacing = buf[i + 27 : body]
            end = body + sum(lacing)
            if len(buf) < end:
                break
            at = body
            for size in lacing:
                self._packet += buf[at : at + size]
                at += size
                if size < 255:
                    packets.append(self._packet)
                    self._packet = b""
            i = end
        self._pending = buf[i:]
        return packets

    def _decode(self, packet: bytes) -> list[np.ndarray]:
        self._packets += 1
        if self._packets == 1:
            if not packet.startswith(b"OpusHead"):
                raise OpusError("the Ogg stream does not start with an OpusHead packet")
            codec = av.CodecContext.create("libopus", "r")
            codec.sample_rate = SAMPLE_RATE
            codec.layout = "mono"
            codec.extradata = packet
            self._codec = codec
            return []
        if self._packets == 2:  # OpusTags
            return []
        assert self._codec is not None
        try:
            frames = self._codec.decode(av.Packet(packet))
        except av.FFmpegError as exc:
            raise OpusError(f"undecodable Opus packet: {exc}") from None
        return [self._to_24k(f) for f in frames]

    def _to_24k(self, frame: av.AudioFrame) -> np.ndarray:
        samples = frame.to_ndarray()
        if samples.dtype == np.int16:
            samples = samples.astype(np.float32) / 32768.0
        if samples.ndim > 1:  # planar (channels, n) or packed (1, n * channels)
            samples = samples.reshape(-1, frame.samples).mean(axis=0)
        samples = samples.astype(np.float32, copy=False)
        if frame.sample_rate == SAMPLE_RATE:
            return samples
        if self._resampler is None:
            self._resampler = soxr.ResampleStream(frame.sample_rate, SAMPLE_RATE, 1, dtype="float32")
        return self._resampler.resample_chunk(samples)
