"""The hibari voice and clause splitting (models/voice/tts.py)."""

from __future__ import annotations

import numpy as np
import pytest

from models.voice.tts import SAMPLE_RATE, ClauseSplitter, split_clauses
from tests.voice.speech import voice


def test_synthesize_speaks_at_24_khz_reproducibly():
    tts = voice()
    audio = tts.synthesize("The capital of France is Paris.")
    assert tts.sample_rate == SAMPLE_RATE == 24_000
    assert audio.dtype == np.float32 and audio.ndim == 1
    assert 1.0 < len(audio) / SAMPLE_RATE < 4.0
    assert 0.05 < np.abs(audio).max() <= 1.0
    np.testing.assert_array_equal(audio, tts.synthesize("The capital of France is Paris."))


def test_synthesize_nothing_to_say_is_empty():
    assert len(voice().synthesize("")) == 0


PIECES = ["Sure", ",", " the", " capital", " of", " France", " is", " Paris", ".", " It", " is", " known"]
PIECES += [" for", " the", " Eiffel", " Tower", ",", " which", " was", " built", " in", " 1889", "."]


def test_clauses_stream_out_as_soon_as_complete():
    splitter = ClauseSplitter()
    emitted = [(i, c) for i, p in enumerate(PIECES) for c in splitter.push(p)]
    assert emitted == [
        (9, "Sure, the capital of France is Paris."),
        (17, "It is known for the Eiffel Tower,"),
    ]
    assert splitter.flush() == ["which was built in 1889."]
    assert splitter.flush() == []


def test_split_clauses_keeps_numbers_and_short_comma_phrases_whole():
    assert list(split_clauses(["Pi is 3.", "14", ", roughly.", " Ok"])) == ["Pi is 3.14, roughly.", "Ok"]
    assert list(split_clauses(["Yes!", "\n", "No?", "  Maybe"])) == ["Yes!", "No?", "Maybe"]


def test_text_without_boundaries_is_cut_at_a_space_past_the_bound():
    words = ["word"] * 30
    clauses = list(split_clauses(" ".join(words), max_clause_chars=50))
    assert all(len(c) <= 50 for c in clauses) and " ".join(clauses) == " ".join(words)


@pytest.mark.parametrize("min_chars", [0, 10])
def test_min_clause_chars_controls_comma_splits(min_chars):
    clauses = list(split_clauses(["Well, ", "I think so, ", "yes."], min_clause_chars=min_chars))
    assert clauses == (["Well,", "I think so,", "yes."] if min_chars == 0 else ["Well, I think so,", "yes."])


def test_first_clause_words_lets_speech_start_before_the_first_sentence_ends():
    splitter = ClauseSplitter(first_clause_words=4)
    emitted = [(i, c) for i, p in enumerate(PIECES) for c in splitter.push(p)]
    assert emitted[:2] == [(5, "Sure, the capital of"), (9, "France is Paris.")]  # "of" ends at " France"
    assert [c for _, c in emitted[2:]] == ["It is known for the Eiffel Tower,"]
    short = ClauseSplitter(first_clause_words=4)
    assert [c for p in ["Paris", "."] for c in short.push(p)] + short.flush() == ["Paris."]
