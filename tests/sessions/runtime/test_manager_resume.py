"""SessionManager ownership, detach and resume: the one registry of a kind's sessions, the resume
grace it owns, and grace-held slots reclaimed first (issue 26 defect 8, issue 27)."""

from __future__ import annotations

import asyncio

from sessions.session import SessionStatus

from .fakes import RecordingLifecycle, make_manager


async def test_only_the_owners_end_counts_and_a_clean_end_closes_at_once():
    lifecycle = RecordingLifecycle()
    manager = make_manager(lifecycle=lifecycle, resume_grace_s=30)
    first, second = object(), object()
    session = manager.attach(await manager.create("d"), first)
    manager.attach(session, second)  # a resume moved it: the first connection's end is not its
    assert await manager.disconnect("d", owner=first, dropped=True) is SessionStatus.ACTIVE
    assert session.owner is second and lifecycle.releases == []
    assert await manager.disconnect("d", owner=second) is SessionStatus.CLOSED  # no grace
    assert lifecycle.reasons("d") == ["disconnect"] and manager.close_reason("d") == "disconnect"


async def test_a_dropped_socket_detaches_until_a_resume_or_the_grace_ends():
    lifecycle = RecordingLifecycle()
    manager = make_manager(lifecycle=lifecycle, resume_grace_s=0.2)
    owner = object()
    kept = manager.attach(await manager.create("kept"), owner)
    manager.attach(await manager.create("lost"), owner)
    await manager.disconnect("kept", owner=owner, dropped=True)
    await manager.disconnect("lost", owner=owner, dropped=True)
    assert kept.owner is None and kept.detached_at is not None and len(manager) == 2
    manager.attach(kept, object())  # resumed within the grace: its timer is gone
    await asyncio.sleep(0.4)
    assert "kept" in manager and kept.detached_at is None
    assert "lost" not in manager and lifecycle.reasons("lost") == ["grace_expired"]
    assert manager.close_reason("lost") == "grace_expired" and manager.close_reason("kept") is None


async def test_without_a_grace_a_dropped_socket_closes_the_session():
    manager = make_manager()
    owner = object()
    manager.attach(await manager.create("s"), owner)
    assert await manager.disconnect("s", owner=owner, dropped=True) is SessionStatus.CLOSED


async def test_grace_held_slots_are_reclaimed_first_oldest_first():
    lifecycle = RecordingLifecycle()
    manager = make_manager(lifecycle=lifecycle, capacity=2, resume_grace_s=30)
    owner = object()
    for sid in ("old", "new"):
        manager.attach(await manager.create(sid), owner)
        await manager.disconnect(sid, owner=owner, dropped=True)
        await asyncio.sleep(0.01)
    await manager.create("third")  # full of detached sessions: the oldest makes room
    assert set(manager.list_sessions()) == {manager.get("new"), manager.get("third")}
    assert lifecycle.reasons("old") == ["evicted"] and manager.close_reason("old") == "evicted"
    assert manager.stats().evicted == 1


async def test_close_soon_closes_once_from_a_callback_and_shutdown_waits_for_it():
    lifecycle = RecordingLifecycle()
    manager = make_manager(lifecycle=lifecycle)
    await manager.create("s")
    manager.close_soon("s", "step_inbox_full")
    manager.close_soon("s", "step_inbox_full")  # one close under way: not a second
    await manager.shutdown()
    assert lifecycle.reasons("s") == ["step_inbox_full"] and manager.close_reason("s") == "step_inbox_full"
