"""Small model stages for the engine's unit tests (real code paths, deterministic timing)."""

from __future__ import annotations

import threading
import time

import torch

from models.stage import StageOutput


class RecordingStage:
    """Doubles payloads; records each batch's session ids and start time."""

    device = "cpu"

    def __init__(self, name: str = "rec", delay_s: float = 0.0) -> None:
        self.name = name
        self.delay_s = delay_s
        self.batches: list[list[str]] = []
        self.starts: list[float] = []

    def forward(self, items):
        self.starts.append(time.monotonic())
        self.batches.append([item.session_id for item in items])
        if self.delay_s:
            time.sleep(self.delay_s)
        return [item.payload * 2 for item in items]


class FlakyStage(RecordingStage):
    """Fails the item whose payload is "bad"; raises for a batch holding "boom"."""

    def forward(self, items):
        self.batches.append([item.session_id for item in items])
        if any(item.payload == "boom" for item in items):
            raise RuntimeError("boom")
        return [ValueError("bad item") if item.payload == "bad" else item.payload for item in items]


class CountingStreamStage:
    """Streams ``payload`` chunks (forever if None, one for a non-int input), one per forward step."""

    device = "cpu"

    def __init__(self, name: str = "stream", step_s: float = 0.0) -> None:
        self.name = name
        self.step_s = step_s
        self.steps: dict[str, int] = {}
        self.first_step_at: float | None = None

    def forward(self, items):
        if self.first_step_at is None:
            self.first_step_at = time.monotonic()
        if self.step_s:
            time.sleep(self.step_s)
        outputs = []
        for item in items:
            self.steps[item.session_id] = self.steps.get(item.session_id, 0) + 1
            total = item.payload if item.payload is None or isinstance(item.payload, int) else 1
            final = total is not None and item.step + 1 >= total
            outputs.append(StageOutput((item.session_id, item.epoch, item.step), final=final))
        return outputs


class PooledStateStage:
    """A stateful stage: per-session rows of a preallocated pool, gathered by slot index."""

    device = "cpu"

    def __init__(self, slot_capacity: int = 4, width: int = 16, name: str = "pooled") -> None:
        self.name = name
        self.slot_capacity = slot_capacity
        self.pool = torch.zeros(slot_capacity, width)
        self.opened: list[tuple[str, int]] = []
        self.released: list[tuple[str, int]] = []
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
        index = torch.tensor([item.slot for item in items])
        rows = self.pool.index_select(0, index) + torch.tensor([[float(item.payload)] for item in items])
        self.pool.index_copy_(0, index, rows)
        return [float(row.sum()) for row in rows]


class AbortableSlowStage:
    """Each forward spins for up to ``run_s`` unless its session is aborted."""

    device = "cpu"
    name = "abortable"

    def __init__(self, run_s: float = 2.0) -> None:
        self.run_s = run_s
        self._aborted: set[str] = set()
        self._lock = threading.Lock()
        self.durations: list[float] = []

    def abort(self, session_id: str) -> None:
        with self._lock:
            self._aborted.add(session_id)

    def forward(self, items):
        with self._lock:
            self._aborted.clear()
        start = time.monotonic()
        ids = {item.session_id for item in items}
        while time.monotonic() - start < self.run_s:
            with self._lock:
                if ids <= self._aborted:
                    break
            time.sleep(0.005)
        self.durations.append(time.monotonic() - start)
        return [item.payload for item in items]


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
