"""Streaming ticks: tagged chunks, commit after the last, superseded by reset/close, transient refusals."""

from __future__ import annotations

import asyncio

import pytest

from sessions.engine.errors import QueueFullError
from sessions.errors import SessionFailedError, TickFailedError, TickSupersededError
from sessions.session import SessionStatus

from .fakes import FailingCommitReducer, RecordingLifecycle, ScriptedExecutor, event, make_session


def recorded(**kwargs):
    """A session over a scripted executor, a recording lifecycle and a counting reducer; the
    tick outcomes it reports are collected in the returned list."""
    executor, lifecycle, reducer = ScriptedExecutor(), RecordingLifecycle(), FailingCommitReducer()
    reducer.fail_commit = False
    outcomes: list[str] = []
    session = make_session(
        executor,
        lifecycle,
        reducer=reducer,
        on_tick=lambda _s, outcome, _code: outcomes.append(outcome),
        **kwargs,
    )
    return session, executor, lifecycle, reducer, outcomes


async def test_chunks_carry_the_tick_identity_and_the_tick_commits_after_the_last():
    session, executor, _lifecycle, reducer, outcomes = recorded()
    session.accept_event(event(1, prompt="hello"))
    got = []
    async for chunk in session.stream_tick("payload"):
        assert session.chunk_index == 0 and session.pending_event_count == 1  # not committed yet
        got.append(chunk)
    snapshot = executor.snapshots[0]
    assert snapshot.payload == "payload" and snapshot.applied_event_ids == (1,)
    assert [(c.seq, c.value) for c in got] == [(0, "a"), (1, "b"), (2, "c")]
    assert all(c.metadata == snapshot.metadata for c in got)
    assert session.chunk_index == 1 and session.ticks_committed == 1 and reducer.commits == 1
    assert session.pending_event_count == 0 and session.prompt == "hello"
    assert outcomes == ["committed"]
    chunks = [c async for c in session.stream_tick()]
    assert {c.metadata.chunk_index for c in chunks} == {1} and session.chunk_index == 2


async def test_a_reset_while_a_chunk_is_awaited_supersedes_the_tick_and_commits_nothing():
    session, executor, lifecycle, reducer, outcomes = recorded()
    executor.gate = asyncio.Event()  # blocks before chunk 1
    stream = session.stream_tick()
    assert (await stream.__anext__()).value == "a"
    reader = asyncio.create_task(stream.__anext__())
    await asyncio.sleep(0)
    await session.reset()
    with pytest.raises(TickSupersededError):
        await reader
    assert session.status is SessionStatus.ACTIVE and session.chunk_index == 0
    assert session.ticks_committed == 0 and reducer.commits == 0
    assert lifecycle.reasons(session.session_id) == ["reset"]
    assert outcomes == ["superseded"] and executor.closed_streams == 1
    executor.gate.set()
    assert [c.value async for c in session.stream_tick()] == ["a", "b", "c"]  # the next tick runs
    assert session.chunk_index == 1


async def test_a_reset_between_chunks_supersedes_the_tick_at_the_next_read():
    session, _executor, lifecycle, reducer, outcomes = recorded()
    stream = session.stream_tick()
    await stream.__anext__()
    resetting = asyncio.create_task(session.reset())
    await asyncio.sleep(0)
    assert not resetting.done()  # it waits for the tick to end
    with pytest.raises(TickSupersededError):
        await stream.__anext__()
    await resetting
    assert session.chunk_index == 0 and reducer.commits == 0 and outcomes == ["superseded"]
    assert lifecycle.reasons(session.session_id) == ["reset"]


async def test_a_close_mid_stream_supersedes_the_tick():
    session, executor, lifecycle, _reducer, outcomes = recorded()
    executor.gate = asyncio.Event()
    stream = session.stream_tick()
    await stream.__anext__()
    reader = asyncio.create_task(stream.__anext__())
    await asyncio.sleep(0)
    assert await session._close("disconnect") is SessionStatus.CLOSED
    with pytest.raises(TickSupersededError):
        await reader
    assert lifecycle.reasons(session.session_id) == ["disconnect"] and outcomes == ["superseded"]
    assert session.chunk_index == 0


