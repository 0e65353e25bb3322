"""Whisper-base transcription with the short encoder window (models/voice/asr.py)."""

from __future__ import annotations

import numpy as np
import pytest

from models.voice.asr import SHORT_WINDOW_SECONDS, WhisperAsr, split_long
from tests.voice.speech import spoken_16k

QUESTIONS = {
    "What is the capital of France?": ("capital", "france"),
    "How many legs does a spider have?": ("legs", "spider"),
}


@pytest.fixture(scope="module")
def asr() -> WhisperAsr:
    return WhisperAsr()


def _words(text: str) -> set[str]:
    return {w.strip(".,?!").lower() for w in text.split()}


@pytest.mark.parametrize("question", sorted(QUESTIONS))
def test_transcribes_a_spoken_question(asr, question):
    audio = spoken_16k(question)
    transcript = asr.transcribe(audio)
    assert set(QUESTIONS[question]) <= _words(transcript.text), transcript
    assert transcript.language == "en"
    assert transcript.audio_seconds == pytest.approx(len(audio) / 16_000)
    assert transcript.compute_seconds > 0


def test_silence_gives_an_empty_transcript(asr):
    transcript = asr.transcribe(np.zeros(16_000, np.float32))
    assert transcript.text == "" and transcript.no_speech_prob > 0.6


def test_batch_matches_single_calls(asr):
    audios = [spoken_16k(q) for q in sorted(QUESTIONS)]
    batch = asr.transcribe_batch(audios)
    assert [t.text for t in batch] == [asr.transcribe(a).text for a in audios]


def test_language_detection_when_no_language_is_set(asr):
    detecting = WhisperAsr(asr.model_dir, language=None)
    transcript = detecting.transcribe(spoken_16k("What is the capital of France?"))
    assert transcript.language == "en" and "france" in _words(transcript.text)


def test_long_audio_is_cut_at_pauses_and_transcribed_whole(asr):
    sentences = [
        "The old lighthouse stood on the northern cliff for two hundred years.",
        "Every night the keeper climbed the stairs to light the lamp.",
        "Ships passing in the dark relied on its beam to avoid the rocks.",
        "One evening a small fishing boat lost its way in the fog.",
        "The keeper rang the bell until the sailors found the harbour.",
        "The next morning the whole village came to thank him with bread.",
    ]
    audio = np.concatenate([spoken_16k(s, 0.3, 0.6) for s in sentences * 2])
    assert len(audio) / 16_000 > SHORT_WINDOW_SECONDS
    windows = split_long(audio)
    assert len(windows) >= 2 and all(len(w) <= SHORT_WINDOW_SECONDS * 16_000 for w in windows)
    np.testing.assert_array_equal(np.concatenate(windows), audio)
    cut = len(windows[0])
    assert np.abs(audio[cut - 800 : cut + 800]).max() < 0.05, "the cut should fall in a pause"
    words = _words(asr.transcribe(audio).text)
    assert {"lighthouse", "keeper", "sailors", "village", "bread"} <= words, words


@pytest.mark.parametrize("samples", [0, 1, 8_001, 16_161])
def test_any_length_is_accepted_and_an_empty_batch_is_empty(asr, samples):
    assert asr.transcribe(np.zeros(samples, np.float32)).text == ""
    assert asr.transcribe_batch([]) == []
