"""``WorldStage``: the world model as a stateful stage of the stage engine (``models/stage.py``).

One engine batch = one ``WorldModel.step`` over the batch's sessions: all their blocks denoise in
one forward, commit their KV, and decode to frames. Item payload: :class:`WorldStageInput`;
result: :class:`WorldStageOutput`. A payload for block 0 starts the session's world afresh
(``reset`` with the tick's seed), so a session reset at the runtime level needs no extra call.
Per-session resident state lives in the model's pooled KV cache and decoder caches, keyed by
session id, in the pool slot the engine allocated (``open_state``'s ``slot``), so the engine's
slot accounting is the only one; ``open_state`` / ``release_state`` run on the engine's worker
thread.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from torch import Tensor

from models.stage import StageItem
from models.world.model import WorldModel, WorldTick


@dataclass(frozen=True)
class WorldStageInput:
    tick: WorldTick
    seed: int


@dataclass(frozen=True)
class WorldStageOutput:
    frames: Tensor  # uint8 [T, H, W, 3]
    block: int
    forward_ms: float
    batch_size: int


class WorldStage:
    def __init__(self, model: WorldModel, name: str = "world", device: str = "cpu") -> None:
        self.model = model
        self.name = name
        self.device = device
        self.slot_capacity = model.pool.slots

    def state_bytes(self) -> int:
        return self.model.bytes_per_session

    def open_state(self, session_id: str, slot: int) -> str:
        self.model.open(session_id, seed=0, slot=slot)
        return session_id

    def release_state(self, session_id: str, slot: int, state: object) -> None:
        self.model.release(session_id)

    def forward(self, items: Sequence[StageItem]) -> list[WorldStageOutput]:
        t0 = time.perf_counter()
        inputs: list[WorldStageInput] = [item.payload for item in items]
        for inp in inputs:
            if inp.tick.block == 0:
                self.model.reset(inp.tick.session_id, seed=inp.seed)
        frames = self.model.step([inp.tick for inp in inputs])
        ms = (time.perf_counter() - t0) * 1000.0
        return [
            WorldStageOutput(f, inp.tick.block, ms, len(items)) for f, inp in zip(frames, inputs, strict=True)
        ]
