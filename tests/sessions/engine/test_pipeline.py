"""``Pipeline``: lanes of bounded channels between a streaming and a batched stage.

The usual lane is a fake LLM-like streaming stage feeding a batched stage (a "vocoder" that
doubles each chunk), as a voice response will run.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from sessions.engine import (
    EngineClosedError,
    EngineError,
    Pipeline,
    QueueFullError,
    SessionReleasedError,
    StageEngine,
    StaleEpochError,
    StreamingStageEngine,
)
from sessions.errors import TransientError
from tests.sessions.engine.conftest import live_tasks, metric, settled, wait_until
from tests.sessions.engine.stages import FakeStreamStage, RecordingStage


@pytest.fixture
def make_pipeline(registry):
    """``async with make_pipeline(*stages, channel_size=...)``: engines for the stages, chained."""

    @contextlib.asynccontextmanager
    async def make(*stages, channel_size: int = 4, stream_buffer: int = 4, **engine_kwargs):
        runners = [
            StreamingStageEngine(s, registry=registry, stream_buffer=stream_buffer)
            if isinstance(s, FakeStreamStage)
            else StageEngine(s, registry=registry, coalesce_window_s=0.0, **engine_kwargs)
            for s in stages
        ]
        pipeline = Pipeline(runners, registry=registry, channel_size=channel_size)
        try:
            yield pipeline
        finally:
            await pipeline.close()

    return make


class Vocoder(RecordingStage):
    """Records, at every forward, whether the upstream request had already finished."""

    def __init__(self, upstream: FakeStreamStage, delay_s: float = 0.0) -> None:
        super().__init__("vocoder", delay_s)
        self.upstream = upstream
        self.upstream_done_at_forward: list[bool] = []

    def forward(self, items):
        self.upstream_done_at_forward.append(bool(self.upstream.ended))
        return super().forward(items)


async def test_the_batched_stage_starts_on_chunk_zero_while_the_stream_still_runs(make_pipeline):
    llm = FakeStreamStage("llm", step_s=0.1)
    vocoder = Vocoder(llm)
    async with make_pipeline(llm, vocoder) as pipeline:
        await pipeline.open("a")
        stream = pipeline.stream("a", 0, 4, request_id="turn")
        first = await stream.__anext__()
        assert "turn" in llm.live  # the first output arrived before the upstream finished
        rest = await stream.collect()
    assert vocoder.upstream_done_at_forward[0] is False
    assert [c.seq for c in [first, *rest]] == [0, 1, 2, 3]
    assert [c.payload for c in [first, *rest]] == [("a", 0, k) * 2 for k in range(4)]
    items = [item for batch in vocoder.items for item in batch]
    assert [(i.request_id, i.seq) for i in items] == [("turn", k) for k in range(4)]  # tags carried


async def test_stale_epoch_chunks_are_dropped_at_every_stage(make_pipeline, registry):
    llm = FakeStreamStage("llm")
    vocoder = RecordingStage("vocoder")
    async with make_pipeline(llm, vocoder, channel_size=2, stream_buffer=2) as pipeline:
        await pipeline.open("s")
        old = pipeline.stream("s", 0, None, request_id="old")  # endless; nobody reads
        await settled(lambda: llm.steps.get("s", 0))  # every buffer filled, the producer paused
        seen_before = sum(len(batch) for batch in vocoder.items)
        assert pipeline.bump_epoch("s", 1) > 0
        assert llm.aborted == ["old"]
        assert metric(registry, "engine_stale_chunks_dropped_total", stage="llm") > 0
        assert metric(registry, "engine_stale_chunks_dropped_total", stage="vocoder") > 0
        with pytest.raises(StaleEpochError):
            async for _ in old:
                pass
        fresh = await pipeline.stream("s", 1, 3, request_id="new").collect()
        assert [(c.epoch, c.seq) for c in fresh] == [(1, 0), (1, 1), (1, 2)]
        later = [item for batch in vocoder.items for item in batch][seen_before:]
        assert [i.epoch for i in later] == [1, 1, 1]  # the vocoder saw no stale chunk after the bump


async def test_a_slow_reader_pauses_only_its_own_session(make_pipeline):
    llm = FakeStreamStage("llm")
    async with make_pipeline(llm, RecordingStage("vocoder"), channel_size=2, stream_buffer=2) as pipeline:
        for sid in ("slow", "other"):
            await pipeline.open(sid)
        slow = pipeline.stream("slow", 0, None, request_id="endless")
        await slow.__anext__()
        paused = await settled(lambda: llm.steps["slow"])  # reader stalls: every hop fills
        assert paused <= 16  # bounded by the channels, not by the endless producer
        other = await asyncio.wait_for(pipeline.stream("other", 0, 3).collect(), 2.0)
        assert len(other) == 3
        assert llm.steps["slow"] == paused  # still paused
        await slow.aclose()


async def test_closing_a_stream_early_cancels_the_upstream_work(make_pipeline):
    llm = FakeStreamStage("llm")
    async with make_pipeline(llm, RecordingStage("vocoder")) as pipeline:
        await pipeline.open("a")
        stream = pipeline.stream("a", 0, None, request_id="endless")
        await stream.__anext__()
        await stream.aclose()
        assert llm.aborted == ["endless"]
        await wait_until(lambda: "endless" in llm.ended)
        stopped = llm.steps["a"]
        await asyncio.sleep(0.1)
        assert llm.steps["a"] == stopped
        assert len(await pipeline.stream("a", 0, 2).collect()) == 2  # the lane goes on


async def test_a_downstream_failure_reaches_the_consumer_and_stops_upstream(make_pipeline):
    class Broken(RecordingStage):
        def forward(self, items):
            return [ValueError("vocoder broke") for _ in items]

    llm = FakeStreamStage("llm")
    async with make_pipeline(llm, Broken("vocoder")) as pipeline:
        await pipeline.open("a")
        with pytest.raises(EngineError, match="vocoder broke"):
            await pipeline.stream("a", 0, None, request_id="endless").collect()
        await wait_until(lambda: "endless" in llm.ended)
        assert llm.aborted == ["endless"]


async def test_submit_returns_the_head_before_the_tail_and_tails_resolve_in_order(make_pipeline):
    first, second = RecordingStage("first"), RecordingStage("second", delay_s=0.05)
    async with make_pipeline(first, second) as pipeline:
        await pipeline.open("a")
        order: list[int] = []
        results = []
        for x in range(3):
            result = await pipeline.submit("a", 0, x, request_id=f"r{x}")
            assert result.head == 2 * x and not result.tail.done()
            result.tail.add_done_callback(lambda _f, x=x: order.append(x))
            results.append(result)
        assert await asyncio.gather(*(r.tail for r in results)) == [0, 4, 8]
        assert order == [0, 1, 2]
        assert [(i.request_id, i.seq) for b in second.items for i in b] == [("r0", 0), ("r1", 0), ("r2", 0)]


async def test_release_fails_pending_tails_typed_and_leaves_no_relay_task(make_pipeline):
    first, second = RecordingStage("first"), RecordingStage("second", delay_s=0.2)
    async with make_pipeline(first, second, channel_size=1) as pipeline:
        await pipeline.open("a")
        assert len(live_tasks("relay-")) == 2
        tails = [(await pipeline.submit("a", 0, x)).tail for x in range(2)]
        await wait_until(lambda: second.items)  # tail 0 is in its forward, tail 1 fills the hop
        blocked = asyncio.create_task(pipeline.submit("a", 0, 2))  # waits for room in the hop
        await wait_until(lambda: len(first.items) == 3)
        await pipeline.release("a", "disconnect")
        tails.append((await blocked).tail)
        outcomes = await asyncio.wait_for(asyncio.gather(*tails, return_exceptions=True), 2.0)
        assert all(isinstance(o, SessionReleasedError) for o in outcomes), outcomes
        assert not live_tasks("relay-")
        assert not pipeline.is_open("a") and not any(r.is_open("a") for r in pipeline.runners)


async def test_close_fails_queued_tails_typed(make_pipeline):
    first, second = RecordingStage("first"), RecordingStage("second", delay_s=0.2)
    async with make_pipeline(first, second) as pipeline:
        await pipeline.open("a")
        tails = [(await pipeline.submit("a", 0, x)).tail for x in range(3)]
        await wait_until(lambda: second.items)
        await pipeline.close()
        outcomes = await asyncio.wait_for(asyncio.gather(*tails, return_exceptions=True), 2.0)
        assert all(isinstance(o, EngineError) for o in outcomes), outcomes
        assert any(isinstance(o, EngineClosedError) for o in outcomes)
        assert not live_tasks("relay-")


async def test_a_full_lane_refuses_a_stream_with_a_transient_error(make_pipeline):
    stage = RecordingStage("slow", delay_s=0.2)
    async with make_pipeline(stage, channel_size=1) as pipeline:
        await pipeline.open("a")
        running = pipeline.stream("a", 0, 1)
        await wait_until(lambda: stage.items)  # the relay is busy with it
        queued = pipeline.stream("a", 0, 2)  # fills the lane's first hop
        with pytest.raises(QueueFullError) as full:
            pipeline.stream("a", 0, 3)
        assert isinstance(full.value, TransientError)
        assert [c.payload for c in await running.collect()] == [2]
        assert [c.payload for c in await queued.collect()] == [4]
