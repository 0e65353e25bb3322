"""Session event intake, transactional ticks and failure semantics (seed reference §2.6-2.7)."""

from __future__ import annotations

import asyncio

import pytest

from sessions.errors import (
    ChunkMetadataError,
    EventQueueFullError,
    InvalidEventError,
    ReducerCommitError,
    SessionFailedError,
    StaleEventError,
    TickFailedError,
    TickInFlightError,
    TickSupersededError,
    TransientError,
)
from sessions.events import ControlInput, SessionEvent
from sessions.session import EventAcceptance, SessionLimits, SessionStatus
from sessions.tick import TickMetadata, TickOutput

from .fakes import FailingCommitReducer, RecordingLifecycle, ScriptedExecutor, event, make_session

ACCEPTED, DUPLICATE = EventAcceptance.ACCEPTED, EventAcceptance.DUPLICATE


async def test_events_are_sorted_and_applied_at_the_tick_boundary_and_stay_sticky():
    executor = ScriptedExecutor()
    session = make_session(executor)
    assert session.accept_event(event(2, prompt="turn left")) is ACCEPTED
    assert session.accept_event(event(1, camera={"yaw": 1})) is ACCEPTED
    assert session.accept_event(event(2, prompt="turn left")) is DUPLICATE
    assert executor.snapshots == []  # nothing runs before a tick is asked for

    result = await session.next_tick()
    tick = executor.snapshots[0]
    assert result.metadata == tick.metadata
    assert tick.applied_event_ids == (1, 2)
    assert tick.prompt == "turn left"
    assert tick.controls == (ControlInput("camera", "test.camera.v1", {"yaw": 1}),)
    assert (tick.request_id, tick.chunk_index) == ("world-1-request-0", 0)
    assert session.accept_event(event(2, prompt="turn left")) is DUPLICATE  # after application too

    await session.next_tick()
    sticky = executor.snapshots[1]
    assert sticky.chunk_index == 1 and sticky.applied_event_ids == ()
    assert sticky.prompt == "turn left" and sticky.control("camera").data == {"yaw": 1}
    assert session.chunk_index == 2 and session.pending_event_count == 0


async def test_composite_event_is_admitted_atomically_and_isolated_from_caller_mutation():
    executor = ScriptedExecutor()
    session = make_session(executor, limits=SessionLimits(max_pending_events=1))
    payload = {"keys": ["w"], "nested": {"speed": 1.5}}
    composite = SessionEvent(
        7,
        prompt="forest",
        controls=(
            ControlInput("camera", "test.camera.v1", payload),
            ControlInput("action", "test.action.v1", {"held": ["w"]}),
        ),
    )
    assert session.accept_event(composite) is ACCEPTED
    payload["keys"].append("a")
    payload["nested"]["speed"] = 99
    assert session.accept_event(composite) is DUPLICATE  # duplicate detection precedes the bound
    with pytest.raises(EventQueueFullError, match="queue is full") as info:
        session.accept_event(event(8, prompt="desert"))
    assert info.value.details["limit"] == 1

    await session.next_tick()
    tick = executor.snapshots[0]
    assert [c.track for c in tick.controls] == ["action", "camera"]  # ordered by track
    assert tick.control("camera").data == {"keys": ("w",), "nested": {"speed": 1.5}}
    with pytest.raises(TypeError):
        tick.control("camera").data["keys"] = ()
    with pytest.raises(AttributeError):
        tick.control("camera").data["keys"].append("j")


async def test_inflight_snapshot_is_immutable_and_the_stale_floor_covers_it():
    executor = ScriptedExecutor()
    executor.gate = asyncio.Event()
    session = make_session(executor)
    session.accept_event(event(10, prompt="first"))
    tick = asyncio.create_task(session.next_tick())
    await executor.started.wait()
    assert session.busy
    assert session.accept_event(event(11, prompt="second")) is ACCEPTED
    with pytest.raises(StaleEventError, match="event floor is 10") as info:
        session.accept_event(event(9))
    assert info.value.details == {"event_id": 9, "floor": 10}
    executor.gate.set()
    await tick
    assert executor.snapshots[0].prompt == "first" and executor.snapshots[0].applied_event_ids == (10,)
    assert session.pending_event_count == 1
    await session.next_tick()
    assert executor.snapshots[1].applied_event_ids == (11,) and executor.snapshots[1].prompt == "second"


async def test_one_tick_at_a_time_a_second_is_refused_as_transient():
    """No lock queues ticks: the owner starts one at a time, and a second started while one runs
    is refused (transient: the session goes on)."""
    executor = ScriptedExecutor()
    executor.gate = asyncio.Event()
    session = make_session(executor)
    first = asyncio.create_task(session.next_tick())
    await executor.started.wait()
    with pytest.raises(TickInFlightError) as refused:
        await session.next_tick()
    assert isinstance(refused.value, TransientError) and session.status is SessionStatus.ACTIVE
    executor.gate.set()
    await first
    await session.next_tick()
    assert [s.chunk_index for s in executor.snapshots] == [0, 1]


