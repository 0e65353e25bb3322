"""Reaper: idle timeout, maximum lifetime with warning, tombstone retries."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry

from sessions.reaper import ExpiryPolicy, Reaper
from sessions.session import SessionStatus

from .fakes import RecordingLifecycle, ScriptedExecutor, make_manager
from .test_manager import Clock


async def test_idle_sessions_expire_through_the_release_path():
    clock, lifecycle, registry = Clock(), RecordingLifecycle(), CollectorRegistry()
    manager = make_manager(lifecycle=lifecycle, clock=clock, registry=registry)
    reaper = Reaper(manager, ExpiryPolicy(idle_timeout_s=30), clock=clock)
    idle = await manager.create("idle")
    active = await manager.create("active")
    clock.now += 20
    await active.next_tick()
    clock.now += 15
    assert await reaper.sweep() == [("idle", "idle")]
    assert lifecycle.releases == [("idle", "idle")]
    assert idle.status is SessionStatus.CLOSED and idle.close_reason == "idle"
    assert "active" in manager and manager.stats().expired == 1
    assert (
        registry.get_sample_value("realtime_session_expiries_total", {"kind": "world", "reason": "idle"}) == 1
    )


async def test_a_session_mid_tick_is_not_idle():
    clock, executor = Clock(), ScriptedExecutor()
    executor.gate = asyncio.Event()
    manager = make_manager(executor, clock=clock)
    reaper = Reaper(manager, ExpiryPolicy(idle_timeout_s=1), clock=clock)
    session = await manager.create("w")
    tick = asyncio.create_task(session.next_tick())
    await executor.started.wait()
    clock.now += 10
    assert await reaper.sweep() == []
    executor.gate.set()
    await tick


async def test_lifetime_warns_once_then_expires():
    clock = Clock()
    manager = make_manager(clock=clock)
    reaper = Reaper(manager, ExpiryPolicy(max_lifetime_s=60, lifetime_warning_s=10), clock=clock)
    session = await manager.create("w")
    warnings: list[float] = []
    session.on_lifetime_warning = warnings.append
    clock.now += 45
    await reaper.sweep()
    assert warnings == []
    clock.now += 7
    await reaper.sweep()
    clock.now += 1
    await reaper.sweep()
    assert warnings == [8.0]
    clock.now += 8
    assert await reaper.sweep() == [("w", "lifetime")]
    assert session.close_reason == "lifetime" and len(manager) == 0


async def test_tombstones_are_retried_until_cleanup_succeeds():
    clock, lifecycle = Clock(), RecordingLifecycle()
    manager = make_manager(lifecycle=lifecycle, clock=clock, capacity=1)
    reaper = Reaper(manager, ExpiryPolicy(idle_timeout_s=5), clock=clock)
    await manager.create("w")
    lifecycle.failures_left = 2
    clock.now += 6
    await reaper.sweep()  # idle expiry fails -> tombstone
    assert manager.tombstones() == ["w"]
    await reaper.sweep()  # retry fails again
    assert manager.tombstones() == ["w"]
    await reaper.sweep()
    assert len(manager) == 0 and lifecycle.reasons("w") == ["idle", "idle", "idle"]


async def test_manager_start_runs_the_reaper_on_its_interval():
    lifecycle = RecordingLifecycle()
    manager = make_manager(lifecycle=lifecycle, expiry=ExpiryPolicy(idle_timeout_s=0.02, interval_s=0.01))
    await manager.start()
    session = await manager.create("w")
    assert await asyncio.wait_for(session.wait_closed(), 2) == "idle"
    await manager.shutdown()
    assert lifecycle.releases == [("w", "idle")]
