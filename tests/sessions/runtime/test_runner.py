"""Single-writer runner and epoch-checked tracked tasks."""

from __future__ import annotations

import asyncio

from sessions.runner import SessionRunner


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
        runner.post(i)
    await runner.stop()
    assert seen == [0, 1, 2, 3, 4]


async def test_handler_errors_do_not_stop_the_runner():
    errors: list[tuple[int, str]] = []
    seen: list[int] = []

    async def handle(item: int) -> None:
        if item == 1:
            raise ValueError("bad command")
        seen.append(item)

    runner = SessionRunner(handle, mailbox_size=2, on_error=lambda item, exc: errors.append((item, str(exc))))
    runner.post(1)
    runner.post(2)
    runner.start()
    await runner.stop()
    assert errors == [(1, "bad command")] and seen == [2]


async def test_cancel_stops_a_busy_runner_and_drops_queued_items():
    async def handle(item):
        await asyncio.sleep(10)

    runner = SessionRunner(handle, mailbox_size=4)
    runner.start()
    runner.post(1)
    runner.post(2)
    await asyncio.sleep(0)
    await runner.cancel()
    assert runner.pending == 1 and runner._task is None  # item 2 was never handled


async def test_put_waits_for_room_and_post_goes_past_the_bound():
    seen: list[int] = []

    async def handle(item: int) -> None:
        seen.append(item)

    runner = SessionRunner(handle, mailbox_size=1)
    runner.post(1)
    waiting = asyncio.create_task(runner.put(2))
    await asyncio.sleep(0.01)
    assert not waiting.done() and runner.pending == 1  # the reader is held back, nothing dropped
    runner.post(3)  # the runner's own follow-up work is never refused
    assert runner.pending == 2
    runner.start()
    await asyncio.wait_for(waiting, 2.0)
    await runner.stop()
    assert seen == [1, 3, 2]
