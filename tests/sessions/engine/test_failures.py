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
from tests.sessions.engine.stages import FlakyStage, PooledStateStage, RecordingStage


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


async def test_a_raising_forward_fails_only_the_offending_item(make_engine, registry):
    """Batch isolation: the forward that raised is re-run in halves until only "c" fails alone."""
    stage = FlakyStage()
    async with make_engine(stage, max_batch=8, coalesce_window_s=0.0) as engine:
        for sid in "abcd":
            await engine.open(sid)
        results = await asyncio.gather(
            *(engine.submit(sid, 0, "boom" if sid == "c" else sid) for sid in "abcd"), return_exceptions=True
        )
        assert [results[0], results[1], results[3]] == ["a", "b", "d"]
        assert isinstance(results[2], StageBatchError)
        assert results[2].batch_size == 1 and isinstance(results[2].cause, RuntimeError)
        assert stage.batches == [list("abcd"), list("ab"), list("cd"), ["c"], ["d"]]
        assert await asyncio.gather(*(engine.submit(sid, 0, sid) for sid in "abcd")) == list("abcd")
    assert metric(registry, "engine_failures_total", stage="rec", scope="batch") == 1


async def test_batch_isolation_advances_healthy_sessions_state_exactly_once(make_engine, registry):
    """A poisoned item in a stateful pooled stage's batch: the transactional forward wrote nothing
    when it raised, so after bisecting each healthy row holds its input exactly once."""
    stage = PooledStateStage(slot_capacity=4, width=2)
    async with make_engine(stage, max_batch=4, coalesce_window_s=0.0) as engine:
        slots = {sid: (await engine.open(sid)).index for sid in "abcd"}
        payloads = {"a": 1, "b": 2, "c": "poison", "d": 4}
        results = await asyncio.gather(
            *(engine.submit(sid, 0, payloads[sid]) for sid in "abcd"), return_exceptions=True
        )
        assert [results[0], results[1], results[3]] == [2.0, 4.0, 8.0]
        assert isinstance(results[2], StageBatchError) and results[2].batch_size == 1
        assert stage.forwards[0] == list("abcd") and len(stage.forwards) > 1
        rows = {sid: stage.pool[slot].tolist() for sid, slot in slots.items()}
        assert rows == {"a": [1.0, 1.0], "b": [2.0, 2.0], "c": [0.0, 0.0], "d": [4.0, 4.0]}
        # the poisoned session goes on from its untouched state, as do the others
        assert await asyncio.gather(*(engine.submit(sid, 0, 1) for sid in "abcd")) == [4.0, 6.0, 2.0, 10.0]
    assert metric(registry, "engine_failures_total", stage="pooled", scope="batch") == 1


async def test_every_item_failing_alone_fails_every_item(make_engine):
    async with make_engine(FlakyStage(), coalesce_window_s=0.0) as engine:
        for sid in "ab":
            await engine.open(sid)
        results = await asyncio.gather(
            *(engine.submit(sid, 0, "boom") for sid in "ab"), return_exceptions=True
        )
        assert all(isinstance(r, StageBatchError) and r.batch_size == 1 for r in results)
        assert await engine.submit("a", 0, "ok") == "ok"


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


async def test_a_newer_epoch_is_made_current_before_the_queue_bound(make_engine):
    """A submit of a newer epoch drops the older work first: a queue full of stale work takes it."""
    async with make_engine(RecordingStage(delay_s=0.1), max_pending=1, coalesce_window_s=0.0) as engine:
        await engine.open("a")
        running = engine.submit("a", 0, 1)
        await asyncio.sleep(0.02)  # in flight now; one more fills the queue
        stale = engine.submit("a", 0, 2)
        fresh = engine.submit("a", 1, 3)
        for old in (running, stale):
            with pytest.raises(StaleEpochError):
                await old
        assert await fresh == 6


async def test_close_fails_pending_work_and_releases_slots(registry):
    stage = RecordingStage(delay_s=0.2)
    engine = StageEngine(stage, registry=registry, coalesce_window_s=0.0)
    await engine.open("a")
    running = engine.submit("a", 0, 1)
    await asyncio.sleep(0.05)
    queued = engine.submit("a", 0, 2)
    queued_stream = engine.stream("a", 0, 3)
    await engine.close()
    assert await running == 2  # the in-flight forward finished
    with pytest.raises(EngineClosedError):
        await queued
    with pytest.raises(EngineClosedError):
        await queued_stream.collect()
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
