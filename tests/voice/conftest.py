"""Fixtures for the voice component tests: the offline spoken question (tests/voice/speech.py)."""

from tests.voice.speech import spoken_question  # noqa: F401 (re-exported as a fixture)
