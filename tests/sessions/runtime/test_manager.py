"""SessionManager: lifecycle boundary, tombstones, interleaving, admission, LRU, metrics."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry

from sessions.errors import (
    CleanupFailedError,
    ReleaseFailedError,
    SessionClosedError,
    SessionExistsError,
    SessionLimitError,
    ShuttingDownError,
    StaleEventError,
    TickFailedError,
    TickSupersededError,
    UnknownSessionError,
)
from sessions.manager import AdmissionPolicy
from sessions.session import EventAcceptance, SessionLimits, SessionStatus

from .fakes import RecordingLifecycle, ScriptedExecutor, event, make_manager


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_reset_close_and_disconnect_reach_the_lifecycle():
    executor, lifecycle = ScriptedExecutor(), RecordingLifecycle()
    manager = make_manager(executor, lifecycle)
    session = await manager.create("world-reset")
    session.accept_event(event(4, prompt="p", camera=1))
    await session.next_tick()
    await manager.reset("world-reset")
    assert lifecycle.releases == [("world-reset", "reset")]
    assert session.status is SessionStatus.ACTIVE and session.chunk_index == 0
    assert session.accept_event(event(4)) is EventAcceptance.DUPLICATE
    await session.next_tick()
    assert executor.snapshots[-1].chunk_index == 0 and executor.snapshots[-1].prompt is None

    assert await manager.close("world-reset") is SessionStatus.CLOSED
    await manager.create("world-disconnect")
    assert await manager.disconnect("world-disconnect") is SessionStatus.CLOSED
    assert lifecycle.releases[1:] == [("world-reset", "close"), ("world-disconnect", "disconnect")]
    assert len(manager) == 0
    with pytest.raises(UnknownSessionError, match="does not exist"):
        manager.get("world-reset")
    assert await manager.close("world-reset") is SessionStatus.CLOSED  # idempotent


async def test_closed_session_refuses_work_and_reports_the_reason():
    manager = make_manager()
    session = await manager.create("w")
    waiter = asyncio.create_task(session.wait_closed())
    await manager.close("w")
    assert await waiter == "close"
    with pytest.raises(SessionClosedError) as info:
        await session.next_tick()
    assert info.value.details["reason"] == "close"


async def test_failed_close_keeps_a_tombstone_until_a_retry_succeeds():
    lifecycle = RecordingLifecycle()
    manager = make_manager(lifecycle=lifecycle)
    first = await manager.create("world-1")
    lifecycle.failures_left = 1
    with pytest.raises(CleanupFailedError):
        await manager.close("world-1")
    assert first.status is SessionStatus.CLEANUP_FAILED
    assert manager.get("world-1") is first and manager.tombstones() == ["world-1"]
    with pytest.raises(SessionExistsError, match="already exists"):
        await manager.create("world-1")
    with pytest.raises(CleanupFailedError, match="cleanup_failed"):
        await manager.reset("world-1")
    assert await manager.close("world-1") is SessionStatus.CLOSED
    with pytest.raises(UnknownSessionError, match="does not exist"):
        manager.get("world-1")
    again = await manager.create("world-1")
    assert again is not first and again.status is SessionStatus.ACTIVE


async def test_failed_disconnect_keeps_the_session_for_an_explicit_retry():
    lifecycle = RecordingLifecycle()
    manager = make_manager(lifecycle=lifecycle)
    await manager.create("world-1")
    lifecycle.failures_left = 1
    assert await manager.disconnect("world-1") is SessionStatus.CLEANUP_FAILED
    assert manager.get("world-1").status is SessionStatus.CLEANUP_FAILED
    assert await manager.close("world-1") is SessionStatus.CLOSED
    assert lifecycle.releases == [("world-1", "disconnect"), ("world-1", "close")]


async def test_release_timeout_is_a_failed_cleanup():
    lifecycle = RecordingLifecycle()
    lifecycle.hang = asyncio.Event()
    manager = make_manager(lifecycle=lifecycle, limits=SessionLimits(release_timeout_s=0.01))
    await manager.create("w")
    with pytest.raises(CleanupFailedError):
        await manager.close("w")
    lifecycle.hang.set()
    assert await manager.close("w") is SessionStatus.CLOSED


async def test_reset_whose_release_fails_leaves_the_session_failed():
    lifecycle = RecordingLifecycle()
    manager = make_manager(lifecycle=lifecycle)
    session = await manager.create("w")
    lifecycle.failures_left = 1
    with pytest.raises(ReleaseFailedError):
        await manager.reset("w")
    assert session.status is SessionStatus.FAILED and session.failure == "release_failed"
    await manager.reset("w")
    assert session.status is SessionStatus.ACTIVE


async def test_concurrent_closes_share_one_release():
    lifecycle = RecordingLifecycle()
    lifecycle.hang = asyncio.Event()
    manager = make_manager(lifecycle=lifecycle)
    await manager.create("w")
    closes = [asyncio.create_task(manager.close("w")) for _ in range(3)]
    await asyncio.sleep(0.01)
    lifecycle.hang.set()
    assert await asyncio.gather(*closes) == [SessionStatus.CLOSED] * 3
    assert lifecycle.releases == [("w", "close")]


async def test_close_during_a_tick_drops_the_tick():
    executor, lifecycle = ScriptedExecutor(), RecordingLifecycle()
    executor.gate = asyncio.Event()
    manager = make_manager(executor, lifecycle)
    session = await manager.create("w")
    tick = asyncio.create_task(session.next_tick())
    await executor.started.wait()
    assert await manager.close("w") is SessionStatus.CLOSED
    with pytest.raises(TickSupersededError):
        await tick
    assert session.chunk_index == 0


async def test_interleaved_sessions_stay_independent():
    executor = ScriptedExecutor()
    manager = make_manager(executor)
    a = await manager.create("world-a")
    b = await manager.create("world-b")
    a.accept_event(event(10, prompt="a"))
    b.accept_event(event(1, prompt="b"))
    await a.next_tick()
    await b.next_tick()
    a.accept_event(event(11))
    await a.next_tick()
    ids = [(s.session_id, s.request_id, s.chunk_index, s.applied_event_ids) for s in executor.snapshots]
    assert ids == [
        ("world-a", "world-a-request-0", 0, (10,)),
        ("world-b", "world-b-request-0", 0, (1,)),
        ("world-a", "world-a-request-1", 1, (11,)),
    ]
    with pytest.raises(StaleEventError, match="floor is 11"):
        a.accept_event(event(2))
    assert b.accept_event(event(2)) is EventAcceptance.ACCEPTED


async def test_server_allocated_ids_are_distinct_and_prefixed_with_the_kind():
    manager = make_manager()
    ids = {(await manager.create()).session_id for _ in range(5)}
    assert len(ids) == 5 and all(i.startswith("world-") for i in ids)


async def test_reject_beyond_capacity_with_a_structured_error():
    manager = make_manager(capacity=2)
    await manager.create("a")
    await manager.create("b")
    with pytest.raises(SessionLimitError) as info:
        await manager.create("c")
    assert info.value.to_dict() == {
        "code": "session_limit_reached",
        "message": "world session limit reached (2 sessions)",
        "limit": 2,
        "reason": "capacity",
        "queued": 0,
    }
    await manager.close("a")
    await manager.create("c")


async def test_tombstones_keep_their_admission_slot():
    lifecycle = RecordingLifecycle()
    manager = make_manager(lifecycle=lifecycle, capacity=1)
    await manager.create("a")
    lifecycle.failures_left = 1
    await manager.disconnect("a")
    with pytest.raises(SessionLimitError):
        await manager.create("b")
    await manager.close("a")
    await manager.create("b")


async def test_queue_admits_in_order_with_position_updates():
    manager = make_manager(capacity=1, admission=AdmissionPolicy(over_capacity="queue", max_queued=2))
    await manager.create("a")
    positions: dict[str, list[int]] = {"b": [], "c": []}
    b = asyncio.create_task(manager.create("b", on_queue_position=positions["b"].append))
    c = asyncio.create_task(manager.create("c", on_queue_position=positions["c"].append))
    await asyncio.sleep(0)
    assert manager.queued == 2
    with pytest.raises(SessionLimitError) as info:
        await manager.create("d")
    assert info.value.details["reason"] == "queue_full"
    await manager.close("a")
    assert (await b).session_id == "b"
    assert not c.done()
    assert positions == {"b": [1], "c": [2, 1]}
    await manager.close("b")
    assert (await c).session_id == "c"
    assert manager.stats().occupied == 1 and manager.queued == 0


async def test_queue_wait_times_out_and_cancelled_waiters_leave_the_queue():
    manager = make_manager(
        capacity=1, admission=AdmissionPolicy(over_capacity="queue", max_queued=4, queue_timeout_s=0.02)
    )
    await manager.create("a")
    with pytest.raises(SessionLimitError) as info:
        await manager.create("b")
    assert info.value.details["reason"] == "queue_timeout"
    waiter = asyncio.create_task(manager.create("c"))
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert manager.queued == 0 and manager.occupied == 1


async def test_lru_eviction_closes_the_least_recently_used_idle_session():
    clock, lifecycle = Clock(), RecordingLifecycle()
    manager = make_manager(
        lifecycle=lifecycle, capacity=2, admission=AdmissionPolicy(evict_idle_lru=True), clock=clock
    )
    old = await manager.create("old")
    clock.now += 1
    new = await manager.create("new")
    clock.now += 1
    await old.next_tick()  # "old" is now the most recently used
    clock.now += 1
    await manager.create("newest")
    assert lifecycle.releases == [("new", "evicted")]
    assert [s.session_id for s in manager.list_sessions()] == ["old", "newest"]
    assert new.status is SessionStatus.CLOSED and new.close_reason == "evicted"
    assert manager.stats().evicted == 1


async def test_eviction_skips_busy_and_recent_sessions():
    clock, executor = Clock(), ScriptedExecutor()
    executor.gate = asyncio.Event()
    manager = make_manager(
        executor,
        capacity=1,
        admission=AdmissionPolicy(evict_idle_lru=True, evict_min_idle_s=5),
        clock=clock,
    )
    busy = await manager.create("busy")
    tick = asyncio.create_task(busy.next_tick())
    await executor.started.wait()
    clock.now += 10
    with pytest.raises(SessionLimitError):
        await manager.create("x")  # the only session is mid-tick
    executor.gate.set()
    await tick
    with pytest.raises(SessionLimitError):
        await manager.create("x")  # active less than 5 s ago
    clock.now += 5
    await manager.create("x")
    assert busy.close_reason == "evicted"


async def test_shutdown_closes_everything_and_refuses_new_sessions():
    lifecycle = RecordingLifecycle()
    manager = make_manager(
        lifecycle=lifecycle, capacity=1, admission=AdmissionPolicy(over_capacity="queue", max_queued=2)
    )
    await manager.create("a")
    queued = asyncio.create_task(manager.create("b"))
    await asyncio.sleep(0)
    await manager.shutdown()
    with pytest.raises(ShuttingDownError):
        await queued
    with pytest.raises(ShuttingDownError):
        await manager.create("c")
    assert lifecycle.releases == [("a", "shutdown")] and len(manager) == 0


async def test_metrics_count_sessions_by_state_ticks_and_rejections():
    registry = CollectorRegistry()
    executor = ScriptedExecutor()
    manager = make_manager(executor, capacity=2, registry=registry)
    other = make_manager(capacity=1, registry=registry)  # a second manager shares the families
    s = await manager.create("a")
    await other.create("z")
    await s.next_tick()
    executor.error = RuntimeError("x")
    with pytest.raises(TickFailedError):
        await s.next_tick()
    await manager.create("b")
    with pytest.raises(SessionLimitError):
        await manager.create("c")

    def value(name, **labels):
        return registry.get_sample_value(name, {"kind": "world", **labels})

    assert value("realtime_sessions", state="failed") == 1
    assert value("realtime_sessions", state="active") == 2  # "b" and the other manager's "z"
    assert value("realtime_session_ticks_total", outcome="committed") == 1
    assert value("realtime_session_failures_total", code="tick_failed") == 1
    assert value("realtime_admission_rejections_total", reason="capacity") == 1
    await manager.close("a")
    assert value("realtime_sessions", state="failed") == 0
    assert value("realtime_sessions", state="closed") == 0


async def test_cancelled_tick_during_close_does_not_undo_the_close():
    executor, lifecycle = ScriptedExecutor(), RecordingLifecycle()
    executor.gate = asyncio.Event()
    lifecycle.hang = asyncio.Event()
    manager = make_manager(executor, lifecycle)
    session = await manager.create("w")
    tick = asyncio.create_task(session.next_tick())
    await executor.started.wait()
    close = asyncio.create_task(manager.close("w"))
    await asyncio.sleep(0)
    tick.cancel()
    await asyncio.gather(tick, return_exceptions=True)
    assert session.status is SessionStatus.CLOSING
    lifecycle.hang.set()
    assert await close is SessionStatus.CLOSED
    assert lifecycle.releases == [("w", "close")]


async def test_a_failing_reducer_factory_gives_its_slot_back():
    def broken():
        raise RuntimeError("no reducer")

    manager = make_manager(capacity=1, reducer_factory=broken)
    with pytest.raises(RuntimeError):
        await manager.create("a")
    assert manager.occupied == 0
