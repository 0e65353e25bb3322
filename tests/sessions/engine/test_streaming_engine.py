"""``StreamingStageEngine`` driving a fake LLM-like stage: order, aborts, bounds, slots, failures."""

from __future__ import annotations

import asyncio
import threading

import pytest

from sessions.engine import (
    EngineClosedError,
    QueueFullError,
    SessionNotOpenError,
    SessionReleasedError,
    SlotsExhaustedError,
    StageItemError,
    StaleEpochError,
    StreamingStageEngine,
)
from sessions.errors import TransientError
from tests.sessions.engine.conftest import live_tasks, metric, wait_until
from tests.sessions.engine.stages import FakeStreamStage, StatefulStreamStage


async def test_chunks_come_in_order_and_submit_collects_every_payload(make_streaming):
    stage = FakeStreamStage(step_s=0.001)
    async with make_streaming(stage) as engine:
        await engine.open("a")
        assert await engine.submit("a", 0, 3, request_id="r0", seq=2, last=False) == (
            ("a", 0, 0),
            ("a", 0, 1),
            ("a", 0, 2),
        )
        item = stage.started[0]
        assert (item.session_id, item.epoch, item.request_id, item.seq, item.last) == ("a", 0, "r0", 2, False)
        assert item.slot == 0 and item.state is None  # a stateless stage still gets its slot index
        assert stage.ended == ["r0"] and stage.aborted == []


async def _started(engine: StreamingStageEngine, session_id: str, epoch: int, request_id: str):
    """An endless request whose first chunk has been read."""
    stream = engine.stream(session_id, epoch, None, request_id=request_id)
    assert (await stream.__anext__()).seq == 0
    return stream


async def test_an_epoch_bump_aborts_the_stale_request_by_its_id(make_streaming, registry):
    stage = FakeStreamStage()
    async with make_streaming(stage) as engine:
        await engine.open("a")
        await engine.open("b")
        old = await _started(engine, "a", 0, "turn-1")
        other = await _started(engine, "b", 0, "other")
        assert engine.bump_epoch("a", 1) == 1
        assert stage.aborted == ["turn-1"]
        with pytest.raises(StaleEpochError) as stale:
            async for _ in old:
                pass
        assert (stale.value.epoch, stale.value.current) == (0, 1)
        await wait_until(lambda: "turn-1" in stage.ended)
        with pytest.raises(StaleEpochError):
            engine.stream("a", 0, 1)  # refused at once
        assert await engine.submit("a", 1, 1, request_id="turn-2") == (("a", 1, 0),)
        assert (await other.__anext__()).session_id == "b"  # the other session was not touched
        await other.aclose()
    assert metric(registry, "engine_stale_chunks_dropped_total", stage="stream") == 1


async def test_a_request_of_a_newer_epoch_aborts_the_older_one(make_streaming):
    """Barge-in: starting the new turn with the new epoch is enough."""
    stage = FakeStreamStage()
    async with make_streaming(stage) as engine:
        await engine.open("a")
        old = await _started(engine, "a", 0, "turn-1")
        new = engine.stream("a", 1, 2, request_id="turn-2")
        assert stage.aborted == ["turn-1"]
        with pytest.raises(StaleEpochError):
            await old.collect()
        assert [c.payload for c in await new.collect()] == [("a", 1, 0), ("a", 1, 1)]


async def test_release_aborts_the_sessions_requests_typed(make_streaming):
    stage = FakeStreamStage()
    async with make_streaming(stage) as engine:
        await engine.open("a")
        stream = await _started(engine, "a", 0, "r")
        await engine.release("a", "reset")
        assert stage.aborted == ["r"] and not engine.is_open("a")
        with pytest.raises(SessionReleasedError) as released:
            await stream.collect()
        assert released.value.reason == "reset"
        with pytest.raises(SessionNotOpenError):
            engine.stream("a", 0, 1)
        await wait_until(lambda: not live_tasks("stream-"))


async def test_a_consumer_aclose_aborts_its_request(make_streaming):
    stage = FakeStreamStage()
    async with make_streaming(stage) as engine:
        await engine.open("a")
        stream = await _started(engine, "a", 0, "r")
        await stream.aclose()
        assert stage.aborted == ["r"]
        await wait_until(lambda: "r" in stage.ended and not live_tasks("stream-"))
        assert engine.is_open("a")  # only the request ended, not the session


async def test_queue_full_beyond_max_pending_is_transient_and_clears(make_streaming):
    stage = FakeStreamStage()
    async with make_streaming(stage, max_pending=2) as engine:
        for sid in "ab":
            await engine.open(sid)
        first = await _started(engine, "a", 0, "a-1")
        second = await _started(engine, "b", 0, "b-1")
        with pytest.raises(QueueFullError) as full:
            engine.stream("a", 0, 1, request_id="a-2")
        assert isinstance(full.value, TransientError) and full.value.limit == 2
        assert [item.request_id for item in stage.started] == ["a-1", "b-1"]  # nothing was started
        await first.aclose()
        await wait_until(lambda: not stage.live - {"b-1"})
        assert await engine.submit("a", 0, 1, request_id="a-2") == (("a", 0, 0),)
        await second.aclose()