@pytest.mark.parametrize("streaming", [True, False], ids=["stream_tick", "next_tick"])
async def test_a_transient_refusal_leaves_the_session_active_with_its_events(streaming):
    session, executor, lifecycle, reducer, outcomes = recorded()
    session.accept_event(event(1, prompt="p"))
    executor.error = QueueFullError("llm", 4)
    epoch = session.epoch
    with pytest.raises(QueueFullError):
        if streaming:
            async for _ in session.stream_tick():
                pass
        else:
            await session.next_tick()
    assert session.status is SessionStatus.ACTIVE and session.epoch == epoch
    assert session.chunk_index == 0 and session.pending_event_count == 1 and reducer.commits == 0
    assert lifecycle.releases == [] and outcomes == ["rejected"]
    executor.error = None
    async for _ in session.stream_tick():
        pass
    assert executor.snapshots[-1].applied_event_ids == (1,) and session.chunk_index == 1


async def test_leaving_a_stream_early_fails_the_session_without_commit():
    session, executor, _lifecycle, reducer, outcomes = recorded()
    stream = session.stream_tick()
    await stream.__anext__()
    await stream.aclose()
    assert session.status is SessionStatus.FAILED and session.failure == "cancelled"
    assert session.chunk_index == 0 and reducer.commits == 0 and outcomes == ["cancelled"]
    assert executor.closed_streams == 1  # the executor's stream was closed too
    with pytest.raises(SessionFailedError):
        await session.next_tick()
    await session.reset()
    assert session.status is SessionStatus.ACTIVE


async def test_an_executor_error_mid_stream_fails_the_session_and_releases_its_state():
    session, executor, lifecycle, reducer, outcomes = recorded()
    executor.error, executor.error_at = RuntimeError("decoder broke"), 1
    got = []
    with pytest.raises(TickFailedError):
        async for chunk in session.stream_tick():
            got.append(chunk.value)
    assert got == ["a"]
    assert session.status is SessionStatus.FAILED and session.chunk_index == 0 and reducer.commits == 0
    assert lifecycle.reasons(session.session_id) == ["failed"] and outcomes == ["failed"]


async def test_interrupt_supersedes_a_streaming_tick_and_keeps_the_session():
    session, executor, lifecycle, reducer, outcomes = recorded()
    session.accept_event(event(1, prompt="p"))
    executor.gate = asyncio.Event()
    stream = session.stream_tick()
    first = await stream.__anext__()
    reader = asyncio.create_task(stream.__anext__())
    await asyncio.sleep(0)
    epoch = session.epoch
    assert first.epoch == epoch
    assert session.interrupt() is True and session.epoch == epoch + 1
    assert executor.fences == [(session.session_id, epoch + 1)]  # the stage runner is fenced too
    with pytest.raises(TickSupersededError):
        await reader
    assert session.status is SessionStatus.ACTIVE and session.chunk_index == 0 and reducer.commits == 0
    assert session.pending_event_count == 1 and lifecycle.releases == [] and outcomes == ["superseded"]
    executor.gate.set()
    chunks = [chunk async for chunk in session.stream_tick()]
    assert {c.epoch for c in chunks} == {epoch + 1}
    assert executor.snapshots[-1].applied_event_ids == (1,) and session.chunk_index == 1


async def test_interrupt_without_a_tick_still_moves_the_epoch_on():
    """A barge-in is one call whether or not a tick runs: the epoch (which the outbound queue
    reads) and the runner's fence move on; nothing else changes."""
    session, executor, lifecycle, _reducer, outcomes = recorded()
    assert session.interrupt() is False
    assert session.epoch == 1 and executor.fences == [(session.session_id, 1)]
    assert session.status is SessionStatus.ACTIVE and lifecycle.releases == [] and outcomes == []


async def test_a_tick_requested_before_an_interrupt_or_reset_is_dropped_unstarted():
    """A tick belongs to the epoch of the call that requested it, not of the task that awaits it
    later: the owner requests it, a cancel or reset arrives before the child task starts it, and
    it never runs (the race the world kind hit; echo and voice request in the runner too)."""
    session, executor, _lifecycle, reducer, outcomes = recorded()
    requested = session.next_tick("requested")
    streaming = session.stream_tick("streaming")
    session.interrupt()
    with pytest.raises(TickSupersededError):
        await requested
    with pytest.raises(TickSupersededError):
        await anext(aiter(streaming))
    before_reset = session.next_tick("before reset")
    await session.reset()
    with pytest.raises(TickSupersededError):
        await before_reset
    assert executor.snapshots == [] and outcomes == ["superseded"] * 3 and reducer.commits == 0
    assert (await session.next_tick("after")).value == 0  # a tick requested after them runs
