"""Sample formats and streaming resampling (models/voice/audio.py)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import soxr

from models.voice import audio

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    import audioop  # removed in Python 3.13; here only as the bit-exact G.711 reference

ALL_PCM16 = np.arange(-32768, 32768, dtype="<i2").tobytes()
ALL_CODES = bytes(range(256))


def test_pcm16_round_trip_is_exact():
    assert audio.float_to_pcm16(audio.pcm16_to_float(ALL_PCM16)) == ALL_PCM16


def test_float_to_pcm16_clips():
    pcm = np.frombuffer(audio.float_to_pcm16(np.array([-2.0, -1.0, 0.0, 1.0, 2.0])), "<i2")
    assert pcm.tolist() == [-32768, -32768, 0, 32767, 32767]


def test_odd_pcm16_length_is_a_typed_error():
    with pytest.raises(audio.AudioFormatError, match="even number of bytes"):
        audio.pcm16_to_float(b"\x00\x01\x02")


@pytest.mark.parametrize(
    ("encode", "decode", "ref_encode", "ref_decode"),
    [
        (audio._ULAW_FROM_PCM16, audio._PCM16_FROM_ULAW, audioop.lin2ulaw, audioop.ulaw2lin),
        (audio._ALAW_FROM_PCM16, audio._PCM16_FROM_ALAW, audioop.lin2alaw, audioop.alaw2lin),
    ],
)
def test_g711_tables_match_audioop(encode, decode, ref_encode, ref_decode):
    assert encode.tobytes() == ref_encode(ALL_PCM16, 2)
    assert decode.astype("<i2").tobytes() == ref_decode(ALL_CODES, 2)


@pytest.mark.parametrize(
    ("to_law", "from_law"),
    [(audio.float_to_ulaw, audio.ulaw_to_float), (audio.float_to_alaw, audio.alaw_to_float)],
)
def test_g711_round_trip_is_close(to_law, from_law):
    t = np.arange(8000) / 8000
    tone = (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    codes = to_law(tone)
    assert len(codes) == len(tone)
    assert np.abs(from_law(codes) - tone).max() < 0.02


@pytest.mark.parametrize(("src", "dst"), [(24_000, 16_000), (16_000, 24_000), (8_000, 24_000)])
def test_streaming_resampler_matches_one_shot(src, dst):
    rng = np.random.default_rng(0)
    signal = rng.uniform(-0.5, 0.5, src).astype(np.float32)
    resampler = audio.Resampler(src, dst)
    chunks = [resampler.push(signal[i : i + src // 50]) for i in range(0, len(signal), src // 50)]
    streamed = np.concatenate([*chunks, resampler.flush()])
    np.testing.assert_allclose(streamed, soxr.resample(signal, src, dst), atol=1e-6)


def test_resampler_is_reusable_after_flush_and_passes_equal_rates_through():
    resampler = audio.Resampler(24_000, 16_000)
    signal = np.ones(2400, np.float32)
    first = np.concatenate([resampler.push(signal), resampler.flush()])
    second = np.concatenate([resampler.push(signal), resampler.flush()])
    np.testing.assert_array_equal(first, second)
    same = audio.Resampler(16_000, 16_000)
    assert same.push(signal) is not None and np.array_equal(same.push(signal), signal)
    assert same.delay_samples == 0.0 and len(same.flush()) == 0
