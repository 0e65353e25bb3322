"""Routine ends are quiet (issue 11 defect 8): a robot dropping mid-request and polite world closes
log INFO lines with the close, never an ERROR line or a traceback."""

from __future__ import annotations

import asyncio
import json
import logging

import msgpack_numpy
import pytest
import websockets

from realtime.bench.examples import libero
from realtime.config import config_from_mapping
from tests.serving import serve_in_process

pytestmark = [pytest.mark.timeout(120), pytest.mark.asyncio(loop_scope="session")]


async def test_dropped_robots_and_polite_world_closes_log_no_errors_or_tracebacks(caplog):
    config = config_from_mapping(
        {
            "robot": {"enabled": True, "device": "cpu", "torch_threads": 1},
            "world": {"enabled": True, "torch_threads": 1, "max_batch": 2},
            "runtime": {"memory_available_bytes": 2**31},
        }
    )
    caplog.set_level(logging.INFO)
    async with serve_in_process(config) as (base, server):
        ws_base = base.replace("http://", "ws://")
        for _ in range(5):  # a robot that sends a request and vanishes before the reply
            robot = await websockets.connect(ws_base + "/", max_size=None)
            await robot.recv()  # metadata
            await robot.send(msgpack_numpy.packb(libero(0)))
            robot.transport.abort()
        for _ in range(5):  # a robot that closes politely between requests
            async with websockets.connect(ws_base + "/", max_size=None) as robot:
                await robot.recv()
                await robot.send(msgpack_numpy.packb(libero(1)))
                await robot.recv()
        for i in range(10):  # polite world closes, mid-stream
            async with websockets.connect(ws_base + "/v1/realtime/world?protocol_version=1") as world:
                await world.send(json.dumps({"type": "session.start", "pacing": "fast", "seed": i}))
                while json.loads(await world.recv())["type"] != "chunk.metadata":
                    pass
                await world.send(json.dumps({"type": "session.close"}))
                while not (
                    isinstance(m := await world.recv(), str) and json.loads(m)["type"] == "session.closed"
                ):
                    pass
        kinds = server.rt_app.state.rt.kinds
        for _ in range(200):
            if all(len(k.manager) == 0 for k in kinds):
                break
            await asyncio.sleep(0.02)
        assert all(len(k.manager) == 0 for k in kinds)
    loud = [
        r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info or "Traceback" in r.getMessage()
    ]
    assert not loud, [(r.name, r.levelname, r.getMessage()) for r in loud]
    closes = [r for r in caplog.records if r.getMessage() in ("closing websocket", "client disconnected")]
    assert len(closes) >= 20 and all(r.levelno == logging.INFO for r in closes)
