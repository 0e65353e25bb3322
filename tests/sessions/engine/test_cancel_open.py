"""A cancelled ``open`` never leaks a stateful stage's slot nor initialises one slot twice.

The worker thread may already run ``open_state`` when the awaiting caller is cancelled; the
engine then keeps the slot reserved until ``open_state`` returns and releases it through
``release_state`` (the normal release path) before the index is handed out again.
"""

from __future__ import annotations

import asyncio

import pytest

from sessions.engine.errors import SessionNotOpenError, SessionReleasedError
from tests.sessions.engine.conftest import metric
from tests.sessions.engine.stages import GatedStateStage


async def _cancelled(task: asyncio.Task) -> None:
    """Cancel an ``engine.open`` task once its ``open_state`` is queued on the worker."""
    await asyncio.sleep(0)
    assert not task.done()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_cancelled_open_is_released_before_its_slot_is_reused(make_engine, registry):
    stage = GatedStateStage(slot_capacity=1)
    async with make_engine(stage) as engine:
        await _cancelled(asyncio.create_task(engine.open("gone")))  # open_state blocks on the gate
        assert engine.active_sessions == 0
        nxt = asyncio.create_task(engine.open("next"))  # waits for the reclaimed slot
        await asyncio.sleep(0.05)
        assert not nxt.done()
        stage.gate.set()
        slot = await asyncio.wait_for(nxt, 5.0)
        assert slot.index == 0 and stage.doubled == []
        assert stage.opened == [("gone", 0), ("next", 0)] and stage.released == [("gone", 0)]
        assert stage.live == {0: "next"} and [s.session_id for s in engine.slots] == ["next"]
        assert await engine.submit("next", 0, 1) == 16.0
        await engine.release("next")
        assert stage.live == {} and len(engine.slots) == 0 and engine.slots.free == 1
        assert metric(registry, "engine_slot_bytes", stage="gated") == 0
        assert metric(registry, "engine_slots_open", stage="gated") == 0


async def test_cancelled_open_alone_frees_its_slot_once_open_state_returns(make_engine, registry):
    stage = GatedStateStage(slot_capacity=2)
    async with make_engine(stage) as engine:
        await _cancelled(asyncio.create_task(engine.open("gone")))
        assert len(engine.slots) == 1  # still reserved: open_state has not returned
        stage.gate.set()
        for _ in range(200):
            if not len(engine.slots):
                break
            await asyncio.sleep(0.01)
        assert len(engine.slots) == 0 and engine.slots.free == 2
        assert stage.released == [("gone", 0)] and stage.live == {}
        assert metric(registry, "engine_slot_bytes", stage="gated") == 0


async def test_reopening_a_cancelled_open_adopts_the_slot(make_engine):
    stage = GatedStateStage(slot_capacity=1)
    async with make_engine(stage) as engine:
        await _cancelled(asyncio.create_task(engine.open("a")))
        again = asyncio.create_task(engine.open("a"))
        await asyncio.sleep(0)
        stage.gate.set()
        slot = await asyncio.wait_for(again, 5.0)
        assert slot.status == "open" and stage.opened == [("a", 0)] and stage.released == []
        assert await engine.submit("a", 0, 1) == 16.0
        await engine.release("a")
        assert stage.released == [("a", 0)] and len(engine.slots) == 0


async def test_open_cancelled_after_open_state_returned_is_released(make_engine):
    """The cancel lands after the slot is open but before the opener resumes."""
    stage = GatedStateStage(slot_capacity=1)
    stage.gate.set()
    async with make_engine(stage) as engine:
        loop = asyncio.get_running_loop()
        opening = asyncio.create_task(engine.open("late"))
        # Queued behind the worker's completion callback: the slot is open, the opener not resumed.
        stage.on_open = lambda: loop.call_soon_threadsafe(loop.call_soon, opening.cancel)
        await asyncio.sleep(0)
        with pytest.raises(asyncio.CancelledError):
            await opening
        nxt = await asyncio.wait_for(engine.open("next"), 5.0)
        assert nxt.index == 0 and stage.doubled == []
        assert stage.released == [("late", 0)] and stage.live == {0: "next"}


async def test_release_racing_an_open_leaves_no_stale_session(make_engine, registry):
    """``release`` while ``open`` of the same session still runs: the open fails typed, the slot
    is released once, and the engine keeps no entry pointing at the freed slot."""
    stage = GatedStateStage(slot_capacity=1)
    async with make_engine(stage) as engine:
        opening = asyncio.create_task(engine.open("s"))
        await asyncio.sleep(0)  # open_state is queued on the worker and blocks on the gate
        releasing = asyncio.create_task(engine.release("s"))
        await asyncio.sleep(0.05)
        stage.gate.set()
        opened, released = await asyncio.gather(opening, releasing, return_exceptions=True)
        assert isinstance(opened, SessionReleasedError), opened
        assert released is None
        assert stage.released == [("s", 0)] and stage.live == {}
        assert engine.active_sessions == 0 and len(engine.slots) == 0 and engine.slots.free == 1
        assert not engine.is_open("s")
        with pytest.raises(SessionNotOpenError):
            engine.submit("s", 0, 1)
        slot = await engine.open("s")  # a fresh open after the race works and is usable
        assert slot.index == 0 and engine.is_open("s")
        assert await engine.submit("s", 0, 1) == 16.0
        assert metric(registry, "engine_slots_open", stage="gated") == 1
