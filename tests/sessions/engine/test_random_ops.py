"""Random interleavings of open/submit/stream/bump/cancel/release never hang or leak."""

from __future__ import annotations

import asyncio
import random

import pytest

from models.stage import StageOutput
from sessions.engine import EngineError, StageEngine
from tests.sessions.engine.conftest import metric


class RandomStage:
    """Streams ``payload`` chunks; fails some items; a stateful stage with a pool of slots."""

    name = "random"
    device = "cpu"
    slot_capacity = 6

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.held: set[int] = set()

    def state_bytes(self) -> int:
        return 100

    def open_state(self, session_id, slot):
        assert slot not in self.held
        self.held.add(slot)

    def release_state(self, session_id, slot, state):
        self.held.remove(slot)

    def forward(self, items):
        out = []
        for item in items:
            assert item.slot in self.held
            if self.rng.random() < 0.05:
                out.append(ValueError("unlucky"))
            else:
                out.append(StageOutput(item.step, final=item.step + 1 >= item.payload))
        return out


async def drain(stream) -> None:
    try:
        async for _ in stream:
            await asyncio.sleep(0)
    except EngineError:
        pass


@pytest.mark.parametrize("seed", range(3))
async def test_random_operations_settle_and_leak_nothing(registry, seed):
    rng = random.Random(seed)
    stage = RandomStage(seed)
    engine = StageEngine(stage, registry=registry, max_batch=3, coalesce_window_s=0.002, stream_buffer=2)
    sessions = [f"s{i}" for i in range(5)]
    epochs = dict.fromkeys(sessions, 0)
    futures, readers = [], []
    for _ in range(300):
        sid = rng.choice(sessions)
        op = rng.random()
        try:
            if op < 0.15:
                await engine.open(sid)
            elif op < 0.45:
                futures.append(engine.submit(sid, epochs[sid], rng.randint(1, 3)))
            elif op < 0.7:
                stream = engine.stream(sid, epochs[sid], rng.randint(1, 5))
                if rng.random() < 0.2:
                    stream.cancel()
                else:
                    readers.append(asyncio.create_task(drain(stream)))
            elif op < 0.85:
                epochs[sid] += 1
                engine.bump_epoch(sid, epochs[sid])
            else:
                await engine.release(sid, rng.choice(["close", "reset", "evicted"]))
        except EngineError:
            pass
        await asyncio.sleep(rng.choice([0, 0, 0.001]))
    done, pending = await asyncio.wait(futures + readers, timeout=10)
    assert not pending, f"{len(pending)} futures or streams never settled"
    for fut in done:
        if fut.exception() is not None:
            assert isinstance(fut.exception(), EngineError)
    for sid in sessions:
        await engine.release(sid, "close")
    assert engine.slots.bytes_in_use == 0 and not stage.held
    assert engine._pending_count == 0
    assert metric(registry, "engine_queue_depth", stage="random") == 0
    assert metric(registry, "engine_channel_depth", stage="random") == 0
    await engine.close()
