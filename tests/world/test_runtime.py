"""World sessions on the real session runtime and stage engine: batching, transactionality,
the control reducer."""

from __future__ import annotations

import asyncio

import pytest
import torch
from prometheus_client import CollectorRegistry

from models.world.model import WorldTick
from models.world.stage import WorldStage, WorldStageInput
from realtime.kinds.world import WorldControlReducer, WorldExecutor, WorldTickPayload
from sessions.engine import StageEngine
from sessions.errors import SessionFailedError, TickFailedError
from sessions.events import ControlInput, SessionEvent
from sessions.manager import SessionManager
from sessions.session import SessionStatus
from tests.world.helpers import make_model

KEYS = ("keys", "world.keys.v1")
MOUSE = ("mouse", "world.mouse.v1")


def _event(event_id: int, keys=None, mouse=None, prompt=None) -> SessionEvent:
    controls = []
    if keys is not None:
        controls.append(ControlInput(*KEYS, {"pressed": keys}))
    if mouse is not None:
        controls.append(ControlInput(*MOUSE, {"dx": mouse[0], "dy": mouse[1]}))
    return SessionEvent(event_id, prompt=prompt, controls=tuple(controls))


def _runtime(stage, max_batch: int, window: float = 0.0):
    engine = StageEngine(stage, registry=CollectorRegistry(), max_batch=max_batch, coalesce_window_s=window)
    manager = SessionManager(
        "world",
        executor=WorldExecutor(engine),
        capacity=stage.slot_capacity,
        lifecycle=engine,
        reducer_factory=WorldControlReducer,
    )
    return engine, manager


def test_reducer_keys_latest_wins_sticky_and_mouse_summed_per_block():
    r = WorldControlReducer()
    first = r.prepare(
        current_controls={},
        events=(_event(1, keys=["w"], mouse=(10, 0)), _event(2, keys=["a"], mouse=(5, -3))),
        chunk_index=0,
    )
    by_track = {c.track: c.data for c in first.controls}
    assert by_track["keys"]["pressed"] == ("a",) and dict(by_track["mouse"]) == {"dx": 15.0, "dy": -3.0}
    current = {c.track: c for c in first.controls}
    second = {c.track: c.data for c in r.prepare(current_controls=current, events=(), chunk_index=1).controls}
    assert second["keys"]["pressed"] == ("a",) and dict(second["mouse"]) == {"dx": 0.0, "dy": 0.0}


async def test_four_sessions_batch_in_one_engine_forward_and_equal_alone():
    seeds = [1, 2, 3, 4]
    keys = [["w"], ["a"], ["d"], ["s", "a"]]

    async def run(max_batch: int) -> tuple[list[list[torch.Tensor]], list[int]]:
        stage = WorldStage(make_model(slots=4))
        engine, manager = _runtime(stage, max_batch, window=0.5 if max_batch > 1 else 0.0)
        sessions = [await manager.create() for _ in seeds]
        for s in sessions:  # open every slot first, so the engine waits for all four submissions
            await engine.open(s.session_id)
        for s, k in zip(sessions, keys, strict=True):
            s.accept_event(_event(1, keys=k))
        frames: list[list[torch.Tensor]] = [[] for _ in seeds]
        batch_sizes = []
        for _ in range(3):
            results = await asyncio.gather(
                *(s.next_tick(WorldTickPayload(seed, "ice")) for s, seed in zip(sessions, seeds, strict=True))
            )
            for i, res in enumerate(results):
                frames[i].append(res.value.output.frames)
                batch_sizes.append(res.value.output.batch_size)
        await manager.shutdown()
        await engine.close()
        return frames, batch_sizes

    batched, sizes = await run(4)
    alone, alone_sizes = await run(1)
    assert set(sizes) == {4} and set(alone_sizes) == {1}
    for a, b in zip(batched, alone, strict=True):
        assert [f.shape[0] for f in a] == [5, 8, 8]
        for x, y in zip(a, b, strict=True):
            assert int((x.int() - y.int()).abs().max()) <= 1


class _Exploding(WorldStage):
    fail_block: int | None = None

    def forward(self, items):
        if any(it.payload.tick.block == self.fail_block for it in items):
            raise RuntimeError("injected failure")
        return super().forward(items)


async def test_failed_tick_fails_session_releases_state_and_reset_restarts():
    stage = _Exploding(make_model(slots=2))
    engine, manager = _runtime(stage, max_batch=2)
    session = await manager.create()
    payload = WorldTickPayload(5, "stone")
    for _ in range(2):
        await session.next_tick(payload)
    stage.fail_block = 2
    session.accept_event(_event(3, keys=["w"]))
    with pytest.raises(TickFailedError):
        await session.next_tick(payload)
    assert session.status == SessionStatus.FAILED and session.chunk_index == 2
    assert session.pending_event_count == 1
    await asyncio.sleep(0.05)  # the failure's release runs through the engine's worker
    assert session.session_id not in stage.model.sessions  # worker state released
    with pytest.raises(SessionFailedError):
        await session.next_tick(payload)
    stage.fail_block = None
    await manager.reset(session.session_id)
    result = await session.next_tick(payload)
    assert session.status == SessionStatus.ACTIVE and result.metadata.chunk_index == 0
    assert result.value.output.frames.shape[0] == 5
    await manager.shutdown()
    await engine.close()


async def test_cancelled_open_does_not_leak_a_kv_slot():
    """The engine follows a cancelled ``open`` by dropping its slot while the worker still runs
    ``open_state``; the KV pool follows the engine's slot indices, so the slot is reusable."""
    stage = WorldStage(make_model(slots=1))
    engine, _ = _runtime(stage, max_batch=1)
    opening = asyncio.create_task(engine.open("gone"))
    await asyncio.sleep(0)  # open_state is queued on the worker
    opening.cancel()
    with pytest.raises(asyncio.CancelledError):
        await opening
    await engine.open("next")
    out = await engine.submit("next", 0, WorldStageInput(WorldTick("next", 0, None, torch.zeros(6)), 1))
    assert out.frames.shape[0] == 5
    assert list(stage.model.sessions) == ["next"] and len(stage.model.pool) == 1
    await engine.release("next")
    assert not stage.model.sessions and len(stage.model.pool) == 0
    await engine.close()
