"""Single-writer runner and epoch-checked tracked tasks."""

from __future__ import annotations

import asyncio

import pytest

from sessions.errors import MailboxFullError
from sessions.runner import SessionRunner, TrackedTasks

from .fakes import ScriptedExecutor, make_session


async def test_mailbox_items_are_handled_one_at_a_time_in_order():
    seen: list[int] = []
    running = 0

    async def handle(item: int) -> None:
        nonlocal running
        running += 1
        assert running == 1
        await asyncio.sleep(0)
        seen.append(item)
        running -= 1

    runner = SessionRunner(handle, mailbox_size=8)
    runner.start()
    for i in range(5):
        runner.submit(i)
    await runner.stop()
    assert seen == [0, 1, 2, 3, 4]


async def test_full_mailbox_raises_and_handler_errors_do_not_stop_the_runner():
    errors: list[tuple[int, str]] = []

    async def handle(item: int) -> None:
        if item == 1:
            raise ValueError("bad command")

    runner = SessionRunner(handle, mailbox_size=2, on_error=lambda item, exc: errors.append((item, str(exc))))
    runner.submit(1)
    runner.submit(2)
    with pytest.raises(MailboxFullError) as info:
        runner.submit(3)
    assert info.value.details == {"limit": 2}
    runner.start()
    await runner.stop()
    assert errors == [(1, "bad command")]


async def test_tracked_task_result_is_dropped_after_the_epoch_moves():
    session = make_session(ScriptedExecutor())
    tasks = TrackedTasks(lambda: session.epoch)
    gate = asyncio.Event()
    results: list[str] = []

    async def slow(fence):
        await gate.wait()
        return "stale"

    async def checking(fence):
        await gate.wait()
        fence.check()
        results.append("not reached")

    tasks.spawn(slow, on_result=results.append)
    tasks.spawn(checking)
    await session.reset()  # bumps the epoch
    gate.set()
    await asyncio.sleep(0.01)
    assert results == [] and tasks.dropped == 2 and len(tasks) == 0

    done = tasks.spawn(lambda fence: asyncio.sleep(0, "fresh"), on_result=results.append)
    await done
    assert results == ["fresh"]


async def test_tracked_task_failures_reach_on_error_unless_stale():
    epoch = 0
    tasks = TrackedTasks(lambda: epoch)
    errors: list[BaseException] = []

    async def boom(fence):
        raise RuntimeError("decode failed")

    await tasks.spawn(boom, on_error=errors.append)
    assert [str(e) for e in errors] == ["decode failed"]
    gate = asyncio.Event()

    async def late_boom(fence):
        await gate.wait()
        raise RuntimeError("late")

    task = tasks.spawn(late_boom, on_error=errors.append)
    epoch = 1
    gate.set()
    await task
    assert len(errors) == 1 and tasks.dropped == 1


async def test_stop_and_cancel_leave_no_tasks():
    async def handle(item):
        await asyncio.sleep(10)

    runner = SessionRunner(handle, mailbox_size=4)
    runner.start()
    runner.submit(1)
    runner.tasks.spawn(lambda fence: asyncio.sleep(10))
    await asyncio.sleep(0)
    assert len(runner.tasks) == 1
    await runner.cancel()
    assert len(runner.tasks) == 0 and runner.pending == 0


async def test_put_waits_for_room_and_post_goes_past_the_bound():
    seen: list[int] = []

    async def handle(item: int) -> None:
        seen.append(item)

    runner = SessionRunner(handle, mailbox_size=1)
    runner.submit(1)
    waiting = asyncio.create_task(runner.put(2))
    await asyncio.sleep(0.01)
    assert not waiting.done() and runner.pending == 1  # the reader is held back, nothing dropped
    runner.post(3)  # the runner's own follow-up work is never refused
    assert runner.pending == 2
    runner.start()
    await asyncio.wait_for(waiting, 2.0)
    await runner.stop()
    assert seen == [1, 3, 2]
