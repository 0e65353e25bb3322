"""Failure isolation (one item, whole batch), typed submit errors, limits checked at construction."""

from __future__ import annotations

import asyncio
import logging
import math

import pytest

from sessions.engine import (
    EngineClosedError,
    EngineConfigError,
    QueueFullError,
    SessionNotOpenError,
    StageBatchError,
    StageEngine,
    StageItemError,
    StaleEpochError,
)
from tests.sessions.engine.conftest import metric
from tests.sessions.engine.stages import FlakyStage, RecordingStage


async def test_a_failed_item_fails_only_that_item(make_engine, registry):
    async with make_engine(FlakyStage(), coalesce_window_s=0.0) as engine:
        for sid in "abc":
            await engine.open(sid)
        results = await asyncio.gather(
            engine.submit("a", 0, "ok-a"),
            engine.submit("b", 0, "bad"),
            engine.submit("c", 0, "ok-c"),
            return_exceptions=True,
        )
        assert results[0] == "ok-a" and results[2] == "ok-c"
        assert isinstance(results[1], StageItemError)
        assert isinstance(results[1].cause, ValueError) and results[1].session_id == "b"
        assert await engine.submit("b", 0, "again") == "again"  # the session goes on
    assert metric(registry, "engine_failures_total", stage="rec", scope="item") == 1


async def test_a_raising_forward_fails_its_batch_and_the_engine_keeps_serving(make_engine, registry):
    stage = FlakyStage()
    async with make_engine(stage, coalesce_window_s=0.0) as engine:
        for sid in "abc":
            await engine.open(sid)
        results = await asyncio.gather(
            *(engine.submit(sid, 0, "boom" if sid == "a" else sid) for sid in "abc"), return_exceptions=True
        )
        assert all(isinstance(r, StageBatchError) for r in results)
        assert results[0].batch_size == 3 and isinstance(results[0].cause, RuntimeError)
        assert await asyncio.gather(*(engine.submit(sid, 0, sid) for sid in "abc")) == list("abc")
    assert metric(registry, "engine_failures_total", stage="rec", scope="batch") == 3


async def test_wrong_output_count_is_a_batch_failure(make_engine):
    class Short(RecordingStage):
        def forward(self, items):
            return []

    async with make_engine(Short(), coalesce_window_s=0.0) as engine:
        await engine.open("a")
        with pytest.raises(StageBatchError, match="0 outputs for 1 items"):
            await engine.submit("a", 0, 1)


async def test_submit_errors_are_typed_and_immediate(make_engine):
    async with make_engine(RecordingStage(delay_s=0.1), max_pending=2, coalesce_window_s=0.0) as engine:
        with pytest.raises(SessionNotOpenError):
            engine.submit("nobody", 0, 1)
        await engine.open("a")
        engine.bump_epoch("a", 3)
        with pytest.raises(StaleEpochError) as stale:
            engine.submit("a", 2, 1)
        assert (stale.value.epoch, stale.value.current) == (2, 3)
        first = engine.submit("a", 3, 1)
        await asyncio.sleep(0.02)  # in flight now; two more fill the queue
        queued = [engine.submit("a", 3, 1), engine.submit("a", 3, 1)]
        with pytest.raises(QueueFullError):
            engine.submit("a", 3, 1)
        assert await asyncio.gather(first, *queued) == [2, 2, 2]
    with pytest.raises(EngineClosedError):
        engine.submit("a", 3, 1)


async def test_close_fails_pending_work_and_releases_slots(registry):
    stage = RecordingStage(delay_s=0.2)
    engine = StageEngine(stage, registry=registry, coalesce_window_s=0.0)
    await engine.open("a")
    running = engine.submit("a", 0, 1)
    await asyncio.sleep(0.05)
    queued = engine.submit("a", 0, 2)
    await engine.close()
    assert await running == 2  # the in-flight forward finished
    with pytest.raises(EngineClosedError):
        await queued
    assert len(engine.slots) == 0 and not engine.worker.thread.is_alive()


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf, -math.inf, "1"])
def test_bad_stall_deadline_is_rejected_at_construction(registry, bad):
    with pytest.raises(EngineConfigError, match="stall_timeout_s"):
        StageEngine(RecordingStage(), registry=registry, stall_timeout_s=bad)


def test_zero_stall_deadline_disables_it_with_a_warning(registry, caplog):
    with caplog.at_level(logging.WARNING, logger="sessions.engine"):
        engine = StageEngine(RecordingStage(), registry=registry, stall_timeout_s=0)
    assert engine.stall_timeout_s == 0
    assert "stall deadline disabled" in caplog.text
    asyncio.run(engine.close())


@pytest.mark.parametrize(
    "limits",
    [
        {"max_batch": 0},
        {"max_pending": -1},
        {"stream_buffer": 0},
        {"coalesce_window_s": -0.01},
        {"coalesce_window_s": math.nan},
        {"eager_remaining": -1},
        {"backpressure": "drop_newest"},
        {"max_sessions": 0},
    ],
)
def test_bad_limits_are_rejected(registry, limits):
    with pytest.raises(EngineConfigError):
        StageEngine(RecordingStage(), registry=registry, **limits)
