"""Compute-aware admission (issue 11 defect 9): the world kind admits only as many paced sessions
as the measured step time keeps at their frame rate, so admitted sessions hold real time; one more
gets the typed capacity error and 1013."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
import websockets

from realtime.config import config_from_mapping
from tests.serving import serve_in_process

pytestmark = [pytest.mark.timeout(120), pytest.mark.asyncio(loop_scope="session")]


async def _recv_json(ws, kind: str, timeout: float = 30.0) -> dict:
    async def loop() -> dict:
        while True:
            message = await ws.recv()
            if isinstance(message, str) and (data := json.loads(message))["type"] == kind:
                return data

    return await asyncio.wait_for(loop(), timeout)


async def test_admitted_paced_sessions_hold_real_time_and_one_more_is_refused():
    config = config_from_mapping(
        {
            "robot": {"enabled": False},
            "runtime": {"memory_available_bytes": 2**34},  # memory alone would admit 256
            "world": {"enabled": True, "torch_threads": 1, "max_batch": 2, "compute_utilisation": 0.3},
        }
    )
    async with serve_in_process(config) as (base, server):
        (world,) = server.rt_app.state.rt.kinds
        plan = world.plan
        assert plan.limited_by == "compute" and 1 <= plan.capacity == world.manager.capacity < 256
        assert plan.compute_capacity == plan.capacity and world.step_seconds  # measured at load
        url = base.replace("http://", "ws://") + "/v1/realtime/world?protocol_version=1"
        sockets = [await websockets.connect(url) for _ in range(plan.capacity)]
        try:
            for ws in sockets:
                await ws.send(json.dumps({"type": "session.start", "pacing": "realtime", "format": "jpeg"}))
                await _recv_json(ws, "session.created")
            extra = await websockets.connect(url)
            await extra.send(json.dumps({"type": "session.start"}))
            refused = await _recv_json(extra, "error")
            assert refused["error"]["code"] == "session_limit_reached"
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await extra.recv()
            assert closed.value.rcvd.code == 1013

            async def frames_per_second(ws) -> float:
                first = await _recv_json(ws, "chunk.metadata")
                start, frames = time.monotonic(), 0
                while time.monotonic() - start < 3.0:
                    meta = await _recv_json(ws, "chunk.metadata")
                    frames += meta["frame_count"]
                assert meta["first_frame_index"] >= first["frame_count"]
                return frames / (time.monotonic() - start)

            rates = await asyncio.gather(*(frames_per_second(ws) for ws in sockets))
            assert all(rate >= 0.8 * 16 for rate in rates), rates  # each keeps its 16 fps
        finally:
            for ws in sockets:
                await ws.close()
