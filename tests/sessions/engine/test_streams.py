"""Chunk streams and pipelines: stale epochs, stall deadline, backpressure, first-chunk start."""

from __future__ import annotations

import asyncio
import time

import pytest

from sessions.engine import EngineError, Pipeline, StageEngine, StaleEpochError, StallError
from tests.sessions.engine.conftest import metric
from tests.sessions.engine.stages import AbortableSlowStage, CountingStreamStage


async def test_stream_chunks_are_numbered_and_end_with_final(make_engine):
    async with make_engine(CountingStreamStage()) as engine:
        await engine.open("a")
        chunks = await engine.stream("a", 0, 4).collect()
    assert [c.seq for c in chunks] == [0, 1, 2, 3]
    assert [c.final for c in chunks] == [False, False, False, True]
    assert {(c.session_id, c.epoch) for c in chunks} == {("a", 0)}


async def wait_until(predicate, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.005)


async def test_stale_epoch_chunks_are_dropped_at_every_stage(registry):
    first = CountingStreamStage("first")
    second = CountingStreamStage("second")
    engines = [
        StageEngine(first, registry=registry, stream_buffer=2, coalesce_window_s=0.0),
        StageEngine(second, registry=registry, stream_buffer=2, coalesce_window_s=0.0),
    ]
    pipeline = Pipeline(engines, registry=registry, channel_size=2)
    try:
        await pipeline.open("s")
        old = pipeline.stream("s", 0, None)  # endless; nobody reads, so every buffer fills
        await wait_until(
            lambda: sum(len(h) for _, h in pipeline._hops["s"]) == 2 and first.steps.get("s", 0) >= 4
        )
        dropped = pipeline.bump_epoch("s", 1)
        assert dropped > 0
        assert metric(registry, "engine_stale_chunks_dropped_total", stage="first") > 0
        assert metric(registry, "engine_stale_chunks_dropped_total", stage="second") > 0
        with pytest.raises(StaleEpochError):
            async for _ in old:
                pass
        fresh = await pipeline.stream("s", 1, 3).collect()
        assert [(c.epoch, c.seq, c.final) for c in fresh] == [(1, 0, False), (1, 1, False), (1, 2, True)]
        assert all(c.payload[1] == 1 for c in fresh)  # the second stage only saw epoch-1 input
    finally:
        await pipeline.close()


async def test_epoch_bump_aborts_in_flight_work(make_engine, registry):
    stage = AbortableSlowStage(run_s=3.0)
    async with make_engine(stage, coalesce_window_s=0.0) as engine:
        await engine.open("a")
        result = engine.submit("a", 0, "old")
        await asyncio.sleep(0.1)
        t0 = time.monotonic()
        engine.bump_epoch("a", 1)
        with pytest.raises(StaleEpochError):
            await result  # the consumer hears at once, not after the forward
        assert time.monotonic() - t0 < 0.1
        assert await engine.submit("a", 1, "new") == "new"
    assert stage.durations[0] < 1.0  # the 3 s forward was cut short
    assert metric(registry, "engine_stale_chunks_dropped_total", stage="abortable") == 1


async def test_stall_deadline_fires_between_chunks(registry):
    class StallsAfterFirst(CountingStreamStage):
        def forward(self, items):
            if items[0].step == 1:
                time.sleep(0.6)
            return super().forward(items)

    engine = StageEngine(StallsAfterFirst(), registry=registry, stall_timeout_s=0.25)
    try:
        await engine.open("a")
        stream = engine.stream("a", 0, 5)
        first = await stream.__anext__()
        assert first.seq == 0
        t0 = time.monotonic()
        with pytest.raises(StallError):
            await stream.__anext__()
        assert 0.2 < time.monotonic() - t0 < 0.5
        assert metric(registry, "engine_stalls_total", stage="stream") == 1
    finally:
        await engine.close()


async def test_stall_deadline_measures_gaps_not_the_whole_stream(make_engine, registry):
    async with make_engine(CountingStreamStage(step_s=0.05), stall_timeout_s=0.2) as engine:
        await engine.open("a")
        chunks = await engine.stream("a", 0, 8).collect()  # ~0.4 s in total, 0.05 s apart
    assert len(chunks) == 8
    assert metric(registry, "engine_stalls_total", stage="stream") == 0


