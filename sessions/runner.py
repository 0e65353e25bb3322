"""``SessionRunner``: the single-writer mailbox of a session (architecture invariant 2).

Contract (the duplex runner's concurrency model, vllm-omni surfaces reference §3.3): the runner
owns one session's mutations. ``await put(item)`` puts a command into a bounded mailbox, waiting
for room when it is full (the reader's backpressure: it stops reading), ``post(item)`` queues the runner's
own follow-up work past the bound (tick outcomes, timers); the runner task awaits
``handle(item)`` for one item at a time, in order. A handler exception goes to
``on_error(item, exc)`` (default: logged) and the runner goes on. ``cancel()`` ends the runner
even when a handler swallowed the cancel request (it is checked before the next item). Slow work is never awaited
inside ``handle``: the connection skeleton runs it as a child task whose outcome is posted back
(``realtime.connection.Connection.spawn``), so a later command (a reset, a cancel) is never stuck
behind it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

from sessions.log_context import session_context

log = logging.getLogger("sessions.runner")

Item = TypeVar("Item")


_STOP: Any = object()


class SessionRunner(Generic[Item]):
    def __init__(
        self,
        handle: Callable[[Item], Awaitable[None]],
        *,
        mailbox_size: int,
        session_id: str = "session",
        on_error: Callable[[Item, BaseException], None] | None = None,
    ) -> None:
        if mailbox_size < 1:
            raise ValueError(f"mailbox_size must be >= 1, got {mailbox_size}")
        self._handle = handle
        self._mailbox: asyncio.Queue[Item] = asyncio.Queue()  # bounded by submit/put, not the queue
        self._room = asyncio.Event()
        self._limit = mailbox_size
        self._session_id = session_id
        self._on_error = on_error
        self._task: asyncio.Task | None = None

    @property
    def pending(self) -> int:
        return self._mailbox.qsize()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"runner-{self._session_id}")

    async def put(self, item: Item) -> None:
        """Queue ``item``, waiting while the mailbox is at its bound (a reader's backpressure)."""
        while self._mailbox.qsize() >= self._limit:
            self._room.clear()
            await self._room.wait()
        self._mailbox.put_nowait(item)

    def post(self, item: Item) -> None:
        """Queue an internal item (a tick result, a timer) past the bound: the runner's own work
        is bounded by construction and must never wait behind client commands."""
        self._mailbox.put_nowait(item)

    async def stop(self) -> None:
        """Process what was submitted before, then stop."""
        if self._task is not None:
            self._mailbox.put_nowait(_STOP)
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def cancel(self) -> None:
        """Stop at once, dropping queued commands."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        task = asyncio.current_task()
        assert task is not None
        with session_context(self._session_id):
            while True:
                if task.cancelling():
                    # A cancel that landed inside ``handle`` and was swallowed there (Python
                    # 3.11's ``wait_for`` does, when its awaitable completes at that moment):
                    # honour it, or ``cancel()`` would wait on an idle mailbox forever.
                    raise asyncio.CancelledError
                item = await self._mailbox.get()
                self._room.set()
                if item is _STOP:
                    return
                try:
                    await self._handle(item)
                except Exception as exc:
                    if self._on_error is not None:
                        self._on_error(item, exc)
                    else:
                        log.exception("session command failed")