async def test_failed_tick_fails_the_session_releases_the_worker_and_requires_reset():
    executor, lifecycle = ScriptedExecutor(), RecordingLifecycle()
    session = make_session(executor, lifecycle)
    session.accept_event(event(3, prompt="boom"))
    executor.error = RuntimeError("model exploded: secret internals")
    epoch = session.epoch
    with pytest.raises(TickFailedError) as info:
        await session.next_tick()
    assert info.value.code == "tick_failed" and "secret" not in info.value.message
    assert session.status is SessionStatus.FAILED and session.epoch > epoch
    assert session.chunk_index == 0 and session.pending_event_count == 1
    assert lifecycle.reasons("world-1") == ["failed"]
    with pytest.raises(SessionFailedError, match="failed"):
        await session.next_tick()
    with pytest.raises(SessionFailedError):
        session.accept_event(event(4))

    executor.error = None
    await session.reset()
    assert session.status is SessionStatus.ACTIVE and session.pending_event_count == 0
    assert lifecycle.reasons("world-1") == ["failed", "reset"]
    assert session.accept_event(event(3, prompt="boom")) is DUPLICATE  # discarded, not replayed
    session.accept_event(event(4, prompt="calm"))
    await session.next_tick()
    assert executor.snapshots[-1].chunk_index == 0
    assert executor.snapshots[-1].applied_event_ids == (4,)


async def test_metadata_mismatch_does_not_commit():
    executor, lifecycle = ScriptedExecutor(), RecordingLifecycle()
    session = make_session(executor, lifecycle)
    session.accept_event(event(1, prompt="a"))
    executor.metadata = lambda snap: TickMetadata("another-world", snap.request_id, snap.chunk_index, (1,))
    with pytest.raises(ChunkMetadataError, match="does not match"):
        await session.next_tick()
    assert session.status is SessionStatus.FAILED
    assert session.chunk_index == 0 and session.prompt is None and session.pending_event_count == 1
    assert lifecycle.reasons("world-1") == ["failed"]


async def test_result_without_metadata_is_a_mismatch():
    class Bare:
        async def execute(self, snapshot):
            return object()

    session = make_session(Bare())
    with pytest.raises(ChunkMetadataError):
        await session.next_tick()


async def test_reducer_commit_failure_is_fail_closed():
    executor, lifecycle, reducer = ScriptedExecutor(), RecordingLifecycle(), FailingCommitReducer()
    session = make_session(executor, lifecycle, reducer=reducer)
    session.accept_event(event(1, prompt="p", camera=1))
    with pytest.raises(ReducerCommitError):
        await session.next_tick()
    assert session.status is SessionStatus.FAILED
    assert session.chunk_index == 0 and session.prompt is None and dict(session.controls) == {}
    assert session.pending_event_count == 1
    await session.reset()
    assert reducer.resets == 1


async def test_reducer_prepare_failure_fails_the_tick():
    class BadPrepare(FailingCommitReducer):
        def prepare(self, **kwargs):
            raise ValueError("bad camera schema")

    session = make_session(reducer=BadPrepare())
    session.accept_event(event(1, camera=1))
    with pytest.raises(TickFailedError, match="preparing controls"):
        await session.next_tick()
    assert session.status is SessionStatus.FAILED


async def test_reset_clears_prompt_controls_and_restarts_chunks_but_keeps_event_ids():
    executor, lifecycle = ScriptedExecutor(), RecordingLifecycle()
    session = make_session(executor, lifecycle)
    session.accept_event(event(4, prompt="p", camera=1))
    await session.next_tick()
    session.accept_event(event(5, prompt="pending"))
    await session.reset()
    assert lifecycle.reasons("world-1") == ["reset"]
    assert session.accept_event(event(4)) is DUPLICATE
    assert session.accept_event(event(5)) is DUPLICATE
    with pytest.raises(StaleEventError):
        session.accept_event(event(3))
    await session.next_tick()
    tick = executor.snapshots[-1]
    assert (tick.chunk_index, tick.prompt, tick.controls, tick.applied_event_ids) == (0, None, (), ())


async def test_reset_during_a_tick_supersedes_it_without_commit():
    executor, lifecycle = ScriptedExecutor(), RecordingLifecycle()
    executor.gate = asyncio.Event()
    session = make_session(executor, lifecycle)
    session.accept_event(event(1, prompt="old"))
    tick = asyncio.create_task(session.next_tick())
    await executor.started.wait()
    await session.reset()
    with pytest.raises(TickSupersededError):
        await tick
    assert session.status is SessionStatus.ACTIVE and session.chunk_index == 0 and session.prompt is None


async def test_a_superseded_tick_leaves_no_cancel_request_on_the_callers_task():
    """The executor runs in the caller's task; reset cancels that task and withdraws the request."""
    executor = ScriptedExecutor()
    executor.gate = asyncio.Event()
    session = make_session(executor)

    async def caller() -> int:
        with pytest.raises(TickSupersededError):
            await session.next_tick()
        await asyncio.sleep(0)  # a leftover cancel request would land here
        return asyncio.current_task().cancelling()

    task = asyncio.create_task(caller())
    await executor.started.wait()
    await session.reset()
    assert await task == 0
    executor.gate = None
    assert not session.busy and (await session.next_tick()).value == 0


