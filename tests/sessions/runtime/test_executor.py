"""``StageExecutor`` between a real ``Session`` and real engines (batched, streaming, pipeline)."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from prometheus_client import CollectorRegistry

from sessions.engine import (
    Pipeline,
    PipelineResult,
    QueueFullError,
    StageEngine,
    StreamingStageEngine,
)
from sessions.errors import TickFailedError, TickSupersededError
from sessions.executor import StageExecutor
from sessions.session import SessionStatus
from sessions.tick import TickOutput
from tests.sessions.engine.conftest import wait_until
from tests.sessions.engine.stages import FakeStreamStage, FlakyStage, PooledStateStage, RecordingStage

from .fakes import make_session


def payload_of(snapshot):
    return snapshot.payload


@contextlib.asynccontextmanager
async def session_on(runner_factory):
    """A session whose executor and lifecycle are the runner ``runner_factory(registry)`` builds."""
    runner = runner_factory(CollectorRegistry())
    session = make_session(StageExecutor(runner, payload_of), lifecycle=runner)
    try:
        yield session, runner
    finally:
        await runner.close()


async def test_execute_opens_on_first_use_and_tags_the_item_with_the_tick():
    stage = RecordingStage()
    async with session_on(lambda r: StageEngine(stage, registry=r, coalesce_window_s=0.0)) as (
        session,
        engine,
    ):
        assert not engine.is_open(session.session_id)
        result = await session.next_tick(21)
        assert isinstance(result, TickOutput) and result.value == 42
        assert result.metadata.chunk_index == 0 and engine.is_open(session.session_id)
        item = stage.items[0][0]
        assert (item.session_id, item.epoch, item.request_id) == ("world-1", 0, "world-1-request-0")
        await session.reset()  # releases the slot; the next tick opens it again
        assert not engine.is_open(session.session_id)
        await session.next_tick(1)
        assert stage.items[-1][0].epoch == session.epoch == 1


async def test_resident_state_lives_across_ticks_and_a_reset_starts_it_fresh():
    stage = PooledStateStage(slot_capacity=2, width=2)
    async with session_on(lambda r: StageEngine(stage, registry=r, coalesce_window_s=0.0)) as (session, _):
        assert [(await session.next_tick(x)).value for x in (1, 2)] == [2.0, 6.0]
        await session.reset()
        assert stage.released == [("world-1", 0)]
        assert (await session.next_tick(1)).value == 2.0


async def test_a_failed_item_fails_the_tick_and_releases_the_slot():
    async with session_on(lambda r: StageEngine(FlakyStage(), registry=r, coalesce_window_s=0.0)) as (
        session,
        engine,
    ):
        with pytest.raises(TickFailedError):
            await session.next_tick("bad")
        assert session.status is SessionStatus.FAILED and not engine.is_open(session.session_id)


async def test_a_full_engine_queue_is_transient_for_the_session():
    stage = RecordingStage(delay_s=0.3)
    async with session_on(lambda r: StageEngine(stage, registry=r, max_pending=1, coalesce_window_s=0.0)) as (
        session,
        engine,
    ):
        await engine.open("busy")
        running = engine.submit("busy", 0, 1)
        await wait_until(lambda: stage.items)
        queued = engine.submit("busy", 0, 2)  # the one pending place is taken
        await engine.open(session.session_id)
        with pytest.raises(QueueFullError):
            await session.next_tick(3)
        assert session.status is SessionStatus.ACTIVE and session.chunk_index == 0
        assert await asyncio.gather(running, queued) == [2, 4]
        assert (await session.next_tick(3)).value == 6


async def test_a_streaming_tick_streams_the_stage_chunks_and_commits():
    stage = FakeStreamStage(step_s=0.001)
    async with session_on(lambda r: StreamingStageEngine(stage, registry=r)) as (session, _):
        chunks = [chunk async for chunk in session.stream_tick(3)]
        assert [(c.seq, c.value) for c in chunks] == [(k, ("world-1", 0, k)) for k in range(3)]
        assert stage.started[0].request_id == chunks[0].metadata.request_id == "world-1-request-0"
        assert session.chunk_index == 1


async def test_a_reset_mid_stream_aborts_the_stage_request_by_the_tick_id():
    stage = FakeStreamStage(stall_at=1, stall_s=30.0)  # chunk 1 never comes: the reader waits
    async with session_on(lambda r: StreamingStageEngine(stage, registry=r)) as (session, engine):
        stream = session.stream_tick(None)  # endless
        await stream.__anext__()
        reader = asyncio.create_task(stream.__anext__())
        await asyncio.sleep(0)
        await session.reset()
        with pytest.raises(TickSupersededError):
            await reader
        assert stage.aborted[:1] == ["world-1-request-0"] and session.chunk_index == 0
        await wait_until(lambda: not stage.live)
        assert not engine.is_open(session.session_id)


async def test_leaving_a_streaming_tick_early_aborts_the_stage_request_at_once():
    stage = FakeStreamStage()
    async with session_on(lambda r: StreamingStageEngine(stage, registry=r)) as (session, _):
        stream = session.stream_tick(None)
        await stream.__anext__()
        await stream.aclose()
        assert stage.aborted == ["world-1-request-0"]
        assert session.status is SessionStatus.FAILED


async def test_a_full_streaming_engine_is_transient_for_a_streaming_tick():
    stage = FakeStreamStage()
    async with session_on(lambda r: StreamingStageEngine(stage, registry=r, max_pending=1)) as (
        session,
        engine,
    ):
        await engine.open("other")
        other = engine.stream("other", 0, None, request_id="other")
        await other.__anext__()
        with pytest.raises(QueueFullError):
            async for _ in session.stream_tick(1):
                pass
        assert session.status is SessionStatus.ACTIVE and session.chunk_index == 0
        await other.aclose()
        await wait_until(lambda: not stage.live)
        assert [c.value async for c in session.stream_tick(1)] == [("world-1", 0, 0)]


async def test_a_tick_on_a_pipeline_returns_the_head_and_a_tail_that_resolves_later():
    def pipeline(registry):
        return Pipeline(
            [
                StageEngine(RecordingStage("first"), registry=registry, coalesce_window_s=0.0),
                StageEngine(RecordingStage("second", delay_s=0.1), registry=registry, coalesce_window_s=0.0),
            ],
            registry=registry,
        )

    async with session_on(pipeline) as (session, runner):
        result = await session.next_tick(1)
        assert isinstance(result.value, PipelineResult) and result.value.head == 2
        assert session.chunk_index == 1 and not result.value.tail.done()  # committed on the head
        assert await result.value.tail == 4
        assert runner.is_open(session.session_id)


async def test_side_work_runs_under_the_sessions_id_and_epoch_and_an_interrupt_fences_the_runner():
    """``Session.submit`` (the voice kind's VAD and ASR) tags work with the session's current
    epoch; ``Session.interrupt`` fences the executor's runner (older work there is stale)."""
    stage, side = RecordingStage(delay_s=0.2), RecordingStage()
    side_engine = StageEngine(side, registry=CollectorRegistry(), coalesce_window_s=0.0)
    async with session_on(lambda r: StageEngine(stage, registry=r, coalesce_window_s=0.0)) as (
        session,
        engine,
    ):
        await side_engine.open(session.session_id)
        assert await session.submit(side_engine, 5) == 10
        tick = asyncio.create_task(session.next_tick(1))
        await wait_until(lambda: stage.items)
        session.interrupt()
        with pytest.raises(TickSupersededError):
            await tick
        assert engine.epoch(session.session_id) == session.epoch == 1  # the runner was fenced
        assert await session.submit(side_engine, 6) == 12
        assert [i[0].epoch for i in side.items] == [0, 1]
        await session.reset()
        await session.submit(side_engine, 7)  # side work goes on while the session lives
        await side_engine.close()
