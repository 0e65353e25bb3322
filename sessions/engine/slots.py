"""Resident per-session state: a slot table keyed by session id.

Each open session holds one slot index in ``[0, capacity)``; a stateful stage keeps the
session's state (KV cache rows, codec caches) at that index of pools it preallocated for
``capacity`` slots, and gathers a batch's rows with one index tensor. The table counts the
resident bytes of every held slot (``bytes_in_use``), which the session runtime's capacity
planner reads together with ``per_session_bytes``.

Slot states: ``opening`` (index reserved, ``open_state`` running) -> ``open`` -> ``releasing``
-> freed; a failed ``release_state`` leaves ``release_failed`` (bytes still counted, index not
reused) until a retried release succeeds. ``open_state`` / ``release_state`` run on the stage's
worker thread, after any forward already queued there, so a running forward never loses a slot.
Opening allocates nothing while work waits in the scheduler: state exists only between an
explicit ``open`` and ``release``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from models.stage import ModelStage, StatefulStage
from sessions.engine.errors import SessionReleasedError, SlotsExhaustedError
from sessions.engine.worker import DeviceWorker

SlotStatus = Literal["opening", "open", "releasing", "release_failed"]


@dataclass
class Slot:
    session_id: str
    index: int
    nbytes: int
    status: SlotStatus = "opening"
    state: Any = None
    opened_at: float = field(default_factory=time.monotonic)
    settled: asyncio.Event = field(default_factory=asyncio.Event)  # set once opening finished


class SlotTable:
    """Slots of one stage. All methods run on the event loop thread (no locks needed)."""

    def __init__(self, stage: ModelStage, worker: DeviceWorker, capacity: int) -> None:
        self.stage = stage
        self.worker = worker
        self.capacity = capacity
        self.stateful = isinstance(stage, StatefulStage)
        self.per_session_bytes = int(stage.state_bytes()) if self.stateful else 0
        self._slots: dict[str, Slot] = {}
        self._free = list(range(capacity - 1, -1, -1))  # pop() hands out the lowest index first

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
        existing = self._slots.get(session_id)
        if existing is not None:
            await existing.settled.wait()
            if existing.status != "open":
                raise SessionReleasedError(session_id, f"slot is {existing.status}")
            return existing
        if not self._free:
            raise SlotsExhaustedError(self.stage.name, self.capacity)
        slot = Slot(session_id, self._free.pop(), self.per_session_bytes)
        self._slots[session_id] = slot
        if self.stateful:
            try:
                slot.state = await self.worker.run(self.stage.open_state, session_id, slot.index)
            except BaseException:
                self._drop(slot)
                slot.settled.set()
                raise
        slot.status = "open"
        slot.settled.set()
        return slot

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
            except BaseException:
                slot.status = "release_failed"
                raise
        self._drop(slot)
        return True

    def _drop(self, slot: Slot) -> None:
        if self._slots.get(slot.session_id) is slot:
            del self._slots[slot.session_id]
            self._free.append(slot.index)
