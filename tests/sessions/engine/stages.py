"""Small model stages for the engine's unit tests (real code paths, deterministic timing).

Batched stages (``forward(items)``) run on the engine's worker thread; :class:`FakeStreamStage` is
a self-scheduling streaming stage in the shape of an LLM on vLLM's ``AsyncLLM``: one async
generator per request, a delay per chunk, an abort flag per request id and an endless mode.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator

import torch

from models.stage import StageItem


class RecordingStage:
    """Doubles payloads; records each batch's items and start time."""

    device = "cpu"

    def __init__(self, name: str = "rec", delay_s: float = 0.0) -> None:
        self.name = name
        self.delay_s = delay_s
        self.items: list[list[StageItem]] = []
        self.starts: list[float] = []

    @property
    def batches(self) -> list[list[str]]:
        return [[item.session_id for item in batch] for batch in self.items]

    def forward(self, items):
        self.starts.append(time.monotonic())
        self.items.append(list(items))
        if self.delay_s:
            time.sleep(self.delay_s)
        return [item.payload * 2 for item in items]


class FlakyStage(RecordingStage):
    """Fails the item whose payload is "bad"; raises for any batch holding "boom"."""

    def forward(self, items):
        self.items.append(list(items))
        if any(item.payload == "boom" for item in items):
            raise RuntimeError("boom")
        return [ValueError("bad item") if item.payload == "bad" else item.payload for item in items]


class PooledStateStage:
    """A stateful stage: per-session rows of a preallocated pool, gathered by slot index.

    ``forward`` adds each item's payload to its session's row and returns the row's sum. It is
    transactional per call, as the stage contract demands: it raises before writing anything if
    any payload is ``"poison"``.
    """

    device = "cpu"

    def __init__(self, slot_capacity: int = 4, width: int = 16, name: str = "pooled") -> None:
        self.name = name
        self.slot_capacity = slot_capacity
        self.pool = torch.zeros(slot_capacity, width)
        self.opened: list[tuple[str, int]] = []
        self.released: list[tuple[str, int]] = []
        self.forwards: list[list[str]] = []
        self.fail_release = False

    def state_bytes(self) -> int:
        return self.pool[0].numel() * self.pool.element_size()

    def open_state(self, session_id, slot):
        self.pool[slot].zero_()
        self.opened.append((session_id, slot))
        return {"slot": slot}

    def release_state(self, session_id, slot, state):
        if self.fail_release:
            raise RuntimeError("device release failed")
        self.released.append((session_id, slot))

    def forward(self, items):
        self.forwards.append([item.session_id for item in items])
        if any(item.payload == "poison" for item in items):
            raise RuntimeError("poisoned input")
        index = torch.tensor([item.slot for item in items])
        rows = self.pool.index_select(0, index) + torch.tensor([[float(item.payload)] for item in items])
        self.pool.index_copy_(0, index, rows)
        return [float(row.sum()) for row in rows]


class GatedStateStage(PooledStateStage):
    """``open_state`` blocks until ``gate`` is set; records a slot initialised while still live."""

    def __init__(self, slot_capacity: int = 1) -> None:
        super().__init__(slot_capacity=slot_capacity, name="gated")
        self.gate = threading.Event()
        self.live: dict[int, str] = {}
        self.doubled: list[tuple[str, int]] = []
        self.on_open = None  # called on the worker thread just before open_state returns

    def open_state(self, session_id, slot):
        self.gate.wait(5.0)
        if slot in self.live:
            self.doubled.append((session_id, slot))
        self.live[slot] = session_id
        if self.on_open is not None:
            self.on_open()
        return super().open_state(session_id, slot)

    def release_state(self, session_id, slot, state):
        super().release_state(session_id, slot, state)
        if self.live.get(slot) == session_id:
            del self.live[slot]


class FakeStreamStage:
    """A fake LLM-like streaming stage: ``stream(item)`` is an async generator per request.

    The payload says how many chunks to yield: an int ``n`` gives ``n`` chunks, ``None`` is
    endless, anything else gives one. Chunk ``k`` is ``(session_id, epoch, k)``, yielded after
    ``step_s`` (and after ``stall_s`` more before chunk ``stall_at``). ``abort(request_id)`` sets
    the request's flag; its generator returns at its next step. Counters: ``steps`` (chunks made
    per session), ``started`` (items), ``aborted`` (request ids, in call order), ``live`` (request
    ids whose generator is running), ``ended`` (request ids whose generator exited).
    """

    device = "cpu"

    def __init__(
        self,
        name: str = "stream",
        step_s: float = 0.0,
        stall_at: int | None = None,
        stall_s: float = 0.0,
    ) -> None:
        self.name = name
        self.step_s = step_s
        self.stall_at = stall_at
        self.stall_s = stall_s
        self.steps: dict[str, int] = {}
        self.started: list[StageItem] = []
        self.aborted: list[str] = []
        self.live: set[str] = set()
        self.ended: list[str] = []
        self.failing: set[str] = set()  # request ids whose stream raises after its first chunk

    def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    async def stream(self, item: StageItem) -> AsyncIterator[tuple[str, int, int]]:
        self.started.append(item)
        self.live.add(item.request_id)
        total = item.payload if item.payload is None or isinstance(item.payload, int) else 1
        k = 0
        try:
            while total is None or k < total:
                if item.request_id in self.aborted:
                    return
                if k == self.stall_at:
                    await asyncio.sleep(self.stall_s)
                await asyncio.sleep(self.step_s)
                if k == 1 and item.request_id in self.failing:
                    raise RuntimeError("generation failed")
                self.steps[item.session_id] = self.steps.get(item.session_id, 0) + 1
                yield (item.session_id, item.epoch, k)
                k += 1
        finally:
            self.live.discard(item.request_id)
            self.ended.append(item.request_id)


class StatefulStreamStage(FakeStreamStage):
    """A streaming stage with per-session resident state (an LLM's KV cache) in slots."""

    def __init__(self, slot_capacity: int = 2, name: str = "llm", step_s: float = 0.0) -> None:
        super().__init__(name=name, step_s=step_s)
        self.slot_capacity = slot_capacity
        self.opened: list[tuple[str, int]] = []
        self.released: list[tuple[str, int]] = []
        self.seen_slots: list[tuple[str, int | None, object]] = []

    def state_bytes(self) -> int:
        return 1000

    def open_state(self, session_id, slot):
        self.opened.append((session_id, slot))
        return f"kv-{session_id}"

    def release_state(self, session_id, slot, state):
        self.released.append((session_id, slot))

    def stream(self, item: StageItem) -> AsyncIterator[tuple[str, int, int]]:
        self.seen_slots.append((item.session_id, item.slot, item.state))
        return super().stream(item)