async def test_backpressure_bounds_a_slow_reader_and_spares_other_sessions(make_engine):
    stage = CountingStreamStage()
    buffer = 3
    async with make_engine(stage, stream_buffer=buffer, coalesce_window_s=0.0) as engine:
        await engine.open("slow")
        await engine.open("other")
        stream = engine.stream("slow", 0, None)  # endless producer
        consumed = 0
        for _ in range(10):
            await stream.__anext__()
            consumed += 1
            await asyncio.sleep(0.01)
            assert stage.steps["slow"] <= consumed + buffer + 1
        await asyncio.sleep(0.1)  # reader stops entirely: the producer stays paused
        assert stage.steps["slow"] <= consumed + buffer + 1
        t0 = time.monotonic()
        assert (await engine.stream("other", 0, 2).collect())[-1].final
        assert time.monotonic() - t0 < 0.5
        await stream.aclose()


async def test_drop_oldest_keeps_memory_bounded_and_counts_drops(make_engine, registry):
    stage = CountingStreamStage()
    async with make_engine(
        stage, stream_buffer=4, backpressure="drop_oldest", coalesce_window_s=0.0
    ) as engine:
        await engine.open("a")
        stream = engine.stream("a", 0, 50)
        await wait_until(lambda: stage.steps.get("a") == 50)
        await asyncio.sleep(0.02)
        chunks = await stream.collect()
    assert [c.seq for c in chunks] == [46, 47, 48, 49] and chunks[-1].final
    assert metric(registry, "engine_backpressure_dropped_total", stage="stream") == 46


async def test_downstream_starts_on_the_first_chunk(registry):
    first = CountingStreamStage("first", step_s=0.15)
    second = CountingStreamStage("second")
    pipeline = Pipeline(
        [StageEngine(s, registry=registry, coalesce_window_s=0.0) for s in (first, second)], registry=registry
    )
    try:
        await pipeline.open("a")
        t0 = time.monotonic()
        arrivals = []
        async for _chunk in pipeline.stream("a", 0, 4):
            arrivals.append(time.monotonic() - t0)
        assert len(arrivals) == 4 and arrivals[0] < 0.35  # first output after ~1 upstream step of 4
        assert second.first_step_at - t0 < 0.35
    finally:
        await pipeline.close()


async def test_pipeline_backpressure_reaches_the_first_stage(registry):
    first = CountingStreamStage("first")
    pipeline = Pipeline(
        [
            StageEngine(s, registry=registry, stream_buffer=2, coalesce_window_s=0.0)
            for s in (first, CountingStreamStage("second"))
        ],
        registry=registry,
        channel_size=2,
    )
    try:
        await pipeline.open("a")
        stream = pipeline.stream("a", 0, None)
        await stream.__anext__()
        await asyncio.sleep(0.2)  # reader stalls; every hop fills, then the first stage pauses
        assert first.steps["a"] <= 12
        await stream.aclose()
        await asyncio.sleep(0.05)
        assert not pipeline._tasks  # relays ended with the stream
    finally:
        await pipeline.close()


async def test_a_downstream_failure_reaches_the_consumer_and_stops_upstream(registry):
    class Fails(CountingStreamStage):
        def forward(self, items):
            return [ValueError("decoder broke") for _ in items]

    first = CountingStreamStage("first")
    pipeline = Pipeline(
        [
            StageEngine(first, registry=registry, coalesce_window_s=0.0),
            StageEngine(Fails("second"), registry=registry),
        ],
        registry=registry,
    )
    try:
        await pipeline.open("a")
        with pytest.raises(EngineError, match="decoder broke"):
            await pipeline.stream("a", 0, None).collect()
        steps = first.steps["a"]
        await asyncio.sleep(0.1)
        assert first.steps["a"] <= steps + 1  # the endless upstream was cancelled
        await pipeline.release("a", "close")
        assert pipeline.bytes_in_use == 0
    finally:
        await pipeline.close()


async def test_an_abandoned_stream_releases_its_work(make_engine):
    import gc

    stage = CountingStreamStage()
    async with make_engine(stage, stream_buffer=2, coalesce_window_s=0.0) as engine:
        await engine.open("a")
        stream = engine.stream("a", 0, None)
        await stream.__anext__()
        del stream
        gc.collect()
        await asyncio.sleep(0.05)
        steps = stage.steps["a"]
        assert engine._pending_count == 0
        assert await engine.submit("a", 0, 1) == ("a", 0, 0)  # the session is free again
        assert stage.steps["a"] == steps + 1


async def test_close_ends_a_running_stream_with_a_typed_error(registry):
    from sessions.engine import EngineClosedError

    engine = StageEngine(CountingStreamStage(step_s=0.05), registry=registry, coalesce_window_s=0.0)
    await engine.open("a")
    stream = engine.stream("a", 0, None)
    await stream.__anext__()
    await engine.close()
    with pytest.raises(EngineClosedError):
        async for _ in stream:
            pass
