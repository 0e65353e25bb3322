"""World sessions on the real session runtime, stage engines and pipeline: batching across
sessions, transactionality, the control adapter, slot ownership, batch isolation."""

from __future__ import annotations

import asyncio

import pytest
import torch
from prometheus_client import CollectorRegistry

from models.world.model import WorldTick
from models.world.stage import WorldBlockInput, WorldBlockStage, WorldDecodeStage, world_input
from realtime.kinds.world import WorldTickPayload
from sessions.engine import Pipeline, StageEngine
from sessions.errors import SessionFailedError, TickFailedError
from sessions.events import ControlInput, SessionEvent
from sessions.executor import StageExecutor
from sessions.manager import SessionManager
from sessions.session import SessionStatus
from sessions.tick import TickSnapshot
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


def _payload(seed: int, prompt: str | None = None) -> WorldTickPayload:
    return WorldTickPayload(seed, prompt, None)  # type: ignore[arg-type]  # no media stage here


def _runtime(model, max_batch: int, window: float = 0.0, block_stage=None):
    registry = CollectorRegistry()
    stages = (block_stage or WorldBlockStage(model), WorldDecodeStage(model))
    engines = [
        StageEngine(s, registry=registry, max_batch=max_batch, coalesce_window_s=window) for s in stages
    ]
    pipeline = Pipeline(engines, registry=registry)
    manager = SessionManager(
        "world", executor=StageExecutor(pipeline, world_input), capacity=model.pool.slots, lifecycle=pipeline
    )
    return pipeline, manager


def test_control_adapter_keys_sticky_and_mouse_summed_over_the_blocks_events():
    events = (_event(1, keys=["w"], mouse=(10, 0)), _event(2, keys=["a"], mouse=(5, -3)))
    keys = ControlInput(*KEYS, {"pressed": ["a"]})
    snapshot = TickSnapshot("s", "r", 3, (1, 2), None, (keys,), events, 0, _payload(7, "ice"))
    inp = world_input(snapshot)
    assert (
        isinstance(inp, WorldBlockInput)
        and inp.seed == 7
        and inp.tick.prompt == "ice"
        and inp.tick.block == 3
    )
    later = world_input(TickSnapshot("s", "r2", 4, (), None, (keys,), (), 0, _payload(7)))
    # the sticky "a" key in both; the mouse only in the block whose events carried it
    assert inp.tick.action[2] == later.tick.action[2] != 0
    assert not torch.equal(inp.tick.action, later.tick.action)


async def test_four_sessions_batch_in_one_forward_per_stage_and_equal_alone():
    seeds = [1, 2, 3, 4]
    keys = [["w"], ["a"], ["d"], ["s", "a"]]

    async def run(max_batch: int) -> tuple[list[list[torch.Tensor]], list[int]]:
        pipeline, manager = _runtime(make_model(slots=4), max_batch, window=0.5 if max_batch > 1 else 0.0)
        sessions = [await manager.create() for _ in seeds]
        for s in sessions:  # open every slot first, so each engine waits for all four submissions
            await pipeline.open(s.session_id)
        for s, k in zip(sessions, keys, strict=True):
            s.accept_event(_event(1, keys=k))
        frames: list[list[torch.Tensor]] = [[] for _ in seeds]
        batch_sizes = []
        for _ in range(3):
            results = await asyncio.gather(
                *(s.next_tick(_payload(seed, "ice")) for s, seed in zip(sessions, seeds, strict=True))
            )
            decoded = await asyncio.gather(*(r.value.tail for r in results))
            for i, (res, out) in enumerate(zip(results, decoded, strict=True)):
                frames[i].append(out.frames)
                batch_sizes += [res.value.head.batch_size, out.batch_size]
        await manager.shutdown()
        await pipeline.close()
        return frames, batch_sizes

    batched, sizes = await run(4)
    alone, alone_sizes = await run(1)
    assert set(sizes) == {4} and set(alone_sizes) == {1}
    for a, b in zip(batched, alone, strict=True):
        assert [f.shape[0] for f in a] == [5, 8, 8]
        for x, y in zip(a, b, strict=True):
            assert int((x.int() - y.int()).abs().max()) <= 1


