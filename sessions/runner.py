"""Single-writer runner and epoch-checked tracked tasks (architecture invariant 2).

Contract (the duplex runner's concurrency model, vllm-omni surfaces reference §3.3):

- :class:`SessionRunner` owns one session's mutations: ``submit(item)`` puts a command into a
  bounded mailbox without waiting (a full mailbox raises :class:`MailboxFullError`, answered as
  backpressure), ``await put(item)`` waits for room instead, ``post(item)`` queues the runner's
  own follow-up work past the bound; the runner task awaits ``handle(item)`` for one item at a
  time, in order. A
  handler exception goes to ``on_error(item, exc)`` (default: logged) and the runner goes on.
  Slow work is never awaited inside ``handle``: it is spawned on :attr:`SessionRunner.tasks` so a
  later command (a reset, a cancel) is never stuck behind it.
- :class:`TrackedTasks` runs background work ``work(fence)`` with an :class:`EpochFence` that
  captured the session epoch at spawn time. The work calls ``fence.check()`` after every await
  (raises :class:`StaleEpochError` once the epoch moved); the result is delivered to
  ``on_result`` only if the epoch still matches when the work finishes; stale results and stale
  failures are counted in ``dropped`` and discarded. ``cancel_all()`` cancels and awaits every
  task; ``len()`` is the number still running (tests count it for leaks).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

from sessions.engine.errors import StaleEpochError
from sessions.errors import MailboxFullError
from sessions.log_context import session_context

log = logging.getLogger("sessions.runner")

T = TypeVar("T")
Item = TypeVar("Item")
EpochSource = Callable[[], int]


class EpochFence:
    """The epoch a piece of work started in; compare after every await."""

    def __init__(self, epoch_source: EpochSource) -> None:
        self._source = epoch_source
        self.epoch = epoch_source()

    @property
    def alive(self) -> bool:
        return self._source() == self.epoch

    def check(self) -> None:
        if not self.alive:
            raise StaleEpochError("session", self.epoch, self._source())


class TrackedTasks:
    def __init__(self, epoch_source: EpochSource, *, name: str = "session") -> None:
        self._epoch_source = epoch_source
        self._name = name
        self._tasks: set[asyncio.Task] = set()
        self.dropped = 0

    def __len__(self) -> int:
        return len(self._tasks)

    def spawn(
        self,
        work: Callable[[EpochFence], Awaitable[T]],
        *,
        on_result: Callable[[T], None] | None = None,
        on_error: Callable[[BaseException], None] | None = None,
    ) -> asyncio.Task[None]:
        """Run ``work(fence)`` in the background; deliver its result only if still current."""
        fence = EpochFence(self._epoch_source)

        async def run() -> None:
            try:
                result = await work(fence)
            except StaleEpochError:
                self.dropped += 1
                return
            except Exception as exc:
                if not fence.alive:
                    self.dropped += 1
                elif on_error is not None:
                    on_error(exc)
                else:
                    log.exception("tracked task of %s failed", self._name)
                return
            if not fence.alive:
                self.dropped += 1
            elif on_result is not None:
                on_result(result)

        task = asyncio.create_task(run(), name=f"{self._name}-task")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def cancel_all(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


_STOP: Any = object()


class SessionRunner(Generic[Item]):
    def __init__(
        self,
        handle: Callable[[Item], Awaitable[None]],
        *,
        mailbox_size: int,
        epoch_source: EpochSource = lambda: 0,
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
        self.tasks = TrackedTasks(epoch_source, name=session_id)

    @property
    def pending(self) -> int:
        return self._mailbox.qsize()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"runner-{self._session_id}")

    def submit(self, item: Item) -> None:
        """Queue ``item`` for the runner; raises ``MailboxFullError`` at the bound."""
        if self._mailbox.qsize() >= self._limit:
            raise MailboxFullError(
                f"session {self._session_id} has {self._limit} commands waiting", limit=self._limit
            )
        self._mailbox.put_nowait(item)

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
        """Process what was submitted before, then stop; cancels tracked tasks."""
        if self._task is not None:
            self._mailbox.put_nowait(_STOP)
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        await self.tasks.cancel_all()

    async def cancel(self) -> None:
        """Stop at once, dropping queued commands; cancels tracked tasks."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        await self.tasks.cancel_all()

    async def _run(self) -> None:
        with session_context(self._session_id):
            while True:
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
