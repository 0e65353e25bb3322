"""Fixtures for the voice component tests: the offline spoken question (tests/voice/speech.py) and
a random-weight Whisper folder at the TINY shape (realtime/bench/random_whisper.py), built once."""

from pathlib import Path

import pytest

from realtime.bench.random_whisper import TINY, build_random_whisper
from tests.voice.speech import spoken_question  # noqa: F401 (re-exported as a fixture)


@pytest.fixture(scope="session")
def tiny_whisper(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Hugging Face Whisper folder of random TINY weights (seed 0)."""
    return build_random_whisper(tmp_path_factory.mktemp("whisper") / "tiny", TINY)