class _Exploding(WorldBlockStage):
    """Raises for a batch holding a chosen session (or block), like a model bug on bad input."""

    fail_block: int | None = None
    fail_session: str | None = None

    def forward(self, items):
        if any(
            it.payload.tick.block == self.fail_block or it.session_id == self.fail_session for it in items
        ):
            raise RuntimeError("injected failure")
        return super().forward(items)


async def test_failed_tick_fails_session_releases_state_and_reset_restarts():
    model = make_model(slots=2)
    stage = _Exploding(model)
    pipeline, manager = _runtime(model, max_batch=2, block_stage=stage)
    session = await manager.create()
    payload = _payload(5, "stone")
    for _ in range(2):
        await session.next_tick(payload)
    stage.fail_block = 2
    session.accept_event(_event(3, keys=["w"]))
    with pytest.raises(TickFailedError):
        await session.next_tick(payload)
    assert session.status == SessionStatus.FAILED and session.chunk_index == 2
    assert session.pending_event_count == 1
    for _ in range(100):  # the failure's release runs through the engines' workers
        if session.session_id not in model.sessions:
            break
        await asyncio.sleep(0.01)
    assert session.session_id not in model.sessions  # worker state released
    with pytest.raises(SessionFailedError):
        await session.next_tick(payload)
    stage.fail_block = None
    await manager.reset(session.session_id)
    result = await session.next_tick(payload)
    assert session.status == SessionStatus.ACTIVE and result.metadata.chunk_index == 0
    assert (await result.value.tail).frames.shape[0] == 5
    await manager.shutdown()
    await pipeline.close()


async def test_a_poisoned_session_fails_alone_and_its_batch_mates_get_their_blocks():
    model = make_model(slots=3)
    stage = _Exploding(model)
    pipeline, manager = _runtime(model, max_batch=3, window=0.5, block_stage=stage)
    sessions = [await manager.create() for _ in range(3)]
    for s in sessions:
        await pipeline.open(s.session_id)
    stage.fail_session = sessions[1].session_id
    outcomes = await asyncio.gather(
        *(s.next_tick(_payload(i)) for i, s in enumerate(sessions)), return_exceptions=True
    )
    assert isinstance(outcomes[1], TickFailedError) and sessions[1].status == SessionStatus.FAILED
    for i in (0, 2):
        assert sessions[i].status == SessionStatus.ACTIVE and sessions[i].chunk_index == 1
        assert (await outcomes[i].value.tail).frames.shape[0] == 5
        assert model.next_block(sessions[i].session_id) == 1  # committed exactly once, despite the re-runs
    await manager.shutdown()
    await pipeline.close()


async def test_cancelled_open_does_not_leak_a_kv_slot():
    """A cancelled ``open`` leaves its slot to the slot table, which releases it through
    ``release_state`` once ``open_state`` returned; the KV pool follows those indices."""
    model = make_model(slots=1)
    engine = StageEngine(
        WorldBlockStage(model), registry=CollectorRegistry(), max_batch=1, coalesce_window_s=0.0
    )
    opening = asyncio.create_task(engine.open("gone"))
    await asyncio.sleep(0)  # open_state is queued on the worker
    opening.cancel()
    with pytest.raises(asyncio.CancelledError):
        await opening
    await engine.open("next")
    out = await engine.submit("next", 0, WorldBlockInput(WorldTick("next", 0, None, torch.zeros(6)), 1))
    assert out.block == 0 and out.latent.shape[0] == model.cfg.frames_per_block
    assert list(model.sessions) == ["next"] and len(model.pool) == 1
    await engine.release("next")
    assert not model.sessions and len(model.pool) == 0
    await engine.close()


def test_a_slot_held_by_another_session_is_refused_not_reconciled():
    model = make_model(slots=2)
    model.open("a", seed=1, slot=1)
    with pytest.raises(Exception, match="held by 'a'"):
        model.open("b", seed=2, slot=1)
    assert model.pool.holder(1) == "a" and "b" not in model.sessions
