"""Ogg/Opus in memory, sans-I/O (``realtime/protocols/duplex/opus.py``): the encoder's stream is
read back by PyAV's own Ogg demuxer and by the project's decoder; bad input is a typed error."""

from __future__ import annotations

import io

import av
import numpy as np
import pytest

from realtime.protocols.duplex.opus import (
    MAX_PENDING_BYTES,
    SAMPLE_RATE,
    OggOpusDecoder,
    OggOpusEncoder,
    OpusError,
)

FRAME = 1920  # 80 ms at 24 kHz
PACKET = 480  # 20 ms at 24 kHz


def _tone(frames: int, hz: float = 440.0) -> np.ndarray:
    t = np.arange(frames * FRAME) / SAMPLE_RATE
    return (0.3 * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def _stream(pcm: np.ndarray) -> list[bytes]:
    """The encoder's output per 80 ms frame, then its closing bytes."""
    encoder = OggOpusEncoder(24_000)
    chunks = [encoder.encode(pcm[i : i + FRAME]) for i in range(0, pcm.shape[0], FRAME)]
    return [*chunks, encoder.close()]


def _dominant_hz(samples: np.ndarray, rate: int = SAMPLE_RATE) -> float:
    spectrum = np.abs(np.fft.rfft(samples * np.hanning(samples.shape[0])))
    return float(np.fft.rfftfreq(samples.shape[0], 1 / rate)[np.argmax(spectrum)])


def test_every_frame_leaves_at_once_and_the_stream_starts_with_its_headers() -> None:
    chunks = _stream(_tone(5))
    assert all(chunks[:5]), "each 80 ms frame completes pages (one per 20 ms packet): none waits"
    assert chunks[0].startswith(b"OggS") and b"OpusHead" in chunks[0] and b"OpusTags" in chunks[0]
    assert b"OpusHead" not in b"".join(chunks[1:])


def test_pyav_demuxes_the_stream_back_to_the_same_audio() -> None:
    pcm = _tone(10)
    with av.open(io.BytesIO(b"".join(_stream(pcm)))) as container:
        assert container.streams.audio[0].codec_context.name in ("opus", "libopus")
        frames = list(container.decode(audio=0))
        rate = frames[0].sample_rate
        assert all(f.layout.nb_channels == 1 for f in frames)
        decoded = np.concatenate([f.to_ndarray().reshape(-1) for f in frames])
    assert abs(decoded.shape[0] * SAMPLE_RATE / rate - pcm.shape[0]) <= 2 * PACKET
    assert abs(_dominant_hz(decoded[rate // 10 : rate // 10 + rate // 4], rate) - 440) < 10


def test_the_decoder_reads_the_stream_split_anywhere_across_frames() -> None:
    pcm = _tone(10)
    data = b"".join(_stream(pcm))
    whole = OggOpusDecoder().feed(data)
    decoder = OggOpusDecoder()
    pieces = [decoder.feed(data[i : i + 333]) for i in range(0, len(data), 333)]  # pages split anywhere
    split = np.concatenate(pieces)
    assert whole.dtype == np.float32 and split.shape == whole.shape
    np.testing.assert_allclose(split, whole, atol=1e-6)
    assert abs(whole.shape[0] - pcm.shape[0]) <= 2 * PACKET
    assert abs(_dominant_hz(whole[4 * PACKET : 4 * PACKET + SAMPLE_RATE // 4]) - 440) < 10
    assert 0.1 < float(np.sqrt(np.mean(whole[4 * PACKET :] ** 2))) < 0.4, "the tone's level (0.21 RMS)"


def test_not_an_ogg_stream_is_a_typed_error() -> None:
    with pytest.raises(OpusError, match="OggS"):
        OggOpusDecoder().feed(b"definitely not an ogg page, but long enough to look at")


def test_an_ogg_stream_without_opus_head_is_a_typed_error() -> None:
    data = b"".join(_stream(_tone(2)))
    head = data.index(b"OpusHead")
    with pytest.raises(OpusError, match="OpusHead"):
        OggOpusDecoder().feed(data[:head] + b"NotOpus!" + data[head + 8 :])


def test_an_undecodable_packet_is_a_typed_error() -> None:
    data = bytearray(b"".join(_stream(_tone(3))))
    page = data.index(b"OggS", data.index(b"OggS", data.index(b"OpusTags")) + 4)  # an audio page
    body = page + 27 + data[page + 26]
    data[body : body + 20] = b"\xff" * 20  # the packet's TOC and frames: garbage (the CRC is not checked)
    with pytest.raises(OpusError, match="undecodable"):
        OggOpusDecoder().feed(bytes(data))


def test_an_unfinished_page_is_bounded() -> None:
    decoder = OggOpusDecoder()
    header = b"OggS" + bytes(22) + bytes([255]) + bytes([255]) * 255  # a page announcing 65 kB
    decoder.feed(header)
    with pytest.raises(OpusError, match=str(MAX_PENDING_BYTES)):
        decoder.feed(bytes(MAX_PENDING_BYTES))
