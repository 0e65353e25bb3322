"""Cross-session batching: max size, coalescing window, deadline not extended, eager dispatch."""

from __future__ import annotations

import asyncio
import time

from tests.sessions.engine.conftest import metric
from tests.sessions.engine.stages import RecordingStage


async def open_all(engine, ids):
    for sid in ids:
        await engine.open(sid)


async def test_batches_form_across_sessions_and_respect_max_batch(make_engine, registry):
    stage = RecordingStage()
    async with make_engine(stage, max_batch=4, coalesce_window_s=0.2) as engine:
        await open_all(engine, "abcdef")
        t0 = time.monotonic()
        results = await asyncio.gather(*(engine.submit(sid, 0, i) for i, sid in enumerate("abcdef")))
    assert results == [0, 2, 4, 6, 8, 10]
    assert stage.batches == [list("abcd"), list("ef")]
    assert stage.starts[0] - t0 < 0.1  # full batch: dispatched at once
    assert 0.15 < stage.starts[1] - t0 < 0.4  # the rest waited for its window
    assert metric(registry, "engine_batch_size_count", stage="rec") == 2
    assert metric(registry, "engine_batch_size_sum", stage="rec") == 6


async def test_partial_batch_waits_for_the_window(make_engine, registry):
    stage = RecordingStage()
    async with make_engine(stage, max_batch=8, coalesce_window_s=0.25) as engine:
        await open_all(engine, "abcd")
        t0 = time.monotonic()
        a = engine.submit("a", 0, 1)
        await asyncio.sleep(0.05)
        b = engine.submit("b", 0, 2)
        assert metric(registry, "engine_queue_depth", stage="rec") == 2  # both wait for the window
        assert await asyncio.gather(a, b) == [2, 4]
        assert metric(registry, "engine_queue_depth", stage="rec") == 0
    assert stage.batches == [["a", "b"]]
    assert 0.2 < stage.starts[0] - t0 < 0.4


async def test_arrivals_never_extend_the_deadline(make_engine):
    stage = RecordingStage()
    window = 0.3
    async with make_engine(stage, max_batch=8, coalesce_window_s=window) as engine:
        await open_all(engine, "abcd")
        t0 = time.monotonic()
        futures = [engine.submit("a", 0, 1)]
        for sid in "bc":
            await asyncio.sleep(0.1)  # arrivals at ~0.1 and ~0.2 s, before the 0.3 s deadline
            futures.append(engine.submit(sid, 0, 1))
        await asyncio.gather(*futures)
    assert stage.batches == [["a", "b", "c"]]
    assert window - 0.02 < stage.starts[0] - t0 < window + 0.12  # not 0.2 + window


async def test_dispatch_at_once_when_every_active_session_submitted(make_engine):
    stage = RecordingStage()
    async with make_engine(stage, max_batch=8, coalesce_window_s=5.0) as engine:
        await open_all(engine, "abc")
        t0 = time.monotonic()
        await asyncio.gather(*(engine.submit(sid, 0, 1) for sid in "abc"))
    assert time.monotonic() - t0 < 1.0
    assert stage.batches == [list("abc")]


async def test_dispatch_at_once_when_few_sessions_remain(make_engine):
    stage = RecordingStage()
    async with make_engine(stage, max_batch=8, coalesce_window_s=5.0, eager_remaining=1) as engine:
        await open_all(engine, "abcd")
        t0 = time.monotonic()
        await asyncio.gather(*(engine.submit(sid, 0, 1) for sid in "abc"))  # only "d" remains
    assert time.monotonic() - t0 < 1.0
    assert stage.batches == [list("abc")]


async def test_one_item_per_session_per_batch_in_order(make_engine):
    stage = RecordingStage()
    async with make_engine(stage, max_batch=8, coalesce_window_s=0.0) as engine:
        await open_all(engine, "ab")
        results = await asyncio.gather(
            engine.submit("a", 0, 1), engine.submit("a", 0, 2), engine.submit("b", 0, 3)
        )
    assert results == [2, 4, 6]
    assert stage.batches == [["a", "b"], ["a"]]


async def test_work_arriving_during_a_forward_joins_the_next_batch(make_engine):
    stage = RecordingStage(delay_s=0.2)
    async with make_engine(stage, max_batch=8, coalesce_window_s=0.01) as engine:
        await open_all(engine, "abcd")
        first = engine.submit("a", 0, 1)
        await asyncio.sleep(0.05)  # "a" is in its forward now
        rest = [engine.submit(sid, 0, 1) for sid in "bcd"]
        await asyncio.gather(first, *rest)
    assert stage.batches == [["a"], ["b", "c", "d"]]
