"""Chunk streams: numbering, stale epochs, the stall deadline, backpressure, abandoned streams."""

from __future__ import annotations

import asyncio
import gc
import threading
import time

import pytest

from sessions.engine import (
    Channel,
    Chunk,
    ChunkStream,
    EngineClosedError,
    SessionReleasedError,
    StaleEpochError,
    StallError,
    StreamingStageEngine,
)
from tests.sessions.engine.conftest import metric, settled, wait_until
from tests.sessions.engine.stages import FakeStreamStage, RecordingStage


async def test_a_batched_stage_streams_one_final_chunk(make_engine):
    async with make_engine(RecordingStage(), coalesce_window_s=0.0) as engine:
        await engine.open("a")
        chunks = await engine.stream("a", 0, 21, request_id="r").collect()
    assert [(c.session_id, c.epoch, c.seq, c.payload, c.final) for c in chunks] == [("a", 0, 0, 42, True)]


async def test_streaming_chunks_are_numbered_in_order_and_the_stream_ends(make_streaming):
    async with make_streaming(FakeStreamStage(step_s=0.001)) as engine:
        await engine.open("a")
        chunks = await engine.stream("a", 0, 4, request_id="r").collect()
    assert [c.seq for c in chunks] == [0, 1, 2, 3]
    assert [c.payload for c in chunks] == [("a", 0, k) for k in range(4)]
    assert {(c.session_id, c.epoch) for c in chunks} == {("a", 0)}


async def test_epoch_bump_fails_in_flight_batched_work_at_once(make_engine, registry):
    """The consumer hears of the bump at once; the forward's stale result is discarded."""
    finished = threading.Event()

    class Slow(RecordingStage):
        def forward(self, items):
            out = super().forward(items)
            finished.set()
            return out

    stage = Slow(delay_s=0.5)
    async with make_engine(stage, coalesce_window_s=0.0) as engine:
        await engine.open("a")
        result = engine.submit("a", 0, 1)
        await wait_until(lambda: stage.items)
        engine.bump_epoch("a", 1)
        with pytest.raises(StaleEpochError):
            await result
        assert not finished.is_set()  # heard while the forward still ran
        assert await engine.submit("a", 1, 2) == 4
    assert metric(registry, "engine_stale_chunks_dropped_total", stage="rec") == 1


async def test_stall_deadline_fires_between_chunks_and_aborts_the_request(make_streaming, registry):
    stage = FakeStreamStage(stall_at=1, stall_s=5.0)
    async with make_streaming(stage, stall_timeout_s=0.25) as engine:
        await engine.open("a")
        stream = engine.stream("a", 0, 5, request_id="r1")
        assert (await stream.__anext__()).seq == 0
        t0 = time.monotonic()
        with pytest.raises(StallError) as stalled:
            await stream.__anext__()
        assert time.monotonic() - t0 >= 0.2
        assert stalled.value.session_id == "a" and stalled.value.timeout_s == 0.25
        assert stage.aborted == ["r1"]
        await wait_until(lambda: "r1" in stage.ended)  # the stalled generator was closed
    assert metric(registry, "engine_stalls_total", stage="stream") == 1


async def test_stall_deadline_measures_gaps_not_the_whole_stream(make_streaming, registry):
    async with make_streaming(FakeStreamStage(step_s=0.05), stall_timeout_s=0.25) as engine:
        await engine.open("a")
        chunks = await engine.stream("a", 0, 8).collect()  # ~0.4 s in total, 0.05 s apart
    assert len(chunks) == 8
    assert metric(registry, "engine_stalls_total", stage="stream") == 0


async def test_backpressure_bounds_a_slow_reader_and_spares_other_sessions(make_streaming):
    stage = FakeStreamStage()
    buffer = 3
    async with make_streaming(stage, stream_buffer=buffer) as engine:
        await engine.open("slow")
        await engine.open("other")
        stream = engine.stream("slow", 0, None, request_id="endless")
        consumed = 0
        for _ in range(10):
            await stream.__anext__()
            consumed += 1
            await asyncio.sleep(0.01)
            assert stage.steps["slow"] <= consumed + buffer + 1  # + the chunk waiting to be put
        paused = await settled(lambda: stage.steps["slow"])  # reader stops: the producer pauses
        assert paused <= consumed + buffer + 1
        other = await asyncio.wait_for(engine.stream("other", 0, 2).collect(), 2.0)
        assert [c.payload for c in other] == [("other", 0, 0), ("other", 0, 1)]
        await stream.aclose()
        assert stage.aborted == ["endless"]


async def test_drop_oldest_keeps_memory_bounded_and_counts_drops(make_streaming, registry):
    stage = FakeStreamStage()
    async with make_streaming(stage, stream_buffer=4, backpressure="drop_oldest") as engine:
        await engine.open("a")
        stream = engine.stream("a", 0, 50, request_id="r")
        await wait_until(lambda: "r" in stage.ended)  # never blocked on the unread stream
        chunks = await stream.collect()
    assert [c.seq for c in chunks] == [46, 47, 48, 49]
    assert metric(registry, "engine_backpressure_dropped_total", stage="stream") == 46
    assert metric(registry, "engine_channel_depth", stage="stream") == 0


async def test_an_abandoned_stream_aborts_its_request_and_frees_its_place(make_streaming):
    stage = FakeStreamStage()
    async with make_streaming(stage, stream_buffer=2, max_pending=1) as engine:
        await engine.open("a")
        stream = engine.stream("a", 0, None, request_id="dropped")
        await stream.__anext__()
        del stream
        gc.collect()
        await wait_until(lambda: "dropped" in stage.ended)
        assert stage.aborted == ["dropped"]
        # max_pending=1: the next request only fits because the abandoned one is gone
        assert await engine.submit("a", 0, 1, request_id="next") == (("a", 0, 0),)


async def test_closing_the_streaming_engine_ends_a_running_stream_typed(registry):
    stage = FakeStreamStage(step_s=0.01)
    engine = StreamingStageEngine(stage, registry=registry)
    await engine.open("a")
    stream = engine.stream("a", 0, None, request_id="r")
    await stream.__anext__()
    await engine.close()
    with pytest.raises(SessionReleasedError) as released:
        async for _ in stream:
            pass
    assert released.value.reason == "shutdown" and stage.aborted == ["r"]
    with pytest.raises(EngineClosedError):
        engine.stream("a", 0, 1)


async def test_a_cancel_landing_as_a_chunk_arrives_is_not_swallowed():
    """The reader is cancelled in the same loop iteration its chunk arrives: it must see the
    cancel (a relay or tick that ran on would never end)."""
    channel = Channel(4)
    cancels: list[BaseException | None] = []
    stream = ChunkStream(channel, stage="s", session_id="a", stall_timeout_s=5.0, on_cancel=cancels.append)
    reader = asyncio.create_task(stream.__anext__())
    await asyncio.sleep(0)  # the reader waits in the channel
    channel.put_nowait(Chunk("a", 0, 0, "x", False))
    reader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reader
    assert len(cancels) == 1 and isinstance(cancels[0], asyncio.CancelledError)
