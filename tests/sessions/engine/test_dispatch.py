"""The frame-clock dispatch policy: lockstep steps every period, silence, lateness, no stragglers."""

from __future__ import annotations

import asyncio
import math
import time

import pytest

from sessions.engine import EngineConfigError, FrameClock
from tests.sessions.engine.conftest import wait_until
from tests.sessions.engine.stages import RecordingStage

SILENCE = 0  # the silence frame; RecordingStage doubles it to 0


def clock(period_s: float) -> tuple[FrameClock, list[tuple[str, int]]]:
    """A frame clock whose silent-step outputs are collected in the returned list."""
    heard: list[tuple[str, int]] = []
    return FrameClock(
        period_s, silence=lambda _sid: SILENCE, on_output=lambda sid, out: heard.append((sid, out))
    ), heard


async def test_open_sessions_step_together_each_period_on_silence_without_input(make_engine):
    period = 0.05
    policy, heard = clock(period)
    stage = RecordingStage("duplex")
    async with make_engine(stage, dispatch=policy, max_batch=8) as engine:
        for sid in "abc":
            await engine.open(sid)
        await wait_until(lambda: len(stage.items) >= 2)  # the clock steps with no input at all
        assert await engine.submit("a", 0, 5) == 10  # input joins the next step
        await wait_until(lambda: len(stage.items) >= 8)
    batches = [{item.session_id: item.payload for item in batch} for batch in stage.items]
    assert all(sorted(b) == list("abc") for b in batches)  # every step holds every open session
    with_input = [b for b in batches if b["a"] == 5]
    assert len(with_input) == 1 and with_input[0]["b"] == with_input[0]["c"] == SILENCE
    silent = sum(1 for b in batches for payload in b.values() if payload == SILENCE)
    assert len(heard) == silent == policy.silent_steps == 3 * len(batches) - 1
    assert {out for _sid, out in heard} == {0} and {sid for sid, _ in heard} == set("abc")
    assert policy.steps == len(batches)
    span = stage.starts[-1] - stage.starts[0]
    assert 0.8 * period * (len(batches) - 1) <= span <= 5 * period * (len(batches) - 1)


async def test_a_late_step_is_counted_and_missed_slots_are_skipped_not_caught_up(make_engine):
    period = 0.1

    class SlowOnce(RecordingStage):
        def forward(self, items):
            self.delay_s = 0.45 if not self.items else 0.0
            return super().forward(items)

    policy, _heard = clock(period)
    stage = SlowOnce("duplex")
    async with make_engine(stage, dispatch=policy) as engine:
        await engine.open("a")
        await wait_until(lambda: len(stage.items) >= 4)
    assert policy.missed_steps >= 2  # ~4 slots passed during the 0.45 s forward
    assert policy.late_steps >= 1 and max(policy.lateness_s) >= 0.3
    # back on the clock after the late step: no burst of catch-up steps
    assert stage.starts[3] - stage.starts[2] >= 0.4 * period


async def test_a_session_whose_consumer_stalls_does_not_delay_the_others(make_engine):
    period = 0.05
    policy, heard = clock(period)
    stage = RecordingStage("duplex")
    async with make_engine(stage, dispatch=policy, max_batch=8) as engine:
        for sid in ("stalled", "a", "b"):
            await engine.open(sid)
        unread = [engine.stream("stalled", 0, 1, buffer=1) for _ in range(3)]  # never read
        got = {"a": 0, "b": 0}

        async def steady(sid: str) -> None:
            for x in range(1, 7):
                assert await engine.submit(sid, 0, x) == 2 * x
                got[sid] += 1

        t0 = time.monotonic()
        await asyncio.wait_for(asyncio.gather(steady("a"), steady("b")), timeout=5 * 7 * period)
        elapsed = time.monotonic() - t0
        del unread
    assert got == {"a": 6, "b": 6}
    assert elapsed <= 5 * 7 * period
    # the stalled session kept stepping with everyone: its inputs, then silence
    assert all("stalled" in [item.session_id for item in batch] for batch in stage.items)
    assert ("stalled", 0) in heard


async def test_the_clock_stops_when_no_session_is_open_and_restarts_on_open(make_engine):
    period = 0.02
    policy, _heard = clock(period)
    stage = RecordingStage("duplex")
    async with make_engine(stage, dispatch=policy) as engine:
        await engine.open("a")
        await wait_until(lambda: len(stage.items) >= 2)
        await engine.release("a")
        await asyncio.sleep(period)  # a step already decided may still run
        stopped = len(stage.items)
        await asyncio.sleep(5 * period)
        assert len(stage.items) == stopped
        await engine.open("b")
        await wait_until(lambda: len(stage.items) > stopped)
        assert stage.batches[-1] == ["b"]


@pytest.mark.parametrize("period", [0, -0.01, math.nan, math.inf, "0.1"])
def test_a_bad_period_is_rejected(period):
    with pytest.raises(EngineConfigError, match="period_s"):
        FrameClock(period, silence=lambda _sid: SILENCE, on_output=lambda _sid, _out: None)


async def test_beyond_max_batch_silent_sessions_take_turns_and_none_starves(make_engine):
    policy, heard = clock(0.02)
    stage = RecordingStage("duplex")
    async with make_engine(stage, dispatch=policy, max_batch=2) as engine:
        for sid in "abc":
            await engine.open(sid)
        await wait_until(lambda: len(stage.items) >= 9)
    stepped = [item.session_id for batch in stage.items[:9] for item in batch]
    assert all(len(batch) == 2 for batch in stage.items[:9])
    assert {sid: stepped.count(sid) for sid in "abc"} == {"a": 6, "b": 6, "c": 6}  # 18 steps, fair
