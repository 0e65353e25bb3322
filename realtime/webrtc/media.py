"""A WebRTC call's audio in and out, on aiortc's tracks (Opus is aiortc's; resampling is soxr's).

- :class:`PlayoutTrack`: the server's outgoing track. aiortc's sender pulls a frame every 20 ms
  of media time; the track paces itself on the wall clock (as aiortc's own tracks do) and plays
  the call's :class:`~realtime.webrtc.playout.Playout` (silence when it is empty) as Opus packets
  it encodes itself (:class:`OpusFrames`: silence costs nothing), handing the
  ``output_audio_buffer.*`` events a pull causes to ``on_events``. While it plays silence,
  audio that arrives goes out at once (not at the next 20 ms tick), its first :data:`PREROLL`
  frames back to back, and the clock restarts there: a receiver's jitter buffer, which plays a
  frame once the next one is in, starts the answer at its arrival, and absorbs the 20 ms lead.
- :func:`read_microphone`: the client's incoming track, decoded by aiortc, down-mixed to mono and
  resampled to the VAD's 16 kHz, cut into chunks of ``chunk_ms`` for the connection.
"""

from __future__ import annotations

import asyncio
import fractions
import time
from collections.abc import Callable

import numpy as np
import soxr
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from av import AudioFrame, CodecContext, Packet

from realtime.protocols.oai_realtime import server_events as ev
from realtime.webrtc.playout import FRAME_SAMPLES, RATE, Playout

MIC_RATE = 16_000  # what the VAD and the ASR take
PREROLL = 1  # frames sent ahead of the clock when audio starts after silence
OPUS_BITRATE = 32_000  # mono speech (Opus's own recommendation for wideband speech: 24-32 kb/s)
_TIME_BASE = fractions.Fraction(1, RATE)


class PlayoutTrack(MediaStreamTrack):
    kind = "audio"

    def __init__(self, playout: Playout, on_events: Callable[[list[ev.ServerEvent]], None]) -> None:
        super().__init__()
        self.playout = playout
        self.on_events = on_events
        self._start: float | None = None
        self._pts = 0
        self._audio = asyncio.Event()  # set by :meth:`audio_queued`
        self._opus = OpusFrames()

    def audio_queued(self) -> None:
        """Audio entered the playout: a track waiting out a silent frame sends it now."""
        self._audio.set()

    async def recv(self) -> Packet:
        if self.readyState != "live":
            raise MediaStreamError
        if self._start is None:
            self._start = time.monotonic()
        else:
            self._pts += FRAME_SAMPLES
            delay = self._start + self._pts / RATE - time.monotonic()
            if self.playout.queued_samples:
                await asyncio.sleep(delay)
            else:  # silence so far: the first audio goes out at once, with the frame after it
                self._audio.clear()
                try:
                    await asyncio.wait_for(self._audio.wait(), max(delay, 0.0))
                    self._start = time.monotonic() - (self._pts + PREROLL * FRAME_SAMPLES) / RATE
                except TimeoutError:
                    pass
        samples, events = self.playout.pull()
        if events:
            self.on_events(events)
        return self._opus.encode(samples, self._pts)


class OpusFrames:
    """20 ms frames -> Opus packets, for a track that hands aiortc packets instead of frames
    (aiortc then only packs them into RTP). Mono speech at :data:`OPUS_BITRATE` (aiortc's own
    encoder is stereo at 96 kb/s, behind a thread hop and a pure-Python level meter per frame); a
    frame of digital silence is one packet encoded once, so a quiet call costs no encoding. A
    talkspurt after silence starts a fresh encoder, as the decoder's state is that of silence."""

    def __init__(self) -> None:
        self._encoder: CodecContext | None = None
        self._silence = bytes(self._encode(self._new_encoder(), np.zeros(FRAME_SAMPLES, np.int16), 0))

    def encode(self, samples: np.ndarray, pts: int) -> Packet:
        if not samples.any():
            self._encoder = None
            packet = Packet(self._silence)
        else:
            if self._encoder is None:
                self._encoder = self._new_encoder()
            packet = self._encode(self._encoder, samples, pts)
        packet.pts, packet.time_base = pts, _TIME_BASE
        return packet

    @staticmethod
    def _new_encoder() -> CodecContext:
        encoder = CodecContext.create("libopus", "w")
        encoder.bit_rate = OPUS_BITRATE
        encoder.format, encoder.layout, encoder.sample_rate = "s16", "mono", RATE
        encoder.time_base = _TIME_BASE
        encoder.options = {"application": "voip"}
        return encoder

    @staticmethod
    def _encode(encoder: CodecContext, samples: np.ndarray, pts: int) -> Packet:
        frame = AudioFrame.from_ndarray(samples.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate, frame.pts, frame.time_base = RATE, pts, _TIME_BASE
        (packet,) = encoder.encode(frame)  # libopus: one packet per 20 ms frame, none held back
        return packet


class Resampler:
    """Mono float32 audio of one rate to another, streaming (no clicks between chunks)."""

    def __init__(self, in_rate: int, out_rate: int) -> None:
        self.in_rate, self.out_rate = in_rate, out_rate
        self._stream = soxr.ResampleStream(in_rate, out_rate, 1, dtype="float32")

    def __call__(self, samples: np.ndarray, last: bool = False) -> np.ndarray:
        if self.in_rate == self.out_rate:
            return samples.astype(np.float32, copy=False)
        return self._stream.resample_chunk(samples.astype(np.float32, copy=False), last=last)


def frame_to_mono(frame: AudioFrame) -> np.ndarray:
    """An aiortc-decoded frame (s16, packed, any layout) as mono float32."""
    channels = len(frame.layout.channels)
    pcm = frame.to_ndarray().reshape(-1, channels).astype(np.float32) / 32768.0
    return pcm.mean(axis=1) if channels > 1 else pcm[:, 0]


async def read_microphone(
    track: MediaStreamTrack, chunk_ms: int, deliver: Callable[[np.ndarray], None]
) -> None:
    """Until the track ends: its audio as 16 kHz mono float32 chunks of ``chunk_ms``."""
    chunk = MIC_RATE * chunk_ms // 1000
    resampler: Resampler | None = None
    pending: list[np.ndarray] = []
    held = 0
    while True:
        try:
            frame = await track.recv()
        except MediaStreamError:
            return
        if resampler is None or resampler.in_rate != frame.sample_rate:
            resampler = Resampler(frame.sample_rate, MIC_RATE)
        samples = resampler(frame_to_mono(frame))
        pending.append(samples)
        held += len(samples)
        if held >= chunk:
            deliver(np.concatenate(pending))
            pending, held = [], 0
