"""Offline test speech: text spoken by the hibari voice, with silence around it, cached per process.

The e2e voice tests reuse this: ``spoken_pcm16_24k`` gives what an OpenAI Realtime client
appends (pcm16 mono 24 kHz), ``spoken_16k`` what the VAD and ASR consume, and the session-scoped
``spoken_question`` fixture bundles one question with the words its transcript and a correct
answer should contain. Arrays are read-only (they are shared through the cache).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import pytest
import soxr

from models.voice.audio import float_to_pcm16
from models.voice.tts import SAMPLE_RATE, HibariTts

QUESTION = "What is the capital of France?"


@functools.cache
def voice() -> HibariTts:
    return HibariTts()


@functools.lru_cache(maxsize=64)
def spoken_24k(text: str, lead_silence_s: float = 0.5, tail_silence_s: float = 1.0) -> np.ndarray:
    """``text`` spoken at 24 kHz float32, preceded and followed by digital silence."""
    speech = voice().synthesize(text, seed=0)
    lead = np.zeros(int(lead_silence_s * SAMPLE_RATE), np.float32)
    tail = np.zeros(int(tail_silence_s * SAMPLE_RATE), np.float32)
    audio = np.concatenate([lead, speech, tail])
    audio.setflags(write=False)
    return audio


@functools.lru_cache(maxsize=64)
def spoken_16k(text: str, lead_silence_s: float = 0.5, tail_silence_s: float = 1.0) -> np.ndarray:
    """:func:`spoken_24k` resampled to 16 kHz."""
    audio = soxr.resample(spoken_24k(text, lead_silence_s, tail_silence_s), SAMPLE_RATE, 16_000)
    audio = audio.astype(np.float32)
    audio.setflags(write=False)
    return audio


def spoken_pcm16_24k(text: str, lead_silence_s: float = 0.5, tail_silence_s: float = 1.0) -> bytes:
    """:func:`spoken_24k` as pcm16 little-endian bytes (``input_audio_buffer.append`` payload)."""
    return float_to_pcm16(spoken_24k(text, lead_silence_s, tail_silence_s))


@dataclass(frozen=True)
class SpokenQuestion:
    text: str
    transcript_words: tuple[str, ...]  # lower-case words a transcript of it contains
    answer_words: tuple[str, ...]  # lower-case words a correct answer contains
    audio_16k: np.ndarray
    pcm16_24k: bytes


@pytest.fixture(scope="session")
def spoken_question() -> SpokenQuestion:
    return SpokenQuestion(
        QUESTION, ("capital", "france"), ("paris",), spoken_16k(QUESTION), spoken_pcm16_24k(QUESTION)
    )
