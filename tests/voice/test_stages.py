"""The voice components as runtime stages (models/voice/stages.py), on the real models."""

from __future__ import annotations

import numpy as np
import pytest
import soxr

from models.stage import StageItem
from models.voice.audio import Resampler
from models.voice.stages import TextChunk, TtsStage, VadInput, VadStage
from models.voice.tts import HibariTts
from models.voice.vad import SileroVad
from tests.voice.speech import spoken_24k

QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def vad() -> SileroVad:
    return SileroVad()


def _item(session: str, slot: int, state: object, payload: object) -> StageItem:
    return StageItem(session, 0, payload, slot=slot, state=state)


def test_one_vad_forward_scores_many_sessions_as_separate_streams_would(vad):
    stage = VadStage(vad, slot_capacity=3)
    states = [stage.open_state(f"s{i}", i) for i in range(3)]
    audio = spoken_24k(QUESTION)
    offsets = (0, 7_000, 19_000)  # each session at another point of the speech
    sizes = (4_800, 2_400, 7_200)  # and with appends of different lengths (frames straddle them)
    references = [(vad.stream(), Resampler(24_000, 16_000)) for _ in range(3)]
    for step in range(6):
        items, expected = [], []
        for i, (stream, resampler) in enumerate(references):
            start = offsets[i] + step * sizes[i]
            chunk = np.ascontiguousarray(audio[start : start + sizes[i]])
            items.append(_item(f"s{i}", i, states[i], VadInput(chunk, 24_000)))
            expected.append(stream.feed(resampler.push(chunk)))
        for out, (frames, probs) in zip(stage.forward(items), expected, strict=True):
            np.testing.assert_array_equal(out.frames, frames)
            np.testing.assert_allclose(out.probabilities, probs, atol=1e-5)
    assert any(out.probabilities.max() > 0.5 for out in stage.forward(items))  # speech is in there


def test_a_failed_vad_forward_leaves_every_stream_as_it_was(vad):
    stage = VadStage(vad, slot_capacity=2)
    good = _item("a", 0, stage.open_state("a", 0), VadInput(np.zeros(4_800, np.float32), 24_000))
    closed = _item("b", 1, None, VadInput(np.zeros(4_800, np.float32), 24_000))  # slot 1 never opened
    before = stage._slots[0].stream.checkpoint()
    with pytest.raises(RuntimeError, match="not open"):
        stage.forward([good, closed])
    after = stage._slots[0].stream.checkpoint()
    assert all(np.array_equal(x, y) for x, y in zip(before, after, strict=True))


def test_an_input_rate_change_gets_its_own_resampler(vad):
    stage = VadStage(vad, slot_capacity=1)
    state = stage.open_state("s", 0)
    g711_rate = soxr.resample(spoken_24k(QUESTION), 24_000, 8_000).astype(np.float32)
    out = stage.forward([_item("s", 0, state, VadInput(g711_rate[:8_000], 8_000))])[0]
    assert len(out.frames) >= 28  # one second of 8 kHz audio: 31 frames at 16 kHz, less the filter delay


def test_tts_speaks_only_completed_clauses_at_the_requested_rate():
    stage = TtsStage(HibariTts())
    text_only, spoken, g711 = stage.forward(
        [
            _item("a", 0, None, TextChunk(" the")),
            _item("b", 0, None, TextChunk(" Paris.", ("The capital of France is Paris.",))),
            _item("c", 0, None, TextChunk("", ("Paris.",), sample_rate=8_000)),
        ]
    )
    assert text_only.text == " the" and text_only.audio.size == 0
    assert spoken.sample_rate == 24_000 and 1.0 < spoken.audio.size / 24_000 < 4.0
    assert g711.sample_rate == 8_000 and 0.2 < g711.audio.size / 8_000 < 2.0
