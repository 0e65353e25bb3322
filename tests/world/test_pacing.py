"""``PlaybackPacer``: the client-playback model and the lead the world kind paces to."""

from __future__ import annotations

import pytest

from realtime.kinds.world_pacing import PlaybackPacer


def _pacer(**kw) -> PlaybackPacer:
    return PlaybackPacer(**{"fps": 16, "margin_s": 0.04, "window": 3, "cap_s": 1.0, **kw})


def test_first_block_starts_at_once_then_waits_for_the_first_send():
    pacer = _pacer()
    assert pacer.wait_s(0.0) == 0.0 and pacer.lead_s() is None
    pacer.generated(5)
    assert pacer.wait_s(0.0) is None  # nothing measured yet: wait for the send
    shows_at = pacer.sent(5, now=10.0, tick_s=0.1)
    assert shows_at == 10.0 and pacer.play_end == pytest.approx(10.0 + 5 / 16)
    assert pacer.lead_s() == pytest.approx(0.14)
    # the next block starts when the client holds only the lead
    assert pacer.wait_s(10.0) == pytest.approx(5 / 16 - 0.14)
    assert pacer.wait_s(10.2) == 0.0


def test_unsent_frames_count_as_ahead_and_a_late_chunk_is_a_stall():
    pacer = _pacer()
    pacer.sent(8, now=0.0, tick_s=0.05)  # plays until 0.5
    pacer.generated(8)
    assert pacer.ahead_s(0.25) == pytest.approx(0.25 + 0.5)
    assert pacer.sent(8, now=0.4, tick_s=0.05) == pytest.approx(0.5)  # on time: plays after the first
    assert pacer.stalls == 0
    assert pacer.sent(8, now=1.2, tick_s=0.05) == pytest.approx(1.2)  # the client ran dry at 1.0
    assert pacer.stalls == 1 and pacer.play_end == pytest.approx(1.7)


def test_lead_is_the_slowest_recent_tick_plus_margin_capped():
    pacer = _pacer(window=3, cap_s=0.3)
    for tick_s in (0.05, 0.2, 0.06, 0.07):
        pacer.sent(8, now=0.0, tick_s=tick_s)
    assert pacer.lead_s() == pytest.approx(0.2 + 0.04)  # 0.05 left the window of 3
    pacer.sent(8, now=0.0, tick_s=0.08)
    pacer.sent(8, now=0.0, tick_s=0.09)
    assert pacer.lead_s() == pytest.approx(0.09 + 0.04)  # the spike aged out
    pacer.sent(8, now=0.0, tick_s=5.0)
    assert pacer.lead_s() == 0.3  # capped at max_ahead_blocks blocks


def test_restart_forgets_playback_but_keeps_the_measured_ticks():
    pacer = _pacer()
    pacer.sent(8, now=0.0, tick_s=0.1)
    pacer.generated(8)
    pacer.restart()
    assert (pacer.play_end, pacer.unsent_frames, pacer.stalls) == (None, 0, 0)
    assert pacer.wait_s(0.0) == 0.0 and pacer.lead_s() == pytest.approx(0.14)
