"""Audio on the OpenAI Realtime wire, sans-I/O: an append's bytes in, float32 samples out;
samples in, a delta's bytes out. ``pcm16`` is 24 kHz signed 16-bit little-endian; ``g711_ulaw``
and ``g711_alaw`` are 8 kHz, one byte per sample (the sample conversions are
``models.voice.audio``'s, bit-exact with G.711)."""

from __future__ import annotations

import numpy as np

from models.voice.audio import (
    alaw_to_float,
    float_to_alaw,
    float_to_pcm16,
    float_to_ulaw,
    pcm16_to_float,
    ulaw_to_float,
)

from .session_config import AudioFormat


def decode_audio(data: bytes, fmt: AudioFormat) -> np.ndarray:
    """An append's bytes in ``fmt`` -> mono float32 samples (a trailing odd pcm16 byte is dropped)."""
    if fmt is AudioFormat.PCM16:
        return pcm16_to_float(data[: len(data) // 2 * 2])
    return (ulaw_to_float if fmt is AudioFormat.G711_ULAW else alaw_to_float)(data)


def encode_audio(samples: np.ndarray, fmt: AudioFormat) -> bytes:
    """Mono float32 samples -> bytes in ``fmt``."""
    if fmt is AudioFormat.PCM16:
        return float_to_pcm16(samples)
    return (float_to_ulaw if fmt is AudioFormat.G711_ULAW else float_to_alaw)(samples)
