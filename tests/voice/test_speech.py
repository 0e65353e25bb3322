"""The offline test speech helper (tests/voice/speech.py) is intelligible to the default ASR."""

from __future__ import annotations

import numpy as np

from models.voice.asr import WhisperAsr
from models.voice.audio import pcm16_to_float
from tests.voice.speech import spoken_24k


def test_spoken_question_is_transcribed(spoken_question):
    transcript = WhisperAsr().transcribe(spoken_question.audio_16k)
    words = {w.strip(".,?!").lower() for w in transcript.text.split()}
    assert set(spoken_question.transcript_words) <= words, transcript.text


def test_spoken_forms_agree_and_carry_the_requested_silence(spoken_question):
    audio_24k = spoken_24k(spoken_question.text)
    np.testing.assert_allclose(pcm16_to_float(spoken_question.pcm16_24k), audio_24k, atol=1 / 32768)
    assert len(spoken_question.audio_16k) == round(len(audio_24k) * 2 / 3)
    assert not audio_24k.flags.writeable
    assert np.abs(audio_24k[: 24_000 // 2]).max() == 0.0 and np.abs(audio_24k[-24_000:]).max() == 0.0
