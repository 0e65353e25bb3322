"""10,000 create / event / tick / close cycles return the runtime to its baseline."""

from __future__ import annotations

import asyncio
import gc
import weakref

from prometheus_client import CollectorRegistry

from sessions.runner import SessionRunner
from sessions.session import Session

from .fakes import RecordingLifecycle, ScriptedExecutor, event, make_manager

CYCLES = 10_000


async def test_ten_thousand_cycles_leave_no_sessions_tasks_or_tombstones():
    registry = CollectorRegistry()
    lifecycle = RecordingLifecycle()
    manager = make_manager(ScriptedExecutor(), lifecycle, capacity=4, registry=registry)
    baseline_tasks = len(asyncio.all_tasks())
    sampled: list[weakref.ref[Session]] = []
    committed = 0

    for i in range(CYCLES):
        session = await manager.create()
        ticks: list[int] = []

        async def handle(command: str, session: Session = session, ticks: list[int] = ticks) -> None:
            if command == "event":
                session.accept_event(event(1, prompt="p", camera=[1, 2]))
            else:
                ticks.append((await session.next_tick()).value)

        runner = SessionRunner(handle, mailbox_size=4)
        runner.start()
        runner.post("event")
        runner.post("tick")
        await runner.stop()
        committed += len(ticks)
        if i % 1000 == 0:
            sampled.append(weakref.ref(session))
        await manager.close(session.session_id)
        del session, runner, handle

    assert committed == CYCLES
    assert len(manager) == 0 and manager.occupied == 0 and manager.tombstones() == []
    assert len(asyncio.all_tasks()) == baseline_tasks
    assert len(lifecycle.releases) == CYCLES
    gc.collect()
    assert [ref for ref in sampled if ref() is not None] == []
    for state in ("active", "failed", "closing", "closed", "cleanup_failed"):
        assert registry.get_sample_value("realtime_sessions", {"kind": "world", "state": state}) in (None, 0)
    stats = manager.stats()
    assert (stats.created, stats.closed, stats.tombstones) == (CYCLES, CYCLES, 0)