async def test_requests_aborted_before_their_first_step_free_their_place(make_streaming):
    """An abort in the same loop iteration as ``stream`` cancels a pump that never ran."""
    stage = FakeStreamStage()
    async with make_streaming(stage, max_pending=1) as engine:
        await engine.open("a")
        for i in range(5):
            stream = engine.stream("a", 0, None, request_id=f"r{i}")
            stream.cancel()
            await wait_until(lambda: not live_tasks("stream-"))
        assert stage.aborted == [f"r{i}" for i in range(5)]
        assert await engine.submit("a", 0, 1, request_id="last") == (("a", 0, 0),)


async def test_a_stage_error_fails_only_its_request(make_streaming, registry):
    stage = FakeStreamStage(step_s=0.001)
    stage.failing.add("bad")
    async with make_streaming(stage) as engine:
        for sid in "ab":
            await engine.open(sid)
        bad = engine.stream("a", 0, 5, request_id="bad")
        good = engine.submit("b", 0, 3, request_id="good")
        assert (await bad.__anext__()).seq == 0
        with pytest.raises(StageItemError) as failed:
            await bad.__anext__()
        assert failed.value.session_id == "a" and isinstance(failed.value.cause, RuntimeError)
        assert len(await good) == 3
        assert await engine.submit("a", 0, 1, request_id="again") == (("a", 0, 0),)
    assert metric(registry, "engine_failures_total", stage="stream", scope="item") == 1


async def test_stateful_slots_open_and_release_through_the_slot_table(make_streaming, registry):
    stage = StatefulStreamStage(slot_capacity=2)
    async with make_streaming(stage) as engine:
        assert engine.per_session_bytes == 1000
        assert (await engine.open("a")).index == 0
        assert (await engine.open("b")).index == 1
        assert await engine.open("a") is engine.slots.get("a")  # idempotent
        assert engine.slots.bytes_in_use == 2000
        assert metric(registry, "engine_slots_open", stage="llm") == 2
        with pytest.raises(SlotsExhaustedError):
            await engine.open("c")
        await engine.submit("b", 0, 1, request_id="rb")
        assert stage.seen_slots == [("b", 1, "kv-b")]  # the item carries the slot and its handle
        await engine.release("a", "close")
        assert stage.released == [("a", 0)]
        assert (await engine.open("c")).index == 0  # the freed index is reused
        assert stage.opened == [("a", 0), ("b", 1), ("c", 0)]
    assert sorted(stage.released) == [("a", 0), ("b", 1), ("c", 0)]  # close released the rest
    assert metric(registry, "engine_slots_open", stage="llm") == 0


async def test_closed_engine_and_unopened_sessions_are_refused_typed(registry):
    engine = StreamingStageEngine(FakeStreamStage(), registry=registry)
    with pytest.raises(SessionNotOpenError):
        engine.stream("nobody", 0, 1)
    await engine.close()
    with pytest.raises(EngineClosedError):
        await engine.open("a")
    with pytest.raises(EngineClosedError):
        engine.stream("a", 0, 1)


async def test_requests_that_end_are_counted_for_the_status_page(make_streaming, registry):
    """``engine_item_seconds`` counts each request that ran to its end (``/v1/status``), not an
    aborted one; the stage batches its own forwards, so no batch is observed."""
    async with make_streaming(FakeStreamStage(step_s=0.001)) as engine:
        await engine.open("a")
        await engine.submit("a", 0, 2, request_id="done")
        aborted = await _started(engine, "a", 0, "aborted")
        engine.bump_epoch("a", 1)
        with pytest.raises(StaleEpochError):
            await aborted.collect()
    assert metric(registry, "engine_item_seconds_count", stage="stream") == 1
    assert metric(registry, "engine_batch_size_count", stage="stream") == 0


class _GatedStreamStage(StatefulStreamStage):
    """``open_state`` blocks until ``gate`` is set."""

    def __init__(self) -> None:
        super().__init__(slot_capacity=1)
        self.gate = threading.Event()

    def open_state(self, session_id, slot):
        self.gate.wait(5.0)
        return super().open_state(session_id, slot)


async def test_a_release_racing_an_open_wins(make_streaming, registry):
    """The open fails typed and keeps no session on the released slot; a fresh open works."""
    stage = _GatedStreamStage()

    async def open_state_returns_later() -> None:
        await asyncio.sleep(0.05)
        stage.gate.set()

    async with make_streaming(stage) as engine:
        # In this order: open posts open_state (blocked on the gate), release waits for it.
        opened, released, _ = await asyncio.gather(
            engine.open("s"), engine.release("s"), open_state_returns_later(), return_exceptions=True
        )
        assert isinstance(opened, SessionReleasedError), opened
        assert released is None and stage.released == [("s", 0)]
        assert engine.active_sessions == 0 and not engine.is_open("s") and len(engine.slots) == 0
        with pytest.raises(SessionNotOpenError):
            engine.stream("s", 0, 1)
        assert (await engine.open("s")).index == 0 and engine.is_open("s")
        assert await engine.submit("s", 0, 1, request_id="r") == (("s", 0, 0),)
        assert metric(registry, "engine_slot_bytes", stage="llm") == 1000
