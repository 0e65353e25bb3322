"""Fixtures for the voice component tests: the offline spoken question (tests/voice/speech.py) and
a random-weight Whisper folder at the TINY shape (realtime/bench/random_whisper.py), built once."""

from pathlib import Path

import pytest

from tests.voice.speech import spoken_question  # noqa: F401 (re-exported as a fixture)


@pytest.fixture(scope="session")
def tiny_whisper(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Hugging Face Whisper folder of random TINY weights (seed 0). Imported here, not at
    collection: torch imported before vLLM changes the CPU engine's threads, and with them the
    vLLM tests' greedy ties (test_llm_vllm.py's paced reply diverged)."""
    from realtime.bench.random_whisper import TINY, build_random_whisper

    return build_random_whisper(tmp_path_factory.mktemp("whisper") / "tiny", TINY)
