"""PCM16 on the duplex wire: 24 kHz mono signed 16-bit little-endian in base64 JSON events
(``input_audio_buffer.append``, ``response.output_audio.delta``), float32 samples inside."""

from __future__ import annotations

import numpy as np


def pcm16_samples(data: bytes) -> np.ndarray:
    """An append's bytes -> float32 samples in [-1, 1) (a trailing odd byte is ignored)."""
    return np.frombuffer(data[: len(data) // 2 * 2], dtype="<i2").astype(np.float32) / 32768.0


def pcm16_bytes(pcm: np.ndarray) -> bytes:
    """A frame's float samples -> the delta's bytes (clipped to [-1, 1])."""
    return (np.clip(pcm, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()
