"""Shared duplex fixtures (the model's tests and the kind's)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from models.duplex.configs import TEST, DuplexModelConfig
from models.duplex.stage import FRAME_SAMPLES, DuplexInput


def speech_frames(n: int, seed: int = 0) -> list[DuplexInput]:
    """``n`` input frames of noise-like audio (a stand-in for a user speaking)."""
    rng = np.random.default_rng(seed)
    return [DuplexInput((0.1 * rng.standard_normal(FRAME_SAMPLES)).astype(np.float32)) for _ in range(n)]


@pytest.fixture
def test_config() -> DuplexModelConfig:
    """The test-sized duplex model in float64 (batched vs alone compares exactly enough)."""
    return dataclasses.replace(TEST, dtype="float64")
