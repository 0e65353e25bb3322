"""Audio sample formats and per-stream resampling for the voice pipeline.

Conventions: audio inside the pipeline is mono float32 in [-1, 1]; on the wire it is pcm16
(signed 16-bit little-endian) or G.711 (µ-law / A-law, one byte per sample, 8 kHz in the OpenAI
Realtime API). The client side runs at 24 kHz; VAD and ASR run at 16 kHz; the TTS voice speaks at
24 kHz.

All functions here are pure. :class:`Resampler` holds one stream's filter state and is owned by
one session and direction (not thread-safe); one instance per stream keeps chunk boundaries
seamless, which resampling each chunk separately does not.
"""

from __future__ import annotations

import numpy as np
import soxr

PCM16_SCALE = 32768.0


class AudioFormatError(ValueError):
    """Bytes that are not whole samples of the stated format; ``str()`` is safe for the wire."""


def pcm16_to_float(data: bytes) -> np.ndarray:
    """pcm16 little-endian bytes -> float32 samples in [-1, 1)."""
    if len(data) % 2:
        raise AudioFormatError(f"pcm16 audio must have an even number of bytes, got {len(data)}")
    return np.frombuffer(data, dtype="<i2").astype(np.float32) / PCM16_SCALE


def float_to_pcm16(samples: np.ndarray) -> bytes:
    """float32 samples -> pcm16 little-endian bytes (rounded, clipped to the int16 range).

    The exact inverse of :func:`pcm16_to_float` on its outputs.
    """
    scaled = np.rint(np.asarray(samples, dtype=np.float32) * PCM16_SCALE)
    return np.clip(scaled, -32768, 32767).astype("<i2").tobytes()


# G.711 as in ITU-T G.711 / the classic Sun g711.c (bit-exact with Python's former audioop).
_ULAW_BIAS = 0x84
_ULAW_CLIP = 8159
_ULAW_SEGMENT_ENDS = np.array([0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF])
_ALAW_SEGMENT_ENDS = np.array([0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF])


def _ulaw_encode(pcm: np.ndarray) -> np.ndarray:
    value = pcm.astype(np.int32) >> 2  # 14-bit, as g711.c's st_14linear2ulaw
    mask = np.where(value < 0, 0x7F, 0xFF)
    value = np.minimum(np.abs(value), _ULAW_CLIP) + (_ULAW_BIAS >> 2)
    segment = np.searchsorted(_ULAW_SEGMENT_ENDS, value)
    code = (np.minimum(segment, 7) << 4) | ((value >> (segment + 1)) & 0x0F)
    code = np.where(segment >= 8, 0x7F, code)
    return (code ^ mask).astype(np.uint8)


def _ulaw_decode(codes: np.ndarray) -> np.ndarray:
    u = ~codes.astype(np.int32) & 0xFF
    exponent = (u >> 4) & 0x07
    magnitude = (((u & 0x0F) << 3) + _ULAW_BIAS) << exponent
    return np.where(u & 0x80, _ULAW_BIAS - magnitude, magnitude - _ULAW_BIAS).astype(np.int16)


def _alaw_encode(pcm: np.ndarray) -> np.ndarray:
    value = pcm.astype(np.int32) >> 3
    mask = np.where(value >= 0, 0xD5, 0x55)
    value = np.where(value >= 0, value, -value - 1)
    segment = np.searchsorted(_ALAW_SEGMENT_ENDS, value)
    shift = np.where(segment < 2, 1, segment)
    code = (np.minimum(segment, 7) << 4) | ((value >> shift) & 0x0F)
    code = np.where(segment >= 8, 0x7F, code)
    return (code ^ mask).astype(np.uint8)


def _alaw_decode(codes: np.ndarray) -> np.ndarray:
    a = codes.astype(np.int32) ^ 0x55
    segment = (a & 0x70) >> 4
    t = (a & 0x0F) << 4
    t = np.where(segment == 0, t + 8, (t + 0x108) << np.maximum(segment - 1, 0))
    return np.where(a & 0x80, t, -t).astype(np.int16)


_ALL_PCM16 = np.arange(-32768, 32768, dtype=np.int32)
_ULAW_FROM_PCM16 = _ulaw_encode(_ALL_PCM16)
_ALAW_FROM_PCM16 = _alaw_encode(_ALL_PCM16)
_PCM16_FROM_ULAW = _ulaw_decode(np.arange(256))
_PCM16_FROM_ALAW = _alaw_decode(np.arange(256))


def ulaw_to_float(data: bytes) -> np.ndarray:
    """G.711 µ-law bytes -> float32 samples."""
    return _PCM16_FROM_ULAW[np.frombuffer(data, dtype=np.uint8)].astype(np.float32) / PCM16_SCALE


def alaw_to_float(data: bytes) -> np.ndarray:
    """G.711 A-law bytes -> float32 samples."""
    return _PCM16_FROM_ALAW[np.frombuffer(data, dtype=np.uint8)].astype(np.float32) / PCM16_SCALE


def _float_to_index(samples: np.ndarray) -> np.ndarray:
    pcm = np.frombuffer(float_to_pcm16(samples), dtype="<i2")
    return pcm.astype(np.int32) + 32768


def float_to_ulaw(samples: np.ndarray) -> bytes:
    """float32 samples -> G.711 µ-law bytes."""
    return _ULAW_FROM_PCM16[_float_to_index(samples)].tobytes()


def float_to_alaw(samples: np.ndarray) -> bytes:
    """float32 samples -> G.711 A-law bytes."""
    return _ALAW_FROM_PCM16[_float_to_index(samples)].tobytes()


class Resampler:
    """Stateful mono float32 resampler for one stream (``soxr.ResampleStream``, quality HQ).

    ``push`` returns whatever output the filter has ready; output comes in bursts, and about
    ``delay_samples`` output samples stay inside the filter until ``flush``. After ``flush`` the
    stream is empty and can be reused for a new utterance (``reset`` drops pending samples
    instead). Equal rates pass samples through untouched.
    """

    def __init__(self, in_rate: int, out_rate: int) -> None:
        self.in_rate = in_rate
        self.out_rate = out_rate
        self._stream = None if in_rate == out_rate else soxr.ResampleStream(in_rate, out_rate, 1, "float32")

    @property
    def delay_samples(self) -> float:
        return 0.0 if self._stream is None else float(self._stream.delay())

    def push(self, samples: np.ndarray) -> np.ndarray:
        samples = np.ascontiguousarray(samples, dtype=np.float32)
        if self._stream is None:
            return samples
        return self._stream.resample_chunk(samples)

    def flush(self) -> np.ndarray:
        if self._stream is None:
            return np.zeros(0, np.float32)
        out = self._stream.resample_chunk(np.zeros(0, np.float32), last=True)
        self._stream.clear()
        return out

    def reset(self) -> None:
        if self._stream is not None:
            self._stream.clear()
