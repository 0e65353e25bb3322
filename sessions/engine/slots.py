"""Resident per-session state: a slot table keyed by session id.

Each open session holds one slot index in ``[0, capacity)``; a stateful stage keeps the
session's state (KV cache rows, codec caches) at that index of pools it preallocated for
``capacity`` slots, and gathers a batch's rows with one index tensor. The table counts the
resident bytes of every held slot (``bytes_in_use``), which the session runtime's capacity
planner reads together with ``per_session_bytes``.

Slot states: ``opening`` (index reserved, ``open_state`` running) -> ``open`` -> ``releasing``
-> freed; a failed ``release_state`` leaves ``release_failed`` (bytes still counted, index not
reused) until a retried release succeeds. A worker that died (``StageWorkerDiedError``) holds
nothing any more: its slots are freed without ``release_state``. ``open_state`` / ``release_state`` run on the stage's
worker thread, after any forward already queued there, so a running forward never loses a slot.
Opening allocates nothing while work waits in the scheduler: state exists only between an
explicit ``open`` and ``release``.

Cancelling an ``open`` is safe for any stateful stage: ``open_state`` may already run on the
worker thread, so the slot stays reserved until it returns. If every caller awaiting the open was
cancelled before one received the slot, the slot is *abandoned*: once ``open_state`` returns it
is released through ``release_state`` like any other slot, and only then is its index reused.
An ``open`` that finds no free index while abandoned slots are being reclaimed waits for them
instead of failing; an ``open`` of the abandoned session itself adopts the slot if its
``open_state`` has not returned yet (no second ``open_state``), or waits for the release.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from models.stage import ModelStage, StatefulStage
from sessions.engine.channels import check_capacity
from sessions.engine.errors import (
    EngineClosedError,
    EngineConfigError,
    SessionReleasedError,
    SlotsExhaustedError,
    StageWorkerDiedError,
)
from sessions.engine.worker import DeviceWorker

log = logging.getLogger("sessions.engine")

SlotStatus = Literal["opening", "open", "releasing", "release_failed"]

DEFAULT_MAX_SESSIONS = 256


def slot_capacity(stage: ModelStage, max_sessions: int | None) -> int:
    """The slots an engine holds for ``stage``: ``max_sessions``, by default the stage's
    ``slot_capacity`` (else :data:`DEFAULT_MAX_SESSIONS`); never more than ``slot_capacity``."""
    stage_capacity = getattr(stage, "slot_capacity", None)
    capacity = (
        max_sessions if max_sessions is not None else getattr(stage, "slot_capacity", DEFAULT_MAX_SESSIONS)
    )
    check_capacity("max_sessions", capacity)
    if stage_capacity is not None and capacity > stage_capacity:
        raise EngineConfigError(
            f"max_sessions {capacity} exceeds stage {stage.name!r} slot_capacity {stage_capacity}"
        )
    return capacity


@dataclass
class Slot:
    session_id: str
    index: int
    nbytes: int
    status: SlotStatus = "opening"
    state: Any = None
    opened_at: float = field(default_factory=time.monotonic)
    settled: asyncio.Event = field(default_factory=asyncio.Event)  # set once opening finished
    openers: int = 0  # callers awaiting the open
    claimed: bool = False  # an opener received the open slot
    abandoned: bool = False  # every opener was cancelled first: released once open_state returns
    error: BaseException | None = None  # why open_state failed


class SlotTable:
    """Slots of one stage. All methods run on the event loop thread (no locks needed)."""

    def __init__(
        self,
        stage: ModelStage,
        worker: DeviceWorker,
        capacity: int,
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        """``on_change`` runs on the loop when an abandoned slot is freed outside open/release."""
        self.stage = stage
        self.worker = worker
        self.capacity = capacity
        self.stateful = isinstance(stage, StatefulStage)
        self.per_session_bytes = int(stage.state_bytes()) if self.stateful else 0
        self._on_change = on_change
        self._slots: dict[str, Slot] = {}
        self._free = list(range(capacity - 1, -1, -1))  # pop() hands out the lowest index first
        self._freed = asyncio.Event()  # replaced each time an index is freed or a reclaim fails

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._slots

    def __len__(self) -> int:
        return len(self._slots)

    def __iter__(self) -> Iterator[Slot]:
        return iter(list(self._slots.values()))

    def get(self, session_id: str) -> Slot | None:
        return self._slots.get(session_id)

    @property
    def bytes_in_use(self) -> int:
        """Resident bytes of every slot held (opening, open, releasing or failed to release)."""
        return sum(slot.nbytes for slot in self._slots.values())

    @property
    def free(self) -> int:
        return len(self._free)

    async def open(self, session_id: str) -> Slot:
        """Reserve a slot and initialise the stage's state in it; idempotent for an open slot."""
        while True:
            existing = self._slots.get(session_id)
            if existing is not None:
                if not existing.abandoned:
                    return await self._claim(existing)
                if existing.status == "opening":  # open_state still runs: adopt it
                    existing.abandoned = False
                    return await self._claim(existing)
            elif self._free:
                break
            elif not any(slot.abandoned for slot in self._slots.values()):
                raise SlotsExhaustedError(self.stage.name, self.capacity)
            await self._freed.wait()  # an abandoned slot is being released
        slot = Slot(session_id, self._free.pop(), self.per_session_bytes)
        self._slots[session_id] = slot
        if not self.stateful:
            slot.status = "open"
            slot.settled.set()
            return slot
        try:
            self.worker.post(
                self.stage.open_state, (session_id, slot.index), functools.partial(self._opened, slot)
            )
        except BaseException:
            self._drop(slot)
            slot.settled.set()
            raise
        return await self._claim(slot)

    async def _claim(self, slot: Slot) -> Slot:
        """Wait for the slot's open to finish and take it; a cancelled last opener abandons it."""
        if not slot.settled.is_set():
            slot.openers += 1
            try:
                await slot.settled.wait()
            except asyncio.CancelledError:
                slot.openers -= 1
                if slot.openers == 0 and not slot.claimed:
                    self._abandon(slot)
                raise
            slot.openers -= 1
        if slot.status != "open":
            raise slot.error or SessionReleasedError(slot.session_id, f"slot is {slot.status}")
        slot.claimed = True
        return slot

    def _abandon(self, slot: Slot) -> None:
        if slot.status == "opening":
            slot.abandoned = True  # _opened releases it
        elif slot.status == "open":  # the cancel landed after open_state returned
            slot.abandoned = True
            self._reclaim(slot)

    def _opened(self, slot: Slot, state: Any, error: BaseException | None) -> None:
        """On the loop once ``open_state`` ran (even if every opener was cancelled meanwhile)."""
        if error is not None:
            slot.error = error
            self._drop(slot)
        else:
            slot.state = state
            slot.status = "open"
            if slot.abandoned:
                self._reclaim(slot)
        slot.settled.set()

    def _reclaim(self, slot: Slot) -> None:
        """Release an abandoned slot through ``release_state``, as ``release`` would."""
        slot.status = "releasing"
        done = functools.partial(self._reclaimed, slot)
        try:
            self.worker.post(self.stage.release_state, (slot.session_id, slot.index, slot.state), done)
        except EngineClosedError as exc:
            done(None, exc)

    def _reclaimed(self, slot: Slot, _result: Any, error: BaseException | None) -> None:
        if error is None or isinstance(error, StageWorkerDiedError):
            self._drop(slot)
        else:  # as a failed release: bytes stay counted, the index is not reused
            log.error("release of an abandoned slot failed: %r", error, extra={"stage": self.stage.name})
            slot.status = "release_failed"
            slot.abandoned = False
            self._wake()
        self._on_change()

    async def release(self, session_id: str) -> bool:
        """Free the session's slot; False if it held none. Raises if ``release_state`` fails."""
        slot = self._slots.get(session_id)
        if slot is not None:
            await slot.settled.wait()  # a release racing an open waits for the state to exist
            slot = self._slots.get(session_id)
        if slot is None or slot.status == "releasing":
            return False
        slot.status = "releasing"
        if self.stateful:
            try:
                await self.worker.run(self.stage.release_state, session_id, slot.index, slot.state)
            except StageWorkerDiedError:  # nothing runs on that worker again: no state is held for it
                pass
            except BaseException:
                slot.status = "release_failed"
                raise
        self._drop(slot)
        return True

    def _drop(self, slot: Slot) -> None:
        if self._slots.get(slot.session_id) is slot:
            del self._slots[slot.session_id]
            self._free.append(slot.index)
            self._wake()

    def _wake(self) -> None:
        self._freed.set()
        self._freed = asyncio.Event()
