"""The WebRTC call's output audio buffer (``realtime.webrtc.playout``), sans-I/O."""

from __future__ import annotations

import numpy as np

from realtime.protocols.oai_realtime import server_events as ev
from realtime.webrtc.playout import FRAME_SAMPLES, RATE, Playout


def _tone(seconds: float) -> np.ndarray:
    return np.full(int(seconds * RATE), 1000, np.int16)


def _types(events: list) -> list[str]:
    return [type(e).__name__ for e in events]


def test_started_when_a_response_plays_and_stopped_once_it_is_done_and_drained():
    p = Playout()
    p.push("resp_1", "item_1", _tone(0.05))  # 2.5 frames
    frame, events = p.pull()
    assert _types(events) == ["OutputAudioStarted"] and events[0].response_id == "resp_1"
    assert frame.shape == (FRAME_SAMPLES,) and (frame == 1000).all()
    assert p.finish("resp_1") == []  # audio still queued
    _, events = p.pull()
    assert events == []
    frame, events = p.pull()  # the last half frame, then silence
    assert (frame[: FRAME_SAMPLES // 2] == 1000).all() and (frame[FRAME_SAMPLES // 2 :] == 0).all()
    assert events == [ev.OutputAudioStopped("resp_1")]
    assert p.pull()[1] == []


def test_an_underrun_inside_a_response_is_silence_not_a_stop():
    p = Playout()
    p.push("resp_1", "item_1", _tone(0.02))
    assert _types(p.pull()[1]) == ["OutputAudioStarted"]
    frame, events = p.pull()
    assert events == [] and not frame.any()
    p.push("resp_1", "item_1", _tone(0.02))
    assert p.pull()[1] == []
    assert p.finish("resp_1") == [ev.OutputAudioStopped("resp_1")]


def test_the_next_response_stops_the_previous_one():
    p = Playout()
    p.push("resp_1", "item_1", _tone(0.02))
    p.push("resp_2", "item_2", _tone(0.02))
    assert _types(p.pull()[1]) == ["OutputAudioStarted"]
    events = p.pull()[1]
    assert events == [ev.OutputAudioStopped("resp_1"), ev.OutputAudioStarted("resp_2")]


def test_clear_drops_the_rest_and_says_how_much_played():
    p = Playout()
    p.push("resp_1", "item_1", _tone(1.0))
    for _ in range(10):
        p.pull()
    cut, events = p.clear()
    assert cut is not None and (cut.response_id, cut.item_id, cut.played_ms) == ("resp_1", "item_1", 200)
    assert events == [ev.OutputAudioCleared("resp_1")]
    assert p.queued_samples == 0 and not p.pull()[0].any()
    assert p.clear() == (None, [])


def test_a_finished_response_without_audio_leaves_nothing_behind():
    p = Playout()
    assert p.finish("resp_text_only") == []
    p.push("resp_2", "item_2", _tone(0.02))
    assert _types(p.pull()[1]) == ["OutputAudioStarted"]
    assert p.pull()[1] == []  # resp_2 is not finished: no stop


def test_audio_beyond_the_bound_is_dropped_and_counted():
    p = Playout(max_seconds=0.1)
    p.push("resp_1", "item_1", _tone(0.3))
    assert p.queued_samples == int(0.1 * RATE)
    assert p.dropped_samples == int(0.2 * RATE)
