"""Resident per-session state: slots, byte accounting, release through the lifecycle path."""

from __future__ import annotations

import asyncio

import pytest

from sessions.engine import EngineConfigError, SessionReleasedError, SlotsExhaustedError, StageEngine
from tests.sessions.engine.conftest import metric
from tests.sessions.engine.stages import PooledStateStage, RecordingStage


async def test_slot_bytes_return_to_zero_after_all_sessions_close(make_engine, registry):
    stage = PooledStateStage(slot_capacity=4, width=16)
    async with make_engine(stage, coalesce_window_s=0.0) as engine:
        assert engine.per_session_bytes == 64
        slots = [await engine.open(sid) for sid in "abc"]
        assert sorted(slot.index for slot in slots) == [0, 1, 2]
        assert engine.slots.bytes_in_use == 3 * 64
        assert metric(registry, "engine_slot_bytes", stage="pooled") == 3 * 64
        # state is resident across ticks and gathered by slot index
        for _ in range(3):
            results = await asyncio.gather(*(engine.submit(sid, 0, 1) for sid in "abc"))
        assert results == [48.0, 48.0, 48.0]  # 16 columns x 3 ticks
        for sid in "abc":
            await engine.release(sid, "close")
        assert engine.slots.bytes_in_use == 0 and len(engine.slots) == 0
        assert metric(registry, "engine_slot_bytes", stage="pooled") == 0
        assert metric(registry, "engine_slots_open", stage="pooled") == 0
        assert sorted(stage.released) == sorted(stage.opened)
        await engine.release("a", "close")  # idempotent
        reopened = await engine.open("d")
        assert reopened.index in (0, 1, 2)
        assert await engine.submit("d", 0, 1) == 16.0  # a reused slot starts from fresh state


async def test_open_is_idempotent_and_capacity_is_enforced(make_engine, registry):
    stage = PooledStateStage(slot_capacity=2)
    async with make_engine(stage) as engine:
        first = await engine.open("a")
        assert await engine.open("a") is first
        await engine.open("b")
        with pytest.raises(SlotsExhaustedError):
            await engine.open("c")
        await engine.release("a", "evicted")
        await engine.open("c")
    with pytest.raises(EngineConfigError, match="slot_capacity"):
        StageEngine(PooledStateStage(slot_capacity=2), registry=registry, max_sessions=3)


async def test_release_fails_pending_work_and_waits_for_the_running_forward(make_engine):
    stage = RecordingStage(delay_s=0.2)
    async with make_engine(stage, coalesce_window_s=0.0) as engine:
        await engine.open("a")
        running = engine.submit("a", 0, 1)
        await asyncio.sleep(0.05)
        queued = engine.submit("a", 0, 2)
        await engine.release("a", "disconnect")
        with pytest.raises(SessionReleasedError) as released:
            await queued
        assert released.value.reason == "disconnect"
        with pytest.raises(SessionReleasedError):
            await running  # its consumer is gone; the result is discarded
        assert len(stage.batches) == 1


async def test_failed_release_keeps_bytes_until_a_retry_succeeds(make_engine):
    stage = PooledStateStage()
    async with make_engine(stage) as engine:
        await engine.open("a")
        stage.fail_release = True
        with pytest.raises(RuntimeError, match="device release failed"):
            await engine.release("a", "close")
        assert engine.slots.get("a").status == "release_failed"
        assert engine.slots.bytes_in_use == engine.per_session_bytes
        stage.fail_release = False
        await engine.release("a", "close")
        assert engine.slots.bytes_in_use == 0