async def test_a_caller_cancel_racing_a_reset_still_cancels_the_caller():
    executor = ScriptedExecutor()
    executor.gate = asyncio.Event()
    session = make_session(executor)
    tick = asyncio.create_task(session.next_tick())
    await executor.started.wait()
    tick.cancel()  # the caller's own cancel, then reset's, before either is delivered
    reset = asyncio.create_task(session.reset())
    with pytest.raises(asyncio.CancelledError):
        await tick
    await reset
    assert session.status is SessionStatus.ACTIVE and session.chunk_index == 0


async def test_an_executor_swallowing_the_cut_still_supersedes_the_tick():
    class Stubborn(ScriptedExecutor):
        async def execute(self, snapshot):
            try:
                return await super().execute(snapshot)
            except asyncio.CancelledError:
                return TickOutput(snapshot.metadata, -1)

    executor = Stubborn()
    executor.gate = asyncio.Event()
    session = make_session(executor)

    async def caller() -> int:
        with pytest.raises(TickSupersededError):
            await session.next_tick()
        await asyncio.sleep(0)
        return asyncio.current_task().cancelling()

    task = asyncio.create_task(caller())
    await executor.started.wait()
    await session.reset()
    assert await task == 0 and session.chunk_index == 0


async def test_close_waits_for_the_cut_tick_before_releasing():
    executor, lifecycle = ScriptedExecutor(), RecordingLifecycle()
    executor.gate = asyncio.Event()
    session = make_session(executor, lifecycle)
    tick = asyncio.create_task(session.next_tick())
    await executor.started.wait()
    await session._close("close")
    assert tick.done() and isinstance(tick.exception(), TickSupersededError)
    assert lifecycle.reasons(session.session_id) == ["close"] and not session.busy


async def test_caller_cancelling_a_tick_fails_the_session_without_commit():
    executor = ScriptedExecutor()
    executor.gate = asyncio.Event()
    session = make_session(executor)
    tick = asyncio.create_task(session.next_tick())
    await executor.started.wait()
    tick.cancel()
    with pytest.raises(asyncio.CancelledError):
        await tick
    assert session.status is SessionStatus.FAILED and session.failure == "cancelled"
    assert session.chunk_index == 0 and not session.busy


async def test_payload_reaches_the_executor_unchanged():
    executor = ScriptedExecutor()
    session = make_session(executor)
    observation = {"state": [0.0] * 8}
    await session.next_tick(observation)
    assert executor.snapshots[0].payload is observation


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: SessionEvent(-1), "event_id"),
        (lambda: SessionEvent(True), "event_id"),
        (lambda: SessionEvent(1, prompt=3), "prompt"),
        (lambda: ControlInput("camera", "s", {"x": float("nan")}), "transport-safe"),
        (lambda: ControlInput("camera", "s", {"x": object()}), "transport-safe"),
        (lambda: ControlInput("camera", "s", {1: 2}), "transport-safe"),
        (lambda: ControlInput("", "s", 1), "track"),
        (
            lambda: SessionEvent(1, controls=(ControlInput("a", "s"), ControlInput("a", "t"))),
            "more than once",
        ),
        (lambda: SessionEvent.from_dict({"event_id": 1, "bogus": 1}), "unknown event field"),
        (lambda: SessionEvent.from_dict({"prompt": "x"}), "event_id is required"),
    ],
)
def test_malformed_events_raise_invalid_event(build, match):
    with pytest.raises(InvalidEventError, match=match) as info:
        build()
    assert info.value.code == "invalid_event"


def test_event_round_trips_through_its_json_form():
    raw = {
        "event_id": 3,
        "prompt": "p",
        "controls": [{"track": "camera", "schema": "s.v1", "data": {"keys": ["w"], "t": 1.5}}],
        "client_ts_ms": 12.0,
    }
    ev = SessionEvent.from_dict(raw)
    assert ev.to_dict() == raw
    raw["controls"][0]["data"]["keys"].append("a")
    assert ev.controls[0].data["keys"] == ("w",)


def test_seen_event_ids_merge_into_ranges_and_forget_the_oldest_beyond_the_bound():
    from sessions.events import SeenEventIds

    seen = SeenEventIds(max_ranges=2)
    for i in (1, 3, 2, 10):
        seen.add(i)
    assert seen.range_count() == 2 and all(i in seen for i in (1, 2, 3, 10)) and 4 not in seen
    seen.add(20)
    assert seen.range_count() == 2 and 2 not in seen and seen.forgotten_below == 3


async def test_forgotten_event_ids_are_stale_not_duplicate():
    session = make_session(limits=SessionLimits(max_event_id_ranges=1))
    session.accept_event(event(1))
    await session.next_tick()
    assert session.accept_event(event(1)) is DUPLICATE
    session.accept_event(event(5))  # a gap: the range holding 1 is forgotten
    with pytest.raises(StaleEventError):
        session.accept_event(event(1))
    assert session.accept_event(event(5)) is DUPLICATE
