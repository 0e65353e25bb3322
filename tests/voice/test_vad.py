"""Silero VAD streams and the server_vad turn detector (models/voice/vad.py)."""

from __future__ import annotations

import numpy as np
import pytest

from models.voice.vad import (
    FRAME_MS,
    FRAME_SAMPLES,
    ServerVadConfig,
    SileroVad,
    SpeechPaused,
    SpeechStarted,
    SpeechStopped,
    TurnDetector,
)
from tests.voice.speech import spoken_16k

QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def vad() -> SileroVad:
    return SileroVad()


def _frame(value: float = 0.0) -> np.ndarray:
    return np.full(FRAME_SAMPLES, value, np.float32)


def test_spoken_question_with_silence_around_gives_one_turn(vad):
    audio = spoken_16k(QUESTION, lead_silence_s=1.0, tail_silence_s=1.5)
    stream, detector = vad.stream(), TurnDetector()
    decisions = []
    for start in range(0, len(audio), 480):  # 30 ms chunks: frames straddle chunk boundaries
        decisions += detector.push_frames(*stream.feed(audio[start : start + 480]))
    assert [type(d) for d in decisions] == [SpeechStarted, SpeechStopped]
    started, stopped = decisions
    speech = np.flatnonzero(np.abs(audio) > 1e-3)
    onset_ms, offset_ms = speech[0] / 16, speech[-1] / 16
    assert onset_ms - 300 - 2 * FRAME_MS <= started.audio_start_ms <= onset_ms - 300 + 3 * FRAME_MS
    assert offset_ms + 500 - FRAME_MS <= stopped.audio_end_ms <= offset_ms + 500 + 6 * FRAME_MS
    assert stopped.audio_start_ms == started.audio_start_ms
    assert len(stopped.audio) == (stopped.audio_end_ms - stopped.audio_start_ms) * 16
    begin = stopped.audio_start_ms * 16
    np.testing.assert_array_equal(stopped.audio, audio[begin : begin + len(stopped.audio)])


