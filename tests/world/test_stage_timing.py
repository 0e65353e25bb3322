"""Stage timing of world chunks (issue 16): a real server exports ``world_stage_seconds`` with a
sample for every stage, for a session's first block and the later ones, and the bench's scrape
summarises the histogram honestly (the model stages' ``BlockTimings``: ``test_stage_streams.py``)."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
import websockets
from prometheus_client import CollectorRegistry, generate_latest

from models.world.profiling import BlockTimings
from realtime.bench import world_stages
from realtime.config import config_from_mapping
from realtime.kinds.world_timing import METRIC, STAGES, StageTimer
from realtime.media.stage import EncodedMedia
from tests.serving import serve_in_process


def test_breakdown_reads_exact_means_p50_and_max_bucket():
    registry = CollectorRegistry()
    timer = StageTimer(registry)
    before = world_stages.parse(generate_latest(registry).decode())
    timings = BlockTimings(
        started_at=10.0,
        launch_ms=40.0,
        gap_ms=3.0,
        idle_ms=1.0,
        denoise_ms=100.0,
        clean_ms=20.0,
        decode_ms=10.0,
        d2h_ms=2.0,
    )
    media = EncodedMedia(b"", 0, 1, 8, 8, 120.0, 12.0, 30.0, 1, timings)
    # first block: due 9.9 s, encoded at 10.2 s, sent 10.25 s
    timer.observe(media, True, due=9.9, ready_at=10.2, sent_at=10.25)
    for queue_ms in (5, 7, 9, 11, 450):  # later blocks: queue waits, one of them long
        timer.observe(media, False, due=10.0 - queue_ms / 1000, ready_at=10.2, sent_at=10.21)
    figures = world_stages.breakdown(before, world_stages.parse(generate_latest(registry).decode()))
    assert figures["n"] == 5 and figures["n_first"] == 1
    first = figures["first_block"]
    assert first["queue"] == pytest.approx(100.0) and first["send"] == pytest.approx(50.0)
    assert first["total"] == pytest.approx(350.0) and first["encode"] == 30.0
    assert 8 <= figures["p50"]["queue"] <= 10  # the median, 9 ms, lies in the (8, 10] bucket
    assert figures["max"]["queue"] == 500.0  # 450 ms: the (400, 500] bucket
    assert 80 <= figures["p50"]["denoise"] <= 100  # all five in the (80, 100] bucket
    assert figures["mean"]["denoise"] == pytest.approx(100.0)  # exact, where p50 only knows the bucket
    assert figures["mean"]["queue"] == pytest.approx((5 + 7 + 9 + 11 + 450) / 5)
    assert figures["mean"]["gap"] == pytest.approx(3.0) and figures["mean"]["idle"] == pytest.approx(1.0)
    assert figures["mean"]["launch"] == pytest.approx(40.0)
    assert set(figures["p50"]) == set(STAGES)


def _config():
    return config_from_mapping(
        {
            "robot": {"enabled": False},
            "runtime": {"memory_available_bytes": 2**30},
            "world": {"enabled": True, "torch_threads": 1, "compute_admission": False, "model": "world-test"},
        }
    )


def _counts(text: str) -> dict[tuple[str, str], float]:
    return {key: series.count for key, series in world_stages.parse(text).items()}


@pytest.mark.timeout(120)
async def test_server_metrics_hold_every_stage_for_first_and_later_blocks():
    async with serve_in_process(_config()) as (base, _server):
        url = base.replace("http://", "ws://") + "/v1/realtime/world?protocol_version=1"
        async with websockets.connect(url, max_size=2**24) as ws:
            start = {"type": "session.start", "prompt": "stone", "seed": 1, "fps": 16, "pacing": "fast"}
            await ws.send(json.dumps(start))
            media = 0
            while media < 3:
                if isinstance(await asyncio.wait_for(ws.recv(), 30), bytes):
                    media += 1
            await ws.send(json.dumps({"type": "session.close"}))
            async for _ in ws:
                pass
        async with httpx.AsyncClient() as client:
            deadline = time.monotonic() + 10  # the runner observes a chunk once the writer is done
            while True:
                text = (await client.get(f"{base}/metrics")).text
                counts = _counts(text)
                done = all(counts.get((s, b), 0) >= 1 for s in STAGES for b in ("first", "later"))
                if done or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.05)
    assert f"# TYPE {METRIC} histogram" in text
    for stage in STAGES:
        assert counts[(stage, "first")] == 1, stage  # one session, one first block
        assert counts[(stage, "later")] >= 1, stage
