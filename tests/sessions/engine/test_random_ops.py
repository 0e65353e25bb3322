"""Random interleavings of open/submit/stream/bump/cancel/release never hang or leak.

Run against each kind of runner: a batched ``StageEngine``, a ``StreamingStageEngine`` and a
``Pipeline`` of the two. Afterwards no slot, pending count, pump or relay task, live stage
generator or channel depth may be left.
"""

from __future__ import annotations

import asyncio
import random

import pytest

from models.stage import StageItem
from sessions.engine import EngineError, Pipeline, PipelineResult, StageEngine, StreamingStageEngine
from tests.sessions.engine.conftest import live_tasks, metric
from tests.sessions.engine.stages import FakeStreamStage

SESSIONS = [f"s{i}" for i in range(5)]


class _Slots:
    """Stateful-stage bookkeeping that asserts the slot table never hands out a held slot."""

    slot_capacity = 6

    def __init__(self) -> None:
        self.held: set[int] = set()

    def state_bytes(self) -> int:
        return 100

    def open_state(self, session_id, slot):
        assert slot not in self.held
        self.held.add(slot)

    def release_state(self, session_id, slot, state):
        self.held.remove(slot)


class RandomBatchedStage(_Slots):
    """Echoes payloads; fails some items, and raises for some whole batches (bisected)."""

    name = "batched"
    device = "cpu"

    def __init__(self, seed: int) -> None:
        super().__init__()
        self.rng = random.Random(seed)

    def forward(self, items):
        assert all(item.slot in self.held for item in items)
        if self.rng.random() < 0.03:
            raise RuntimeError("unlucky batch")
        return [ValueError("unlucky") if self.rng.random() < 0.05 else item.payload for item in items]


class RandomStreamStage(_Slots, FakeStreamStage):
    """The fake LLM with slots; some requests fail after their first chunk."""

    def __init__(self, seed: int) -> None:
        _Slots.__init__(self)
        FakeStreamStage.__init__(self, name="streaming", step_s=0.001)
        self.rng = random.Random(seed + 1000)

    def stream(self, item: StageItem):
        assert item.slot in self.held
        if self.rng.random() < 0.05:
            self.failing.add(item.request_id)
        return super().stream(item)


def build(kind: str, seed: int, registry):
    batched = RandomBatchedStage(seed)
    streaming = RandomStreamStage(seed)
    engines = {
        "batched": lambda: StageEngine(
            batched, registry=registry, max_batch=3, coalesce_window_s=0.002, stream_buffer=2
        ),
        "streaming": lambda: StreamingStageEngine(
            streaming, registry=registry, stream_buffer=2, max_pending=8
        ),
    }
    if kind == "pipeline":
        runner = Pipeline([engines["streaming"](), engines["batched"]()], registry=registry, channel_size=2)
    else:
        runner = engines[kind]()
    stages = {"batched": [batched], "streaming": [streaming], "pipeline": [streaming, batched]}[kind]
    return runner, stages


async def settle_submit(runner, sid: str, epoch: int, n: int, request_id: str) -> None:
    result = await runner.submit(sid, epoch, n, request_id=request_id)
    if isinstance(result, PipelineResult):
        await result.tail


async def read(stream, limit: int) -> None:
    """Read up to ``limit`` chunks, then close the stream early (typed errors are fine)."""
    try:
        got = 0
        async for _ in stream:
            got += 1
            if got >= limit:
                break
            await asyncio.sleep(0)
    except EngineError:
        pass
    finally:
        await stream.aclose()


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("kind", ["batched", "streaming", "pipeline"])
async def test_random_operations_settle_and_leak_nothing(registry, kind, seed):
    rng = random.Random(seed)
    runner, stages = build(kind, seed, registry)
    epochs = dict.fromkeys(SESSIONS, 0)
    tasks: list[asyncio.Task] = []
    for i in range(300):
        sid = rng.choice(SESSIONS)
        op = rng.random()
        request_id = f"{sid}-{i}"
        try:
            if op < 0.15:
                await runner.open(sid)
            elif op < 0.45:
                n = rng.randint(1, 3)
                tasks.append(asyncio.create_task(settle_submit(runner, sid, epochs[sid], n, request_id)))
            elif op < 0.7:
                stream = runner.stream(sid, epochs[sid], rng.choice([1, 3, 5, None]), request_id=request_id)
                if rng.random() < 0.2:
                    stream.cancel()
                else:
                    tasks.append(asyncio.create_task(read(stream, rng.randint(1, 6))))
            elif op < 0.85:
                epochs[sid] += 1
                runner.bump_epoch(sid, epochs[sid])
            else:
                await runner.release(sid, rng.choice(["close", "reset", "evicted"]))
        except EngineError:
            pass
        await asyncio.sleep(rng.choice([0, 0, 0.001]))
    for sid in SESSIONS:  # endless streams still being read end here
        await runner.release(sid, "close")
    done, pending = await asyncio.wait(tasks, timeout=10)
    assert not pending, f"{len(pending)} submits or streams never settled"
    for task in done:
        if task.exception() is not None:
            assert isinstance(task.exception(), EngineError), task.exception()
    await asyncio.sleep(0.01)  # done callbacks of cancelled pumps
    engines = runner.runners if isinstance(runner, Pipeline) else (runner,)
    for engine in engines:
        assert engine.slots.bytes_in_use == 0 and len(engine.slots) == 0
        if isinstance(engine, StageEngine):
            assert engine.scheduler.pending == 0
        else:
            assert engine._inflight == 0
    for stage in stages:
        assert not stage.held
        assert metric(registry, "engine_channel_depth", stage=stage.name) == 0
    assert metric(registry, "engine_queue_depth", stage="batched") == 0
    assert not live_tasks("stream-") and not live_tasks("relay-")
    if kind != "batched":
        assert not stages[0].live  # every generator the stage started was closed
    await runner.close()