def test_silence_alone_never_starts_speech(vad):
    stream, detector = vad.stream(), TurnDetector()
    assert detector.push_frames(*stream.feed(np.zeros(16_000 * 3, np.float32))) == []
    assert detector.position_ms == (16_000 * 3 // FRAME_SAMPLES) * FRAME_MS


def test_batched_forward_equals_separate_streams(vad):
    a = spoken_16k(QUESTION)[: 40 * FRAME_SAMPLES].reshape(40, FRAME_SAMPLES)
    b = spoken_16k("Tell me a fun fact about cats.")[: 40 * FRAME_SAMPLES].reshape(40, FRAME_SAMPLES)
    alone_a, alone_b = vad.stream().feed(a.reshape(-1))[1], vad.stream().feed(b.reshape(-1))[1]
    sa, sb = vad.stream(), vad.stream()
    together = np.stack([vad.forward([sa, sb], np.stack([a[i], b[i]])) for i in range(40)])
    np.testing.assert_allclose(together[:, 0], alone_a, atol=1e-5)
    np.testing.assert_allclose(together[:, 1], alone_b, atol=1e-5)
    assert alone_a.max() > 0.9


def test_stream_reset_forgets_state(vad):
    audio = spoken_16k(QUESTION)[: 20 * FRAME_SAMPLES]
    stream = vad.stream()
    first = stream.feed(audio)[1]
    stream.feed(audio[:100])
    stream.reset()
    np.testing.assert_allclose(stream.feed(audio)[1], first, atol=1e-6)


def test_forward_rejects_mismatched_frames(vad):
    with pytest.raises(ValueError, match="frames must be"):
        vad.forward([vad.stream()], np.zeros((2, FRAME_SAMPLES), np.float32))


def _run(detector: TurnDetector, probabilities: list[float]) -> list[tuple[int, object]]:
    return [(i, d) for i, p in enumerate(probabilities) if (d := detector.push(_frame(i), p)) is not None]


def test_prefix_padding_and_silence_duration_round_up_to_frames():
    detector = TurnDetector(ServerVadConfig(prefix_padding_ms=100, silence_duration_ms=100))
    probs = [0.0] * 10 + [0.9] * 5 + [0.0] * 10
    (i0, started), (i1, stopped) = _run(detector, probs)
    assert (i0, started) == (10, SpeechStarted(audio_start_ms=(10 - 4) * FRAME_MS))  # ceil(100/32) = 4
    assert i1 == 15 + 4 - 1 and stopped.audio_end_ms == 19 * FRAME_MS
    assert [int(v) for v in stopped.audio[::FRAME_SAMPLES]] == list(range(6, 19))


def test_hysteresis_keeps_speech_through_dips_above_threshold_minus_offset():
    detector = TurnDetector(ServerVadConfig(threshold=0.5, silence_duration_ms=64))
    decisions = _run(detector, [0.9, 0.4, 0.4, 0.4, 0.2, 0.2])
    assert [type(d) for _, d in decisions] == [SpeechStarted, SpeechStopped]
    assert decisions[1][0] == 5


def test_max_utterance_bound_commits_and_speech_restarts():
    detector = TurnDetector(ServerVadConfig(prefix_padding_ms=0, max_utterance_ms=10 * FRAME_MS))
    decisions = _run(detector, [0.9] * 25)
    assert [(i, type(d)) for i, d in decisions] == [
        (0, SpeechStarted),
        (9, SpeechStopped),
        (10, SpeechStarted),
        (19, SpeechStopped),
        (20, SpeechStarted),
    ]
    assert len(decisions[1][1].audio) == 10 * FRAME_SAMPLES


def test_reset_drops_the_utterance_but_keeps_the_clock():
    detector = TurnDetector()
    _run(detector, [0.0, 0.9, 0.9])
    assert detector.in_speech
    detector.reset()
    assert not detector.in_speech and detector.position_ms == 3 * FRAME_MS
    assert detector.push(_frame(), 0.9) == SpeechStarted(audio_start_ms=3 * FRAME_MS)


def test_a_candidate_end_of_speech_is_announced_and_the_stop_names_it_when_silence_held():
    detector = TurnDetector(
        ServerVadConfig(prefix_padding_ms=0, silence_duration_ms=5 * FRAME_MS), speculate_ms=1
    )
    probs = [0.9] * 4 + [0.0] * 2 + [0.9] * 3 + [0.0] * 5  # a pause in the speech, then the end
    decisions = _run(detector, probs)
    assert [(i, type(d)) for i, d in decisions] == [
        (0, SpeechStarted),
        (4, SpeechPaused),  # the first silent frame
        (9, SpeechPaused),
        (13, SpeechStopped),
    ]
    first, last, stopped = (d for _, d in decisions[1:])
    assert len(first.audio) == 5 * FRAME_SAMPLES and first.audio_end_ms == 5 * FRAME_MS
    assert first.pause_id != last.pause_id == stopped.pause_id  # speech came after the first pause
    assert np.array_equal(
        stopped.audio[: len(last.audio)], last.audio
    )  # the stop's audio: the pause's + silence


def test_no_candidate_end_without_speculation_or_when_the_bound_stops_speech():
    assert [type(d) for _, d in _run(TurnDetector(), [0.9] * 3 + [0.0] * 20)] == [
        SpeechStarted,
        SpeechStopped,
    ]
    detector = TurnDetector(
        ServerVadConfig(prefix_padding_ms=0, max_utterance_ms=6 * FRAME_MS), speculate_ms=32
    )
    (_, _), (_, paused), (_, stopped) = _run(detector, [0.9, 0.9, 0.0, 0.9, 0.9, 0.9])
    assert isinstance(paused, SpeechPaused) and stopped.pause_id is None  # speech resumed after the pause


@pytest.mark.parametrize("bad", [{"threshold": 1.5}, {"prefix_padding_ms": -1}, {"silence_duration_ms": -5}])
def test_config_rejects_out_of_range_values(bad):
    with pytest.raises(ValueError):
        ServerVadConfig(**bad)
